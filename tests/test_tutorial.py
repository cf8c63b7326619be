"""docs/tutorial.md runs as written: its files are written from the page, its commands run in
order in an empty folder (the default run with a shorter training, the slow run exactly as the
page says, checking the trained policy beats a random one). The page is read with
``tests/test_docs.py``'s block parser, which runs every other guide."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emote_cli.app import app
from tests.test_docs import RUN_ELSEWHERE, page_blocks

TUTORIAL = Path(__file__).resolve().parents[1] / "docs" / "tutorial.md"
SHORT_TRAINING = ["--steps", "60", "--set", "memory.warmup_steps=50"]


def tutorial_parts() -> tuple[dict[str, str], list[list[str]]]:
    """The page's files (blocks with a title) and its commands (``$ emote ...`` lines of its
    console blocks, without ``emote``), in page order."""
    files: dict[str, str] = {}
    commands: list[list[str]] = []
    for block in page_blocks(TUTORIAL.read_text(encoding="utf-8"), "tutorial.md"):
        assert block.marker is None, f"{block.where}: the tutorial runs every block"
        if block.title:
            files[block.title] = block.body
        elif block.language == "console":
            for line in block.commands().splitlines():
                words = shlex.split(line)
                assert words[0] == "emote", line
                commands.append(words[1:])
    return files, commands


def run_tutorial(folder: Path, *, train_extra: list[str]) -> dict[str, str]:
    """Writes the page's files into ``folder``, runs its commands there and returns each
    command's output by its text; every command must succeed."""
    files, commands = tutorial_parts()
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    runner = CliRunner(env={"COLUMNS": "200"})
    outputs = {}
    for words in commands:
        args = words + train_extra if words[0] == "train" else words
        result = runner.invoke(app, args)
        assert result.exit_code == 0, f"emote {' '.join(args)}:\n{result.output}"
        outputs[" ".join(words)] = result.stdout
    return outputs


def test_the_page_has_the_env_the_recipe_and_every_step() -> None:
    assert RUN_ELSEWHERE["tutorial.md"] == "tests/test_tutorial.py"
    files, commands = tutorial_parts()
    assert set(files) == {"mygame.py", "chase.toml"}
    assert 'entry_point = "mygame:Chase"' in files["chase.toml"]
    steps = [
        words[:2] if words[0] in ("env", "export", "memory") else words[:1] for words in commands
    ]
    assert steps == [
        ["env", "check"], ["train"], ["eval"], ["export", "onnx"], ["eval"], ["collect"],
        ["memory", "inspect"],
    ]  # fmt: skip
    assert "--profile" in commands[3] and "ml-agents" in commands[3]


def test_the_tutorial_runs_as_written_with_a_shorter_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    outputs = run_tutorial(tmp_path, train_extra=SHORT_TRAINING)
    assert outputs["env check chase.toml"].rstrip().endswith("passed")
    run = json.loads((tmp_path / "runs" / "chase" / "run.json").read_text(encoding="utf-8"))
    assert run["env"]["entry_point"] == "mygame:Chase"
    exported = outputs["export onnx runs/chase --out chase.onnx --profile ml-agents"]
    assert "obs_0" in exported and "deterministic_continuous_actions" in exported
    # the file (normaliser inside, raw pixels in) plays as the run's networks do
    from_run = outputs["eval runs/chase --episodes 20"]
    from_file = outputs["eval chase.onnx --episodes 20"]
    assert from_run.split(": ", 1)[1] == from_file.split(": ", 1)[1]
    assert "20 episodes" in outputs["collect --policy chase.onnx --out chase.zarr --episodes 20"]
    assert (tmp_path / "chase.zarr").is_dir()


def test_a_policy_file_moved_with_its_env_module_plays_from_any_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    run_tutorial(tmp_path, train_extra=SHORT_TRAINING)
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    for name in ("chase.onnx", "mygame.py"):
        (shipped / name).write_bytes((tmp_path / name).read_bytes())
    (tmp_path / "mygame.py").unlink()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    runner = CliRunner(env={"COLUMNS": "200"})
    played = runner.invoke(app, ["eval", str(shipped / "chase.onnx"), "--episodes", "2"])
    assert played.exit_code == 0, played.output
    assert "2 episodes of mygame:Chase" in played.stdout


def _mean_return(output: str) -> float:
    match = re.search(r"mean return (-?[\d.]+)", output)
    assert match, output
    return float(match.group(1))


@pytest.mark.slow
def test_the_tutorial_as_written_trains_a_policy_far_above_a_random_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    outputs = run_tutorial(tmp_path, train_extra=[])
    runner = CliRunner(env={"COLUMNS": "200"})
    random_play = ["collect", "chase.toml", "--out", "random.zarr", "--episodes", "20"]
    assert runner.invoke(app, random_play).exit_code == 0
    inspected = runner.invoke(app, ["memory", "inspect", "random.zarr", "--returns", "--json"])
    random_mean = json.loads(inspected.stdout)["returns"]["mean"]
    trained_mean = _mean_return(outputs["eval runs/chase --episodes 20"])
    assert trained_mean > random_mean + 15.0, (trained_mean, random_mean)
