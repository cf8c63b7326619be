"""Implicit Q-Learning through the command line: iql_pendulum trained from a store that
``emote collect`` made, resumed, evaluated and exported with ONNX parity to the checkpoint's
policy; what it refuses (training live, a store of discrete actions), leaving no run behind."""

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
from emote_core.nn import GaussianMlpPolicy

SMALL = ("--device", "cpu", "--set", "memory.batch_size=32", "--set", "eval.episodes=1",
         "--set", "eval.interval=0", "--set", "iql.hidden_dims=[16]",
         "--set", "training.checkpoint_interval=20", "-q")  # fmt: skip


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Random-policy stores: 2 Pendulum episodes and 2 CartPole episodes."""
    root = tmp_path_factory.mktemp("iql")
    runner = CliRunner()
    for recipe, out in (("sac_pendulum", "pendulum.zarr"), ("dqn_cartpole", "cartpole.zarr")):
        collected = runner.invoke(app, ["collect", recipe, "--out", str(root / out),
                                        "--episodes", "2", "--seed", "3", "-q"])  # fmt: skip
        assert collected.exit_code == 0, collected.output
    return root


def invoke(runner: CliRunner, *args: str):
    return runner.invoke(app, list(args))


def test_iql_pendulum_trains_from_a_store_resumes_then_evaluates_and_exports_with_parity(
    runner: CliRunner, stores: Path, in_tmp: Path
) -> None:
    store = str(stores / "pendulum.zarr")
    trained = invoke(runner, "train", "iql_pendulum", "--memory", store, "--no-live",
                     "--run-dir", "run", "--steps", "20", *SMALL)  # fmt: skip
    assert trained.exit_code == 0, trained.output
    resumed = invoke(runner, "train", "--resume", "--run-dir", "run", "--memory", store,
                     "--no-live", "--steps", "40", "--device", "cpu", "-q")  # fmt: skip
    assert resumed.exit_code == 0, resumed.output
    latest, checkpoint = load_latest_checkpoint(in_tmp / "run")
    assert latest.name == "checkpoint_40.tar"
    assert set(checkpoint["callbacks"]) >= {"iql_target", "value", "q", "policy"}
    by_run = json.loads(invoke(runner, "eval", "run", "--json", "--min-return", "-1e9").stdout)
    assert by_run["lengths"] == [200]
    exported = invoke(runner, "export", "onnx", "run", "--out", "iql.onnx", "--json")
    assert exported.exit_code == 0, exported.output
    assert json.loads(exported.stdout)["inputs"] == ["obs", "epsilon"]
    by_onnx = json.loads(invoke(runner, "eval", "iql.onnx", "--json",
                                "--min-return", "-1e9").stdout)  # fmt: skip
    assert by_onnx["mean_return"] == pytest.approx(by_run["mean_return"], rel=1e-4)
    # The graph is the checkpoint's policy: tanh(mean + std * epsilon).
    policy = GaussianMlpPolicy(observation_dim=3, action_dim=1, hidden_dims=[16])
    policy.load_state_dict(checkpoint["callbacks"]["policy"]["network_state_dict"])
    policy.eval()
    obs = np.array([[1.0, 0.0, 0.5], [0.0, 1.0, -2.0]], dtype=np.float32)
    epsilon = np.array([[0.3], [-1.0]], dtype=np.float32)
    (actions,) = onnxruntime.InferenceSession("iql.onnx").run(
        None, {"obs": obs, "epsilon": epsilon}
    )
    with torch.no_grad():
        expected = policy(torch.from_numpy(obs), torch.from_numpy(epsilon)).numpy()
    np.testing.assert_allclose(actions, expected, atol=1e-5)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--memory", "{stores}/pendulum.zarr", "--live"), "learns from stored episodes only"),
        (("--memory", "{stores}/cartpole.zarr", "--no-live", "--set", 'env.id="CartPole-v1"',
          "--set", "memory.batch_size=8"),
         'discrete actions — use algorithm = "cql" or "bc"'),
        (("--memory", "{stores}/pendulum.zarr", "--no-live", "--set", "iql.expectile=1.5"),
         "'iql.expectile' must be in (0, 1)"),
    ],
)  # fmt: skip
def test_what_iql_refuses_is_one_line_and_leaves_no_run_behind(
    runner: CliRunner, stores: Path, in_tmp: Path, args: tuple[str, ...], message: str
) -> None:
    args = tuple(arg.format(stores=stores) for arg in args)
    result = invoke(runner, "train", "iql_pendulum", *args, "--run-dir", "run", "--steps", "2",
                    "--device", "cpu")  # fmt: skip
    assert result.exit_code in (1, 2), result.output
    errors = [line for line in result.stderr.splitlines() if line.lower().startswith("error")]
    assert len(errors) == 1 and message in " ".join(result.stderr.split()), result.stderr
    assert not (in_tmp / "run").exists()
