"""The sac_symmetry_lunar_lander recipe through the command line: train, checkpoint, resume,
export (the policy alone) and eval; and the mirror maps it refuses before a run exists."""

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

SMALL = ("--set", "memory.batch_size=32", "--set", "memory.warmup_steps=64", "--device", "cpu",
         "--set", "training.checkpoint_interval=20", "--set", "eval.episodes=1",
         "--set", "sac.hidden_dims=[32, 32]", "--set", "symmetry.hidden_dims=[32]")  # fmt: skip


def invoke(runner: CliRunner, *args: str):
    return runner.invoke(app, list(args))


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def discriminator(checkpoint: Path) -> dict[str, torch.Tensor]:
    callbacks = load_checkpoint(checkpoint)["callbacks"]
    return callbacks["symmetry_discriminator"]["network_state_dict"]


def test_the_symmetry_recipe_trains_resumes_exports_the_policy_alone_and_evaluates(
    runner: CliRunner, in_tmp: Path
) -> None:
    (in_tmp / "notes.txt").write_text("mine")
    trained = invoke(runner, "train", "sac_symmetry_lunar_lander", "--run-dir", "run",
                     "--steps", "40", *SMALL, "-q")  # fmt: skip
    assert trained.exit_code == 0, trained.output
    at_40 = load_checkpoint(in_tmp / "run/checkpoints/checkpoint_40.tar")["callbacks"]
    assert {"symmetry_discriminator", "symmetry_reward", "q1", "policy"} <= set(at_40)
    # the discriminator reads the 8 observation numbers and the 2 action numbers
    assert discriminator(in_tmp / "run/checkpoints/checkpoint_40.tar")[
        "encoder.layers.0.weight"
    ].shape == (32, 10)
    accumulator = ea.EventAccumulator(str(in_tmp / "run/tensorboard"))
    accumulator.Reload()
    tags = set(accumulator.Tags()["scalars"])
    assert {"symmetry_bp_step/confusion_reward", "symmetry_bp_step/task_reward",
            "symmetry_bp_step/loss/gradient_penalty",
            "loss_bp_step/symmetry_discriminator"} <= tags  # fmt: skip
    confusion = [e.value for e in accumulator.Scalars("symmetry_bp_step/confusion_reward")]
    assert all(-1.0 <= value <= 0.0 for value in confusion)

    resumed = invoke(runner, "train", "--resume", "--run-dir", "run", "--steps", "60", "-q")
    assert resumed.exit_code == 0, resumed.output
    before = discriminator(in_tmp / "run/checkpoints/checkpoint_40.tar")
    after = discriminator(in_tmp / "run/checkpoints/checkpoint_60.tar")
    assert any(not torch.equal(before[k], after[k]) for k in before)  # it went on training

    exported = invoke(runner, "export", "onnx", "run", "--out", "policy.onnx", "--json")
    assert exported.exit_code == 0, exported.output
    assert json.loads(exported.stdout)["outputs"] == ["actions"]
    session = onnxruntime.InferenceSession("policy.onnx", providers=["CPUExecutionProvider"])
    feeds = {i.name: np.zeros([1, *i.shape[1:]], np.float32) for i in session.get_inputs()}
    assert session.run(None, feeds)[0].shape == (1, 2)  # the lander's two engines, no score
    evaluated = invoke(runner, "eval", "run", "--episodes", "1", "--min-return", "-5000", "--json")
    assert evaluated.exit_code == 0, evaluated.output
    assert (in_tmp / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize(
    ("recipe", "settings", "message", "code"),
    [
        ("sac_symmetry_lunar_lander", ["symmetry.action_signs=[1, -1, 1]"],
         "error: symmetry.action_signs has 3 entries, but the action has 2 dimensions in "
         "'LunarLander-v3'", 1),
        ("sac_symmetry_lunar_lander", ["symmetry.observation_signs=[-1, 1, -1, 1, -1, -1, 1]",
                                       "symmetry.observation_permutation=[0, 1, 2, 3, 4, 5, 6]"],
         "error: symmetry.observation_permutation has 7 entries, but the observation has 8 "
         "dimensions in 'LunarLander-v3'", 1),
        ("sac_symmetry_lunar_lander", ["symmetry.action_permutation=[1, 0]"],
         "symmetry.action is not a reflection", 2),
        ("dqn_cartpole", ['addons=["symmetry"]', "symmetry.action_signs=[-1]"],
         "error: the symmetry add-on mirrors continuous actions, and 'CartPole-v1' has discrete",
         1),
    ],
)  # fmt: skip
def test_a_mirror_map_that_does_not_fit_is_refused_in_one_line_leaving_no_run(
    runner: CliRunner, in_tmp: Path, recipe: str, settings: list[str], message: str, code: int
) -> None:
    sets = [item for setting in settings for item in ("--set", setting)]
    result = invoke(runner, "train", recipe, "--run-dir", "run", "--steps", "5", *sets,
                    "--device", "cpu")  # fmt: skip
    assert result.exit_code == code, result.output
    assert message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (in_tmp / "run").exists()
