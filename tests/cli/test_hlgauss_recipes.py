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
