"""The amp_pendulum recipe through the command line: the two commands that make its reference
store, then train, checkpoint, resume, export and eval; and the reference stores it refuses."""

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
from emote_core.stores.stored import ColumnSchema
from emote_core.stores.zarr_store import create_store, store_columns

SMALL = ("--set", "memory.batch_size=32", "--set", "memory.warmup_steps=64", "--device", "cpu",
         "--set", "training.checkpoint_interval=20", "--set", "eval.episodes=2")  # fmt: skip


def invoke(runner: CliRunner, *args: str):
    return runner.invoke(app, list(args))


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def collect(runner: CliRunner, recipe: str, out: str, episodes: int, *policy: str) -> None:
    result = invoke(runner, "collect", recipe, "--out", out, "--episodes", str(episodes),
                    *policy, "-q")  # fmt: skip
    assert result.exit_code == 0, result.output


def discriminator(checkpoint: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(checkpoint)["callbacks"]["discriminator"]["network_state_dict"]


def test_amp_pendulum_trains_from_a_trained_runs_store_resumes_exports_and_evaluates(
    runner: CliRunner, in_tmp: Path
) -> None:
    # The AMP guide's (docs/algorithms.md) two commands, at a tiny budget: a SAC run, then its
    # policy's episodes.
    expert = invoke(runner, "train", "sac_pendulum", "--run-dir", "expert", "--steps", "20", *SMALL)
    assert expert.exit_code == 0, expert.output
    collect(runner, "sac_pendulum", "expert.zarr", 2, "--policy", "expert")

    trained = invoke(runner, "train", "amp_pendulum", "--run-dir", "run", "--steps", "40", *SMALL)
    assert trained.exit_code == 0, trained.output
    at_40 = load_checkpoint(in_tmp / "run/checkpoints/checkpoint_40.tar")["callbacks"]
    assert {"discriminator", "amp_reward", "amp_reference_memory", "q1", "policy"} <= set(at_40)
    assert at_40["amp_reference_memory"]["sources"] == [
        {"url": "expert.zarr", "shards": {"main": 2}}
    ]
    accumulator = ea.EventAccumulator(str(in_tmp / "run/tensorboard"))
    accumulator.Reload()
    tags = set(accumulator.Tags()["scalars"])
    assert {"amp_bp_step/task_reward", "amp_bp_step/style_reward",
            "amp_bp_step/loss/gradient_penalty", "loss_bp_step/discriminator"} <= tags  # fmt: skip
    style = [e.value for e in accumulator.Scalars("amp_bp_step/style_reward")]
    assert all(0.0 <= value <= 1.0 for value in style)

    resumed = invoke(runner, "train", "--resume", "--run-dir", "run", "--steps", "60", "-q")
    assert resumed.exit_code == 0, resumed.output
    before, after = (
        discriminator(in_tmp / "run/checkpoints/checkpoint_40.tar"),
        discriminator(in_tmp / "run/checkpoints/checkpoint_60.tar"),
    )
    assert any(not torch.equal(before[k], after[k]) for k in before)  # it went on training

    exported = invoke(runner, "export", "onnx", "run", "--out", "policy.onnx", "--json")
    assert exported.exit_code == 0, exported.output
    export = json.loads(exported.stdout)
    assert export["outputs"] == ["actions"] and "obs" in export["inputs"]
    session = onnxruntime.InferenceSession("policy.onnx", providers=["CPUExecutionProvider"])
    feeds = {i.name: np.zeros([1, *i.shape[1:]], np.float32) for i in session.get_inputs()}
    assert session.run(None, feeds)[0].shape == (1, 1)  # the policy: one action, no score
    evaluated = invoke(runner, "eval", "run", "--episodes", "2", "--min-return", "-5000", "--json")
    assert evaluated.exit_code == 0, evaluated.output
    assert json.loads(evaluated.stdout)["episodes"] == 2


def test_offline_amp_training_interrupted_and_resumed_equals_the_uninterrupted_run(
    runner: CliRunner, in_tmp: Path
) -> None:
    collect(runner, "sac_pendulum", "ref.zarr", 2)  # the random policy: quick to make
    offline = ("train", "amp_pendulum", "--no-live", "--memory", "ref.zarr", "--set",
               "amp.reference=ref.zarr", *SMALL, "-q")  # fmt: skip
    assert invoke(runner, *offline, "--steps", "40", "--run-dir", "straight").exit_code == 0
    assert invoke(runner, *offline, "--steps", "20", "--run-dir", "parts").exit_code == 0
    resumed = invoke(runner, "train", "--resume", "--run-dir", "parts", "--no-live",
                     "--steps", "40", "-q")  # fmt: skip
    assert resumed.exit_code == 0, resumed.output
    tail = "checkpoints/checkpoint_40.tar"
    straight, parts = (
        load_checkpoint(in_tmp / "straight" / tail),
        load_checkpoint(in_tmp / "parts" / tail),
    )
    for name in ("discriminator", "policy", "q1"):
        a, b = straight["callbacks"][name], parts["callbacks"][name]
        assert all(torch.equal(a["network_state_dict"][k], b["network_state_dict"][k])
                   for k in a["network_state_dict"]), name  # fmt: skip
    assert (straight["callbacks"]["amp_reference_memory"]["random_state"]
            == parts["callbacks"]["amp_reference_memory"]["random_state"])  # fmt: skip


def empty_pendulum_store(path: Path) -> None:
    schemas = [
        ColumnSchema("obs", "Column", (3,), np.dtype(np.float32)),
        ColumnSchema("actions", "Column", (1,), np.dtype(np.float32)),
        ColumnSchema("rewards", "Column", (1,), np.dtype(np.float32)),
    ]
    episode = (0, {"obs": np.zeros((2, 3), np.float32), "actions": np.zeros((1, 1), np.float32),
                   "rewards": np.zeros((1, 1), np.float32)}, None)  # fmt: skip
    columns = store_columns(schemas, episode, "rewards")
    create_store(path, columns=columns, length_key="rewards", env_id="Pendulum-v1")


@pytest.mark.parametrize(
    ("store", "message"),
    [
        ("missing.zarr", "error: 'amp.reference' names 'missing.zarr', which does not exist"),
        ("empty.zarr", "error: 'amp.reference' names store 'empty.zarr', which holds no episodes"),
        ("middle.zarr", "error: 'amp.reference': store 'middle.zarr' holds observations 'obs' of"),
        (
            "short.zarr",
            "error: 'amp.reference' store 'short.zarr' holds 200 transitions in 1 episode; a",
        ),
    ],
)
def test_a_reference_store_that_cannot_serve_is_refused_in_one_line_leaving_no_run(
    runner: CliRunner, in_tmp: Path, store: str, message: str
) -> None:
    if store == "empty.zarr":
        empty_pendulum_store(in_tmp / store)
    elif store == "middle.zarr":  # another environment's observations: 2 numbers, not 3
        collect(runner, "sac_hit_the_middle", store, 1)
    elif store == "short.zarr":  # one episode of 200 transitions; a batch needs 256
        collect(runner, "sac_pendulum", store, 1)
    result = invoke(runner, "train", "amp_pendulum", "--run-dir", "run", "--steps", "5",
                    "--set", f"amp.reference={store}", "--device", "cpu")  # fmt: skip
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith(message), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (in_tmp / "run").exists()
