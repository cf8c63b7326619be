"""The replay memory in a checkpoint, by reference to the stores that hold its episodes.

A checkpoint does not copy the table. It records which committed episodes the table was filled
from: so many episodes of each shard of each ``--memory`` store, and of the run's own export
store the shards this run wrote, committed up to the moment of the checkpoint. Resuming reads
exactly those episodes back (all of them, none twice): episodes that the interrupted run committed
after its checkpoint stay in the store, but the resumed run, which writes a shard of its own, does
not train on them. The table's random generators go into the checkpoint too.

A run that follows its stores (``emote train --follow``) pins what its
:class:`~emote_core.stores.follow.StoreFollower` has read per shard, and records the runs of
episodes the table holds in the order they entered it: resuming rebuilds that table exactly and
follows on from the pins.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from emote_core.callback import Callback, Order
from emote_core.errors import CheckpointError
from emote_core.utils.random_state import capture, restore

if TYPE_CHECKING:
    from emote_core.memory.table import ArrayMemoryTable
    from emote_core.stores.follow import StoreFollower
    from emote_core.stores.memory_export import MemoryExporterProxyWrapper
    from emote_core.stores.zarr_store import MemoryStore

log = logging.getLogger(__name__)


class ReplayMemoryCheckpoint(Callback):
    """Records (``state_dict``) and restores (``load_state_dict``) what a table holds.

    Taking the state first commits the episodes the exporter still holds, so that the store and
    the checkpoint agree on what was collected before it.

    Args:
        table: The replay table.
        sources: The stores the table starts from (``--memory``), read in this order.
        exporter: The run's export of live episodes, when this run collects them.
        export_store: The run's export store (``exporter.export_path``); a run resumed without
            collecting still reads the episodes its earlier parts collected there.
        skip_damaged: Leave damaged episodes out when reading (refused otherwise).
        follower: Reads the sources as they grow (``--follow``): fills the table, and its
            pins are what checkpoints record of them.
        name: The callback's name (keys its checkpoint entry).
    """

    # After the Checkpointer: its final checkpoint commits the last episodes, then the export's
    # shard is let go.
    order: ClassVar[int] = Order.CHECKPOINT + 50

    def __init__(
        self,
        *,
        table: ArrayMemoryTable,
        sources: Sequence[str | os.PathLike[str]] = (),
        exporter: MemoryExporterProxyWrapper | None = None,
        export_store: str | os.PathLike[str] | None = None,
        skip_damaged: bool = False,
        follower: StoreFollower | None = None,
        name: str = "replay_memory",
    ) -> None:
        super().__init__(name=name)
        self.table = table
        self.exporter = exporter
        self.export_store = export_store
        self.skip_damaged = skip_damaged
        self.follower = follower
        self.sources: list[dict[str, Any]] = [
            {"url": os.fspath(url), "shards": None} for url in sources
        ]
        self.exported: dict[str, int] = {}
        """Episodes per shard of the export store that earlier parts of this run committed."""

    def fill(self, opened: Sequence[MemoryStore] | None = None) -> int:
        """Fills the table from the sources, pinning what was read; returns the episodes read.

        Args:
            opened: The sources, already open (read once, not again), in their order.
        """
        from emote_core.stores.zarr_store import MemoryStore

        if self.follower is not None:
            before = self.table.episode_count
            self.follower.fill()
            self._pin_followed()
            return self.table.episode_count - before
        stores = (
            list(opened) if opened is not None else [MemoryStore(s["url"]) for s in self.sources]
        )
        for source, store in zip(self.sources, stores, strict=True):
            source["shards"] = store.committed()
        return self._load(self.sources, {}, stores)

    def _load(
        self,
        sources: list[dict[str, Any]],
        exported: dict[str, int],
        opened: Sequence[MemoryStore] | None = None,
    ) -> int:
        from emote_core.stores.zarr_store.tables import load_table

        urls: list[Any] = list(opened) if opened is not None else [s["url"] for s in sources]
        limits = [dict(source["shards"]) for source in sources]
        if exported and self.export_store is not None:
            urls.append(os.fspath(self.export_store))
            limits.append(dict(exported))
        if not urls:
            return 0
        loaded = load_table(self.table, urls, skip_damaged=self.skip_damaged, limits=limits)
        named = [getattr(url, "url", url) for url in urls]
        log.info("memory: %d episodes (%d transitions) from %s", loaded, self.table.size(), named)
        return loaded

    def _pin_followed(self) -> None:
        if self.follower is not None:
            for source, pins in zip(self.sources, self.follower.read, strict=True):
                source["shards"] = dict(pins)

    def random_generators(self) -> dict[str, Any]:
        """The table's generators (its sampling and ejection), by the table's names."""
        return dict(self.table.random_generators())

    def state_dict(self) -> dict[str, Any]:
        exported = dict(self.exported)
        if self.exporter is not None:
            exported[self.exporter.shard] = self.exporter.committed()
        self._pin_followed()
        followed = {} if self.follower is None else {"follow": self.follower.state()}
        return {
            **followed,
            "sources": [dict(s, shards=dict(s["shards"] or {})) for s in self.sources],
            "exported": {k: v for k, v in exported.items() if v},
            "episodes": self.table.episode_count,
            "transitions": self.table.size(),
            "random_state": capture(self.table.random_generators()),
        }

    def load_state_dict(
        self,
        state_dict: dict[str, Any],
        load_network: bool = True,
        load_optimizer: bool = True,
        load_hparams: bool = True,
    ) -> None:
        """Refills the table with exactly the episodes the checkpoint recorded.

        Raises:
            CheckpointError: If the run's export is gone, or the exporter would write into a
                shard the checkpoint already counts.
            FormatError: If a store holds fewer episodes than recorded, or damaged ones.
        """
        sources = [dict(s) for s in state_dict["sources"]]
        exported = {str(k): int(v) for k, v in state_dict.get("exported", {}).items()}
        if exported and (self.export_store is None or not os.path.exists(self.export_store)):
            raise CheckpointError(
                f"the checkpoint counts {sum(exported.values())} episodes in the run's memory "
                f"export '{self.export_store}', which is missing — the replay memory cannot be "
                "restored"
            )
        if self.exporter is not None and self.exporter.shard in exported:
            raise CheckpointError(
                f"the resumed run would append to shard '{self.exporter.shard}' of "
                f"'{self.exporter.export_path}', which the checkpoint already counts"
            )
        self.sources, self.exported = sources, exported
        if self.follower is not None and "follow" in state_dict:
            self._restore_followed(self.follower, state_dict["follow"], exported)
        else:
            self._load(sources, exported)
        held = state_dict["episodes"]
        if held and not sources and not exported:
            log.warning(
                "the run did not store its episodes (memory.store_episodes = false), so the %d "
                "episodes its memory held cannot come back: the resumed run starts with an empty "
                "memory and collects again",
                held,
            )
        elif (self.table.episode_count, self.table.size()) != (held, state_dict["transitions"]):
            log.warning(
                "the restored memory holds %d episodes (%d transitions); the checkpoint's held %d "
                "(%d)",
                self.table.episode_count,
                self.table.size(),
                state_dict["episodes"],
                state_dict["transitions"],
            )
        restore(self.table.random_generators(), state_dict["random_state"], owner="the memory")

    def _restore_followed(
        self, follower: StoreFollower, state: dict[str, Any], exported: dict[str, int]
    ) -> None:
        """The followed episodes the checkpoint's table held, in their order, then the episodes
        this run collected itself (``--follow --live``: those come after, renumbered)."""
        from emote_core.stores.zarr_store import MemoryStore

        extra: list[Any] = []
        if exported and self.export_store is not None:
            extra = list(
                MemoryStore(self.export_store).episodes(
                    max_transitions=self.table.maxlen, skip_damaged=self.skip_damaged,
                    limits=exported,
                )
            )  # fmt: skip
        follower.restore(state, extra)
        log.info(
            "memory: %d episodes (%d transitions) as the checkpoint held them; following %s on "
            "from %s",
            self.table.episode_count, self.table.size(), follower.urls, follower.read,
        )  # fmt: skip

    def restore_without_state(self) -> None:
        """For a checkpoint from before the memory was recorded in it: the table takes every
        episode of the sources and of the run's export, as resumes did then (not an exact
        continuation)."""
        log.warning(
            "the checkpoint does not record the replay memory (written by an older emote): "
            "loading every episode of %s and of the run's export instead",
            [source["url"] for source in self.sources] or "no stores",
        )
        from emote_core.stores.zarr_store import MemoryStore

        for source in self.sources:
            source["shards"] = MemoryStore(source["url"]).committed()
        if self.export_store is not None and os.path.exists(self.export_store):
            self.exported = MemoryStore(self.export_store).committed()
        self._load(self.sources, self.exported)

    def end_training(self) -> None:
        """Commits the episodes completed since the last export and lets go of the shard."""
        if self.exporter is None:
            return
        try:
            self.exporter.export()
        finally:
            self.exporter.close()  # the store's shard is free for the next run, even in-process
        exporter = self.exporter
        log.log(
            logging.INFO if exporter.exported_episodes else logging.DEBUG,
            "exported %d episodes of memory '%s' to %s",
            exporter.exported_episodes, exporter.target_memory_name, exporter.export_path,
        )  # fmt: skip


__all__ = ["ReplayMemoryCheckpoint"]
