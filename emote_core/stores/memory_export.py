"""Run memory on disk: a proxy wrapper that appends live episodes to a store (read back by
:class:`~emote_core.integrations.upstream.importer.MemoryImporterCallback`)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from emote_core.errors import ConfigurationError
from emote_core.memory.proxy import REWARDS_COLUMN, MemoryProxy
from emote_core.memory.wrappers import MemoryTableProxyWrapper, agent_steps
from emote_core.stores.zarr_store.layout import DEFAULT_SHARD
from emote_core.typing import AgentId, DictObservation, DictResponse, EpisodeState
from emote_core.utils import BlockTimers

if TYPE_CHECKING:
    from emote_core.stores.provenance import Provenance
    from emote_core.stores.zarr_store.tables import StoreAppender

log = logging.getLogger(__name__)


def export_path(directory: str | os.PathLike[str], target_memory_name: str) -> Path:
    """Where :class:`MemoryExporterProxyWrapper` writes a memory."""
    return Path(directory) / f"{target_memory_name}_export"


class MemoryExporterProxyWrapper(MemoryTableProxyWrapper):
    """Appends completed episodes to the store ``<root>/<name>_export`` now and then.

    Every ``inf_steps_per_memory_export`` agent steps, and at most once per
    ``min_time_per_export`` seconds, the episodes completed since the last export are appended
    and committed, on the thread that calls :meth:`add`. An existing store is appended to.

    Args:
        inner: The wrapped proxy.
        target_memory_name: The memory's name; the export is ``<name>_export``.
        inf_steps_per_memory_export: Agent steps between exports.
        experiment_root_path: The directory of the export (created when missing).
        min_time_per_export: The fewest seconds between two exports.
        clock: The time source, in seconds (for tests).
        shard: The store shard this run writes (a resumed run writes a shard of its own).
        spaces: The MDP spaces to record in a store created now (``MDPSpace.to_json()``).
        provenance: Who writes (the run), recorded in the store with the first export.
        store: The store to write instead of ``<root>/<name>_export``.

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
        shard: str = DEFAULT_SHARD,
        spaces: dict[str, Any] | None = None,
        provenance: Provenance | None = None,
        store: str | os.PathLike[str] | None = None,
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
        self._target_memory_name = target_memory_name
        self.inf_steps_per_memory_export = inf_steps_per_memory_export
        self.min_time_per_export = float(min_time_per_export)
        self._export_path = (
            export_path(experiment_root_path, target_memory_name) if store is None else Path(store)
        )
        self._shard = shard
        self._lock = threading.Lock()  # the collector's thread and checkpoints both export
        self._clock = clock
        self._spaces = spaces
        self._provenance = provenance
        self._steps_since_export = 0
        self._last_export_time: float | None = None
        self.export_count = 0
        """Exports written so far."""
        self._exported_episodes = 0
        listeners = getattr(self.unwrapped, "episode_listeners", None)
        if listeners is None:
            raise ConfigurationError(
                "MemoryExporterProxyWrapper needs a MemoryTableProxy at the bottom of the wrapper "
                f"stack (it listens for completed episodes); got {type(self.unwrapped).__name__}"
            )
        listeners.append(self._completed)
        self._pending: list[tuple[int, dict[str, Any], EpisodeState]] = []
        self._appender: StoreAppender | None = None

    @property
    def target_memory_name(self) -> str:
        """The name the export is made under."""
        return self._target_memory_name

    @property
    def export_path(self) -> Path:
        """The store episodes are appended to."""
        return self._export_path

    @property
    def shard(self) -> str:
        """The store's shard this wrapper appends to."""
        return self._shard

    @property
    def exported_episodes(self) -> int:
        """Episodes appended to the store by this wrapper so far."""
        return self._exported_episodes

    def _completed(self, identity: int, sequence: dict[str, Any], end_state: EpisodeState) -> None:
        with self._lock:
            self._pending.append((identity, sequence, end_state))

    def add(
        self,
        observations: Mapping[AgentId, DictObservation],
        responses: Mapping[AgentId, DictResponse],
    ) -> None:
        """Passes the step on, then exports the table when an export is due."""
        self._inner.add(observations, responses)
        self._count_steps(agent_steps(observations))

    def add_episode(self, sequence: Mapping[str, Any], end_state: EpisodeState) -> None:
        """Passes a whole episode on, then exports when one is due (its actions count as its
        agent steps)."""
        self._inner.add_episode(sequence, end_state)  # type: ignore[attr-defined]
        self._count_steps(len(sequence[REWARDS_COLUMN]))

    def _count_steps(self, steps: int) -> None:
        self._steps_since_export += steps
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
                appended = self._append_pending()
        else:
            appended = self._append_pending()
        self._steps_since_export = 0
        self.export_count += 1
        self._exported_episodes += appended
        log.debug(  # every checkpoint exports: the run's total is told once, when it ends
            "exported %d episodes of memory '%s' to %s in %.2f s",
            appended,
            self.target_memory_name,
            self.export_path,
            time.perf_counter() - started,
        )
        return self.export_path

    def committed(self) -> int:
        """Exports what is pending now and returns the episodes committed to this run's shard."""
        self.export()
        with self._lock:
            return self._appender.writer.episodes if self._appender is not None else 0

    def close(self) -> None:
        """Lets go of the export store's shard (its lease); a later export takes it again."""
        with self._lock:
            if self._appender is not None:
                self._appender.close()
                self._appender = None

    def _append_pending(self) -> int:
        from emote_core.stores.zarr_store.tables import StoreAppender

        with self._lock:
            if self._appender is None:
                self._appender = StoreAppender(
                    self.export_path, self.table, spaces=self._spaces,
                    provenance=self._provenance, shard=self.shard,
                )  # fmt: skip
            pending, self._pending = self._pending, []
            self._appender.append(pending)
            return len(pending)


__all__ = ["MemoryExporterProxyWrapper", "export_path"]
