"""A Hypothesis state machine over a real store: writers on two shards that append, hold, let go
and die mid-append, a second writer that must be refused, and damage to committed episodes.
After every step the store must read exactly the model: every committed, undamaged episode,
byte for byte; damaged ones refused by default, skipped when asked, named by verify."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from emote_core.errors import FormatError, StorageError
from emote_core.stores.stored import ColumnSchema
from emote_core.stores.zarr_store import MemoryStore, ShardWriter, create_store, store_columns
from emote_core.stores.zarr_store.verify import verify_store
from emote_core.typing import EpisodeState

SCHEMAS = [
    ColumnSchema("obs", "Column", (2,), np.dtype(np.float32)),
    ColumnSchema("actions", "Column", (1,), np.dtype(np.float32)),
    ColumnSchema("rewards", "Column", (1,), np.dtype(np.float32)),
]
SHARDS = ("a", "b")
LENGTHS = st.lists(st.integers(1, 9), min_size=1, max_size=4)


def episode(identity: int, length: int) -> tuple:
    """Values derive from ``identity`` (carried in every observation's first entry)."""
    steps = np.arange(length + 1, dtype=np.float32)
    data = {
        "obs": np.stack([np.full(length + 1, identity, np.float32), steps], 1),
        "actions": steps[:length, None] * 2,
        "rewards": steps[:length, None] + identity,
    }
    end = EpisodeState.TERMINAL if identity % 2 else EpisodeState.INTERRUPTED
    return identity, data, end


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="emote-machine-"))
        self.url = str(self.directory / "s.zarr")
        create_store(self.url, columns=store_columns(SCHEMAS, episode(0, 1), "rewards"),
                     length_key="rewards")  # fmt: skip
        self.writers: dict[str, ShardWriter] = {}
        self.committed: dict[str, list[tuple[int, int]]] = {s: [] for s in SHARDS}  # (id, len)
        self.damaged: set[int] = set()  # identities
        self.next_identity = 0

    def teardown(self) -> None:
        for writer in self.writers.values():
            writer.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _writer(self, shard: str) -> ShardWriter:
        if shard not in self.writers:
            self.writers[shard] = ShardWriter(self.url, shard=shard)
        return self.writers[shard]

    @rule(
        shard=st.sampled_from(SHARDS), lengths=st.lists(st.integers(1, 9), min_size=1, max_size=4)
    )
    def append(self, shard: str, lengths: list[int]) -> None:
        batch = []
        for length in lengths:
            batch.append(episode(self.next_identity, length))
            self.committed[shard].append((self.next_identity, length))
            self.next_identity += 1
        self._writer(shard).append(batch)

    @rule(
        shard=st.sampled_from(SHARDS), lengths=st.lists(st.integers(1, 9), min_size=1, max_size=3)
    )
    def writer_dies_mid_append(self, shard: str, lengths: list[int]) -> None:
        """Rows written, commit record never: then the process is gone (its lease with it)."""
        writer = self._writer(shard)
        attributes = writer.group.attrs
        original = type(attributes).update

        def dies(self_, update):
            if "commit" in update:
                raise KeyboardInterrupt
            return original(self_, update)

        batch = [episode(self.next_identity + k, n) for k, n in enumerate(lengths)]
        self.next_identity += len(lengths)
        type(attributes).update = dies
        try:
            with pytest.raises(KeyboardInterrupt):
                writer.append(batch)
        finally:
            type(attributes).update = original
        writer.lease.release()  # what the kernel does for a dead process
        del self.writers[shard]

    @precondition(lambda self: bool(self.writers))
    @rule(data=st.data())
    def a_second_writer_is_refused(self, data) -> None:
        shard = data.draw(st.sampled_from(sorted(self.writers)))
        with pytest.raises(StorageError, match="is being written by pid"):
            ShardWriter(self.url, shard=shard)

    @precondition(lambda self: bool(self.writers))
    @rule(data=st.data())
    def writer_lets_go(self, data) -> None:
        self.writers.pop(data.draw(st.sampled_from(sorted(self.writers)))).close()

    @precondition(lambda self: any(self.committed.values()))
    @rule(data=st.data())
    def damage_a_committed_episode(self, data) -> None:
        import zarr

        shard = data.draw(st.sampled_from([s for s in SHARDS if self.committed[s]]))
        index = data.draw(st.integers(0, len(self.committed[shard]) - 1))
        identity = self.committed[shard][index][0]
        row = int(sum(length + 1 for _, length in self.committed[shard][:index]))
        column = zarr.open_array(str(Path(self.url) / "shards" / shard / "columns" / "obs"))
        column[row + 1, 1] = -1.0  # one value of one observation
        self.damaged.add(identity)

    @invariant()
    def the_store_reads_exactly_the_model(self) -> None:
        store = MemoryStore(self.url)
        expected = {i: n for rows in self.committed.values() for i, n in rows}
        intact = {i for i in expected if i not in self.damaged}
        read = list(store.episodes(skip_damaged=True))
        got = {int(data["obs"][0, 0]) for _, data, _ in read}
        assert got == intact
        for _, data, end in read:
            identity = int(data["obs"][0, 0])
            want = episode(identity, expected[identity])
            assert end == want[2]
            for key in ("obs", "actions", "rewards"):
                np.testing.assert_array_equal(data[key], want[1][key])
        ids = [identity for identity, _, _ in read]
        assert len(set(ids)) == len(ids)
        if self.damaged:
            with pytest.raises(FormatError, match="damaged episodes"):
                list(store.episodes())
        report = verify_store(self.url)
        assert report.ok == (not self.damaged)
        assert len(report.damaged_episodes) == len(self.damaged)


TestStoreMachine = StoreMachine.TestCase
TestStoreMachine.settings = settings(max_examples=12, stateful_step_count=12, deadline=None)
