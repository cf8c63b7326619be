"""Evaluation inside `emote train` as a user sees it: eval.json and its history, best.tar,
TensorBoard curves against updates and env steps, the recipe's threshold in `emote eval`, and
Weights & Biases offline with `--track`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing import event_accumulator as ea
from typer.testing import CliRunner

from emote_cli.app import app

TINY = ("--set", "memory.warmup_steps=64", "--set", "memory.batch_size=16", "--threads", "1",
        "--set", "eval.episodes=3")  # fmt: skip


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restore_torch_threads: None) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def train(runner: CliRunner, *args: str):
    return runner.invoke(app, ["train", "sac_hit_the_middle", *TINY, "-q", "--json", *args])


def test_training_evaluates_keeps_the_best_and_reports(runner: CliRunner, in_tmp: Path) -> None:
    trained = train(runner, "--steps", "40", "--run-dir", "r", "--set", "eval.interval=20",
                    "--set", "eval.min_return=1000")  # fmt: skip
    assert trained.exit_code == 0, trained.output  # a missed threshold does not fail training
    json.loads(trained.stdout)

    report = json.loads((in_tmp / "r" / "eval.json").read_text())
    assert report["source"] == "training" and report["bp_step"] == 40
    assert report["episodes"] == 3 and report["seed"] == 1_000 and report["deterministic"]
    assert report["threshold"] == 1000 and report["passed"] is False
    assert report["lowest_return"] <= report["mean_return"] <= report["highest_return"]
    assert report["best"]["bp_step"] in (20, 40) and len(report["history"]) == 1
    assert Path(report["best"]["checkpoint"]).name == "best.tar"

    events = ea.EventAccumulator(str(in_tmp / "r" / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("eval_bp_step/mean_return")] == [20, 40]
    env_steps = [e.step for e in events.Scalars("eval_env_step/mean_return")]
    assert env_steps[0] >= 64 + 20 and env_steps[1] == env_steps[0] + 20  # warm-up, then 1/update
    assert "episode_env_step/reward" in events.Tags()["scalars"]
    assert events.Scalars("hparam/eval_mean_return")[0].value == pytest.approx(
        report["mean_return"]
    )

    # The recipe's threshold, without --min-return: exit 3, saying where it came from.
    missed = runner.invoke(app, ["eval", "r", "--episodes", "3", "-q"])
    assert missed.exit_code == 3
    assert "[eval] min_return of the run's recipe 'r/recipe.toml'" in missed.stderr
    assert missed.stderr.count("\n") == 1 and "pass --min-return" in missed.stderr
    elsewhere = runner.invoke(app, ["eval", "r", "--env", "emote/HitTheMiddle-v0", "--episodes",
                                    "1", "--json"])  # fmt: skip
    assert elsewhere.exit_code == 0, elsewhere.output  # the recipe's threshold is for its env
    assert json.loads(elsewhere.stdout)["threshold"] is None
    met = runner.invoke(app, ["eval", "r", "--episodes", "3", "--min-return", "-1e6", "--json"])
    assert met.exit_code == 0, met.output
    assert json.loads(met.stdout)["passed"] is True

    history = json.loads((in_tmp / "r" / "eval.json").read_text())["history"]
    assert [(h["source"], h["passed"]) for h in history] == [
        ("training", False), ("emote eval", False), ("emote eval", None), ("emote eval", True),
    ]  # fmt: skip
    assert history[1]["threshold_from"].endswith("'r/recipe.toml'")

    # best.tar is an ordinary checkpoint: evaluating it replays the best evaluation exactly.
    best = runner.invoke(app, ["eval", "r/checkpoints/best.tar", "--episodes", "3",
                               "--min-return", "-1e6", "--json"])  # fmt: skip
    assert best.exit_code == 0, best.output
    assert json.loads(best.stdout)["mean_return"] == pytest.approx(report["best"]["mean_return"])


def test_track_writes_an_offline_wandb_run_into_the_run_directory(
    runner: CliRunner, in_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wandb = pytest.importorskip("wandb", reason="the wandb extra is not installed")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(in_tmp / "wandb-home"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(in_tmp / "wandb-home"))
    trained = train(runner, "--steps", "20", "--run-dir", "r", "--track",
                    "--set", "training.log_interval=10")  # fmt: skip
    assert trained.exit_code == 0, trained.output
    assert json.loads(trained.stdout)["steps"] == 20  # W&B printed nothing to stdout
    wandb.teardown()  # what the end of the process does: the service writes everything out

    (offline,) = (in_tmp / "r" / "wandb").glob("offline-run-*")
    data = next(offline.glob("run-*.wandb")).read_bytes()
    for key in (b"eval/mean_return", b"loss/q1", b"episode/reward", b"sac_hit_the_middle"):
        assert key in data, key
    assert "wandb = true" in (in_tmp / "r" / "recipe.toml").read_text()


def test_track_without_wandb_is_one_line_naming_the_install(
    runner: CliRunner, in_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if the extra were not installed
    result = train(runner, "--steps", "5", "--run-dir", "r", "--track")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert 'pip install -e ".[wandb]"' in result.stderr
    assert not (in_tmp / "r").exists()  # a run that never started leaves nothing behind
