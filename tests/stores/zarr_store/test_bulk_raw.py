"""Loading stores whose columns are all stored raw: read straight from their chunk files to the
table's rows by two threads, the same table as episode by episode; damage in a raw chunk, a chunk
of the wrong size or an episode table found and named where it is; followers reading the new
runs of such stores."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import zarr

from emote_core.errors import FormatError
from emote_core.stores.stored import ColumnSchema
from emote_core.stores.zarr_store import MemoryStore, bulk, raw_chunks, tables
from emote_core.stores.zarr_store.verify import verify_store
from emote_core.typing import EpisodeState
from tests.stores.zarr_store.test_bulk import (
    assert_same_tables,
    bulk_spy,
    load_both,
    write_shards,
)
from tests.stores.zarr_store.test_bulk import table as bulk_table

WIDE = 8
SCHEMAS = [  # random values in every column: each goes raw once its first batch is 64 KB
    ColumnSchema("obs", "Column", (WIDE,), np.dtype(np.float32)),
    ColumnSchema("actions", "Column", (2,), np.dtype(np.float32)),
    ColumnSchema("rewards", "Column", (1,), np.dtype(np.float32)),
]


def episode(identity: int) -> tuple:
    rng = np.random.default_rng(identity)
    length = 200 + identity * 53 % 300
    return (
        identity,
        {
            "obs": rng.standard_normal((length + 1, WIDE), dtype=np.float32),
            "actions": rng.standard_normal((length, 2), dtype=np.float32),
            "rewards": rng.standard_normal((length, 1), dtype=np.float32),
        },
        EpisodeState.TERMINAL if identity % 4 else EpisodeState.INTERRUPTED,
    )


def write(url: str, shards: dict[str, list[range]]) -> None:
    """Each range of ids committed as one append, the shards taking turns."""
    write_shards(SimpleNamespace(schemas=SCHEMAS, make=episode), url, shards)


def shard_group(url: str, shard: str = "main"):
    return zarr.open_group(url, mode="r")[f"shards/{shard}"]


def chunk_file(array, row: int) -> Path:
    """The file of the chunk of a local array that holds ``row``."""
    rows = array.metadata.chunk_grid.chunk_shape[0]
    coords = (row // rows, *([0] * (len(array.shape) - 1)))
    return Path(array.store.root) / array.path / str(array.metadata.encode_chunk_key(coords))


def damage(path: Path, change) -> None:
    data = bytearray(path.read_bytes())
    change(data)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("zarrs", ["1", "0"])
@pytest.mark.parametrize("change", ["longer", "shorter"])
def test_a_raw_chunk_of_the_wrong_size_is_named_even_where_its_rows_read(
    tmp_path, monkeypatch, zarrs, change
):
    # The last obs chunk is read in part (the store ends inside it): zarrs alone would read
    # those rows from a chunk file zarr's own pipeline refuses as damaged.
    monkeypatch.setenv("EMOTE_ZARRS", zarrs)
    url = str(tmp_path / "s.zarr")
    write(url, {"main": [range(0, 30)]})
    obs = shard_group(url)["columns/obs"]
    last = chunk_file(obs, obs.shape[0] - 1)
    size = last.stat().st_size
    rows = obs.metadata.chunk_grid.chunk_shape[0]
    assert obs.shape[0] % rows and size == rows * WIDE * 4  # a whole raw chunk, read in part
    unread = (rows - obs.shape[0] % rows) * WIDE * 4  # bytes past the store's last row
    if change == "longer":
        damage(last, lambda data: data.extend(b"\0" * 64))
    else:
        damage(last, lambda data: data.__delitem__(slice(size - unread // 2, None)))
    taken = bulk_spy(monkeypatch)
    with pytest.raises(FormatError, match=r"shard 'main': \d+ damaged episodes") as refused:
        tables.load_table(bulk_table(200_000, obs=WIDE), [url])
    assert taken == [None]
    assert last.relative_to(url).as_posix() in str(refused.value)
    assert not verify_store(url).ok


@pytest.mark.parametrize(
    "change",
    [
        lambda data: data.__setitem__(slice(20, 40), b"\xff" * 20),  # damaged compressed bytes
        lambda data: data.__setitem__(slice(4, 8), (1 << 31).to_bytes(4, "little")),  # claims 2 GB
        lambda data: data.__delitem__(slice(30, None)),  # cut short
    ],
)
def test_a_damaged_episode_table_is_named_with_its_shard(tmp_path, change):
    url = str(tmp_path / "s.zarr")
    write(url, {"main": [range(0, 30)], "clean": [range(30, 40)]})
    lengths = shard_group(url)["episodes/length"]
    damage(chunk_file(lengths, 0), change)
    found = MemoryStore(url)
    assert "clean" in [s.name for s in found.shards]
    assert "main" in found.damaged_shards
    assert "episodes/length is unreadable" in found.damaged_shards["main"]
    with pytest.raises(FormatError, match="shard 'main'"):
        found.check_readable()
    with pytest.raises(FormatError, match="shard 'main'"):
        tables.load_table(bulk_table(200_000, obs=WIDE), [url])


def test_a_shard_whose_metadata_is_not_json_is_still_reported(tmp_path):
    url = str(tmp_path / "s.zarr")
    write(url, {"main": [range(0, 30)], "clean": [range(30, 40)]})
    metadata = Path(url) / "shards" / "main" / "episodes" / "length" / "zarr.json"
    document = json.loads(metadata.read_text())
    document["codecs"] = "not a codec list"
    metadata.write_text(json.dumps(document))
    store = MemoryStore(url)
    assert "main" in store.damaged_shards and [s.name for s in store.shards] == ["clean"]


def test_a_followers_run_of_new_episodes_reads_what_was_written(tmp_path):
    from emote_core.stores.zarr_store import tail

    url = str(tmp_path / "s.zarr")
    write(url, {"main": [range(0, 20), range(20, 30)]})
    store = MemoryStore(url)
    shard = store.shards[0]
    run = tail.read_episode_run(
        url, shard.group, shard.commit, store.columns, shard="main", start=12, stop=30
    )
    assert [e[0] for e in run.episodes] == list(range(12, 30))
    for identity, data, end in run.episodes:
        _, expected, expected_end = episode(identity)
        assert end == expected_end
        for name in expected:
            np.testing.assert_array_equal(data[name], expected[name])
    np.testing.assert_array_equal(run.written_at, shard.table["written_at"][12:30])


def test_raw_transition_columns_are_read_straight_to_the_tables_rows(tmp_path, monkeypatch):
    url = str(tmp_path / "s.zarr")
    write(url, {"a": [range(0, 200), range(400, 410)], "b": [range(200, 400), range(410, 420)]})
    columns = shard_group(url, "a")["columns"]
    for name in ("obs", "actions", "rewards"):  # all raw: N-row columns too
        assert raw_chunks.raw_files(columns[name]) is not None
    planned = []
    real = raw_chunks.RawColumnReader.plan

    def plan(self, *args, **kwargs):
        planned.append(self._array.path.rsplit("/", 1)[-1])
        return real(self, *args, **kwargs)

    monkeypatch.setattr(raw_chunks.RawColumnReader, "plan", plan)
    for maxlen in (200_000, 30_000):  # everything; the newest that fit (runs from mid-shard)
        planned.clear()
        fast, slow, taken = load_both(monkeypatch, lambda m=maxlen: bulk_table(m, obs=WIDE), [url])
        assert taken[0] is not None
        assert_same_tables(fast, slow)
        assert set(planned) == {"obs", "actions", "rewards"}  # none decoded through zarr


def raw_array(tmp_path: Path, rows: int, chunk_rows: int, width: int = 3):
    """A raw (bytes codec only) local array of ``rows`` numbered rows."""
    values = np.arange(rows * width, dtype=np.float32).reshape(rows, width)
    array = zarr.create_array(
        str(tmp_path / "raw.zarr"),
        shape=values.shape,
        chunks=(chunk_rows, width),
        dtype=np.float32,
        compressors=None,
        fill_value=-7.0,
    )
    array[:] = values
    return array, values


def scattered(values: np.ndarray, sources, counts, destinations, rows: int) -> np.ndarray:
    expected = np.zeros((rows, values.shape[1]), values.dtype)
    for source, count, destination in zip(sources, counts, destinations, strict=True):
        expected[destination : destination + count] = values[source : source + count]
    return expected


@pytest.mark.parametrize("iov_max", [1024, 3])
def test_scattered_segments_land_where_they_are_sent(tmp_path, monkeypatch, iov_max):
    monkeypatch.setattr(raw_chunks, "IOV_MAX", iov_max)
    array, values = raw_array(tmp_path, rows=1000, chunk_rows=64)
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 64, 15)  # some empty, some across chunks (at most 960 rows)
    gaps = rng.integers(0, 3, 15)  # some back to back in the file (merged), some apart
    sources = np.cumsum(counts + gaps) - counts - gaps
    destinations = np.cumsum(counts + 1) - counts - 1  # a row left after each, as the table does
    out = np.zeros((int(destinations[-1] + counts[-1] + 5), 3), np.float32)
    with raw_chunks.RawColumnReader(array, raw_chunks.raw_files(array)) as column:
        column.open(0, 1000)
        column.read_segments(sources, counts, out, destinations)
        expected = scattered(values, sources, counts, destinations, len(out))
        np.testing.assert_array_equal(out, expected)
        parts = np.zeros_like(out)  # the same reads planned in parts, read part by part
        plans = column.plan(sources, counts, destinations, [4, 9, 9, 15])
        for calls in plans:
            column.read_planned(calls, parts)
        np.testing.assert_array_equal(parts, expected)
        assert plans[2] == []  # an empty part plans nothing


def test_a_chunk_without_a_file_reads_as_the_fill_value_and_short_reads_are_finished(
    tmp_path, monkeypatch
):
    array, values = raw_array(tmp_path, rows=256, chunk_rows=64)
    directory = raw_chunks.raw_files(array)
    (directory / str(array.metadata.encode_chunk_key((1, 0)))).unlink()  # rows 64:128
    values[64:128] = -7.0
    real = raw_chunks.os.preadv

    def short(descriptor, buffers, offset):  # at most 100 bytes, into the first buffer only
        return real(descriptor, [buffers[0][:100]], offset)

    monkeypatch.setattr(raw_chunks.os, "preadv", short)
    sources, counts, destinations = np.array([10, 60, 200]), np.array([40, 80, 56]), [0, 41, 122]
    out = np.zeros((178, 3), np.float32)
    with raw_chunks.RawColumnReader(array, directory) as column:
        column.open(0, 256)
        column.read_segments(sources, counts, out, np.array(destinations))
    np.testing.assert_array_equal(out, scattered(values, sources, counts, destinations, 178))


def test_rows_are_handed_out_to_read_ahead_once_each_in_row_order(tmp_path):
    array, _ = raw_array(tmp_path, rows=256, chunk_rows=64)
    directory = raw_chunks.raw_files(array)
    (directory / str(array.metadata.encode_chunk_key((2, 0)))).unlink()  # rows 128:192
    row = 3 * 4  # bytes
    with raw_chunks.RawColumnReader(array, directory) as column:
        column.open(0, 256)
        first = column.to_read_ahead(70, 200)  # chunks 1 (from row 70), 2 (no file), 3 (to 200)
        again = column.to_read_ahead(0, 256)  # chunk 0, and what is left of chunks 1 and 3
        spans = [
            (Path(f"/proc/self/fd/{fd}").resolve().relative_to(directory.resolve()).parts[1],
             offset, size)
            for fd, offset, size in first + again
        ]  # fmt: skip
        assert spans == [
            ("1", 6 * row, 58 * row), ("3", 0, 8 * row),  # the rows asked for
            ("0", 0, 64 * row), ("3", 8 * row, 56 * row),  # chunk 1 was handed out past 128
        ]  # fmt: skip
        assert column.to_read_ahead(0, 256) == []


def test_segments_that_do_not_fit_the_destination_are_refused(tmp_path):
    array, _ = raw_array(tmp_path, rows=256, chunk_rows=64)
    with raw_chunks.RawColumnReader(array, raw_chunks.raw_files(array)) as column:
        column.open(0, 256)
        out = np.zeros((50, 3), np.float32)
        for destinations in ([0, 45], [-3, 10]):  # past the end; before the start
            with pytest.raises(ValueError, match="outside"):
                column.read_segments(np.array([0, 100]), np.array([10, 10]), out, destinations)
        with pytest.raises(ValueError, match="of its rows"):  # rows of another width
            column.read_segments(np.array([0]), np.array([4]), np.zeros((8, 2), np.float32), [0])
        assert not out.any()


@pytest.mark.parametrize("damaged", [None, 0, 57, 119])  # none; the first, a middle, the last
def test_damage_in_any_part_is_found_whichever_thread_checks_it(tmp_path, monkeypatch, damaged):
    # Parts of 16 KB, which the two threads take in turn, each checking what it read.
    monkeypatch.setattr(bulk, "PART_BYTES", 16 << 10)
    url = str(tmp_path / "s.zarr")
    write(url, {"main": [range(0, 60), range(60, 120)]})
    group = shard_group(url)
    actions = group["columns/actions"]
    assert raw_chunks.raw_files(actions) is not None
    if damaged is not None:  # one byte of the episode's last action, in its raw chunk file
        row = int(group["episodes/offset"][damaged, 0] + group["episodes/length"][damaged] - 1)
        rows = actions.metadata.chunk_grid.chunk_shape[0]
        chunk = Path(url) / actions.path / actions.metadata.encode_chunk_key((row // rows, 0))
        data = bytearray(chunk.read_bytes())
        data[(row % rows) * 8 + 3] ^= 0x40
        chunk.write_bytes(bytes(data))
    taken = bulk_spy(monkeypatch)
    if damaged is None:
        assert tables.load_table(bulk_table(200_000, obs=WIDE), [url]) == 120
        assert taken == [120]  # loaded in bulk, every part clean
        return
    with pytest.raises(FormatError, match="damaged episodes") as refused:
        tables.load_table(bulk_table(200_000, obs=WIDE), [url])
    assert taken == [None]  # the bulk loader found it and left the naming to the other path
    assert f"1 damaged episodes (checksum mismatch or unreadable chunks), ids [{damaged}]" in str(
        refused.value
    )


def reads_on_both_threads(monkeypatch, fail_on: str | None = None) -> list[str]:
    """Which thread ("main" or "helper") reads each part from now on; the loading thread waits
    at its first part until the helper has read one, and the helper waits at its second until
    the loading thread holds one (else, on a busy machine, it could take every part before the
    loading thread starts), so both read parts whatever the timing.
    ``fail_on``: that thread's first read fails as a vanished chunk file would."""
    import threading

    monkeypatch.setattr(bulk.os, "cpu_count", lambda: 2)  # two threads on any machine
    seen, helper_read, main_reading = [], threading.Event(), threading.Event()
    real = raw_chunks.RawColumnReader.read_planned

    def read_planned(self, calls, out):
        who = "main" if threading.current_thread() is threading.main_thread() else "helper"
        if who == "main" and "main" not in seen:
            main_reading.set()
            assert helper_read.wait(10), "no part was read on a second thread"
        elif who == "helper" and "helper" in seen:
            assert main_reading.wait(10), "the loading thread read no part"
        seen.append(who)
        try:
            if who == fail_on:
                raise FileNotFoundError(f"a chunk file went away ({who})")
            real(self, calls, out)
        finally:
            if who == "helper":
                helper_read.set()

    monkeypatch.setattr(raw_chunks.RawColumnReader, "read_planned", read_planned)
    return seen


