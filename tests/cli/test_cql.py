"""Conservative Q-Learning through the command line: cql_pendulum and cql_cartpole trained from
stores that ``emote collect`` made, evaluated and exported with ONNX parity, a resumed run equal
to an uninterrupted one; what it refuses (training live, a bad table), leaving no run behind."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch
from typer.testing import CliRunner

from emote_cli.app import app
from emote_core.callbacks.checkpoint_files import load_latest_checkpoint
from tests.cli.conftest import (
    assert_gaussian_graph,
    assert_refused,
    evaluate_and_export,
    small_training,
)

SMALL = small_training("cql", "--set", "cql.sampled_actions=4")
pytestmark = pytest.mark.usefixtures("restore_torch_threads")


def checkpoint_networks(run: Path) -> dict[str, dict[str, torch.Tensor]]:
    _, checkpoint = load_latest_checkpoint(run)
    return {name: state["network_state_dict"] for name, state in checkpoint["callbacks"].items()
            if "network_state_dict" in state}  # fmt: skip


def test_cql_pendulum_trains_resumes_evaluates_and_exports_with_parity(
    runner: CliRunner, offline_stores: Path, in_tmp: Path
) -> None:
    store = str(offline_stores / "pendulum.zarr")
    for run, steps in (("run", "40"), ("parts", "20")):
        trained = runner.invoke(app, ["train", "cql_pendulum", "--memory", store, "--no-live",
                                      "--run-dir", run, "--steps", steps, *SMALL])  # fmt: skip
        assert trained.exit_code == 0, trained.output
    resumed = runner.invoke(app, ["train", "--resume", "--run-dir", "parts", "--steps", "40",
                                  "--threads", "1", "-q"])  # fmt: skip
    assert resumed.exit_code == 0, resumed.output
    # The resumed run's networks are the uninterrupted run's, bit for bit.
    whole, parts = checkpoint_networks(in_tmp / "run"), checkpoint_networks(in_tmp / "parts")
    assert set(whole) == {"policy", "q1", "q2"} == set(parts)
    for name, state in whole.items():
        for key, tensor in state.items():
            assert torch.equal(tensor, parts[name][key]), (name, key)

    by_run, exported, by_onnx = evaluate_and_export(runner, "run", "cql.onnx")
    assert by_run["lengths"] == [200]
    assert exported["inputs"] == ["obs", "epsilon"]
    assert by_onnx["mean_return"] == pytest.approx(by_run["mean_return"], rel=1e-4)
    # The graph is the checkpoint's policy: tanh(mean + std * epsilon).
    assert_gaussian_graph("cql.onnx", whole["policy"])


def test_cql_cartpole_trains_on_a_store_and_exports_its_greedy_q_network(
    runner: CliRunner, offline_stores: Path, in_tmp: Path
) -> None:
    trained = runner.invoke(app, ["train", "cql_cartpole", "--memory",
                                  str(offline_stores / "cartpole.zarr"), "--no-live",
                                  "--run-dir", "run", "--steps", "20", *SMALL])  # fmt: skip
    assert trained.exit_code == 0, trained.output
    by_run, exported, by_onnx = evaluate_and_export(runner, "run", "cql.onnx")
    assert exported["outputs"] == ["actions", "q_values"]
    assert by_onnx["returns"] == by_run["returns"]
    from emote_core.nn import DiscreteActionValueMlp

    q = DiscreteActionValueMlp(observation_dim=4, num_actions=2, hidden_dims=[16])
    q.load_state_dict(checkpoint_networks(in_tmp / "run")["q"])
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
    runner: CliRunner, offline_stores: Path, tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    assert_refused(runner, tmp_path, "cql_pendulum", args, message, stores=offline_stores)
