"""Wrappers around a memory proxy: forwarding to the wrapped proxy, and periodic table exports.

A wrapper is itself a proxy: it takes the same ``add(observations, responses)`` calls, does its
own work and passes them on. Attributes, methods and properties it does not define are looked up
on the wrapped proxy, so a stack of wrappers behaves like the proxy at its bottom
(``wrapper.table``, ``wrapper.timers``, ``wrapper.size()``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from emote_core.errors import ConfigurationError
from emote_core.memory.callbacks import export_path
from emote_core.memory.proxy import MemoryProxy
from emote_core.typing import AgentId, DictObservation, DictResponse, EpisodeState
from emote_core.utils import BlockTimers

if TYPE_CHECKING:
    from emote_core.memory.formats.zarr_store.tables import StoreAppender
    from emote_core.memory.table import ArrayMemoryTable

log = logging.getLogger(__name__)

_RUNNING = EpisodeState.RUNNING
_INITIAL = EpisodeState.INITIAL
_FINAL = (EpisodeState.TERMINAL, EpisodeState.INTERRUPTED)


def agent_steps(observations: Mapping[AgentId, DictObservation]) -> int:
    """Observations that got an action (INITIAL and RUNNING ones): one inference each."""
    return sum(1 for o in observations.values() if o.episode_state in (_RUNNING, _INITIAL))


class MemoryProxyWrapper:
    """Base of proxy wrappers: passes ``add`` on and forwards every unknown attribute.

    Args:
        inner: The wrapped proxy (a :class:`~emote_core.memory.proxy.MemoryTableProxy` or another
            wrapper).
    """

    def __init__(self, inner: MemoryProxy) -> None:
        self._inner = inner

    @property
    def inner(self) -> MemoryProxy:
        """The wrapped proxy."""
        return self._inner

    @property
    def unwrapped(self) -> MemoryProxy:
        """The proxy at the bottom of the stack of wrappers."""
        proxy: Any = self._inner
        while isinstance(proxy, MemoryProxyWrapper):
            proxy = proxy.inner
        return proxy

    def add(
        self,
        observations: Mapping[AgentId, DictObservation],
        responses: Mapping[AgentId, DictResponse],
    ) -> None:
        """Passes one step of every agent on to the wrapped proxy."""
        self._inner.add(observations, responses)

    def is_initial(self, identity: AgentId) -> bool:
        """Whether agent ``identity`` has no open episode."""
        return self._inner.is_initial(identity)

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails. Dunder names and the wrapped proxy itself are not
        # forwarded: copy/pickle probe dunders before __init__ has run.
        if name.startswith("__") or name == "_inner":
            raise AttributeError(name)
        try:
            inner = self.__dict__["_inner"]
        except KeyError:
            raise AttributeError(name) from None
        return getattr(inner, name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._inner!r})"


class MemoryTableProxyWrapper(MemoryProxyWrapper):
    """A wrapper of a :class:`~emote_core.memory.proxy.MemoryTableProxy` (or of a wrapper of one).

    Adds the table proxy's API, typed, on top of :class:`MemoryProxyWrapper`'s forwarding.
    """

    @property
    def table(self) -> ArrayMemoryTable:
        """The table the proxy adds episodes to."""
        return self._inner.table  # type: ignore[attr-defined]

    @property
    def timers(self) -> BlockTimers:
        """The proxy's block timers."""
        return self._inner.timers  # type: ignore[attr-defined]

    def size(self) -> int:
        """Transitions held by the table."""
        return self._inner.size()  # type: ignore[attr-defined]

    def resize(self, maxlen: int) -> None:
        """Changes the table's ``maxlen``."""
        self._inner.resize(maxlen)  # type: ignore[attr-defined]

    def store(self, path: str | os.PathLike[str], version: Any = None) -> None:
        """Writes the table to ``path``."""
        self._inner.store(path, version)  # type: ignore[attr-defined]


