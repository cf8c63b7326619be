"""Per-episode checks (``checks.py``): taken a few episodes at a time (as the bulk loader takes
them, part by part on two threads) they find exactly what one pass over every episode finds, and
each finding is checked here against checksums worked out episode by episode with zlib."""

from __future__ import annotations

import itertools
import zlib

import numpy as np
import pytest

from emote_core.stores.stored import ColumnSchema
from emote_core.stores.zarr_store.checks import EpisodeChecks
from emote_core.stores.zarr_store.layout import (
    TABLE_CHECKSUM,
    RowKind,
    StoreColumn,
    table_checksums,
)

COLUMNS = [
    StoreColumn(ColumnSchema("obs", "Column", (3,), np.dtype(np.float32)), RowKind.OBSERVATIONS),
    StoreColumn(ColumnSchema("actions", "Column", (2,), np.dtype(np.int64)), RowKind.TRANSITIONS),
    StoreColumn(ColumnSchema("tag", "Column", (), np.dtype(np.uint8)), RowKind.EPISODE),
]


def shard(episodes: int = 9, seed: int = 0) -> tuple[dict, dict]:
    """An episode table and its columns' rows, checksums worked out one episode at a time."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 40, episodes)
    steps = np.concatenate([[0], np.cumsum(lengths)])
    data = {
        "obs": rng.standard_normal((int(steps[-1]) + episodes, 3)).astype(np.float32),
        "actions": rng.integers(-9, 9, (int(steps[-1]), 2)),
        "tag": rng.integers(0, 255, episodes).astype(np.uint8),
    }
    table = {
        "id": np.arange(100, 100 + episodes),
        "offset": np.stack([steps[:-1], steps[:-1] + np.arange(episodes)], 1),
        "length": lengths,
        "end_state": np.full(episodes, 2, dtype=np.int8),
        "return": rng.standard_normal(episodes),
        "written_at": np.zeros(episodes),
    }
    checksums = []
    for k in range(episodes):
        o, a, n = int(table["offset"][k, 1]), int(table["offset"][k, 0]), int(lengths[k])
        value = zlib.crc32(data["obs"][o : o + n + 1].tobytes())
        value = zlib.crc32(data["actions"][a : a + n].tobytes(), value)
        checksums.append(zlib.crc32(data["tag"][k : k + 1].tobytes(), value))
    table["checksum"] = np.array(checksums, dtype=np.uint32)
    table[TABLE_CHECKSUM] = table_checksums(table)
    return table, data


def read(data: dict, bad: dict | None = None) -> dict:
    return {name: (values, (bad or {}).get(name)) for name, values in data.items()}


def in_parts(checks: EpisodeChecks, count: int, size: int) -> np.ndarray:
    bounds = [*range(0, count, size), count]
    return np.concatenate([checks.checksums(a, b) for a, b in itertools.pairwise(bounds)])


@pytest.mark.parametrize("size", [1, 2, 4, 9])
def test_checksums_taken_part_by_part_are_each_episodes_own(size):
    table, data = shard()
    indices = np.arange(9)
    checks = EpisodeChecks(COLUMNS, table, read(data), indices)
    found = in_parts(checks, 9, size)
    np.testing.assert_array_equal(found, table["checksum"])
    assert not checks.damaged(found).any()
    assert checks.nbytes == sum(v.nbytes for v in data.values())


def test_a_changed_byte_damages_its_episode_alone_and_only_that_one():
    table, data = shard()
    row = int(table["offset"][4, 0]) + 1  # an action of episode 4
    data["actions"][row, 1] += 1
    checks = EpisodeChecks(COLUMNS, table, read(data), np.arange(9))
    damaged = checks.damaged(in_parts(checks, 9, 2))
    assert np.flatnonzero(damaged).tolist() == [4]
    whole = EpisodeChecks(COLUMNS, table, read(data), np.arange(9)).all_damaged()
    np.testing.assert_array_equal(damaged, whole)


def test_unreadable_rows_damage_the_episodes_they_fall_in_not_their_neighbours():
    table, data = shard()
    bad = np.zeros(len(data["obs"]), dtype=bool)
    first, last = int(table["offset"][2, 1]), int(table["offset"][6, 1] + table["length"][6])
    bad[[first, last]] = True  # episode 2's first observation row, episode 6's last
    checks = EpisodeChecks(COLUMNS, table, read(data, {"obs": bad}), np.arange(9))
    assert np.flatnonzero(checks.unreadable).tolist() == [2, 6]
    assert np.flatnonzero(checks.damaged(in_parts(checks, 9, 4))).tolist() == [2, 6]


def test_rows_past_the_data_read_are_unreadable():
    table, data = shard()
    cut = int(table["offset"][7, 0] + table["length"][7]) - 1  # episode 7 one action short
    short = dict(data, actions=data["actions"][:cut])
    checks = EpisodeChecks(COLUMNS, table, read(short), np.arange(9))
    assert np.flatnonzero(checks.unreadable).tolist() == [7, 8]


def test_a_changed_episode_table_row_is_damage_even_with_its_data_intact():
    table, data = shard()
    table["return"] = table["return"].copy()
    table["return"][5] += 1.0
    checks = EpisodeChecks(COLUMNS, table, read(data), np.arange(9))
    found = in_parts(checks, 9, 3)
    np.testing.assert_array_equal(found, table["checksum"])  # the data is intact
    assert np.flatnonzero(checks.damaged(found)).tolist() == [5]


def test_some_episodes_rows_laid_out_elsewhere_and_not_contiguous():
    table, data = shard()
    indices = np.array([1, 3, 4, 8])
    # Rows of these episodes alone, packed back to back (as a table holds them), each column
    # a non-contiguous view, and ``row_starts`` saying where each episode begins.
    packed, starts = {}, {}
    for column in COLUMNS:
        rows_of = {RowKind.OBSERVATIONS: 1, RowKind.TRANSITIONS: 0}
        if column.rows == RowKind.EPISODE:
            pieces = [data[column.name][k : k + 1] for k in indices]
        else:
            which = rows_of[column.rows]
            pieces = [
                data[column.name][int(table["offset"][k, which]) :][
                    : int(table["length"][k]) + column.extra_rows
                ]
                for k in indices
            ]
        rows = np.concatenate(pieces)
        spread = np.zeros((2 * len(rows), *rows.shape[1:]), rows.dtype)
        spread[::2] = rows
        packed[column.name] = spread[::2]
        assert not packed[column.name].flags.c_contiguous
        starts[column.name] = np.cumsum([0] + [len(p) for p in pieces[:-1]])
    checks = EpisodeChecks(COLUMNS, table, read(packed), indices, row_starts=starts)
    np.testing.assert_array_equal(in_parts(checks, 4, 3), table["checksum"][indices])


def test_data_starting_partway_through_a_column_is_checked_from_its_base():
    table, data = shard()
    indices = np.arange(5, 9)
    bases = {"obs": int(table["offset"][5, 1]), "actions": int(table["offset"][5, 0])}
    tail = {name: values[bases.get(name, 0) :] for name, values in data.items()}
    checks = EpisodeChecks(COLUMNS, table, read(tail), indices, row_base=bases)
    np.testing.assert_array_equal(in_parts(checks, 4, 1), table["checksum"][indices])
