"""``emote memory verify``: intact stores pass, damage is named, nothing is ever changed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import zarr
from typer.testing import CliRunner

from emote_cli._common import ExitCode
from emote_cli.app import app
from emote_core.integrations.convert import source_sha256, write_target
from emote_core.stores.stored import ColumnSchema, StoredTable

ROOT = Path(__file__).parents[2]
LEGACY_ZIP = sorted(
    (ROOT / "tests" / "integrations" / "upstream" / "data").glob("emote-rl-23-legacy-*.zip")
)[0]


def _store(path: Path, episodes: int = 30, length: int = 40) -> Path:
    """A store of ``episodes`` episodes; episode i's observations start at row 1000 i."""
    columns = [
        ColumnSchema("obs", "Column", (4,), np.dtype(np.float32)),
        ColumnSchema("actions", "Column", (2,), np.dtype(np.float32)),
        ColumnSchema("rewards", "Column", (1,), np.dtype(np.float32)),
    ]
    records = []
    for i in range(episodes):
        obs = np.arange((length + 1) * 4, dtype=np.float32).reshape(-1, 4) + 1000 * i
        actions = np.full((length, 2), i, np.float32)
        records.append((100 + i, {"obs": obs, "actions": actions, "rewards": actions[:, :1]}, 2))
    stored = StoredTable("generated", "test", columns, records, length_key="actions")
    write_target(stored, path)
    return path


def _one_error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ")
    assert "Traceback" not in result.stderr
    return lines[-1]


def test_an_intact_store_passes_with_a_summary(runner: CliRunner, tmp_path):
    store = _store(tmp_path / "memory.zarr")
    result = runner.invoke(app, ["memory", "verify", str(store)])
    assert result.exit_code == ExitCode.OK, result.stderr
    assert "is intact: 30 episodes, 1,200 transitions" in result.stdout
    assert "MB/s" in result.stdout

    result = runner.invoke(app, ["memory", "verify", str(store), "--json"])
    report = json.loads(result.stdout)
    assert result.exit_code == ExitCode.OK
    assert report["ok"] is True and report["problems"] == []
    assert (report["episodes"], report["transitions"]) == (30, 1200)
    assert report["bytes_checked"] == 30 * (41 * 16 + 40 * 8 + 40 * 4)
    assert report["mb_per_second"] > 0


def test_changed_data_names_the_damaged_episodes_and_the_store_is_not_touched(runner, tmp_path):
    store = _store(tmp_path / "memory.zarr")
    # Rewrite two episodes' observations behind the store's back: checksums no longer match.
    observations = zarr.open_array(store / "shards" / "main" / "columns" / "obs", mode="r+")
    observations[41 * 3 : 41 * 3 + 2] = -1.0  # episode index 3 (id 103)
    observations[41 * 7 + 40] = -1.0  # the final observation of episode index 7 (id 107)
    before = source_sha256(str(store))[0]

    result = runner.invoke(app, ["memory", "verify", str(store)])
    assert result.exit_code == ExitCode.ERROR
    line = _one_error_line(result)
    assert "damaged" in line and "[103, 107]" in line

    result = runner.invoke(app, ["memory", "verify", str(store), "--json"])
    assert result.exit_code == ExitCode.ERROR
    report = json.loads(result.stdout)
    assert report["ok"] is False
    assert [e["id"] for e in report["damaged_episodes"]] == [103, 107]
    assert source_sha256(str(store))[0] == before


def test_an_unreadable_chunk_is_named_with_its_rows(runner, tmp_path):
    store = _store(tmp_path / "memory.zarr", episodes=3)
    chunk = next((store / "shards" / "main" / "columns" / "actions").rglob("c/*/*"))
    chunk.write_bytes(b"not zstd at all")
    before = source_sha256(str(store))[0]

    result = runner.invoke(app, ["memory", "verify", str(store), "--json"])
    assert result.exit_code == ExitCode.ERROR
    report = json.loads(result.stdout)
    assert any("column 'actions' rows 0:" in problem for problem in report["problems"])
    assert [e["id"] for e in report["damaged_episodes"]] == [100, 101, 102]
    assert "column 'actions' rows 0:" in _one_error_line(result)
    assert source_sha256(str(store))[0] == before


@pytest.mark.parametrize("kind", ["zip", "directory", "missing"])
def test_what_is_not_a_store_is_refused_with_a_pointer_to_convert(runner, tmp_path, kind):
    path = {"zip": LEGACY_ZIP, "directory": tmp_path, "missing": tmp_path / "nope.zarr"}[kind]
    result = runner.invoke(app, ["memory", "verify", str(path), "--json"])
    assert result.exit_code == ExitCode.ERROR
    # --json: the failure is also the one document on stdout, so `| jq` never reads silence
    assert json.loads(result.stdout) == {
        "error": result.stderr.strip().removeprefix("error: "),
        "exit_code": ExitCode.ERROR,
    }
    line = _one_error_line(result)
    if kind == "zip":
        assert "verify checks emote memory stores" in line
        assert "emote memory convert" in line
    elif kind == "directory":
        assert "not an emote memory store" in line
    else:
        assert "does not exist" in line
