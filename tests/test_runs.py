"""Run directories are created once, resumed on purpose, never overwritten by accident."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from emote_core.errors import ConfigurationError
from emote_core.recipes import load_recipe
from emote_core.runs import RunDirectory, prepare_run
from emote_core.utils.devices import resolve_device


def test_a_new_run_records_recipe_command_seed_and_versions(tmp_path: Path) -> None:
    recipe = load_recipe("sac_pendulum", ["seed=7"])
    run = prepare_run(tmp_path / "run", recipe=recipe, command=["emote", "train", "x"])
    resolved = load_recipe(run.recipe_file)
    assert resolved.seed == 7 and resolved.env == recipe.env and resolved.sac == recipe.sac
    record = json.loads(run.run_file.read_text())
    assert record["seed"] == 7 and record["starts"][0]["command"] == ["emote", "train", "x"]
    assert record["packages"]["torch"] == torch.__version__
    assert run.checkpoints.is_dir() and run.tensorboard.is_dir() and run.exports.is_dir()


def test_an_existing_run_is_never_overwritten_without_resume_or_force(tmp_path: Path) -> None:
    recipe = load_recipe("sac_pendulum")
    run = prepare_run(tmp_path / "run", recipe=recipe, command=["a"])
    marker = run.path / "keep.txt"
    marker.write_text("precious")
    with pytest.raises(ConfigurationError, match="already exists; pass --resume"):
        prepare_run(tmp_path / "run", recipe=recipe, command=["b"])
    assert marker.read_text() == "precious"
    with pytest.raises(ConfigurationError, match="holds no run with checkpoints"):
        prepare_run(tmp_path / "run", recipe=recipe, command=["b"], resume=True)
    prepare_run(tmp_path / "run", recipe=recipe, command=["c"], force=True)
    assert not marker.exists()


def test_resume_appends_to_the_run_record(tmp_path: Path) -> None:
    recipe = load_recipe("sac_pendulum")
    run = prepare_run(tmp_path / "run", recipe=recipe, command=["first"])
    (run.checkpoints / "checkpoint_10.tar").write_bytes(b"x")
    prepare_run(tmp_path / "run", recipe=recipe, command=["second"], resume=True)
    starts = json.loads(run.run_file.read_text())["starts"]
    assert [s["command"] for s in starts] == [["first"], ["second"]]
    assert starts[1]["resume"] is True
    with pytest.raises(ConfigurationError, match="contradict"):
        prepare_run(tmp_path / "run", recipe=recipe, command=["x"], resume=True, force=True)


def test_device_choice_is_explicit() -> None:
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ConfigurationError, match="not a device"):
        resolve_device("gpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigurationError, match="no CUDA device"):
            resolve_device("cuda")


def test_evaluations_append_to_eval_json_instead_of_overwriting_it(tmp_path: Path) -> None:
    run = RunDirectory(tmp_path)
    run.eval_file.write_text(json.dumps({"mean_return": -3.0}))  # as emote wrote it before
    run.write_eval({"mean_return": 1.0, "source": "training"})
    run.write_eval({"mean_return": 2.0, "source": "emote eval", "history": ["ignored"]})

    written = json.loads(run.eval_file.read_text())
    assert written["mean_return"] == 2.0 and written["source"] == "emote eval"
    assert [entry["mean_return"] for entry in written["history"]] == [-3.0, 1.0, 2.0]
    assert all("history" not in entry for entry in written["history"])
    assert written["history"][-1]["time"] == written["time"]
    assert run.read_eval() == written


def test_a_run_that_cannot_be_written_leaves_nothing_and_spares_its_neighbours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import emote_core.runs as runs

    (tmp_path / "notes.txt").write_text("mine")
    recipe = load_recipe("sac_pendulum")

    def full_disk(path: Path, text: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(runs, "_write_atomically", full_disk)
    with pytest.raises(OSError, match="No space left"):
        prepare_run(tmp_path / "run", recipe=recipe, command=["a"])
    assert not (tmp_path / "run").exists()
    assert (tmp_path / "notes.txt").read_text() == "mine"
    # An empty directory the user made is theirs: a failed start leaves it where it was.
    (tmp_path / "mine").mkdir()
    with pytest.raises(OSError, match="No space left"):
        prepare_run(tmp_path / "mine", recipe=recipe, command=["a"])
    assert (tmp_path / "mine").is_dir()


def test_nested_tables_with_unset_optional_keys_round_trip_through_recipe_toml(
    tmp_path: Path,
) -> None:
    recipe = load_recipe("sac_curl_pixels")
    assert recipe.sac.conv.observation_key is None and recipe.curl.projection_dim is None
    run = prepare_run(tmp_path / "run", recipe=recipe, command=["a"])
    assert load_recipe(run.recipe_file) == recipe


def test_a_run_on_another_env_than_its_recipes_is_named_after_that_env_too() -> None:
    from emote_core.runs import RUNS_DIRECTORY, default_run_path

    plain = default_run_path("sac_pixels")
    named = default_run_path("sac_pixels", "emote/PixelCarRacing-v0")
    assert plain.parent == named.parent == Path(RUNS_DIRECTORY)
    assert re.fullmatch(r"sac_pixels-\d{8}-\d{6}", plain.name)
    assert re.fullmatch(r"sac_pixels-emote_PixelCarRacing-v0-\d{8}-\d{6}", named.name)
    assert default_run_path("r", "my_envs:Maze/Big-v2").name.startswith("r-my_envs_Maze_Big-v2-")


def test_the_newest_run_of_a_recipe_is_told_by_its_time_whatever_its_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from emote_core.runs import latest_run_path

    monkeypatch.chdir(tmp_path)
    for name in ("sac-Pendulum-v1-20261127-235959", "sac-20261128-000001", "sac-mine"):
        (tmp_path / "runs" / name).mkdir(parents=True)
    assert latest_run_path("sac") == Path("runs/sac-20261128-000001")
    (tmp_path / "runs" / "sac-Pendulum-v1-20261128-000002").mkdir()
    assert latest_run_path("sac") == Path("runs/sac-Pendulum-v1-20261128-000002")
