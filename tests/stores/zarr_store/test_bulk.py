"""Loading stores in bulk: the same table as adding the episodes one by one, damage still
reported where it is, and stores that plain zarr-python reads whether or not zarrs is there."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from emote_core.errors import FormatError
from emote_core.memory.builders import DictObsMemoryTable
from emote_core.memory.columns import Column, TagColumn, VirtualColumn
from emote_core.memory.mappers import NextElementMapper, SyntheticDones, SyntheticMasks
from emote_core.memory.strategies import FifoEjectionStrategy, UniformSampleStrategy
from emote_core.memory.table import ArrayMemoryTable
from emote_core.spaces import BoxSpace, DictSpace, MDPSpace
from emote_core.stores.zarr_store import (
    ShardWriter,
    acceleration,
    bulk,
    create_store,
    store_columns,
    tables,
)
from emote_core.stores.zarr_store.reader import MemoryStore
from emote_core.typing import EpisodeState


def table(
    maxlen: int = 10_000, tags: bool = False, obs: int = 3, seed: int = 3
) -> ArrayMemoryTable:
    return ArrayMemoryTable(
        columns=[
            Column("obs", (obs,), np.float32),
            Column("actions", (2,), np.float32),
            Column("rewards", (1,), np.float32),
            *([TagColumn("goal", (2,), np.int64)] if tags else []),
            VirtualColumn("next_obs", (obs,), np.float32, "obs", NextElementMapper()),
            VirtualColumn("dones", (1,), np.float32, "rewards", SyntheticDones()),
            VirtualColumn("masks", (1,), np.float32, "rewards", SyntheticMasks()),
        ],
        maxlen=maxlen,
        sampler=UniformSampleStrategy(),
        ejector=FifoEjectionStrategy(),
        length_key="rewards",
        seed=seed,
    )


def write_shards(kit, url: str, shards: dict[str, list[range]]) -> None:
    """Commits, per shard, each range of episode ids as one commit, the shards in turn, so that
    their episodes interleave in time."""
    create_store(
        url, columns=store_columns(kit.schemas, kit.make(1), "rewards"), length_key="rewards"
    )
    writers = {name: ShardWriter(url, shard=name) for name in shards}
    for turn in range(max(len(ranges) for ranges in shards.values())):
        for name, ranges in shards.items():
            if turn < len(ranges):
                writers[name].append([kit.make(i) for i in ranges[turn]])
    for writer in writers.values():
        writer.close()


def bulk_spy(monkeypatch) -> list:
    """What each bulk load answers from now on (its episodes, or ``None`` where it stepped
    aside), in a list that fills as loads run."""
    taken = []
    real = tables.load_in_bulk

    def spy(*args, **kwargs):
        taken.append(real(*args, **kwargs))
        return taken[-1]

    monkeypatch.setattr(tables, "load_in_bulk", spy)
    return taken


def load_both(monkeypatch, make, urls, **options):
    """The table loaded in bulk and the table loaded episode by episode (bulk path off)."""
    real = tables.load_in_bulk
    taken = bulk_spy(monkeypatch)
    fast = make()
    fast_count = tables.load_table(fast, urls, **options)
    monkeypatch.setattr(tables, "load_in_bulk", lambda *a, **k: None)
    slow = make()
    slow_count = tables.load_table(slow, urls, **options)
    monkeypatch.setattr(tables, "load_in_bulk", real)
    assert fast_count == slow_count
    return fast, slow, taken


def assert_same_tables(fast: ArrayMemoryTable, slow: ArrayMemoryTable) -> None:
    assert (fast.size(), fast.episode_count, fast.full()) == (
        slow.size(),
        slow.episode_count,
        slow.full(),
    )
    got, expected = list(fast.episodes()), list(slow.episodes())
    assert [(i, e) for i, _, e in got] == [(i, e) for i, _, e in expected]
    for (_, a, _), (_, b, _) in zip(got, expected, strict=True):
        assert a.keys() == b.keys()
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])
    for count, length in [(7, 1), (5, 3)]:  # the same draws give the same batches
        assert_same_batch(fast.sample(count, length), slow.sample(count, length))


def assert_same_batch(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in b:
        if isinstance(b[name], dict):
            assert_same_batch(a[name], b[name])
        else:
            np.testing.assert_array_equal(np.asarray(a[name]), np.asarray(b[name]))


def test_several_shards_with_ragged_episodes_load_as_one_by_one(kit, tmp_path, monkeypatch):
    url = str(tmp_path / "s.zarr")
    write_shards(kit, url, {"a": [range(0, 7), range(20, 23)], "b": [range(7, 9), range(30, 41)]})
    fast, slow, taken = load_both(monkeypatch, table, [url])
    assert taken == [23]  # the bulk path loaded them
    added = kit.make(99)
    fast.add_sequence(10**6, added[1], end_state=added[2])  # the filled table takes more
    slow.add_sequence(10**6, added[1], end_state=added[2])
    lengths = {len(data["rewards"]) for _, data, _ in fast.episodes()}
    assert len(lengths) > 5  # ragged
    for record in fast.episodes():
        kit.check(record)
    assert_same_tables(fast, slow)


def test_a_table_smaller_than_the_stores_keeps_the_newest_and_renumbers_repeated_ids(
    kit, tmp_path, monkeypatch
):
    urls = [str(tmp_path / "one.zarr"), str(tmp_path / "two.zarr")]
    write_shards(kit, urls[0], {"main": [range(0, 12)]})
    write_shards(kit, urls[1], {"main": [range(0, 9)], "side": [range(9, 15)]})
    make = lambda: table(maxlen=150)  # noqa: E731 - fewer transitions than both stores hold
    fast, slow, taken = load_both(monkeypatch, make, urls)
    assert taken[0] and taken[0] < 27
    assert_same_tables(fast, slow)
    assert sorted(i for i, _, _ in fast.episodes()) == list(range(taken[0]))  # renumbered


def test_tag_columns_and_limits_load_as_one_by_one(tmp_path, monkeypatch):
    rng = np.random.default_rng(1)
    source = table(tags=True)
    for identity in range(9):
        length = 1 + identity * 5 % 7
        source.add_sequence(
            identity,
            {
                "obs": rng.normal(size=(length + 1, 3)).astype(np.float32),
                "actions": rng.normal(size=(length, 2)).astype(np.float32),
                "rewards": rng.normal(size=(length, 1)).astype(np.float32),
                "goal": np.array([identity, -identity]),
            },
            end_state=EpisodeState.TERMINAL if identity % 2 else EpisodeState.INTERRUPTED,
        )
    url = str(tmp_path / "tags.zarr")
    tables.save_table(source, url)
    fast, slow, taken = load_both(
        monkeypatch, lambda: table(tags=True), [url], limits=[{"main": 6}]
    )
    assert taken == [6]
    assert_same_tables(fast, slow)
    assert [int(d["goal"][0]) for _, d, _ in fast.episodes()] == list(range(6))


def pixel_spaces() -> MDPSpace:
    return MDPSpace(
        rewards=BoxSpace(np.float32, (1,)),
        actions=BoxSpace(np.float32, (2,)),
        state=DictSpace({"obs": BoxSpace(np.uint8, (12, 10, 3 * 4), 0, 255, frames=4)}),
    )


def test_frame_stacked_uint8_pixels_load_as_one_by_one(tmp_path, monkeypatch):
    rng = np.random.default_rng(2)
    source = DictObsMemoryTable(spaces=pixel_spaces(), maxlen=5_000, seed=0)
    for identity in range(6):
        length = 3 + 4 * identity
        frames = rng.integers(0, 256, (length + 1, 12, 10, 3), dtype=np.uint8)
        stacks = np.stack(
            [np.concatenate([frames[max(p - j, 0)] for j in (3, 2, 1, 0)], -1) for p in
             range(length + 1)]
        )  # fmt: skip
        source.add_sequence(
            identity,
            {
                "obs": stacks,
                "actions": rng.normal(size=(length, 2)).astype(np.float32),
                "rewards": rng.normal(size=(length, 1)).astype(np.float32),
            },
            end_state=EpisodeState.TERMINAL,
        )
    url = str(tmp_path / "pixels.zarr")
    tables.save_table(source, url, spaces=pixel_spaces().to_json())
    make = lambda: DictObsMemoryTable(spaces=pixel_spaces(), maxlen=5_000, seed=0)  # noqa: E731
    fast, slow, taken = load_both(monkeypatch, make, [url])
    assert taken == [6]
    assert_same_tables(fast, slow)
    batch = fast.sample(4, 2)
    assert batch["observation"]["obs"].dtype == torch_uint8()


def torch_uint8():
    import torch

    return torch.uint8


def garble_first_obs_chunk(url: str, shard: str = "main") -> str:
    column = Path(url) / "shards" / shard / "columns" / "obs"
    chunk = next(p for p in sorted(column.rglob("*")) if p.is_file() and p.name != "zarr.json")
    data = bytearray(chunk.read_bytes())
    for k in range(len(data) // 2, len(data) // 2 + 64):
        data[k] ^= 0xFF
    chunk.write_bytes(bytes(data))
    return chunk.relative_to(url).as_posix()


def test_a_damaged_chunk_is_still_reported_with_where_it_is(kit, tmp_path, monkeypatch):
    url = str(tmp_path / "s.zarr")
    write_shards(kit, url, {"main": [range(0, 30)], "clean": [range(100, 104)]})
    key = garble_first_obs_chunk(url)
    with pytest.raises(FormatError, match=r"shard 'main': \d+ damaged episodes") as refused:
        tables.load_table(table(), [url])
    assert key in str(refused.value)  # the chunk file that could not be read
    assert "`skip_damaged=True`" in str(refused.value)
    fast, slow, _ = load_both(monkeypatch, table, [url], skip_damaged=True)
    assert_same_tables(fast, slow)
    assert {i for i, _, _ in fast.episodes()} >= set(range(100, 104))


def test_a_table_holding_episodes_loads_episode_by_episode_and_still_gets_the_store(kit, tmp_path):
    url = str(tmp_path / "s.zarr")
    write_shards(kit, url, {"main": [range(0, 5)]})
    target = table()
    target.add_sequence(77, dict(kit.make(77)[1]))
    assert tables.load_table(target, [url]) == 5
    assert [i for i, _, _ in target.episodes()] == list(range(5))


def test_without_zarrs_stores_load_the_same_and_nothing_is_said(kit, tmp_path, monkeypatch, caplog):
    url = str(tmp_path / "s.zarr")
    write_shards(kit, url, {"a": [range(0, 6)], "b": [range(6, 11)]})
    real = acceleration.importlib.util.find_spec
    monkeypatch.setattr(
        acceleration.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "zarrs" else real(name, *a),
    )
    assert not acceleration.zarrs_enabled()
    with caplog.at_level(logging.INFO):
        loaded = table()
        assert tables.load_table(loaded, [url]) == 11
    assert not [r for r in caplog.records if r.levelno >= logging.INFO]
    array = acceleration.open_array(MemoryStore(url).shards[0].group, "columns/obs")
    assert type(array._async_array.codec_pipeline).__name__ == "BatchedCodecPipeline"
    for record in loaded.episodes():
        kit.check(record)


def test_switched_off_zarrs_reads_with_the_default_pipeline(kit, tmp_path, monkeypatch):
    url = str(tmp_path / "s.zarr")
    write_shards(kit, url, {"main": [range(0, 4)]})
    monkeypatch.setenv(acceleration.ZARRS_SWITCH, "0")
    group = MemoryStore(url).shards[0].group
    assert not acceleration.reads_with_zarrs(group)
    array = acceleration.open_array(group, "columns/obs")
    assert type(array._async_array.codec_pipeline).__name__ == "BatchedCodecPipeline"


def test_with_zarrs_installed_local_stores_read_through_it(kit, tmp_path, monkeypatch):
    pytest.importorskip("zarrs", reason="zarrs (a dependency of emote) is not installed")
    url = str(tmp_path / "s.zarr")
    write_shards(kit, url, {"main": [range(0, 8)]})
    array = acceleration.open_array(MemoryStore(url).shards[0].group, "columns/obs")
    assert type(array._async_array.codec_pipeline).__name__ == "ZarrsCodecPipeline"
    fast, slow, taken = load_both(monkeypatch, table, [url])
    assert taken == [8]
    assert_same_tables(fast, slow)


def test_plain_zarr_with_its_default_pipeline_reads_what_emote_wrote(kit, tmp_path):
    import zarr

    url = str(tmp_path / "s.zarr")
    write_shards(kit, url, {"main": [range(0, 6)]})
    default = "zarr.core.codec_pipeline.BatchedCodecPipeline"
    with zarr.config.set({"codec_pipeline.path": default}):
        shard = zarr.open_group(url, mode="r")["shards/main"]
        obs, offsets = shard["columns/obs"][:], shard["episodes/offset"][:]
        lengths = shard["episodes/length"][:]
        assert type(shard["columns/obs"]._async_array.codec_pipeline).__name__ == (
            "BatchedCodecPipeline"
        )
    for identity in range(6):
        start = offsets[identity, 1]
        expected = kit.make(identity)[1]["obs"]
        np.testing.assert_array_equal(obs[start : start + lengths[identity] + 1], expected)


def test_the_crc32_in_use_is_zlibs() -> None:
    import zlib

    data = np.random.default_rng(0).integers(0, 256, 100_003, dtype=np.uint8)
    assert acceleration.crc32(data) == zlib.crc32(data)
    assert acceleration.crc32(data[777:], acceleration.crc32(data[:777])) == zlib.crc32(data)


def test_bulk_steps_aside_for_a_table_that_holds_episodes(kit, tmp_path):
    url = str(tmp_path / "s.zarr")
    write_shards(kit, url, {"main": [range(0, 3)]})
    target = table()
    target.add_sequence(5, dict(kit.make(5)[1]))
    assert bulk.load_in_bulk(target, [MemoryStore(url)], [None], skip_damaged=False) is None
    assert target.episode_count == 1


def test_a_zarrs_that_fails_to_read_costs_speed_never_data(kit, tmp_path, monkeypatch, caplog):
    zarrs = pytest.importorskip("zarrs", reason="zarrs (a dependency of emote) is not installed")
    from emote_core.stores.zarr_store.verify import verify_store

    url = str(tmp_path / "s.zarr")
    write_shards(kit, url, {"main": [range(0, 9)]})

    async def broken(*args, **kwargs):
        raise RuntimeError("a zarrs that does not fit this zarr")

    monkeypatch.setattr(zarrs.ZarrsCodecPipeline, "read", broken)
    loaded = table()
    with caplog.at_level(logging.WARNING):
        assert tables.load_table(loaded, [url]) == 9
        assert verify_store(url).ok
    assert not caplog.records
    for record in loaded.episodes():
        kit.check(record)
