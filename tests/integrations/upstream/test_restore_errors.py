"""Bad memory files raise a FormatError that says what is wrong; the table stays unchanged."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from emote_core.errors import FormatError
from emote_core.integrations.upstream import TableSerializationVersion, restore_table


@pytest.fixture
def filled(fixture_table):
    table = fixture_table()
    table.add_sequence(-1, {"observation": np.arange(4.0), "reward": np.ones(3)})
    table.add_sequence(2, {"observation": np.arange(3.0), "reward": np.zeros(2)})
    return table


def _rewrite(source: Path, target: Path, **replace: bytes) -> Path:
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
        for name in old.namelist():
            new.writestr(name, replace.get(name.replace(".", "_"), old.read(name)))
    return target


def _configuration(path: Path) -> dict:
    with zipfile.ZipFile(path) as archive:
        return json.loads(archive.read("configuration.json"))


@pytest.mark.parametrize(
    ("table_options", "needle"),
    [
        ({"reward_shape": (1,)}, r"column 'reward' differs.*shape \(\).*shape \(1,\)"),
        ({"obs_dtype": np.float64}, r"column 'observation' differs.*float32.*float64"),
    ],
)
def test_a_schema_mismatch_names_the_column_and_both_schemas(
    upstream_v1, fixture_table, table_snapshot, table_options, needle
):
    table = fixture_table(**table_options)
    table.add_sequence(
        9,
        {
            "observation": np.zeros(3),
            "reward": np.ones((2, *table_options.get("reward_shape", ()))),
        },
    )
    before = table_snapshot(table)
    with pytest.raises(FormatError, match=needle):
        restore_table(table, upstream_v1)
    assert table_snapshot(table) == before


def test_a_column_missing_from_the_file_is_named(upstream_v1, filled, table_snapshot, tmp_path):
    config = _configuration(upstream_v1)
    config["columns"] = [c for c in config["columns"] if c[0] != "observation"]
    config["part_keys"] = ["reward"]
    path = _rewrite(
        upstream_v1, tmp_path / "bad.zip", configuration_json=json.dumps(config).encode()
    )
    before = table_snapshot(filled)
    with pytest.raises(FormatError, match=r"does not store column 'observation'"):
        restore_table(filled, path)
    assert table_snapshot(filled) == before


def test_a_truncated_zip_is_refused(upstream_v1, filled, table_snapshot, tmp_path):
    data = upstream_v1.read_bytes()
    path = tmp_path / "half.zip"
    path.write_bytes(data[: len(data) // 2])
    before = table_snapshot(filled)
    with pytest.raises(FormatError, match=r"not a readable zip archive.*truncated") as caught:
        restore_table(filled, path)
    assert "\n" not in str(caught.value)
    assert table_snapshot(filled) == before


@pytest.mark.parametrize(
    ("content", "needle"),
    [(b"", "is empty"), (b"observation,reward\n1,2\n", "neither a zip archive nor a pickle")],
)
def test_empty_and_non_zip_files_are_refused(filled, table_snapshot, tmp_path, content, needle):
    path = tmp_path / "memory.zip"
    path.write_bytes(content)
    before = table_snapshot(filled)
    with pytest.raises(FormatError, match=needle):
        restore_table(filled, path)
    assert table_snapshot(filled) == before


def test_a_missing_file_is_named(filled, tmp_path):
    with pytest.raises(FormatError, match=r"does not exist"):
        restore_table(filled, tmp_path / "nowhere.zip")


def test_an_unsupported_version_is_refused(upstream_v1, filled, table_snapshot, tmp_path):
    path = _rewrite(upstream_v1, tmp_path / "v7.zip", version=b"7")
    before = table_snapshot(filled)
    with pytest.raises(FormatError, match=r"version '7'.*upgrade emote"):
        restore_table(filled, path)
    assert table_snapshot(filled) == before


def test_a_zip_that_is_not_a_memory_is_refused(filled, tmp_path):
    path = tmp_path / "other.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("readme.txt", "hello")
    with pytest.raises(FormatError, match=r"neither a 'version' nor a 'data.pickle'"):
        restore_table(filled, path)


def test_ranges_beyond_the_data_are_refused(upstream_v1, filled, table_snapshot, tmp_path):
    ranges = np.array([[i, 5 * i, 5] for i in range(100)], dtype=np.int64)
    ranges[-1, 1] = 498  # rows 498..503 of a 500-row column
    buffer = io.BytesIO()
    np.save(buffer, ranges)
    path = _rewrite(upstream_v1, tmp_path / "ranges.zip", observation_ranges_npy=buffer.getvalue())
    before = table_snapshot(filled)
    with pytest.raises(FormatError, match=r"episode 99 rows 498..503 of a column with 500 rows"):
        restore_table(filled, path)
    assert table_snapshot(filled) == before


def test_episodes_with_wrong_row_counts_are_refused(upstream_v1, filled, table_snapshot, tmp_path):
    ranges = np.array([[i, 4 * i, 4] for i in range(100)], dtype=np.int64)  # 4 observations
    ranges[-1, 2] = 2  # ... and only 2 for the last episode: neither N nor N + 1
    buffer = io.BytesIO()
    np.save(buffer, ranges)
    path = _rewrite(upstream_v1, tmp_path / "rows.zip", observation_ranges_npy=buffer.getvalue())
    before = table_snapshot(filled)
    with pytest.raises(FormatError, match=r"column 'observation' of episode 99 has 2 rows"):
        restore_table(filled, path)
    assert table_snapshot(filled) == before


def test_pickled_data_in_a_v1_file_is_never_unpickled(upstream_v1, filled, tmp_path):
    buffer = io.BytesIO()
    np.save(buffer, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    path = _rewrite(upstream_v1, tmp_path / "objects.zip", reward_npy=buffer.getvalue())
    with pytest.raises(FormatError, match=r"holds pickled objects.*not unpickled"):
        restore_table(filled, path)


def test_a_failure_while_swapping_content_puts_the_table_back(
    upstream_v1, filled, table_snapshot, monkeypatch
):
    before = table_snapshot(filled)

    working = filled.ejector.load_state

    def broken(state):
        if 99 in state["identities"]:  # the file's state, not the table's own
            raise RuntimeError("strategy state is corrupt")
        working(state)

    monkeypatch.setattr(filled.ejector, "load_state", broken, raising=False)
    with pytest.raises(FormatError, match=r"strategy state is corrupt.*left as it was"):
        restore_table(filled, upstream_v1)
    monkeypatch.undo()
    assert table_snapshot(filled) == before
    filled.add_sequence(3, {"observation": np.arange(3.0), "reward": np.zeros(2)})
    assert [identity for identity, _, _ in filled.episodes()] == [-1, 2, 3]


def test_an_override_version_reads_the_zip_as_that_layout(upstream_v1, fixture_table):
    table = fixture_table()
    with pytest.raises(FormatError, match=r"has no member 'data.pickle'"):
        restore_table(table, upstream_v1, TableSerializationVersion.LEGACY)
    restore_table(table, upstream_v1, TableSerializationVersion.V1)
    assert table.episode_count == 100
