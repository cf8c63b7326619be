"""`emote train --resume` as a user runs it: the run's own recipe, refusals that write nothing,
and a resumed run that continues the same run."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import tomllib
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from emote_cli.app import app
from emote_core.callbacks.checkpointing import load_checkpoint
from emote_core.stores.zarr_store import MemoryStore

TRAIN = ("train", "sac_hit_the_middle", "-q", "--json")
FAST = ("--set", "training.checkpoint_interval=20", "--set", "training.log_interval=10")


def invoke(runner: CliRunner, *args: str):
    return runner.invoke(app, list(args))


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*")
            if p.is_file()}  # fmt: skip


def flat(value, prefix=""):
    if isinstance(value, dict):
        for key, item in value.items():
            yield from flat(item, f"{prefix}/{key}")
    elif isinstance(value, list | tuple):
        for position, item in enumerate(value):
            yield from flat(item, f"{prefix}/{position}")
    else:
        yield prefix, value


def differences(first: Path, second: Path) -> list[str]:
    a, b = dict(flat(load_checkpoint(first))), dict(flat(load_checkpoint(second)))
    different = []
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key), b.get(key)
        same = (
            torch.equal(x, y)
            if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)
            else x == y
        )
        if not same:
            different.append(key)
    return different


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def store(runner: CliRunner, in_tmp: Path) -> Path:
    result = invoke(runner, "collect", "sac_hit_the_middle", "--out", "store.zarr",
                    "--episodes", "12", "-q", "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    return in_tmp / "store.zarr"


def test_offline_training_interrupted_and_resumed_equals_the_uninterrupted_run(
    runner: CliRunner, store: Path, in_tmp: Path
) -> None:
    offline = ("--no-live", "--memory", str(store), *FAST)
    straight = invoke(runner, *TRAIN, *offline, "--steps", "40", "--run-dir", "straight")
    assert straight.exit_code == 0, straight.output
    first = invoke(runner, *TRAIN, *offline, "--steps", "20", "--run-dir", "parts")
    assert first.exit_code == 0, first.output
    # The resume names neither the recipe nor the store: both come from the run.
    resumed = invoke(runner, "train", "--resume", "--run-dir", "parts", "--no-live",
                     "--steps", "40", "-q", "--json")  # fmt: skip
    assert resumed.exit_code == 0, resumed.output
    assert json.loads(resumed.stdout)["steps"] == 40

    tail = "checkpoints/checkpoint_40.tar"
    assert differences(in_tmp / "straight" / tail, in_tmp / "parts" / tail) == []


def test_a_live_run_resumed_holds_the_episodes_committed_before_its_checkpoint_and_the_new(
    runner: CliRunner, in_tmp: Path
) -> None:
    result = invoke(runner, *TRAIN, *FAST, "--steps", "60", "--run-dir", "r")
    assert result.exit_code == 0, result.output
    run = in_tmp / "r"
    at_20 = load_checkpoint(run / "checkpoints" / "checkpoint_20.tar")["callbacks"]
    counted = at_20["replay_memory"]["exported"]
    # As if the run had been killed after checkpoint 20: later checkpoints are gone, while the
    # episodes it committed after checkpoint 20 stay in the store.
    for later in ("checkpoint_40.tar", "checkpoint_60.tar"):
        (run / "checkpoints" / later).unlink()
    before = MemoryStore(run / "memory_export").committed()
    assert before["main"] > counted["main"]

    resumed = invoke(runner, "train", "--resume", "--run-dir", "r", "--steps", "60", "-q")
    assert resumed.exit_code == 0, resumed.output
    after = MemoryStore(run / "memory_export").committed()
    assert after["main"] == before["main"]  # nothing committed is lost or rewritten
    new = after["resume-1"]
    assert new > 0
    memory = load_checkpoint(run / "checkpoints" / "checkpoint_60.tar")["callbacks"]
    state = memory["replay_memory"]
    assert state["exported"] == {"main": counted["main"], "resume-1": new}
    assert state["episodes"] == counted["main"] + new  # all of them, none twice
    collector = memory["gym_collector"]
    assert collector["completed_episodes"] == counted["main"] + new


def test_a_resume_that_changes_what_the_checkpoints_hold_is_refused_with_nothing_written(
    runner: CliRunner, in_tmp: Path
) -> None:
    result = invoke(runner, *TRAIN, *FAST, "--steps", "20", "--run-dir", "r")
    assert result.exit_code == 0, result.output
    before = snapshot(in_tmp / "r")
    refusals = [
        (("train", "--resume", "--run-dir", "r", "--set", "sac.hidden_dims=[32, 32]"),
         "sac.hidden_dims [64, 64] -> [32, 32] would change what the checkpoints"),
        (("train", "--resume", "--run-dir", "r", "--set", "env.id=Pendulum-v1"),
         "env.id 'emote/HitTheMiddle-v0' -> 'Pendulum-v1'"),
        (("train", "--resume", "--run-dir", "r", "--seed", "7"), "seed 0 -> 7"),
        (("train", "--resume", "--run-dir", "r", "--set", "sac.learning_rate=0.1"),
         "sac.learning_rate"),
        (("train", "sac_pendulum", "--resume", "--run-dir", "r"),
         "trains recipe 'sac_hit_the_middle', not 'sac_pendulum'"),
        (("train", "--resume", "--run-dir", "r", "--memory", "other.zarr"),
         "trains from --memory [], not ['other.zarr']"),
    ]  # fmt: skip
    for args, message in refusals:
        refused = invoke(runner, *args)
        assert refused.exit_code == 1, (args, refused.output)
        assert message in refused.stderr and refused.stderr.count("\n") == 1, refused.stderr
        assert snapshot(in_tmp / "r") == before, args
    evaluated = invoke(runner, "eval", "r", "--episodes", "1", "--json")
    assert evaluated.exit_code == 0, evaluated.output


def test_allowed_changes_are_recorded_in_the_history_and_never_rewrite_the_recipe(
    runner: CliRunner, in_tmp: Path
) -> None:
    result = invoke(runner, *TRAIN, *FAST, "--steps", "20", "--run-dir", "r")
    assert result.exit_code == 0, result.output
    recipe = (in_tmp / "r" / "recipe.toml").read_bytes()
    changes = ("--set", "training.bp_steps=40", "--set", "eval.episodes=3")
    resumed = invoke(runner, "train", "--resume", "--run-dir", "r", *changes, "-q", "--json")
    assert resumed.exit_code == 0, resumed.output
    assert json.loads(resumed.stdout)["steps"] == 40
    assert (in_tmp / "r" / "recipe.toml").read_bytes() == recipe
    starts = json.loads((in_tmp / "r" / "run.json").read_text())["starts"]
    assert starts[1]["changes"] == {
        "eval.episodes": [10, 3],
        "training.bp_steps": [2000, 40],
    }
    assert tomllib.loads(recipe.decode())["training"]["bp_steps"] == 2000

    # A later resume goes on from the changed recipe: bp_steps stays 40, so nothing is left.
    again = invoke(runner, "train", "--resume", "--run-dir", "r", "-q", "--json")
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["steps"] == 40
    evaluated = invoke(runner, "eval", "r", "--json")
    assert json.loads(evaluated.stdout)["episodes"] == 3  # the run's [eval] as changed


def test_resume_needs_a_run(runner: CliRunner, in_tmp: Path) -> None:
    (in_tmp / "mine").mkdir()
    (in_tmp / "mine" / "checkpoints").mkdir()
    (in_tmp / "mine" / "checkpoints" / "checkpoint_1.tar").write_bytes(b"not ours")
    refused = invoke(runner, "train", "--resume", "--run-dir", "mine")
    assert refused.exit_code == 1 and "holds no run with checkpoints" in refused.stderr
    no_run = invoke(runner, "train", "--resume")
    assert no_run.exit_code == 2 and "--resume needs the run" in no_run.stderr
    no_recipe = invoke(runner, "train")
    assert no_recipe.exit_code == 2 and "RECIPE is needed" in no_recipe.stderr


@pytest.mark.slow
def test_sac_pendulum_interrupted_halfway_and_resumed_reaches_the_recipes_return_band(
    runner: CliRunner, in_tmp: Path
) -> None:
    half = invoke(runner, "train", "sac_pendulum", "--steps", "10000", "--run-dir", "p", "-q")
    assert half.exit_code == 0, half.output
    # The first start asked for 10,000 updates, which a plain --resume would keep: ask for the
    # recipe's whole run.
    resumed = invoke(
        runner, "train", "--resume", "--run-dir", "p", "-q", "--json", "--steps", "19900"
    )
    assert resumed.exit_code == 0, resumed.output
    assert json.loads(resumed.stdout)["steps"] == 19_900
    memory = load_checkpoint(in_tmp / "p" / "checkpoints" / "checkpoint_19900.tar")["callbacks"]
    state = memory["replay_memory"]  # the first half's episodes came back, with the new ones
    assert state["episodes"] == sum(state["exported"].values()) > 0
    assert set(state["exported"]) == {"main", "resume-1"}
    # The recipe's [eval] min_return (-200; rl-baselines3-zoo reports -157 +- 89 at 20k steps).
    evaluated = invoke(runner, "eval", "p", "--episodes", "10", "--min-return", "-200", "--json")
    assert evaluated.exit_code == 0, evaluated.output
    assert json.loads(evaluated.stdout)["mean_return"] >= -200


def test_a_run_whose_checkpoint_predates_the_recorded_memory_still_resumes(
    runner: CliRunner, in_tmp: Path
) -> None:
    result = invoke(runner, *TRAIN, *FAST, "--steps", "20", "--run-dir", "old")
    assert result.exit_code == 0, result.output
    checkpoint = in_tmp / "old" / "checkpoints" / "checkpoint_20.tar"
    data = torch.load(checkpoint, weights_only=True)
    held = data["callbacks"].pop("replay_memory")["episodes"]  # as emote wrote them before
    torch.save(data, checkpoint)

    resumed = runner.invoke(app, ["train", "--resume", "--run-dir", "old", "--steps", "100"])
    assert resumed.exit_code == 0, resumed.output
    assert "does not record the replay memory" in resumed.stderr
    state = load_checkpoint(in_tmp / "old" / "checkpoints" / "checkpoint_100.tar")["callbacks"]
    memory = state["replay_memory"]
    assert memory["exported"]["main"] == held  # every episode of its export, from then on counted
    assert memory["episodes"] == held + memory["exported"]["resume-1"]


def test_a_run_that_does_not_store_its_episodes_says_its_memory_starts_empty_on_resume(
    runner: CliRunner, in_tmp: Path
) -> None:
    unstored = ("--set", "memory.store_episodes=false")
    result = invoke(runner, *TRAIN, *FAST, *unstored, "--steps", "40", "--run-dir", "r")
    assert result.exit_code == 0, result.output
    assert not (in_tmp / "r" / "memory_export").exists()
    resumed = runner.invoke(app, ["train", "--resume", "--run-dir", "r", "--steps", "60"])
    assert resumed.exit_code == 0, resumed.output
    assert "did not store its episodes (memory.store_episodes = false)" in resumed.stderr


def test_a_resume_without_steps_goes_on_to_the_total_the_run_was_started_for(
    runner: CliRunner, in_tmp: Path
) -> None:
    started = invoke(runner, *TRAIN, *FAST, "--steps", "20", "--run-dir", "r")
    assert started.exit_code == 0, started.output
    checkpoint = in_tmp / "r" / "checkpoints" / "checkpoint_20.tar"
    checkpoint.rename(checkpoint.with_name("checkpoint_10.tar"))  # as if stopped at update 10
    # `--steps 20` was asked for; the recipe's bp_steps (2000) is not what the run was for.
    resumed = invoke(runner, "train", "--resume", "--run-dir", "r", "-q", "--json")
    assert resumed.exit_code == 0, resumed.output
    assert json.loads(resumed.stdout)["steps"] == 20
    longer = invoke(runner, "train", "--resume", "--run-dir", "r", "--steps", "30", "-q", "--json")
    assert json.loads(longer.stdout)["steps"] == 30
    again = invoke(runner, "train", "--resume", "--run-dir", "r", "-q", "--json")
    assert json.loads(again.stdout)["steps"] == 30


def _train_until_interrupted(args: list[str], *, past: int, cwd: Path) -> tuple[str, int]:
    """Runs ``emote ARGS`` (a real process), sends Ctrl-C once its progress shows an update
    beyond ``past``, and returns its last stderr line and exit status."""
    process = subprocess.Popen(
        [sys.executable, "-m", "emote_cli", *args], cwd=cwd, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert process.stderr is not None
    lines: list[str] = []
    progressed, seen = threading.Event(), threading.Event()

    def read() -> None:
        for line in process.stderr:  # type: ignore[union-attr]
            lines.append(line)
            shown = re.match(r"train update=(\d+)/", line)
            if shown and int(shown[1]) > past:
                progressed.set()
                seen.set()
        seen.set()  # it ended without getting there

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert seen.wait(timeout=180) and progressed.is_set(), "".join(lines[-20:])
    process.send_signal(signal.SIGINT)
    status = process.wait(timeout=120)
    reader.join(timeout=60)
    return lines[-1].rstrip("\n"), status


def test_the_resume_hint_of_an_interrupted_no_live_run_resumes_it_as_it_was(
    runner: CliRunner, store: Path, in_tmp: Path
) -> None:
    """The printed hint names no mode or store: the resume takes both from the run's record."""
    began = ["train", "sac_hit_the_middle", "--memory", str(store), "--no-live", "--steps",
             "100000", "--run-dir", "r", "--threads", "1"]  # fmt: skip
    last, status = _train_until_interrupted(began, past=0, cwd=in_tmp)
    assert status == 130, last
    hint = re.fullmatch(r"error: interrupted at update (\d+); resume with: (.*)", last)
    assert hint is not None, last
    stopped = int(hint[1])
    command = shlex.split(hint[2])
    assert command[:2] == ["emote", "train"]

    last, status = _train_until_interrupted(
        [*command[1:], "--threads", "1"], past=stopped, cwd=in_tmp
    )
    assert status == 130, last
    assert re.fullmatch(r"error: interrupted at update (\d+); resume with: .*", last), last
    starts = json.loads((in_tmp / "r" / "run.json").read_text())["starts"]
    assert [(s["live"], s["memory"], s["resume"]) for s in starts] == [
        (False, [str(store)], False),
        (False, [str(store)], True),
    ]
    # Asked for live collection explicitly, the run refuses in one line and writes nothing.
    refused = invoke(runner, "train", "--resume", "--run-dir", "r", "--live")
    assert refused.exit_code == 1 and refused.stderr.count("\n") == 1, refused.stderr
    assert "--resume --live: run 'r' trains from stored memory only" in refused.stderr
