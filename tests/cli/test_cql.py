"""Conservative Q-Learning through the command line: cql_pendulum and cql_cartpole trained from
stores that ``emote collect`` made, evaluated and exported with ONNX parity, a resumed run equal
to an uninterrupted one; what it refuses (training live, a bad table), leaving no run behind."""

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

SMALL = ("--device", "cpu", "--threads", "1", "--set", "memory.batch_size=32",
         "--set", "eval.episodes=1", "--set", "eval.interval=0", "--set", "cql.hidden_dims=[16]",
         "--set", "cql.sampled_actions=4", "--set", "training.checkpoint_interval=20",
         "-q")  # fmt: skip


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Random-policy stores: 2 Pendulum episodes and 3 CartPole episodes."""
    root = tmp_path_factory.mktemp("cql")
    runner = CliRunner()
    for recipe, out, episodes in (("sac_pendulum", "pendulum.zarr", "2"),
                                  ("dqn_cartpole", "cartpole.zarr", "3")):  # fmt: skip
        collected = runner.invoke(app, ["collect", recipe, "--out", str(root / out),
                                        "--episodes", episodes, "--seed", "3", "-q"])  # fmt: skip
        assert collected.exit_code == 0, collected.output
    return root


def invoke(runner: CliRunner, *args: str):
    return runner.invoke(app, list(args))


def checkpoint_networks(run: Path) -> dict[str, dict[str, torch.Tensor]]:
    _, checkpoint = load_latest_checkpoint(run)
    return {name: state["network_state_dict"] for name, state in checkpoint["callbacks"].items()
            if "network_state_dict" in state}  # fmt: skip


def test_cql_pendulum_trains_resumes_evaluates_and_exports_with_parity(
    runner: CliRunner, stores: Path, in_tmp: Path, restore_torch_threads: None
) -> None:
    store = str(stores / "pendulum.zarr")
    for run, steps in (("run", "40"), ("parts", "20")):
        trained = invoke(runner, "train", "cql_pendulum", "--memory", store, "--no-live",
                         "--run-dir", run, "--steps", steps, *SMALL)  # fmt: skip
        assert trained.exit_code == 0, trained.output
    resumed = invoke(runner, "train", "--resume", "--run-dir", "parts", "--steps", "40",
                     "--threads", "1", "-q")  # fmt: skip
    assert resumed.exit_code == 0, resumed.output
    # The resumed run's networks are the uninterrupted run's, bit for bit.
    whole, parts = checkpoint_networks(in_tmp / "run"), checkpoint_networks(in_tmp / "parts")
    assert set(whole) == {"policy", "q1", "q2"} == set(parts)
    for name, state in whole.items():
        for key, tensor in state.items():
            assert torch.equal(tensor, parts[name][key]), (name, key)

    by_run = json.loads(invoke(runner, "eval", "run", "--json", "--min-return", "-1e9").stdout)
    assert by_run["lengths"] == [200]
    exported = invoke(runner, "export", "onnx", "run", "--out", "cql.onnx", "--json")
    assert exported.exit_code == 0, exported.output
    assert json.loads(exported.stdout)["inputs"] == ["obs", "epsilon"]
    by_onnx = json.loads(invoke(runner, "eval", "cql.onnx", "--json",
                                "--min-return", "-1e9").stdout)  # fmt: skip
    assert by_onnx["mean_return"] == pytest.approx(by_run["mean_return"], rel=1e-4)
    # The graph is the checkpoint's policy: tanh(mean + std * epsilon).
    from emote_core.nn import GaussianMlpPolicy

    policy = GaussianMlpPolicy(observation_dim=3, action_dim=1, hidden_dims=[16])
    policy.load_state_dict(whole["policy"])
    policy.eval()
    obs = np.array([[1.0, 0.0, 0.5], [0.0, 1.0, -2.0]], dtype=np.float32)
    epsilon = np.array([[0.3], [-1.0]], dtype=np.float32)
    (actions,) = onnxruntime.InferenceSession("cql.onnx").run(
        None, {"obs": obs, "epsilon": epsilon}
    )
    with torch.no_grad():
        expected = policy(torch.from_numpy(obs), torch.from_numpy(epsilon)).numpy()
    np.testing.assert_allclose(actions, expected, atol=1e-5)


def test_cql_cartpole_trains_on_a_store_and_exports_its_greedy_q_network(
    runner: CliRunner, stores: Path, in_tmp: Path, restore_torch_threads: None
) -> None:
    trained = invoke(runner, "train", "cql_cartpole", "--memory", str(stores / "cartpole.zarr"),
                     "--no-live", "--run-dir", "run", "--steps", "20", *SMALL)  # fmt: skip
    assert trained.exit_code == 0, trained.output
    by_run = json.loads(invoke(runner, "eval", "run", "--json", "--min-return", "-1e9").stdout)
    exported = invoke(runner, "export", "onnx", "run", "--out", "cql.onnx", "--json")
    assert exported.exit_code == 0, exported.output
    assert json.loads(exported.stdout)["outputs"] == ["actions", "q_values"]
    by_onnx = json.loads(invoke(runner, "eval", "cql.onnx", "--json",
                                "--min-return", "-1e9").stdout)  # fmt: skip
    assert by_onnx["returns"] == by_run["returns"]
    from emote_core.nn import DiscreteActionValueMlp

    q = DiscreteActionValueMlp(observation_dim=4, num_actions=2, hidden_dims=[16])
    q.load_state_dict(checkpoint_networks(in_tmp / "run")["policy"])
    obs = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    actions, values = onnxruntime.InferenceSession("cql.onnx").run(None, {"obs": obs})
    with torch.no_grad():
        np.testing.assert_allclose(values, q(torch.from_numpy(obs)).numpy(), atol=1e-5)
    np.testing.assert_array_equal(actions[:, 0], values.argmax(axis=1))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "learns from stored episodes only"),
        (("--memory", "{stores}/pendulum.zarr", "--live"), "learns from stored episodes only"),
        (("--memory", "{stores}/pendulum.zarr", "--no-live", "--set",
          "cql.conservative_weight=-1"), "'cql.conservative_weight' must be finite and >= 0"),
    ],
)  # fmt: skip
def test_what_cql_refuses_is_one_line_and_leaves_no_run_behind(
    runner: CliRunner, stores: Path, in_tmp: Path, args: tuple[str, ...], message: str
) -> None:
    args = tuple(arg.format(stores=stores) for arg in args)
    result = invoke(runner, "train", "cql_pendulum", *args, "--run-dir", "run", "--steps", "2",
                    "--device", "cpu")  # fmt: skip
    assert result.exit_code in (1, 2), result.output
    errors = [line for line in result.stderr.splitlines() if line.lower().startswith("error")]
    assert len(errors) == 1 and message in " ".join(result.stderr.split()), result.stderr
    assert not (in_tmp / "run").exists()
