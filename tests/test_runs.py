"""Run directories are created once, resumed on purpose, never overwritten by accident."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch

from emote_core.errors import ConfigurationError, FormatError
from emote_core.recipes import load_recipe
from emote_core.runs import (
    RUN_FILE_LIMIT,
    RunDirectory,
    check_resumable_run,
    is_run,
    prepare_run,
    run_recipe,
)
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
    with pytest.raises(
        ConfigurationError, match="already exists; pass `resume=True` to continue it, `force=True`"
    ):
        prepare_run(tmp_path / "run", recipe=recipe, command=["b"])
    assert marker.read_text() == "precious"
    with pytest.raises(ConfigurationError, match="holds no run with checkpoints"):
        prepare_run(tmp_path / "run", recipe=recipe, command=["b"], resume=True)
    prepare_run(tmp_path / "run", recipe=recipe, command=["c"], force=True)
    assert marker.read_text() == "precious"  # --force deletes what emote wrote, not this


def test_resume_appends_to_the_run_record(tmp_path: Path) -> None:
    recipe = load_recipe("sac_pendulum")
    run = prepare_run(tmp_path / "run", recipe=recipe, command=["first"])
    (run.checkpoints / "checkpoint_10.tar").write_bytes(b"x")
    prepare_run(tmp_path / "run", recipe=recipe, command=["second"], resume=True)
    starts = json.loads(run.run_file.read_text())["starts"]
    assert [s["command"] for s in starts] == [["first"], ["second"]]
    assert starts[1]["resume"] is True
    with pytest.raises(ConfigurationError, match="`resume=True` and `force=True` contradict"):
        prepare_run(tmp_path / "run", recipe=recipe, command=["x"], resume=True, force=True)


def test_device_choice_is_explicit() -> None:
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ConfigurationError, match=r"^`device='gpu'`: 'gpu' is not a device"):
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


def _tree(folder: Path) -> dict[str, bytes | None]:
    """Every entry under ``folder``: a file's bytes, ``None`` for anything else."""
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() and not p.is_symlink()
            else None for p in folder.rglob("*")}  # fmt: skip


def test_force_deletes_only_what_the_run_wrote_by_name_and_keeps_the_rest(tmp_path: Path) -> None:
    recipe = load_recipe("sac_pendulum")
    run = prepare_run(tmp_path / "run", recipe=recipe, command=["first"])
    written = json.loads(run.run_file.read_text())["written"]
    assert {"checkpoints", "tensorboard", "exports", "eval.json", "memory_export"} <= set(written)
    ours = [run.checkpoints / "checkpoint_5.tar", run.checkpoints / "best.tar",
            run.tensorboard / "events.out.tfevents.1.host.1.0", run.exports / "policy_1.onnx",
            run.exports / "latest.onnx"]  # fmt: skip
    for path in ours:
        path.write_bytes(b"emote's")
    run.write_eval({"mean_return": 1.0})
    mine = {run.path / "my_notes.txt": "notes", run.checkpoints / "mine.txt": "kept",
            tmp_path / "next_door.txt": "neighbour"}  # fmt: skip
    for path, text in mine.items():
        path.write_text(text)

    prepare_run(run.path, recipe=recipe, command=["second"], force=True)
    assert all(path.read_text() == text for path, text in mine.items())
    assert not any(path.exists() for path in ours) and not run.eval_file.exists()
    record = json.loads(run.run_file.read_text())
    assert [start["command"] for start in record["starts"]] == [["second"]]
    assert "my_notes.txt" not in record["written"] and "checkpoints" in record["written"]


def test_force_refuses_a_run_that_holds_an_input_of_the_command(tmp_path: Path) -> None:
    recipe = load_recipe("sac_pendulum")
    run = prepare_run(tmp_path / "run", recipe=recipe, command=["first"])
    (run.path / "data.zarr").mkdir()
    (run.path / "data.zarr" / "zarr.json").write_text("{}")
    (run.checkpoints / "checkpoint_5.tar").write_bytes(b"x")
    before = _tree(run.path)
    for inputs, memory in (([], [str(run.path / "data.zarr")]), ([run.path / "r.toml"], [])):
        with pytest.raises(ConfigurationError, match="lies inside run directory") as refused:
            prepare_run(run.path, recipe=recipe, command=["b"], force=True, memory=memory,
                        inputs=inputs)  # fmt: skip
        assert "\n" not in str(refused.value)
        assert _tree(run.path) == before


