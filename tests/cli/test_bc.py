"""Behaviour cloning through the command line: bc_pendulum trained from a store that
``emote collect`` made, evaluated and exported with ONNX parity; discrete bc on CartPole; what
it refuses (training live, a store of another environment), leaving no run behind."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime
import pytest
from typer.testing import CliRunner

from emote_cli.app import app
from emote_core.callbacks.checkpoint_files import load_latest_checkpoint
from tests.cli.conftest import (
    assert_gaussian_graph,
    assert_refused,
    evaluate_and_export,
    small_training,
)

SMALL = small_training("bc")
pytestmark = pytest.mark.usefixtures("restore_torch_threads")


@pytest.mark.parametrize("policy", ["gaussian", "deterministic"])
def test_bc_pendulum_trains_from_a_store_then_evaluates_and_exports_with_parity(
    runner: CliRunner, offline_stores: Path, in_tmp: Path, policy: str
) -> None:
    trained = runner.invoke(app, ["train", "bc_pendulum", "--memory",
                                  str(offline_stores / "pendulum.zarr"), "--no-live",
                                  "--run-dir", "run", "--steps", "40",
                                  "--set", f'bc.policy="{policy}"', *SMALL])  # fmt: skip
    assert trained.exit_code == 0, trained.output
    assert (in_tmp / "run/checkpoints/checkpoint_40.tar").is_file()
    by_run, exported, by_onnx = evaluate_and_export(runner, "run", "bc.onnx")
    assert by_run["lengths"] == [200]
    assert exported["inputs"] == ["obs", "epsilon"]
    assert by_onnx["mean_return"] == pytest.approx(by_run["mean_return"], rel=1e-4)
    # The graph is the checkpoint's policy: tanh(mean + std * epsilon).
    _, checkpoint = load_latest_checkpoint(in_tmp / "run")
    state = checkpoint["callbacks"]["policy"]["network_state_dict"]
    limits = (-20.0, -19.0) if policy == "deterministic" else (-20.0, 2.0)
    assert_gaussian_graph("bc.onnx", state, log_std=limits)


def test_discrete_bc_trains_on_a_cartpole_store_and_exports_greedy_actions(
    runner: CliRunner, offline_stores: Path, in_tmp: Path
) -> None:
    trained = runner.invoke(app, ["train", "bc_pendulum", "--memory",
                                  str(offline_stores / "cartpole.zarr"), "--no-live",
                                  "--run-dir", "run", "--steps", "20",
                                  "--set", 'env.id="CartPole-v1"', *SMALL])  # fmt: skip
    assert trained.exit_code == 0, trained.output
    by_run, exported, by_onnx = evaluate_and_export(runner, "run", "bc.onnx")
    assert exported["outputs"] == ["actions", "q_values"]
    assert by_onnx["returns"] == by_run["returns"]
    session = onnxruntime.InferenceSession("bc.onnx")
    obs = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    actions, logits = session.run(None, {"obs": obs})
    np.testing.assert_array_equal(actions[:, 0], logits.argmax(axis=1))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "learns from stored episodes only"),
        (("--memory", "{stores}/pendulum.zarr", "--live"), "learns from stored episodes only"),
        (("--memory", "{stores}/cartpole.zarr", "--no-live"), "collected on CartPole-v1"),
        (("--memory", "{stores}/pendulum.zarr", "--no-live", "--set", 'bc.policy="gausian"'),
         "'bc.policy' must be one of ['gaussian', 'deterministic']"),
    ],
)  # fmt: skip
def test_what_bc_refuses_is_one_line_and_leaves_no_run_behind(
    runner: CliRunner, offline_stores: Path, tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    assert_refused(runner, tmp_path, "bc_pendulum", args, message, stores=offline_stores)
