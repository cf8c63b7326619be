"""Published policies from the learner to Ray workers that cannot see its run directory.

The driver's :class:`PolicyRelay` watches ``RUN_DIR/exports/latest.onnx``, checks each newly
published file once, and offers its bytes through Ray to every worker (a started one gets the
newest before it steps). A worker writes them into its :class:`PolicyMirror`, a run directory of
its own that its collector follows as it would the learner's.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from emote_core.assembly.published_policy import (
    POLL_INTERVAL_S,
    PublishedFile,
    published_policy_path,
)
from emote_core.errors import ConfigurationError, EmoteError
from emote_core.onnx.publishing import replace_atomically
from emote_core.recipes.schema import Recipe
from emote_core.spaces import MDPSpace

__all__ = ["PolicyMirror", "PolicyRelay", "RelayedPolicy"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RelayedPolicy:
    """A published policy as the driver read it.

    Attributes:
        data: The ONNX file's bytes.
        training_step: The update its weights come from (its metadata).
    """

    data: bytes
    training_step: int


class PolicyRelay:
    """The driver's view of the policy a run publishes: each new file read once and checked.

    Args:
        run_dir: The learner's run directory (on the driver's machine).
        recipe: The collect's recipe: a policy must fit its environment...
        spaces: ...whose spaces these are. A policy that does not fit is refused here, where
            the user sees it, rather than by every worker.
        poll_interval: The most often the file's ``stat`` is looked at, in seconds.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        recipe: Recipe,
        spaces: MDPSpace,
        *,
        poll_interval: float = POLL_INTERVAL_S,
    ) -> None:
        self.path = published_policy_path(run_dir)
        self.recipe = recipe
        self.spaces = spaces
        self.training_steps: list[int] = []
        """The training step of every policy read, in order."""
        self._file = PublishedFile(self.path, self._read, poll_interval=poll_interval)
        self._shared: tuple[Any, int] | None = None  # the newest one's ObjectRef and version

    def first(
        self, *, wait: bool, should_stop: Callable[[], bool] | None = None
    ) -> RelayedPolicy | None:
        """The policy published now, or the first one published (``wait``); ``None`` when
        ``should_stop`` ended the wait (:meth:`PublishedFile.first`).

        Raises:
            ConfigurationError: Without ``wait``, if no policy is published yet.
            EmoteError: If the published file is no loadable emote policy.
        """
        return self._file.first(wait=wait, should_stop=should_stop)

    def poll(self, *, force: bool = False) -> RelayedPolicy | None:
        """A newly published policy, or ``None`` (:meth:`PublishedFile.poll`)."""
        return self._file.poll(force=force)

    def share(self, ray: Any, policy: RelayedPolicy, actors: Sequence[Any]) -> None:
        """Puts ``policy`` in Ray's object store, for the workers started from now on
        (:meth:`newest`), and offers it to the running ``actors`` (an offer to an actor that
        died meanwhile is lost with it)."""
        version = 1 if self._shared is None else self._shared[1] + 1
        self._shared = (ray.put(policy.data), version)
        for actor in actors:
            actor.offer_policy.remote(*self._shared)

    def newest(self) -> dict[str, Any]:
        """The arguments that give a new :class:`~emote_core.scale.workers.CollectorWorker`
        the newest policy shared (none before the first)."""
        if self._shared is None:
            return {}
        return {"policy_data": self._shared[0], "policy_version": self._shared[1]}

    def _read(self, path: Path) -> RelayedPolicy:
        from emote_core.assembly.compatibility import onnx_collect_agent
        from emote_core.onnx.format import MAX_POLICY_BYTES
        from emote_core.utils.files import read_regular_file

        try:  # a pipe or a device in its place is refused, not read
            data = read_regular_file(
                path, limit=MAX_POLICY_BYTES, rule="a run publishes its policy as an .onnx file"
            )
        except OSError as error:  # replaced or removed since its stat was taken
            raise ConfigurationError(f"cannot read '{path}': {error.strerror or error}") from None
        # The bytes read are the bytes checked and relayed, whatever happens to the file since.
        with tempfile.TemporaryDirectory(prefix="emote-policy-check-") as folder:
            copy = Path(folder) / path.name
            copy.write_bytes(data)
            try:
                agent, _ = onnx_collect_agent(copy, self.recipe, self.spaces, seed=None)
            except EmoteError as error:  # named as published, not as the private copy checked
                error.args = tuple(str(arg).replace(str(copy), str(path)) for arg in error.args)
                raise
            step = int(agent.metadata.training_step)
        self.training_steps.append(step)
        log.info("relaying the policy of training step %d from %s to the workers", step, path)
        return RelayedPolicy(data, step)


class PolicyMirror:
    """A worker's own run directory holding the newest policy relayed to it, published there
    as a learner publishes (``exports/latest.onnx`` replaced atomically).

    It lives in the machine's temporary folder (``emote-policy-<pid>-...``) until
    :meth:`close` removes it.
    """

    def __init__(self) -> None:
        self.run_dir = Path(tempfile.mkdtemp(prefix=f"emote-policy-{os.getpid()}-"))
        self.path = published_policy_path(self.run_dir)
        self.path.parent.mkdir()
        self.version = 0
        """The version of the policy published here (0: none yet)."""
        self._lock = threading.Lock()  # offers arrive on the actor's other threads
        self._closed = False

    def publish(self, data: bytes, version: int) -> bool:
        """Publishes ``data`` unless a policy of this ``version`` or a newer one is here
        already (offers may arrive out of order), or the mirror was closed.

        Returns:
            Whether ``data`` was published.
        """
        with self._lock:
            if self._closed or version <= self.version:
                return False
            replace_atomically(self.path, lambda temporary: temporary.write_bytes(data))
            self.version = version
            return True

    def close(self) -> None:
        """Removes the mirror; later offers are ignored."""
        with self._lock:
            self._closed = True
            shutil.rmtree(self.run_dir, ignore_errors=True)
