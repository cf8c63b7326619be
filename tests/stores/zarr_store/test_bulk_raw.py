"""Reading local stores straight from their files: the episode tables and column metadata without
zarr's event loop, and raw columns scattered straight to the table's rows. Each gives what zarr
gives, and anything unusual (other layouts, damage) is left to zarr, which names it as before."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import zarr

from emote_core.errors import FormatError
from emote_core.stores.stored import ColumnSchema
from emote_core.stores.zarr_store import (
    MemoryStore,
    bulk,
    local_arrays,
    raw_chunks,
    reader,
    tables,
)
from emote_core.stores.zarr_store.layout import EPISODE_FIELDS, TABLE_CHECKSUM
from emote_core.stores.zarr_store.local_arrays import LocalReadError, open_local
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


def test_episode_tables_read_from_files_are_what_zarr_reads(tmp_path):
    url = str(tmp_path / "s.zarr")
    write(url, {"main": [range(0, 30), range(30, 31)]})
    group = shard_group(url)
    for field in [*EPISODE_FIELDS, TABLE_CHECKSUM]:
        local = open_local(group, f"episodes/{field}")
        expected = group[f"episodes/{field}"][:]
        assert local is not None and local.shape == expected.shape
        got = local.read(0, len(expected))
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)
    for name in ("obs", "actions"):  # and the columns' layouts
        local = open_local(group, f"columns/{name}")
        assert local is not None and not local.compressed
        np.testing.assert_array_equal(local.read(5, 700), group[f"columns/{name}"][5:700])


def test_other_layouts_and_stores_are_left_to_zarr(tmp_path):
    root = zarr.open_group(str(tmp_path / "z.zarr"), mode="w")
    zstd = root.create_array(
        "zstd", shape=(10,), chunks=(4,), dtype=np.int64, compressors=zarr.codecs.ZstdCodec()
    )
    zstd[:] = np.arange(10)
    assert open_local(root, "zstd") is None  # another compressor
    assert open_local(root, "missing") is None  # no metadata
    assert open_local(root, "") is None  # a group
    memory = zarr.open_group(zarr.storage.MemoryStore(), mode="w")
    memory.create_array("a", shape=(4,), dtype=np.int64)
    assert open_local(memory, "a") is None  # not on the local file system


@pytest.mark.parametrize(
    ("dtype", "fill"),
    [
        (np.float32, 0.0), (np.float32, np.nan), (np.float64, -np.inf), (np.float16, 1.5),
        (np.int64, -(2**63)), (np.uint64, 2**64 - 1), (np.uint8, 7), (np.int16, -3),
        (np.bool_, True), (np.float32, np.inf),
    ],
)  # fmt: skip
@pytest.mark.parametrize("compressed", [False, True])
def test_metadata_in_the_writers_form_parses_as_zarr_parses_it(tmp_path, dtype, fill, compressed):
    from zarr.core.metadata import ArrayV3Metadata

    root = zarr.open_group(str(tmp_path / "z.zarr"), mode="w")
    compressors = raw_chunks.compressor() if compressed else None  # Blosc, as the writer's
    root.create_array(
        "a", shape=(10, 3), chunks=(4, 3), dtype=dtype, fill_value=fill, compressors=compressors
    )
    document = json.loads((tmp_path / "z.zarr" / "a" / "zarr.json").read_text())
    found = local_arrays.plain_metadata(document)
    assert found is not None
    metadata, found_dtype, found_compressed = found
    expected = ArrayV3Metadata.from_dict(document)
    assert found_dtype == np.dtype(expected.dtype.to_native_dtype())
    assert found_compressed == compressed == local_arrays.direct_codecs(expected)
    assert metadata.shape == expected.shape
    assert metadata.chunk_grid.chunk_shape == tuple(expected.chunk_grid.chunk_shape)
    assert metadata.encode_chunk_key((2, 0)) == expected.encode_chunk_key((2, 0))
    assert type(metadata.fill_value) is type(expected.fill_value)
    np.testing.assert_array_equal(metadata.fill_value, expected.fill_value)  # NaN equals NaN
    local = open_local(root, "a")
    assert local is not None and isinstance(local.metadata, local_arrays.PlainMetadata)
    np.testing.assert_array_equal(local.read(0, 10), root["a"][:])  # all fill: no chunks


def _changed(document: dict, path: tuple, value) -> dict:
    changed = json.loads(json.dumps(document))
    place = changed
    for key in path[:-1]:
        place = place[key]
    if value is KeyError:
        del place[path[-1]]
    else:
        place[path[-1]] = value
    return changed


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("dimension_names",), ["t", "x"]),
        (("chunk_key_encoding", "configuration", "separator"), "."),
        (("codecs", 0, "configuration", "endian"), "big"),
        (("codecs", 1), {"name": "zstd", "configuration": {"level": 0, "checksum": False}}),
        (("codecs", 1, "configuration", "cname"), "nope"),
        (("codecs", 1, "configuration", "clevel"), 12),
        (("fill_value",), "0x7fc00000"),
        (("fill_value",), True),
        (("fill_value",), 1e300),
        (("storage_transformers",), [{"name": "x"}]),
        (("chunk_grid", "configuration", "chunk_shape"), [4, 2]),
        (("chunk_grid", "name"), "rectilinear"),
        (("data_type",), "complex64"),
        (("shape",), [10, -3]),
        (("shape",), [10.0, 3]),
        (("attributes",), None),
        (("extra",), 1),
        (("codecs",), KeyError),
        (("data_type",), {"name": "float32", "configuration": {}}),  # unhashable values
        (("chunk_grid", "configuration"), []),
        (("codecs", 1, "configuration", "cname"), ["lz4"]),
        (("codecs", 1, "configuration", "shuffle"), {"shuffle": 1}),
    ],
)  # fmt: skip
def test_metadata_off_the_writers_form_is_left_to_zarrs_parser(tmp_path, path, value):
    root = zarr.open_group(str(tmp_path / "z.zarr"), mode="w")
    root.create_array(
        "a", shape=(10, 3), chunks=(4, 3), dtype=np.float32, compressors=raw_chunks.compressor()
    )
    document = json.loads((tmp_path / "z.zarr" / "a" / "zarr.json").read_text())
    assert local_arrays.plain_metadata(document) is not None
    assert local_arrays.plain_metadata(_changed(document, path, value)) is None


def test_a_missing_episode_table_chunk_reads_as_fill_value_as_in_zarr(tmp_path):
    url = str(tmp_path / "s.zarr")
    write(url, {"main": [range(0, 30)]})
    group = shard_group(url)
    local = open_local(group, "episodes/return")
    local.chunk_path(0).unlink()
    np.testing.assert_array_equal(local.read(0, 30), group["episodes/return"][:30])


def damage(path: Path, change) -> None:
    data = bytearray(path.read_bytes())
    change(data)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "change",
    [
        lambda data: data.__setitem__(slice(20, 40), b"\xff" * 20),  # damaged compressed bytes
        lambda data: data.__setitem__(slice(4, 8), (1 << 31).to_bytes(4, "little")),  # claims 2 GB
        lambda data: data.__delitem__(slice(30, None)),  # cut short
    ],
)
def test_a_damaged_episode_table_is_named_as_zarr_names_it(tmp_path, monkeypatch, change):
    url = str(tmp_path / "s.zarr")
    write(url, {"main": [range(0, 30)], "clean": [range(30, 40)]})
    local = open_local(shard_group(url), "episodes/length")
    damage(local.chunk_path(0), change)
    with pytest.raises(LocalReadError):
        local.read(0, 30)
    found = MemoryStore(url)
    monkeypatch.setattr(reader, "read_rows_locally", lambda *a: None)  # zarr alone
    expected = MemoryStore(url)
    assert found.damaged_shards == expected.damaged_shards
    assert [s.name for s in found.shards] == [s.name for s in expected.shards]
    if found.damaged_shards:
        with pytest.raises(FormatError, match="shard 'main'"):
            found.check_readable()


def test_a_shard_whose_metadata_is_not_json_is_still_reported(tmp_path):
    url = str(tmp_path / "s.zarr")
    write(url, {"main": [range(0, 30)], "clean": [range(30, 40)]})
    metadata = Path(url) / "shards" / "main" / "episodes" / "length" / "zarr.json"
    document = json.loads(metadata.read_text())
    document["codecs"] = "not a codec list"
    metadata.write_text(json.dumps(document))
    store = MemoryStore(url)
    assert "main" in store.damaged_shards and [s.name for s in store.shards] == ["clean"]


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


def test_a_followers_run_of_new_episodes_reads_the_same_table_from_files(tmp_path, monkeypatch):
    from emote_core.stores.zarr_store import tail

    url = str(tmp_path / "s.zarr")
    write(url, {"main": [range(0, 20), range(20, 30)]})
    store = MemoryStore(url)
    shard = store.shards[0]
    runs = {}
    for how in ("files", "zarr"):
        if how == "zarr":
            monkeypatch.setattr(tail, "read_rows_locally", lambda *a: None)
        runs[how] = tail.read_episode_run(
            url, shard.group, shard.commit, store.columns, shard="main", start=12, stop=30
        )
    assert [e[0] for e in runs["files"].episodes] == list(range(12, 30))
    for (a, data, end), (b, expected, expected_end) in zip(
        runs["files"].episodes, runs["zarr"].episodes, strict=True
    ):
        assert (a, end) == (b, expected_end)
        for name in expected:
            np.testing.assert_array_equal(data[name], expected[name])
    np.testing.assert_array_equal(runs["files"].written_at, runs["zarr"].written_at)


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


def test_the_threads_hand_the_gil_over_quickly_while_they_read(tmp_path, monkeypatch):
    import sys

    from emote_core.utils.threading import QUICK_SWITCH_SECONDS

    url = str(tmp_path / "s.zarr")
    write(url, {"main": [range(0, 30)]})
    intervals = []
    real = raw_chunks.RawColumnReader.read_planned

    def read_planned(self, calls, out):
        intervals.append(sys.getswitchinterval())
        real(self, calls, out)

    monkeypatch.setattr(raw_chunks.RawColumnReader, "read_planned", read_planned)
    monkeypatch.setattr(bulk.os, "cpu_count", lambda: 2)
    before = sys.getswitchinterval()
    assert tables.load_table(bulk_table(200_000, obs=WIDE), [url]) == 30
    quick = pytest.approx(min(before, QUICK_SWITCH_SECONDS))
    assert intervals and all(interval == quick for interval in intervals)
    assert sys.getswitchinterval() == before
