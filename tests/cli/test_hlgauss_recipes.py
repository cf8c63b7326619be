"""The HL-Gauss recipes as a user runs them: train, checkpoint, resume, export and eval (the run
and the ONNX file), on a tiny budget."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from typer.testing import CliRunner

from emote_cli.app import app
from emote_core.recipes import find_recipe


def run(runner: CliRunner, *args: str):
    return runner.invoke(app, list(args))


@pytest.mark.parametrize(
    ("recipe", "q_name", "outputs"),
    [
        ("sac_hlgauss_pendulum", "q1", ["actions"]),
        ("dqn_hlgauss_cartpole", "q", ["actions", "q_values"]),
    ],
)
def test_an_hl_gauss_recipe_trains_resumes_exports_and_evaluates(
    runner: CliRunner,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    one_torch_thread: None,
    recipe: str,
    q_name: str,
    outputs: list[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    small = ("--set", "memory.warmup_steps=64", "--set", "memory.batch_size=32", "-q", "--json")
    result = run(runner, "train", recipe, "--steps", "40", "--run-dir", "r", *small)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["steps"] == 40

    checkpoint = torch.load(tmp_path / "r" / "checkpoints" / "checkpoint_40.tar", weights_only=True)
    weights = checkpoint["callbacks"][q_name]["network_state_dict"]
    assert "centers" in weights and any(key.startswith("logit_net.") for key in weights)
    bins = weights["centers"].shape[0]
    assert bins == {"sac_hlgauss_pendulum": 101, "dqn_hlgauss_cartpole": 51}[recipe]

    (events,) = (tmp_path / "r" / "tensorboard").iterdir()
    accumulator = EventAccumulator(str(events))
    accumulator.Reload()
    clipped = accumulator.Scalars(f"training_bp_step/{q_name}_targets_clipped")
    assert clipped and all(0.0 <= point.value <= 1.0 for point in clipped)

    resumed = run(runner, "train", recipe, "--steps", "60", "--run-dir", "r", "--resume", *small)
    assert resumed.exit_code == 0, resumed.output
    assert json.loads(resumed.stdout)["steps"] == 60

    exported = run(runner, "export", "onnx", "r", "--out", "policy.onnx", "--json")
    assert exported.exit_code == 0, exported.output
    summary = json.loads(exported.stdout)
    assert summary["outputs"] == outputs and summary["training_step"] == 60
    model = onnx.load("policy.onnx")
    assert [output.name for output in model.graph.output] == outputs

    for source in ("r", "policy.onnx"):
        evaluated = run(runner, "eval", source, "--episodes", "1", "--min-return", "-1e9", "--json")
        assert evaluated.exit_code == 0, evaluated.output
        assert json.loads(evaluated.stdout)["episodes"] == 1


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("sac_hlgauss_pendulum", "--set", "sac.critic=hl_gaus"), 2, "did you mean 'hl_gauss'?"),
        (("dqn_cartpole", "--set", "dqn.critic=hubber"), 2, "did you mean 'huber'?"),
        (("sac_pendulum", "--set", "sac.critic=huber"), 2, "must be one of ['mse', 'hl_gauss']"),
        (
            ("sac_hlgauss_pendulum", "--set", "sac.hl_gauss.min_value=200"),
            2,
            "min_value must be below max_value; got min_value=200.0 and max_value=100.0",
        ),
        (
            ("dqn_hlgauss_cartpole", "--set", "dqn.hl_gauss.max_value=-10"),
            2,
            "min_value must be below max_value",
        ),
        (
            ("dqn_hlgauss_cartpole", "--set", "dqn.hl_gauss.num_bins=1"),
            2,
            "num_bins must be an integer of at least 2; got 1",
        ),
        (
            ("sac_hlgauss_pendulum", "--set", "sac.hl_gauss.smoothing_ratio=0"),
            2,
            "smoothing_ratio' must be above 0",
        ),
        (("sac_pendulum", "--set", "sac.hl_gauss.num_bins=11"), 2, 'set sac.critic = "hl_gauss"'),
    ],
)
def test_bad_critic_settings_are_one_line_and_leave_no_run(
    runner: CliRunner,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    args: tuple[str, ...],
    code: int,
    message: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    result = run(runner, "train", *args, "--run-dir", "r")
    assert result.exit_code == code, result.output
    assert message in result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ")
    assert not (tmp_path / "r").exists() and list(tmp_path.iterdir()) == []


def test_a_recipe_file_with_an_empty_support_is_an_error_of_the_file(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    text = find_recipe("sac_hlgauss_pendulum").read_text()
    assert "min_value = -1700.0" in text
    Path("bad.toml").write_text(text.replace("min_value = -1700.0", "min_value = 100.0"))
    result = run(runner, "train", "bad.toml", "--run-dir", "r")
    assert result.exit_code == 1, result.output
    assert "bad.toml: 'sac.hl_gauss': min_value must be below max_value" in result.stderr
    assert result.stderr.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.toml"]