def test_force_never_empties_a_folder_on_the_strength_of_a_forged_run_json(tmp_path: Path) -> None:
    recipe = load_recipe("sac_pendulum")
    folder = tmp_path / "mine"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "my_notes.txt").write_text("notes")
    (folder / "checkpoints" / "checkpoint_5.tar").write_bytes(b"my own")
    (folder / "memory_export").mkdir()
    (folder / "memory_export" / "data.bin").write_bytes(b"not a store")
    forgeries = [
        ({"format": "emote-run"}, "lists no files that emote wrote there"),
        ({"format": "emote-run", "written": ["my_notes.txt", "run.json"]},
         "checkpoints' is not among the files"),
        ({"format": "emote-run", "written": ["my_notes.txt", "run.json", "checkpoints",
                                             "memory_export"]}, "is not an emote-memory store"),
    ]  # fmt: skip
    for forged, message in forgeries:
        (folder / "run.json").write_text(json.dumps(forged))
        before = _tree(folder)
        with pytest.raises(ConfigurationError, match=message) as refused:
            prepare_run(folder, recipe=recipe, command=["b"], force=True)
        assert "\n" not in str(refused.value)
        assert _tree(folder) == before, forged
    # What the record lists but emote's layout cannot write is never deleted.
    (folder / "run.json").write_text(json.dumps(forgeries[-1][0]))
    (folder / "memory_export" / "data.bin").unlink()
    prepare_run(folder, recipe=recipe, command=["b"], force=True)
    assert (folder / "my_notes.txt").read_text() == "notes"


def _hostile_run_json(path: Path, kind: str) -> str:
    """Puts a hostile ``run.json`` at ``path``; returns what the refusal says."""
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
        return r"is not a file \(mode p"
    if kind == "device":
        path.symlink_to("/dev/zero")
        return r"is not a file \(mode c"
    if kind == "huge":
        with open(path, "wb") as file:
            file.truncate(RUN_FILE_LIMIT + 1)  # sparse: no disk, no time
        return f"holds {RUN_FILE_LIMIT + 1} bytes, more than"
    documents = {
        "deep": "[" * 100_000 + "]" * 100_000,
        "not-json": "{",
        "list": "[]",
        "starts": '{"format": "emote-run", "starts": 5}',
        "memory": '{"format": "emote-run", "starts": [{"memory": "a.zarr"}]}',
        "steps": '{"format": "emote-run", "starts": [{"steps": "many"}]}',
        "changes": '{"format": "emote-run", "starts": [{"changes": {"sac.lr": 1}}]}',
        "written": '{"format": "emote-run", "written": [1]}',
    }
    path.write_text(documents[kind])
    return "is damaged: "


@pytest.mark.parametrize(
    "kind",
    ["fifo", "device", "huge", "deep", "not-json", "list", "starts", "memory", "steps",
     "changes", "written"],
)  # fmt: skip
def test_a_run_json_that_is_no_file_or_no_record_is_a_one_line_error(
    tmp_path: Path, kind: str, no_hang: None
) -> None:
    recipe = load_recipe("sac_pendulum")
    run = prepare_run(tmp_path / "run", recipe=recipe, command=["a"])
    (run.checkpoints / "checkpoint_5.tar").write_bytes(b"x")
    message = _hostile_run_json(run.run_file, kind)
    for read in (
        lambda: is_run(run.path),  # emote eval asks this
        lambda: check_resumable_run(run.path),  # emote train --resume
        lambda: run_recipe(run),
        lambda: prepare_run(run.path, recipe=recipe, command=["b"], force=True),
        lambda: prepare_run(run.path, recipe=recipe, command=["b"], resume=True),
    ):
        with pytest.raises(FormatError, match=message) as refused:
            read()
        assert str(refused.value).startswith(f"'{run.run_file}'")
        assert "\n" not in str(refused.value)
    assert run.run_file.is_symlink() or run.run_file.is_fifo() or run.run_file.is_file()


def test_an_eval_json_that_is_a_named_pipe_is_refused_not_read(tmp_path: Path, no_hang: None):
    run = RunDirectory(tmp_path)
    os.mkfifo(run.eval_file)
    with pytest.raises(FormatError, match=r"eval\.json' is not a file"):
        run.write_eval({"mean_return": 1.0})
    assert run.eval_file.is_fifo()