def test_two_threads_read_and_check_the_parts_into_the_same_table(tmp_path, monkeypatch):
    monkeypatch.setattr(bulk, "PART_BYTES", 16 << 10)
    url = str(tmp_path / "s.zarr")
    write(url, {"main": [range(0, 60), range(60, 120)]})
    seen = reads_on_both_threads(monkeypatch)
    loaded, expected, taken = load_both(monkeypatch, lambda: bulk_table(200_000, obs=WIDE), [url])
    assert taken[0] == 120 and {"main", "helper"} <= set(seen)
    assert_same_tables(loaded, expected)


@pytest.mark.parametrize("fail_on", ["main", "helper"])
def test_a_read_failing_on_either_thread_leaves_the_load_to_the_other_path(
    tmp_path, monkeypatch, fail_on
):
    monkeypatch.setattr(bulk, "PART_BYTES", 16 << 10)
    url = str(tmp_path / "s.zarr")
    write(url, {"main": [range(0, 60), range(60, 120)]})
    reads_on_both_threads(monkeypatch, fail_on=fail_on)
    taken = bulk_spy(monkeypatch)
    assert tables.load_table(bulk_table(200_000, obs=WIDE), [url]) == 120
    assert taken == [None]  # stepped aside: the episode-by-episode path read every episode
