"""emote-memory Zarr stores: round trips, shards, torn tails, verification and bad input."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emote_core.errors import FormatError, SchemaError
from emote_core.memory.columns import Column, VirtualColumn
from emote_core.memory.mappers import NextElementMapper, SyntheticDones, SyntheticMasks
from emote_core.memory.strategies import FifoEjectionStrategy, UniformSampleStrategy
from emote_core.memory.table import ArrayMemoryTable
from emote_core.stores.zarr_store import (
    MemoryStore,
    ShardWriter,
    create_store,
    store_columns,
)
from emote_core.stores.zarr_store.tables import load_table, save_table
from emote_core.stores.zarr_store.verify import verify_store
from emote_core.typing import EpisodeState


def new_store(kit, url: str | Path) -> str:
    columns = store_columns(kit.schemas, kit.make(1), "rewards")
    create_store(url, columns=columns, length_key="rewards")
    return str(url)


def make_table(maxlen: int = 10_000) -> ArrayMemoryTable:
    return ArrayMemoryTable(
        columns=[
            Column("obs", (3,), np.float32),
            Column("actions", (2,), np.float32),
            Column("rewards", (1,), np.float32),
            VirtualColumn("next_obs", (3,), np.float32, "obs", NextElementMapper()),
            VirtualColumn("dones", (1,), np.float32, "rewards", SyntheticDones()),
            VirtualColumn("masks", (1,), np.float32, "rewards", SyntheticMasks()),
        ],
        maxlen=maxlen,
        sampler=UniformSampleStrategy(),
        ejector=FifoEjectionStrategy(),
        length_key="rewards",
    )


def tree_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def test_appended_batches_read_back_exactly(tmp_path: Path, kit) -> None:
    url = new_store(kit, tmp_path / "s.zarr")
    writer = ShardWriter(url)
    writer.append([kit.make(i) for i in range(10)])
    writer.append([kit.make(i) for i in range(10, 25)])
    store = MemoryStore(url)
    records = list(store.episodes())
    assert [r[0] for r in records] == list(range(25))
    for record in records:
        kit.check(record)
    info = store.info()
    assert info["episodes"] == 25
    assert info["transitions"] == sum(1 + i % 17 for i in range(25))
    assert info["end_states"]["INTERRUPTED"] == sum(1 for i in range(25) if i % 3 == 0)
    assert info["columns"]["obs"] == {"dtype": "float32", "shape": [3], "kind": "Column",
                                      "rows": "observations"}  # fmt: skip
    json.dumps(info)  # the inspect report is JSON as it is


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 30), min_size=1, max_size=12),
    ids=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=12, max_size=12, unique=True),
    interrupted=st.lists(st.booleans(), min_size=12, max_size=12),
)
def test_table_store_table_round_trip_is_exact(lengths, ids, interrupted) -> None:
    import tempfile

    table = make_table()
    rng = np.random.default_rng(0)
    for k, length in enumerate(lengths):
        table.add_sequence(
            ids[k],
            {
                "obs": rng.standard_normal((length + 1, 3)).astype(np.float32),
                "actions": rng.standard_normal((length, 2)).astype(np.float32),
                "rewards": rng.standard_normal((length, 1)).astype(np.float32),
            },
            end_state=EpisodeState.INTERRUPTED if interrupted[k] else EpisodeState.TERMINAL,
        )
    with tempfile.TemporaryDirectory() as directory:
        save_table(table, Path(directory) / "t.zarr")
        restored = make_table()
        load_table(restored, [Path(directory) / "t.zarr"])
        assert verify_store(Path(directory) / "t.zarr").ok
    before, after = list(table.episodes()), list(restored.episodes())
    assert [(i, e) for i, _, e in before] == [(i, e) for i, _, e in after]
    for (_, a, _), (_, b, _) in zip(before, after, strict=True):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])


def test_a_saved_table_keeps_its_virtual_columns_in_the_schema(tmp_path: Path, kit) -> None:
    table = make_table()
    table.add_sequence(1, kit.make(1)[1])
    save_table(table, tmp_path / "t.zarr")
    store = MemoryStore(tmp_path / "t.zarr")
    virtual = {c.name: c for c in store.schemas() if c.kind == "VirtualColumn"}
    assert sorted(virtual) == ["dones", "masks", "next_obs"]
    assert virtual["next_obs"].target_name == "obs"
    assert virtual["masks"].mapper == {"type": "SyntheticMasks"}
    assert store.info()["columns"]["dones"]["rows"] == "virtual"


def test_shards_are_read_as_their_union_and_load_renumbers_repeated_ids(
    tmp_path: Path, kit
) -> None:
    url = new_store(kit, tmp_path / "s.zarr")
    ShardWriter(url, shard="collector-0").append([kit.make(i) for i in range(5)])
    ShardWriter(url, shard="collector-1").append([kit.make(i) for i in range(3)])
    store = MemoryStore(url)
    assert [s.name for s in store.shards] == ["collector-0", "collector-1"]
    assert store.episode_count == 8
    table = make_table()
    assert load_table(table, [url]) == 8
    assert sorted(i for i, _, _ in table.episodes()) == list(range(8))


def test_loading_keeps_the_newest_episodes_that_fit(tmp_path: Path, kit) -> None:
    url = new_store(kit, tmp_path / "s.zarr")
    writer = ShardWriter(url)
    for i in range(6):
        writer.append([kit.make(i, 10)])
    table = make_table(maxlen=35)
    load_table(table, [url])
    assert [i for i, _, _ in table.episodes()] == [3, 4, 5]


def test_memory_urls_work_like_paths(kit) -> None:
    url = new_store(kit, "memory://emote-test-store")
    ShardWriter(url).append([kit.make(i) for i in range(4)])
    assert MemoryStore(url).episode_count == 4
    assert verify_store(url).ok


def test_rows_past_the_commit_are_ignored_and_cut_on_reopen(
    tmp_path: Path, monkeypatch, kit
) -> None:
    url = new_store(kit, tmp_path / "s.zarr")
    writer = ShardWriter(url)
    writer.append([kit.make(i) for i in range(3)])

    attributes = type(writer.group.attrs)
    original = attributes.update

    def killed_before_commit(self, update):  # the writer dies after its rows, before the commit
        if "commit" in update:
            raise KeyboardInterrupt
        return original(self, update)

    monkeypatch.setattr(attributes, "update", killed_before_commit)
    with pytest.raises(KeyboardInterrupt):
        writer.append([kit.make(i) for i in range(3, 9)])
    monkeypatch.undo()
    writer.lease.release()  # what the kernel does for a process that dies
    store = MemoryStore(url)
    assert store.episode_count == 3
    report = verify_store(url)
    assert report.ok and any("torn tail" in note for note in report.notes)
    reopened = ShardWriter(url)  # repairs
    assert not verify_store(url).notes
    reopened.append([kit.make(i) for i in range(3, 5)])
    records = list(MemoryStore(url).episodes())
    assert [r[0] for r in records] == [0, 1, 2, 3, 4]
    for record in records:
        kit.check(record)


def test_verify_names_damaged_episodes_and_never_writes(tmp_path: Path, kit) -> None:
    url = new_store(kit, tmp_path / "s.zarr")
    ShardWriter(url).append([kit.make(i, 50) for i in range(40)])
    assert verify_store(url).ok
    chunk = next(p for p in (tmp_path / "s.zarr").rglob("c/*/*") if "obs" in str(p))
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x5A
    chunk.write_bytes(bytes(data))
    digest = tree_digest(tmp_path / "s.zarr")
    report = verify_store(url)
    assert not report.ok
    assert report.damaged_episodes and all(d["shard"] == "main" for d in report.damaged_episodes)
    assert tree_digest(tmp_path / "s.zarr") == digest


def test_bad_input_is_refused_clearly(tmp_path: Path, kit) -> None:
    with pytest.raises(FormatError, match="no emote memory store"):
        MemoryStore(tmp_path / "missing.zarr")
    url = new_store(kit, tmp_path / "s.zarr")
    with pytest.raises(FormatError):
        new_store(kit, url)  # never overwrites without asking
    writer = ShardWriter(url)
    identity, data, end = kit.make(1)
    data["obs"] = data["obs"][:-1]
    with pytest.raises(SchemaError, match="column 'obs' of episode 1"):
        writer.append([kit.make(0), (identity, data, end)])
    assert MemoryStore(url).episode_count == 0  # nothing of the batch was committed
    with pytest.raises(FormatError, match="shard names"):
        ShardWriter(url, shard="../escape")
    import zarr

    group = zarr.open_group(url, mode="r+")
    group.attrs.update({"format_version": 7})
    with pytest.raises(FormatError, match="format_version 7; this emote reads up to 1"):
        MemoryStore(url)
    group.attrs.update({"format": "something-else"})
    with pytest.raises(FormatError, match="not an emote memory store"):
        MemoryStore(url)
