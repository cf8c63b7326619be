"""``emote memory convert`` of tmrl datasets given as tmrl's ``dataset_path`` folder."""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emote_cli._common import ExitCode
from emote_cli.app import app
from emote_core.stores.zarr_store import MemoryStore

TMRL_FILE = Path(__file__).parents[1] / "integrations" / "data" / "tmrl_cartpole_mixed.data.pkl"


@pytest.fixture
def dataset_folder(tmp_path) -> Path:
    """A folder as tmrl's dataset_path: data.pkl written by tmrl's GenericTorchMemory."""
    folder = tmp_path / "TmrlData" / "dataset"
    folder.mkdir(parents=True)
    shutil.copy(TMRL_FILE, folder / "data.pkl")
    return folder


def _convert(runner: CliRunner, *args: str):
    return runner.invoke(app, ["memory", "convert", *args])


def _one_error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def test_a_dataset_folder_converts_like_its_data_pkl(runner, tmp_path, dataset_folder):
    result = _convert(runner, str(dataset_folder), str(tmp_path / "folder.zarr"), "--json")
    assert result.exit_code == ExitCode.OK, result.stderr
    from_folder = json.loads(result.stdout)
    result = _convert(runner, str(TMRL_FILE), str(tmp_path / "file.zarr"), "--json")
    from_file = json.loads(result.stdout)
    assert from_folder["source_format"] == "tmrl-dataset"
    assert from_folder["episodes"] == from_file["episodes"] > 0
    assert from_folder["transitions"] == from_file["transitions"]
    # The folder hashes as its data.pkl: the same dataset has one sha256 however it is named.
    assert from_folder["source_sha256"] == hashlib.sha256(TMRL_FILE.read_bytes()).hexdigest()
    assert from_folder["source_sha256"] == from_file["source_sha256"]
    verified = runner.invoke(app, ["memory", "verify", str(tmp_path / "folder.zarr"), "--json"])
    assert verified.exit_code == ExitCode.OK and json.loads(verified.stdout)["ok"] is True
    folder_episodes = list(MemoryStore(str(tmp_path / "folder.zarr")).episodes())
    file_episodes = list(MemoryStore(str(tmp_path / "file.zarr")).episodes())
    assert [(len(d["rewards"]), e) for _, d, e in folder_episodes] == [
        (len(d["rewards"]), e) for _, d, e in file_episodes
    ]
    inspected = runner.invoke(app, ["memory", "inspect", str(dataset_folder), "--json"])
    assert inspected.exit_code == ExitCode.OK, inspected.stderr


def test_a_folder_that_is_no_tmrl_dataset_gets_one_clear_error(runner, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = _convert(runner, str(empty), str(tmp_path / "a.zarr"))
    assert result.exit_code == ExitCode.ERROR
    assert "nor a tmrl dataset folder (a data.pkl of tmrl's lists)" in _one_error_line(result)

    result = _convert(runner, str(empty), str(tmp_path / "a.zarr"), "--from", "tmrl-dataset")
    assert result.exit_code == ExitCode.ERROR
    line = _one_error_line(result)
    assert "is a directory without data.pkl" in line and "pass that folder or the file" in line

    other = tmp_path / "other"
    other.mkdir()
    (other / "data.pkl").write_bytes(pickle.dumps({"obs": [1, 2, 3]}))
    result = _convert(runner, str(other), str(tmp_path / "a.zarr"))
    assert result.exit_code == ExitCode.ERROR
    assert "is a directory but not an emote memory store" in _one_error_line(result)
    assert not (tmp_path / "a.zarr").exists()


@pytest.mark.parametrize("target", ["zarr", "npz"])
def test_force_never_replaces_a_tmrl_dataset(runner, tmp_path, dataset_folder, target):
    source = tmp_path / "source.zarr"
    assert _convert(runner, str(TMRL_FILE), str(source), "-q").exit_code == ExitCode.OK
    before = (dataset_folder / "data.pkl").read_bytes()
    result = _convert(runner, str(source), str(dataset_folder), "--to", target, "--force")
    assert result.exit_code == ExitCode.ERROR
    assert "choose another destination" in _one_error_line(result)
    result = _convert(
        runner, str(source), str(dataset_folder / "data.pkl"), "--to", target, "--force"
    )
    assert result.exit_code == ExitCode.ERROR
    assert "choose another destination" in _one_error_line(result)
    assert sorted(p.name for p in dataset_folder.iterdir()) == ["data.pkl"]
    assert (dataset_folder / "data.pkl").read_bytes() == before
    assert sorted(p.name for p in dataset_folder.parent.iterdir()) == ["dataset"]
