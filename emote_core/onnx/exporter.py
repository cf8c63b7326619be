"""Exporting the acting network to ONNX during training: the :class:`OnnxExporter` callback.

It exports periodically, and on request from other threads, into a run's ``exports/`` directory,
through :mod:`emote_core.onnx.writer` (opset check, ``onnx.checker``, onnxruntime parity) in the
layout :mod:`emote_core.onnx.format` describes. Exports of a finished run's checkpoints
(``emote export onnx``) are assembled in :mod:`emote_core.assembly.export`.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
from collections.abc import Callable, Mapping
from concurrent import futures
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from emote_core.callback import Callback, Order
from emote_core.errors import ConfigurationError, ExportError
from emote_core.onnx.format import metadata_props
from emote_core.onnx.graph import PolicyGraph, policy_metadata, proxy_policy_graph
from emote_core.onnx.publishing import LATEST_POLICY, replace_atomically
from emote_core.onnx.storage import CRUDStorage, StorageItem, StorageItemHandle
from emote_core.onnx.writer import (
    DEFAULT_OPSET,
    SUPPORTED_OPSETS,
    ExportReport,
    check_opset,
    write_policy,
)
from emote_core.spaces import MDPSpace

log = logging.getLogger(__name__)


UPSTREAM_PREFIX = "savedmodel_"
"""File-name prefix of exports of an agent proxy (upstream emote's default)."""


class QueuedExport:
    """An export requested with :meth:`OnnxExporter.queue_export`: a result to wait on.

    Args:
        metadata: Props for this export only.
        exporter_name: The name of the exporter that serves it (for messages).
    """

    def __init__(self, metadata: Mapping[str, Any] | None, exporter_name: str = "") -> None:
        self.metadata = dict(metadata or {})
        self.exporter_name = exporter_name
        self.future: futures.Future[StorageItem] = futures.Future()

    def done(self) -> bool:
        """Whether the export has been made (or failed)."""
        return self.future.done()

    @property
    def return_value(self) -> StorageItem | None:
        """The stored export once made, else ``None``."""
        done = self.future.done() and not self.future.cancelled()
        return self.future.result() if done and self.future.exception() is None else None

    def block_until_complete(self, timeout: float | None = None) -> StorageItem:
        """Waits for the export and returns it.

        Args:
            timeout: Seconds to wait; ``None`` waits as long as it takes.

        Raises:
            ExportError: If the export fails, or is not made within ``timeout``.
        """
        try:
            return self.future.result(timeout)
        except futures.TimeoutError:
            self.future.cancel()
            raise ExportError(
                f"'{self.exporter_name}' did not serve the export request within {timeout} s; the "
                "training thread serves requests after every batch — is training running?"
            ) from None


class OnnxExporter(Callback):
    """Exports the acting network to ONNX every ``interval`` updates, and whenever asked.

    Exports are the items of a :class:`CRUDStorage` in ``directory`` (``policy_<n>.onnx``); each
    is checked and parity-tested like ``emote export onnx`` output and records the update it was
    taken at.

    Every ``publish_interval`` updates, and when training ends, the policy also replaces
    ``directory/latest.onnx`` in one rename, so readers never see a half-written file.

    :meth:`export` runs on the training thread; other threads call :meth:`export_threadsafe`,
    which waits until the training thread serves it (between batches, or through
    :meth:`process_pending_exports` before the first: pass this callback as
    ``MemoryWarmup(exporter=...)``).

    Given ``agent_proxy`` (upstream emote's positional call), it exports any proxy with a
    ``policy`` and ``input_names``; files are then ``savedmodel_<n>.onnx`` and the metadata's
    algorithm is empty.

    Args:
        agent_proxy: The proxy whose policy to export (instead of ``graph``).
        spaces: The MDP space of the proxy's inputs and actions (with ``agent_proxy``).
        requires_epsilon: Whether the policy takes an ``epsilon`` noise input of the action's
            shape after the observations (with ``agent_proxy``).
        device: Accepted for upstream's call; exports always trace a CPU copy.
        graph: Snapshots the acting network into a :class:`~emote_core.onnx.graph.PolicyGraph`
            on the training thread at every export.
        directory: Where exports go (a run's ``exports/``).
        interval: Updates between periodic exports; ``None`` exports only on request.
        recipe_name: The run's recipe's name, recorded in every export.
        recipe_toml: The resolved recipe as TOML, recorded so the export can be evaluated alone.
        env_action_space: The environment's own action space (its bounds are recorded).
        opset: The default-domain opset.
        prefix: File names are ``<prefix><handle>.onnx`` (default ``policy_``, or ``savedmodel_``
            for an agent proxy).
        max_exports: Keep at most this many exports, deleting the oldest.
        publish_interval: Updates between publications of ``latest.onnx``; ``None`` or 0
            publishes none.
        name: The callback's name.

    Raises:
        ConfigurationError: If the opset is not supported, ``max_exports`` is not positive, or
            not exactly one of ``graph`` and ``agent_proxy`` (with its ``spaces`` and
            ``requires_epsilon``) is given.
        ExportError: If ``agent_proxy`` cannot be exported (no policy, inputs not in ``spaces``).
        CallbackDefinitionError: If ``interval`` is not a positive integer or ``None``.
    """

    order: ClassVar[int] = Order.CHECKPOINT

    def __init__(
        self,
        agent_proxy: Any = None,
        spaces: MDPSpace | None = None,
        requires_epsilon: bool | None = None,
        directory: str | Path | None = None,
        interval: int | None = None,
        prefix: str | None = None,
        device: Any = None,
        *,
        graph: Callable[[], PolicyGraph] | None = None,
        recipe_name: str = "",
        recipe_toml: str = "",
        env_action_space: Any = None,
        opset: int = DEFAULT_OPSET,
        max_exports: int | None = None,
        publish_interval: int | None = None,
        name: str = "onnx_exporter",
    ) -> None:
        super().__init__(name=name, cycle=interval)
        if directory is None:
            raise ConfigurationError(f"OnnxExporter '{name}': pass directory=, where exports go")
        if device is not None:
            torch.device(device)  # a malformed device is an error here, as upstream's would be
        self.graph = self._graph_source(name, graph, agent_proxy, spaces, requires_epsilon)
        if prefix is None:
            prefix = "policy_" if agent_proxy is None else UPSTREAM_PREFIX
        self.recipe_name = recipe_name
        self.recipe_toml = recipe_toml
        self.env_action_space = env_action_space
        self.opset = check_opset(opset)
        self.storage = CRUDStorage(
            directory, prefix=prefix, extension="onnx", max_items=max_exports
        )
        self.last_report: ExportReport | None = None
        """The report of the latest export (its ``out`` is the stored file)."""
        self._metadata: dict[str, str] = {}
        self._requests: collections.deque[QueuedExport] = collections.deque()
        self._state_lock = threading.Lock()  # guards _metadata, _requests and _closed
        self._export_lock = threading.Lock()  # one trace at a time
        self._training_thread: int | None = None
        self._closed = False
        self._bp_step = 0
        if publish_interval is not None and (
            isinstance(publish_interval, bool)
            or not isinstance(publish_interval, int)
            or publish_interval < 0
        ):
            raise ConfigurationError(
                f"OnnxExporter '{name}': publish_interval must be a number of updates >= 0 or "
                f"None; got {publish_interval!r}"
            )
        self.publish_interval = publish_interval or 0
        self.published_step: int | None = None
        """The update of the latest publication (``None``: none yet)."""

    @staticmethod
    def _graph_source(
        name: str,
        graph: Callable[[], PolicyGraph] | None,
        agent_proxy: Any,
        spaces: MDPSpace | None,
        requires_epsilon: bool | None,
    ) -> Callable[[], PolicyGraph]:
        owner = f"OnnxExporter '{name}'"
        if (graph is None) == (agent_proxy is None):
            raise ConfigurationError(
                f"{owner}: pass either graph= (a policy graph) or agent_proxy= (with spaces= and "
                "requires_epsilon=, as upstream emote), exactly one of them"
            )
        if graph is not None:
            return graph
        if spaces is None or not isinstance(requires_epsilon, bool):
            raise ConfigurationError(
                f"{owner}: exporting an agent proxy needs spaces= (its MDP space) and "
                f"requires_epsilon=True/False; got spaces={spaces!r}, "
                f"requires_epsilon={requires_epsilon!r}"
            )
        source = functools.partial(
            proxy_policy_graph, agent_proxy, spaces, requires_epsilon=requires_epsilon
        )
        graph = source()  # fails now, not at the first export, if the proxy cannot be exported
        try:
            graph.run(graph.sample_inputs(1, np.random.default_rng(0)))
        except ExportError:
            raise
        except Exception as error:
            raise ExportError(
                f"{owner}: the proxy's policy fails on inputs {dict(graph.input_shapes)} "
                f"(one row each, from spaces): {type(error).__name__}: {error}"
            ) from error
        return source

    # Exporting.

    def add_metadata(self, key: str, value: Any) -> None:
        """Records ``key`` in every later export; non-string values are written as JSON.

        Raises:
            TypeError: If ``key`` is not a string.
            ConfigurationError: If ``key`` is one emote writes itself.
        """
        props = metadata_props(self.name, {key: value})
        with self._state_lock:
            self._metadata.update(props)

    def export(self, metadata: Mapping[str, Any] | None = None) -> StorageItem:
        """Exports the network now; call this on the training thread.

        Args:
            metadata: Props for this export only, on top of :meth:`add_metadata`'s.

        Returns:
            The stored export.

        Raises:
            TypeError: If a key of ``metadata`` is not a string.
            ConfigurationError: If a key of ``metadata`` is one emote writes itself.
            ExportError: If the export fails its checks (nothing is stored).
        """
        metadata = metadata_props(self.name, metadata or {})
        with self._export_lock:
            reports: list[ExportReport] = []
            item = self.storage.create_with_saver(
                lambda path: reports.append(self._write(path, metadata))
            )
            self.last_report = replace(reports[0], out=item.filepath)
        log.info(
            "exported the policy at update %d to %s (max abs diff %.2g)",
            self._bp_step, item.filepath, self.last_report.max_abs_diff,
        )  # fmt: skip
        return item

    def _write(self, path: str | Path, metadata: Mapping[str, Any] | None) -> ExportReport:
        """Writes the network at this update to ``path`` (checked, parity-tested)."""
        with self._state_lock:
            extra = dict(self._metadata)
        extra.update(metadata_props(self.name, metadata or {}))
        graph = self.graph()
        described = policy_metadata(
            graph, recipe_name=self.recipe_name, recipe_toml=self.recipe_toml,
            env_action_space=self.env_action_space, training_step=self._bp_step,
        )  # fmt: skip
        return write_policy(graph, path, opset=self.opset, metadata=replace(described, extra=extra))

    def publish(self) -> Path:
        """Replaces ``latest.onnx`` with the network now; call this on the training thread.

        The file is written under a temporary name beside it, flushed to disk and renamed over
        the old one: a reader opens either the old file or the new one, whole. Nothing else in
        the directory changes.

        Returns:
            The published file.

        Raises:
            ExportError: If the export fails its checks (the old file stays).
        """
        target = Path(self.storage.directory) / LATEST_POLICY
        with self._export_lock:
            report = replace_atomically(target, lambda path: self._write(path, None))
            self.published_step = self._bp_step
        log.info(
            "published the policy of update %d to %s (max abs diff %.2g)",
            self._bp_step, target, report.max_abs_diff,
        )  # fmt: skip
        return target

    def queue_export(self, metadata: Mapping[str, Any] | None = None) -> QueuedExport:
        """Queues an export for the training thread, from any thread, without waiting.

        The training thread serves it after its next batch (or in
        :meth:`process_pending_exports`); once training has ended, it is made at once.

        Args:
            metadata: Props for this export only.

        Returns:
            The request: wait on it with :meth:`QueuedExport.block_until_complete`.

        Raises:
            TypeError: If a key of ``metadata`` is not a string.
            ConfigurationError: If a key of ``metadata`` is one emote writes itself.
        """
        request = QueuedExport(metadata_props(self.name, metadata or {}), self.name)
        with self._state_lock:
            closed = self._closed
            if not closed:
                self._requests.append(request)
        if closed:  # nothing changes the weights any more
            self._serve(request)
        return request

    def export_threadsafe(
        self, metadata: Mapping[str, Any] | None = None, *, timeout: float | None = None
    ) -> StorageItem:
        """Exports from any thread: queued for the training thread, which serves it soon.

        Args:
            metadata: Props for this export only.
            timeout: Seconds to wait; ``None`` waits as long as it takes.

        Returns:
            The stored export.

        Raises:
            ExportError: If the export fails, or is not served within ``timeout``.
        """
        if threading.get_ident() == self._training_thread:
            return self.export(metadata)
        return self.queue_export(metadata).block_until_complete(timeout)

    def process_pending_exports(self) -> None:
        """Serves the requests queued by :meth:`queue_export` (on the training thread)."""
        while True:
            with self._state_lock:
                if not self._requests:
                    return
                request = self._requests.popleft()
            self._serve(request)

    def _serve(self, request: QueuedExport) -> None:
        if not request.future.set_running_or_notify_cancel():
            return  # the caller gave up waiting
        try:
            request.future.set_result(self.export(request.metadata))
        except Exception as error:  # the requester gets the error, training goes on
            request.future.set_exception(error)

    # Storage.

    def items(self) -> list[StorageItem]:
        """The stored exports, oldest first."""
        return self.storage.items()

    def get(self, handle: StorageItemHandle) -> StorageItem | None:
        """The export with ``handle``, or ``None``."""
        return self.storage.get(handle)

    def latest(self) -> StorageItem | None:
        """The newest export, or ``None``."""
        return self.storage.latest()

    def delete(self, handle: StorageItemHandle) -> bool:
        """Deletes an export; whether there was one."""
        return self.storage.delete(handle)

    # Hooks.

    def begin_training(self, bp_step: int = 0) -> None:
        """Notes the training thread and serves requests made before training began."""
        self._training_thread = threading.get_ident()
        self._bp_step = bp_step
        with self._state_lock:
            self._closed = False
        self.process_pending_exports()

    def end_batch(self, bp_step: int) -> None:
        """Serves the queued requests with this update's weights, and publishes every
        ``publish_interval`` updates."""
        self._bp_step = bp_step
        self.process_pending_exports()
        if self.publish_interval and bp_step % self.publish_interval == 0:
            self.publish()

    def end_cycle(self, bp_step: int) -> None:
        """The periodic export."""
        self._bp_step = bp_step
        self.export()

    def end_training(self) -> None:
        """Serves the last requests; later ones run on their own threads."""
        with self._state_lock:
            self._closed = True
        self.process_pending_exports()
        self._training_thread = None
        if self.publish_interval and self._bp_step and self.published_step != self._bp_step:
            try:  # the final weights, for collectors that go on
                self.publish()
            except Exception as error:  # training may be ending because of an error
                log.warning("could not publish the final policy: %s", error)

    def __repr__(self) -> str:
        return f"OnnxExporter(name={self.name!r}, directory={self.storage.directory!r})"


__all__ = [
    "LATEST_POLICY",
    "SUPPORTED_OPSETS",
    "UPSTREAM_PREFIX",
    "OnnxExporter",
    "QueuedExport",
]