class MemoryExporterProxyWrapper(MemoryTableProxyWrapper):
    """Appends completed episodes to the store ``<root>/<name>_export`` now and then.

    The export is an emote-memory Zarr store that grows incrementally: after every
    ``inf_steps_per_memory_export`` agent steps (observations that got an action), and no sooner
    than ``min_time_per_export`` seconds after the previous export, the episodes completed since
    the last export are appended and committed (never a full rewrite), from the thread that calls
    :meth:`add`. An existing store there is appended to (a resumed run). A later run reads it
    back with :class:`~emote_core.memory.callbacks.MemoryImporterCallback`.

    Args:
        inner: The wrapped proxy.
        target_memory_name: The memory's name; the export is ``<name>_export``.
        inf_steps_per_memory_export: Agent steps between exports.
        experiment_root_path: The directory of the export (created when missing).
        min_time_per_export: The fewest seconds between two exports.
        clock: The time source, in seconds (for tests).

    Raises:
        ConfigurationError: If the step count is not positive or the time is negative.
    """

    def __init__(
        self,
        inner: MemoryProxy,
        *,
        target_memory_name: str,
        inf_steps_per_memory_export: int,
        experiment_root_path: str | os.PathLike[str],
        min_time_per_export: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if (
            isinstance(inf_steps_per_memory_export, bool)
            or not isinstance(inf_steps_per_memory_export, int)
            or inf_steps_per_memory_export < 1
        ):
            raise ConfigurationError(
                f"inf_steps_per_memory_export must be a positive integer; got "
                f"{inf_steps_per_memory_export!r}"
            )
        if min_time_per_export < 0:
            raise ConfigurationError(
                f"min_time_per_export must be >= 0 seconds; got {min_time_per_export!r}"
            )
        super().__init__(inner)
        self.target_memory_name = target_memory_name
        self.inf_steps_per_memory_export = inf_steps_per_memory_export
        self.min_time_per_export = float(min_time_per_export)
        self.export_path = export_path(experiment_root_path, target_memory_name)
        self._clock = clock
        self._steps_since_export = 0
        self._last_export_time: float | None = None
        self.export_count = 0
        """Exports written so far."""
        listeners = getattr(self.unwrapped, "episode_listeners", None)
        if listeners is None:
            raise ConfigurationError(
                "MemoryExporterProxyWrapper needs a MemoryTableProxy at the bottom of the wrapper "
                f"stack (it listens for completed episodes); got {type(self.unwrapped).__name__}"
            )
        listeners.append(self._completed)
        self._pending: list[tuple[int, dict[str, Any], EpisodeState]] = []
        self._appender: StoreAppender | None = None

    def _completed(self, identity: int, sequence: dict[str, Any], end_state: EpisodeState) -> None:
        self._pending.append((identity, sequence, end_state))

    def add(
        self,
        observations: Mapping[AgentId, DictObservation],
        responses: Mapping[AgentId, DictResponse],
    ) -> None:
        """Passes the step on, then exports the table when an export is due."""
        self._inner.add(observations, responses)
        self._steps_since_export += agent_steps(observations)
        if self._steps_since_export < self.inf_steps_per_memory_export:
            return
        now = self._clock()
        last = self._last_export_time
        if last is not None and now - last < self.min_time_per_export:
            return
        self.export()
        self._last_export_time = now

    def export(self) -> Path:
        """Appends the episodes completed since the last export now; restarts the step count.

        Returns:
            The store's path.
        """
        self.export_path.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        timers = getattr(self._inner, "timers", None)
        if isinstance(timers, BlockTimers):
            with timers.scope("export"):
                self._append_pending()
        else:
            self._append_pending()
        self._steps_since_export = 0
        self.export_count += 1
        log.info(
            "exported memory '%s' to %s in %.2f s",
            self.target_memory_name,
            self.export_path,
            time.perf_counter() - started,
        )
        return self.export_path

    def _append_pending(self) -> None:
        from emote_core.memory.formats.zarr_store.tables import StoreAppender

        if self._appender is None:
            self._appender = StoreAppender(self.export_path, self.table)
        pending, self._pending = self._pending, []
        self._appender.append(pending)


__all__ = [
    "MemoryExporterProxyWrapper",
    "MemoryProxyWrapper",
    "MemoryTableProxyWrapper",
    "agent_steps",
]
