"""Behaviour cloning through the command line: bc_pendulum trained from a store that
``emote collect`` made, evaluated and exported with ONNX parity; discrete bc on CartPole; what
it refuses (training live, a store of another environment), leaving no run behind."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch
from typer.testing import CliRunner

from emote_cli.app import app
from emote_core.callbacks.checkpoint_files import load_latest_checkpoint

SMALL = ("--device", "cpu", "--set", "memory.batch_size=32", "--set", "eval.episodes=1",
         "--set", "eval.interval=0", "--set", "bc.hidden_dims=[16]",
         "--set", "training.checkpoint_interval=20", "-q")  # fmt: skip


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Random-policy stores: 2 Pendulum episodes and 3 CartPole episodes."""
    root = tmp_path_factory.mktemp("bc")
    runner = CliRunner()
    for recipe, out, episodes in (("sac_pendulum", "pendulum.zarr", "2"),
                                  ("dqn_cartpole", "cartpole.zarr", "3")):  # fmt: skip
        collected = runner.invoke(app, ["collect", recipe, "--out", str(root / out),
                                        "--episodes", episodes, "--seed", "3", "-q"])  # fmt: skip
        assert collected.exit_code == 0, collected.output
    return root


def invoke(runner: CliRunner, *args: str):
    return runner.invoke(app, list(args))


@pytest.mark.parametrize("policy", ["gaussian", "deterministic"])
def test_bc_pendulum_trains_from_a_store_then_evaluates_and_exports_with_parity(
    runner: CliRunner, stores: Path, in_tmp: Path, policy: str
) -> None:
    trained = invoke(runner, "train", "bc_pendulum", "--memory", str(stores / "pendulum.zarr"),
                     "--no-live", "--run-dir", "run", "--steps", "40",
                     "--set", f'bc.policy="{policy}"', *SMALL)  # fmt: skip
    assert trained.exit_code == 0, trained.output
    assert (in_tmp / "run/checkpoints/checkpoint_40.tar").is_file()
    by_run = json.loads(invoke(runner, "eval", "run", "--json", "--min-return", "-1e9").stdout)
    assert by_run["lengths"] == [200]
    exported = invoke(runner, "export", "onnx", "run", "--out", "bc.onnx", "--json")
    assert exported.exit_code == 0, exported.output
    assert json.loads(exported.stdout)["inputs"] == ["obs", "epsilon"]
    by_onnx = json.loads(invoke(runner, "eval", "bc.onnx", "--json",
                                "--min-return", "-1e9").stdout)  # fmt: skip
    assert by_onnx["mean_return"] == pytest.approx(by_run["mean_return"], rel=1e-4)
    # The graph is the checkpoint's policy: tanh(mean + std * epsilon).
    _, checkpoint = load_latest_checkpoint(in_tmp / "run")
    state = checkpoint["callbacks"]["policy"]["network_state_dict"]
    from emote_core.nn import GaussianMlpPolicy

    limits = (-20.0, -19.0) if policy == "deterministic" else (-20.0, 2.0)
    torch_policy = GaussianMlpPolicy(observation_dim=3, action_dim=1, hidden_dims=[16],
                                     log_std_min=limits[0], log_std_max=limits[1])  # fmt: skip
    torch_policy.load_state_dict(state)
    torch_policy.eval()
    obs = np.array([[1.0, 0.0, 0.5], [0.0, 1.0, -2.0]], dtype=np.float32)
    epsilon = np.array([[0.3], [-1.0]], dtype=np.float32)
    session = onnxruntime.InferenceSession("bc.onnx")
    (actions,) = session.run(None, {"obs": obs, "epsilon": epsilon})
    with torch.no_grad():
        expected = torch_policy(torch.from_numpy(obs), torch.from_numpy(epsilon)).numpy()
    np.testing.assert_allclose(actions, expected, atol=1e-5)


def test_discrete_bc_trains_on_a_cartpole_store_and_exports_greedy_actions(
    runner: CliRunner, stores: Path, in_tmp: Path
) -> None:
    trained = invoke(runner, "train", "bc_pendulum", "--memory", str(stores / "cartpole.zarr"),
                     "--no-live", "--run-dir", "run", "--steps", "20",
                     "--set", 'env.id="CartPole-v1"', *SMALL)  # fmt: skip
    assert trained.exit_code == 0, trained.output
    by_run = json.loads(invoke(runner, "eval", "run", "--json", "--min-return", "-1e9").stdout)
    exported = invoke(runner, "export", "onnx", "run", "--out", "bc.onnx", "--json")
    assert exported.exit_code == 0, exported.output
    assert json.loads(exported.stdout)["outputs"] == ["actions", "q_values"]
    by_onnx = json.loads(invoke(runner, "eval", "bc.onnx", "--json",
                                "--min-return", "-1e9").stdout)  # fmt: skip
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
    runner: CliRunner, stores: Path, in_tmp: Path, args: tuple[str, ...], message: str
) -> None:
    args = tuple(arg.format(stores=stores) for arg in args)
    result = invoke(runner, "train", "bc_pendulum", *args, "--run-dir", "run", "--steps", "2",
                    "--device", "cpu")  # fmt: skip
    assert result.exit_code in (1, 2), result.output
    errors = [line for line in result.stderr.splitlines() if line.lower().startswith("error")]
    assert len(errors) == 1 and message in " ".join(result.stderr.split()), result.stderr
    assert not (in_tmp / "run").exists()
