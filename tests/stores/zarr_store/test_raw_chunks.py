"""Columns stored raw where Blosc does not pay: the writer's choice, plain zarr reading it, the
bulk loader's straight-from-file reads giving the same table as the episode-by-episode path,
damage in a raw chunk still reported, and stores of the old policy (Blosc everywhere) as before."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from emote_core.errors import FormatError
from emote_core.integrations.convert import convert
from emote_core.memory.table import ArrayMemoryTable
from emote_core.stores.follow import StoreFollower
from emote_core.stores.stored import ColumnSchema
from emote_core.stores.zarr_store import (
    MemoryStore,
    ShardWriter,
    create_store,
    raw_chunks,
    store_columns,
    tables,
    writer,
)
from emote_core.stores.zarr_store.verify import verify_store
from emote_core.typing import EpisodeState
from tests.stores.zarr_store.test_bulk import assert_same_tables, load_both
from tests.stores.zarr_store.test_bulk import table as bulk_table

OBS = 8
SCHEMAS = [
    ColumnSchema("obs", "Column", (OBS,), np.dtype(np.float32)),  # random: goes raw
    ColumnSchema("actions", "Column", (2,), np.dtype(np.float32)),  # a slow ramp: keeps Blosc
    ColumnSchema("rewards", "Column", (1,), np.dtype(np.float32)),  # too few bytes: keeps Blosc
]


def episode(identity: int, length: int | None = None) -> tuple:
    """Episode ``identity``: random observations, smooth actions, rewards that name it."""
    rng = np.random.default_rng(identity)
    length = length if length is not None else 300 + identity * 37 % 200
    steps = np.arange(length, dtype=np.float32)
    obs = rng.standard_normal((length + 1, OBS), dtype=np.float32)
    actions = np.stack([steps, np.full(length, identity, np.float32)], 1)
    rewards = np.full((length, 1), identity, np.float32)
    end = EpisodeState.TERMINAL if identity % 3 else EpisodeState.INTERRUPTED
    return identity, {"obs": obs, "actions": actions, "rewards": rewards}, end


def write(url: str, batches: dict[str, list[range]]) -> None:
    """Commits each range of episode ids as one append, shard by shard in turn."""
    create_store(url, columns=store_columns(SCHEMAS, episode(0), "rewards"), length_key="rewards")
    writers = {name: ShardWriter(url, shard=name) for name in batches}
    for turn in range(max(len(ranges) for ranges in batches.values())):
        for name, ranges in batches.items():
            if turn < len(ranges):
                writers[name].append([episode(i) for i in ranges[turn]])
    for shard in writers.values():
        shard.close()


def table(maxlen: int = 200_000) -> ArrayMemoryTable:
    return bulk_table(maxlen, obs=OBS, seed=5)


def codecs(url: str, shard: str = "main") -> dict[str, list[str]]:
    import zarr

    group = zarr.open_group(url, mode="r")[f"shards/{shard}/columns"]
    return {
        name: [codec["name"] for codec in group[name].metadata.to_dict()["codecs"]]
        for name in ("obs", "actions", "rewards")
    }


def assert_episodes(records, identities) -> None:
    records = list(records)
    assert [r[0] for r in records] == list(identities)
    for identity, data, end in records:
        expected = episode(identity, len(data["rewards"]))
        assert end == expected[2]
        for name in ("obs", "actions", "rewards"):
            np.testing.assert_array_equal(data[name], expected[1][name])


def test_random_columns_go_raw_and_compressible_or_small_ones_keep_blosc(tmp_path):
    url = str(tmp_path / "s.zarr")
    write(url, {"main": [range(0, 40), range(40, 45)]})
    assert codecs(url) == {
        "obs": ["bytes"],
        "actions": ["bytes", "blosc"],
        "rewards": ["bytes", "blosc"],  # 40 episodes of rewards are under 64 KB
    }
    again = str(tmp_path / "again.zarr")
    write(again, {"main": [range(0, 40)]})
    assert codecs(again) == codecs(url)  # the same first batch, the same choice


def test_a_first_batch_under_the_trial_size_keeps_blosc_for_good(tmp_path):
    url = str(tmp_path / "s.zarr")
    write(url, {"main": [range(0, 2), range(2, 60)]})  # 2 episodes: < 64 KB of observations
    assert codecs(url)["obs"] == ["bytes", "blosc"]
    assert_episodes(MemoryStore(url).episodes(), range(60))


def test_the_choice_follows_the_measured_ratio():
    rng = np.random.default_rng(0)
    noise = rng.standard_normal((4096, OBS), dtype=np.float32)
    walk = np.cumsum(rng.standard_normal((4096, OBS), dtype=np.float32) * 0.01, axis=0)
    pixels = np.zeros((64, 84, 84, 3), np.uint8)
    pixels[:, 20:40, 10:60] = rng.integers(0, 255, (64, 20, 50, 3), dtype=np.uint8)
    assert raw_chunks.compressed_ratio(noise) > raw_chunks.RAW_RATIO
    assert raw_chunks.stores_raw(noise, 1 << 15)
    assert not raw_chunks.stores_raw(walk, 1 << 15)
    assert not raw_chunks.stores_raw(pixels, 1 << 15)
    assert not raw_chunks.stores_raw(noise[:100], 1 << 15)  # too few bytes to judge


def test_a_store_mixing_raw_and_blosc_loads_in_bulk_as_episode_by_episode(tmp_path, monkeypatch):
    url = str(tmp_path / "s.zarr")
    write(url, {"a": [range(0, 30), range(60, 64)], "b": [range(30, 60), range(70, 71)]})
    assert codecs(url, "a")["obs"] == ["bytes"] and codecs(url, "b")["obs"] == ["bytes"]
    assert codecs(url, "a")["actions"] == ["bytes", "blosc"]
    group = MemoryStore(url).shards[0].group
    assert raw_chunks.raw_files(group["columns/obs"]) is not None  # read straight from files
    assert raw_chunks.raw_files(group["columns/actions"]) is None  # through zarr
    fast, slow, taken = load_both(monkeypatch, table, [url])
    assert taken == [65]
    assert_same_tables(fast, slow)  # 65 episodes: also past the index's first 64 slots
    assert_episodes(fast.episodes(), [*range(0, 30), *range(60, 64), *range(30, 60), 70])
    small, small_slow, _ = load_both(monkeypatch, lambda: table(maxlen=5_000), [url])
    assert_same_tables(small, small_slow)  # the newest that fit: runs that start mid-shard


def test_raw_and_blosc_stores_load_together_with_either_pipeline(tmp_path, monkeypatch):
    raw, old = str(tmp_path / "raw.zarr"), str(tmp_path / "old.zarr")
    write(raw, {"main": [range(0, 30)]})
    monkeypatch.setattr(writer, "stores_raw", lambda *a: False)  # the old policy: Blosc
    write(old, {"main": [range(30, 50)]})
    monkeypatch.undo()
    assert codecs(old)["obs"] == ["bytes", "blosc"] and codecs(raw)["obs"] == ["bytes"]
    for switch in ("0", "1"):
        monkeypatch.setenv("EMOTE_ZARRS", switch)
        fast, slow, taken = load_both(monkeypatch, table, [old, raw])
        assert taken == [50]
        assert_same_tables(fast, slow)
        assert_episodes(fast.episodes(), [*range(30, 50), *range(30)])  # old store first


def test_an_all_zero_chunk_zarr_leaves_unwritten_reads_as_zeros(tmp_path, monkeypatch):
    url = str(tmp_path / "s.zarr")
    write(url, {"main": [range(0, 30)]})
    zeros = episode(99, length=100_000)
    zeros[1]["obs"][:] = 0.0  # several whole chunks of zeros: zarr writes no file for them
    with ShardWriter(url) as shard:
        shard.append([zeros])
    assert codecs(url)["obs"] == ["bytes"]
    import zarr

    array = zarr.open_group(url, mode="r")["shards/main/columns/obs"]
    files = [p for p in (Path(url) / "shards/main/columns/obs/c").rglob("*") if p.is_file()]
    assert len(files) < -(-array.shape[0] // array.chunks[0])  # chunks left unwritten
    fast, slow, taken = load_both(monkeypatch, lambda: table(maxlen=400_000), [url])
    assert taken == [31]
    assert_same_tables(fast, slow)
    assert not np.any(list(fast.episodes())[-1][1]["obs"])


def raw_obs_chunk(url: str, shard: str = "main") -> Path:
    column = Path(url) / "shards" / shard / "columns" / "obs"
    return next(p for p in sorted(column.rglob("*")) if p.is_file() and p.name != "zarr.json")


def test_flipped_bytes_in_a_raw_chunk_are_reported_with_shard_and_episodes(tmp_path, monkeypatch):
    url = str(tmp_path / "s.zarr")
    write(url, {"main": [range(0, 30)], "clean": [range(100, 130)]})
    chunk = raw_obs_chunk(url)
    data = bytearray(chunk.read_bytes())
    data[5000] ^= 0x01
    chunk.write_bytes(bytes(data))
    with pytest.raises(FormatError, match=r"shard 'main': 1 damaged episodes") as refused:
        tables.load_table(table(), [url])
    assert "ids [0]" in str(refused.value)
    fast, slow, _ = load_both(monkeypatch, table, [url], skip_damaged=True)
    assert_same_tables(fast, slow)
    assert sorted(i for i, _, _ in fast.episodes()) == [*range(1, 30), *range(100, 130)]
    assert not verify_store(url).ok


def test_a_cut_raw_chunk_is_reported_with_the_chunk_file(tmp_path):
    url = str(tmp_path / "s.zarr")
    write(url, {"main": [range(0, 30)]})
    chunk = raw_obs_chunk(url)
    chunk.write_bytes(chunk.read_bytes()[:1000])
    key = chunk.relative_to(url).as_posix()
    with pytest.raises(FormatError, match=r"shard 'main': \d+ damaged episodes") as refused:
        tables.load_table(table(), [url])
    assert key in str(refused.value)


@pytest.fixture
def no_hang():
    """Ends the test run with every thread's traceback if the test blocks for 60 s (a reader
    waiting on a named pipe, in any thread), rather than leave it hanging."""
    import faulthandler

    faulthandler.dump_traceback_later(60, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.mark.parametrize("hostile", ["fifo", "device"])
def test_a_store_holding_a_named_pipe_or_a_device_is_refused_not_waited_on(
    tmp_path, hostile: str, no_hang
):
    import os

    url = str(tmp_path / "s.zarr")
    write(url, {"main": [range(0, 30)]})
    chunk = raw_obs_chunk(url)
    chunk.unlink()
    if hostile == "fifo":
        os.mkfifo(chunk)  # opening it for reading would wait for a writer forever
        kind = "a named pipe"
    else:
        chunk.symlink_to("/dev/zero")  # reading it would never end
        kind = "a character device"
    key = chunk.as_posix()
    for read in (
        lambda: tables.load_table(table(), [url]),
        lambda: verify_store(url),
        lambda: MemoryStore(url),
        lambda: ShardWriter(url, shard="other"),  # appending: the store is read first
        lambda: tables.StoreAppender(url, table(), shard="other"),  # is it a store? refused
    ):
        with pytest.raises(FormatError, match=f"'{key}' is {kind}") as refused:
            read()
        assert "\n" not in str(refused.value)
    assert chunk.is_symlink() or chunk.is_fifo()  # nothing of the store was replaced


def test_only_emote_s_stores_are_walked_not_other_folders_or_zarr_groups(tmp_path, no_hang):
    import os

    import zarr

    from emote_core.stores.zarr_store.groups import is_store, open_group

    folder = tmp_path / "things"  # a user's folder, with a named pipe of theirs in it
    folder.mkdir()
    os.mkfifo(folder / "pipe")
    assert not is_store(folder)
    with pytest.raises(FormatError, match="no emote memory store"):
        open_group(folder, "r")
    other = tmp_path / "other.zarr"  # a Zarr group that is not an emote store
    zarr.open_group(str(other), mode="w")
    os.mkfifo(other / "pipe")
    assert not is_store(other)
    store = str(tmp_path / "s.zarr")
    write(store, {"main": [range(0, 3)]})
    (Path(store) / "zarr.json").unlink()
    os.mkfifo(Path(store) / "zarr.json")  # the root metadata itself is never opened
    with pytest.raises(FormatError, match=r"zarr\.json' is a named pipe"):
        is_store(store)


def test_the_raw_reader_itself_refuses_a_named_pipe(tmp_path, no_hang):
    import os

    import zarr

    url = str(tmp_path / "s.zarr")
    write(url, {"main": [range(0, 30)]})
    chunk = raw_obs_chunk(url)
    chunk.unlink()
    os.mkfifo(chunk)  # put there after the store was opened, say
    array = zarr.open_group(url, mode="r")["shards/main/columns/obs"]
    reader = raw_chunks.RawColumnReader(array, Path(url) / "shards/main/columns/obs")
    with pytest.raises(FormatError, match="is not a file"):
        reader.open(0, 10)


def test_plain_zarr_with_its_default_pipeline_reads_raw_columns(tmp_path):
    import zarr

    url = str(tmp_path / "s.zarr")
    write(url, {"main": [range(0, 30)]})
    default = "zarr.core.codec_pipeline.BatchedCodecPipeline"
    with zarr.config.set({"codec_pipeline.path": default}):
        shard = zarr.open_group(url, mode="r")["shards/main"]
        obs, offsets = shard["columns/obs"][:], shard["episodes/offset"][:]
        lengths = shard["episodes/length"][:]
    for identity in range(30):
        start = offsets[identity, 1]
        expected = episode(identity)[1]["obs"]
        np.testing.assert_array_equal(obs[start : start + lengths[identity] + 1], expected)


def test_old_policy_stores_verify_follow_and_convert_as_before(tmp_path, monkeypatch):
    monkeypatch.setattr(writer, "stores_raw", lambda *a: False)
    old = str(tmp_path / "old.zarr")
    write(old, {"main": [range(0, 30)]})
    monkeypatch.undo()
    assert set(map(tuple, codecs(old).values())) == {("bytes", "blosc")}
    report = verify_store(old)
    assert report.ok, report.problems
    memory = table()
    follower = StoreFollower(memory, [old])
    follower.fill()
    with ShardWriter(old) as shard:  # appending to it keeps its codecs
        shard.append([episode(i) for i in range(30, 40)])
    assert follower.poll().episodes == 10
    assert_episodes(memory.episodes(), range(40))
    assert codecs(old)["obs"] == ["bytes", "blosc"]
    convert(old, tmp_path / "old.zip", target_format="emote-v1")
    convert(tmp_path / "old.zip", tmp_path / "new.zarr")
    assert codecs(str(tmp_path / "new.zarr"))["obs"] == ["bytes"]  # written by today's policy
    assert_episodes(MemoryStore(tmp_path / "new.zarr").episodes(), range(40))


def test_raw_stores_verify_and_follow(tmp_path):
    url = str(tmp_path / "s.zarr")
    write(url, {"main": [range(0, 30)]})
    memory = table()
    follower = StoreFollower(memory, [url])
    follower.fill()
    with ShardWriter(url) as shard:
        shard.append([episode(i) for i in range(30, 35)])
    assert follower.poll().episodes == 5
    assert_episodes(memory.episodes(), range(35))
    report = verify_store(url)
    assert report.ok, report.problems


def test_only_an_empty_array_changes_its_codecs(tmp_path):
    url = str(tmp_path / "s.zarr")
    write(url, {"main": [range(0, 3)]})
    import zarr

    array = zarr.open_group(url, mode="r+")["shards/main/columns/obs"]
    with pytest.raises(ValueError, match="holds rows"):
        raw_chunks.with_codecs(array, raw=True)


def test_a_column_a_killed_writer_left_empty_is_decided_again_by_the_next_first_batch(tmp_path):
    import zarr

    url = str(tmp_path / "s.zarr")
    create_store(url, columns=store_columns(SCHEMAS, episode(0), "rewards"), length_key="rewards")
    ShardWriter(url).close()  # the arrays exist, empty
    group = zarr.open_group(url, mode="r+")["shards/main/columns"]
    raw_chunks.with_codecs(group["actions"], raw=True)  # as a writer killed after deciding
    raw_chunks.with_codecs(raw_chunks.with_codecs(group["rewards"], raw=True), raw=False)
    with ShardWriter(url) as shard:
        shard.append([episode(i) for i in range(40)])
    assert codecs(url) == {
        "obs": ["bytes"],
        "actions": ["bytes", "blosc"],  # compressible: Blosc again
        "rewards": ["bytes", "blosc"],
    }
    fresh = str(tmp_path / "fresh.zarr")
    write(fresh, {"main": [range(0, 40)]})
    compressed = zarr.open_group(fresh, mode="r")["shards/main/columns/actions"]
    again = zarr.open_group(url, mode="r")["shards/main/columns/actions"]
    assert again.metadata.to_dict()["codecs"] == compressed.metadata.to_dict()["codecs"]
    assert_episodes(MemoryStore(url).episodes(), range(40))


def test_a_failed_codec_rewrite_keeps_writing_what_the_metadata_says(tmp_path, monkeypatch, caplog):
    from emote_core.stores.zarr_store import writer

    def broken(array, *, raw):
        raise AttributeError("zarr moved its internals")

    monkeypatch.setattr(writer, "with_codecs", broken)
    url = str(tmp_path / "s.zarr")
    with caplog.at_level("WARNING"):
        write(url, {"main": [range(0, 40), range(40, 45)]})
    assert "keeps its codecs (AttributeError" in caplog.text
    assert codecs(url)["obs"] == ["bytes", "blosc"]  # as created: the old policy
    assert_episodes(MemoryStore(url).episodes(), range(45))
