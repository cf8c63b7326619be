"""Loading stores whose columns are all stored raw: in bulk, the same table as episode by episode;
damage in a raw chunk, a chunk of the wrong size or an episode table found and named where it
is; followers reading the new runs of such stores."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import zarr

from emote_core.errors import FormatError
from emote_core.stores.stored import ColumnSchema
from emote_core.stores.zarr_store import MemoryStore, tables
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
def test_raw_transition_columns_load_in_bulk_as_episode_by_episode(tmp_path, monkeypatch, zarrs):
    monkeypatch.setenv("EMOTE_ZARRS", zarrs)
    url = str(tmp_path / "s.zarr")
    write(url, {"a": [range(0, 200), range(400, 410)], "b": [range(200, 400), range(410, 420)]})
    columns = shard_group(url, "a")["columns"]
    for name in ("obs", "actions", "rewards"):  # all raw: N-row columns too
        assert [c["name"] for c in columns[name].metadata.to_dict()["codecs"]] == ["bytes"]
    for maxlen in (200_000, 30_000):  # everything; the newest that fit (runs from mid-shard)
        fast, slow, taken = load_both(monkeypatch, lambda m=maxlen: bulk_table(m, obs=WIDE), [url])
        assert taken[0] is not None
        assert_same_tables(fast, slow)


@pytest.mark.parametrize("damaged", [None, 0, 57, 119])  # none; the first, a middle, the last
def test_damage_in_any_episode_is_found_and_named_by_id(tmp_path, monkeypatch, damaged):
    url = str(tmp_path / "s.zarr")
    write(url, {"main": [range(0, 60), range(60, 120)]})
    group = shard_group(url)
    actions = group["columns/actions"]
    if damaged is not None:  # one byte of the episode's last action, in its raw chunk file
        row = int(group["episodes/offset"][damaged, 0] + group["episodes/length"][damaged] - 1)
        rows = actions.metadata.chunk_grid.chunk_shape[0]
        damage(chunk_file(actions, row), lambda data: data.__setitem__(
            (row % rows) * 8 + 3, data[(row % rows) * 8 + 3] ^ 0x40))  # fmt: skip
    taken = bulk_spy(monkeypatch)
    if damaged is None:
        assert tables.load_table(bulk_table(200_000, obs=WIDE), [url]) == 120
        assert taken == [120]  # loaded in bulk, every episode clean
        return
    with pytest.raises(FormatError, match="damaged episodes") as refused:
        tables.load_table(bulk_table(200_000, obs=WIDE), [url])
    assert taken == [None]  # the bulk loader found it and left the naming to the other path
    assert f"1 damaged episodes (checksum mismatch or unreadable chunks), ids [{damaged}]" in str(
        refused.value
    )


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
