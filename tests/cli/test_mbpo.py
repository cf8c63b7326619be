"""The mbpo_pendulum recipe through the command line: train, checkpoint, resume, export the policy,
eval; offline from a store; and what it refuses before a run exists."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch
from tensorboard.backend.event_processing import event_accumulator as ea
from typer.testing import CliRunner

from emote_cli.app import app
from emote_core.callbacks.checkpointing import load_checkpoint

SMALL = ("--device", "cpu", "--set", "memory.batch_size=32", "--set", "memory.warmup_steps=1000",
         "--set", "training.checkpoint_interval=20", "--set", "training.bp_steps_per_inference=4",
         "--set", "eval.episodes=1", "--set", "eval.interval=0", "--set", "sac.hidden_dims=[32]",
         "--set", "model.ensemble_size=3", "--set", "model.num_elites=2",
         "--set", "model.hidden_size=16", "--set", "model.num_layers=2",
         "--set", "model.check_interval=10", "--set", "model.warmup_updates=5",
         "--set", "model.rollouts_per_update=8", "--set", "model.retain_updates=5",
         "--set", "model.train_interval=2")  # fmt: skip


def invoke(runner: CliRunner, *args: str):
    return runner.invoke(app, list(args))


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def model_state(checkpoint: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(checkpoint)["callbacks"]["dynamic_model"]["network_state_dict"]


def test_mbpo_pendulum_trains_resumes_exports_the_policy_and_evaluates(
    runner: CliRunner, in_tmp: Path
) -> None:
    (in_tmp / "notes.txt").write_text("mine")
    trained = invoke(runner, "train", "mbpo_pendulum", "--run-dir", "run", "--steps", "40",
                     *SMALL, "-q")  # fmt: skip
    assert trained.exit_code == 0, trained.output
    at_40 = load_checkpoint(in_tmp / "run/checkpoints/checkpoint_40.tar")["callbacks"]
    assert {"dynamic_model", "model_progress", "model_collector", "batch_sampler", "policy",
            "q1"} <= set(at_40)  # fmt: skip
    assert at_40["dynamic_model"]["steps"] == 20  # every 2nd update
    model = model_state(in_tmp / "run/checkpoints/checkpoint_40.tar")
    assert model["model.hidden.0.weight"].shape[0] == 3  # three members
    assert model["input_normalizer.count"] > 0 and model["target_normalizer.count"] > 0
    assert at_40["model_progress"]["checks_since_improvement"] >= 0
    assert np.isfinite(at_40["model_progress"]["last_nmse"])  # 5 warm-up episodes: one held out
    accumulator = ea.EventAccumulator(str(in_tmp / "run/tensorboard"))
    accumulator.Reload()
    tags = set(accumulator.Tags()["scalars"])
    assert {"model_bp_step/holdout_nmse", "training_bp_step/prob_sampling_from_model",
            "training_bp_step/model_rollout_length", "loss_bp_step/dynamic_model",
            "model_bp_step/rollout_reward"} <= tags, tags  # fmt: skip
    probability = [
        e.value for e in accumulator.Scalars("training_bp_step/prob_sampling_from_model")
    ]
    assert probability[-1] == pytest.approx(0.95)

    resumed = invoke(runner, "train", "--resume", "--run-dir", "run", "--steps", "60", "-q")
    assert resumed.exit_code == 0, resumed.output
    before = model_state(in_tmp / "run/checkpoints/checkpoint_40.tar")
    after = model_state(in_tmp / "run/checkpoints/checkpoint_60.tar")
    assert after["input_normalizer.count"] > before["input_normalizer.count"]
    assert not torch.equal(before["model.hidden.0.weight"], after["model.hidden.0.weight"])

    exported = invoke(runner, "export", "onnx", "run", "--out", "policy.onnx", "--json")
    assert exported.exit_code == 0, exported.output
    assert json.loads(exported.stdout)["outputs"] == ["actions"]
    session = onnxruntime.InferenceSession("policy.onnx", providers=["CPUExecutionProvider"])
    assert sorted(i.name for i in session.get_inputs()) == ["epsilon", "obs"]
    feeds = {i.name: np.zeros([1, *i.shape[1:]], np.float32) for i in session.get_inputs()}
    assert session.run(None, feeds)[0].shape == (1, 1)
    evaluated = invoke(runner, "eval", "run", "--episodes", "1", "--min-return", "-5000", "--json")
    assert evaluated.exit_code == 0, evaluated.output
    assert json.loads(evaluated.stdout)["episodes"] == 1
    assert (in_tmp / "notes.txt").read_text() == "mine"


def test_mbpo_pendulum_trains_the_model_and_the_agent_offline_from_a_store(
    runner: CliRunner, in_tmp: Path
) -> None:
    collected = invoke(runner, "collect", "sac_pendulum", "--out", "random.zarr", "--episodes",
                       "6", "-q")  # fmt: skip
    assert collected.exit_code == 0, collected.output
    trained = invoke(runner, "train", "mbpo_pendulum", "--memory", "random.zarr", "--no-live",
                     "--run-dir", "run", "--steps", "20", *SMALL, "-q")  # fmt: skip
    assert trained.exit_code == 0, trained.output
    at_20 = load_checkpoint(in_tmp / "run/checkpoints/checkpoint_20.tar")["callbacks"]
    assert at_20["dynamic_model"]["steps"] == 10
    assert np.isfinite(at_20["model_progress"]["last_nmse"])


@pytest.mark.parametrize(
    ("settings", "message", "code"),
    [
        (["model.ensemble_size=0"], "'model.ensemble_size' must be at least 1; got 0", 2),
        (["model.num_elites=9"], "'model.num_elites' (9) must not exceed 'model.ensemble_size'", 2),
        (["model.rollout_length=0"], "'model.rollout_length' must be at least 1; got 0", 2),
        (["model.final_rollout_length=-1"], "'model.final_rollout_length' must be at least 1", 2),
        (["model.termination=\"pendulm\""], "did you mean 'pendulum'?", 2),
        (["model.model_data_probability=1.5"], "'model.model_data_probability' must be in", 2),
        (["memory.rollout_length=3"], "the model add-on trains on one-transition windows", 1),
        (["model.rollouts_per_update=512"], "'model.rollouts_per_update' (512) exceeds", 1),
    ],
)  # fmt: skip
def test_bad_model_settings_are_refused_in_one_line_leaving_no_run(
    runner: CliRunner, in_tmp: Path, settings: list[str], message: str, code: int
) -> None:
    sets = [item for setting in settings for item in ("--set", setting)]
    result = invoke(runner, "train", "mbpo_pendulum", "--run-dir", "run", "--steps", "5", *sets,
                    "--device", "cpu")  # fmt: skip
    assert result.exit_code == code, result.output
    assert message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (in_tmp / "run").exists()


def test_an_env_or_store_the_model_cannot_serve_is_refused_leaving_no_run(
    runner: CliRunner, in_tmp: Path
) -> None:
    discrete = invoke(runner, "train", "dqn_cartpole", "--run-dir", "run", "--steps", "5",
                      "--set", 'addons=["model"]', "--device", "cpu")  # fmt: skip
    assert discrete.exit_code == 1, discrete.output
    assert "the model add-on learns dynamics over continuous actions; 'CartPole-v1'" in (
        discrete.stderr
    )
    collected = invoke(runner, "collect", "sac_hit_the_middle", "--out", "middle.zarr",
                       "--episodes", "1", "-q")  # fmt: skip
    assert collected.exit_code == 0, collected.output
    mismatch = invoke(runner, "train", "mbpo_pendulum", "--memory", "middle.zarr", "--no-live",
                      "--run-dir", "run", "--steps", "5", "--device", "cpu")  # fmt: skip
    assert mismatch.exit_code == 1, mismatch.output
    assert "middle.zarr" in mismatch.stderr and len(mismatch.stderr.strip().splitlines()) == 1
    assert not (in_tmp / "run").exists()


def test_mbpo_inverted_pendulum_trains_with_its_termination_and_evaluates(
    runner: CliRunner, in_tmp: Path
) -> None:
    trained = invoke(runner, "train", "mbpo_inverted_pendulum", "--run-dir", "run", "--steps",
                     "20", *SMALL, "-q")  # fmt: skip
    assert trained.exit_code == 0, trained.output
    at_20 = load_checkpoint(in_tmp / "run/checkpoints/checkpoint_20.tar")["callbacks"]
    assert at_20["dynamic_model"]["steps"] == 10
    accumulator = ea.EventAccumulator(str(in_tmp / "run/tensorboard"))
    accumulator.Reload()
    # Random actions topple the pole within a few model steps: some rollouts end TERMINAL.
    assert "model_bp_step/rollout_terminated" in accumulator.Tags()["scalars"]
    evaluated = invoke(runner, "eval", "run", "--episodes", "1", "--min-return", "0", "--json")
    assert evaluated.exit_code == 0, evaluated.output
