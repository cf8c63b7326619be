"""Implicit Q-Learning through the command line: iql_pendulum trained from a store that
``emote collect`` made, resumed, evaluated and exported with ONNX parity to the checkpoint's
policy; what it refuses (training live, a store of discrete actions), leaving no run behind."""

from __future__ import annotations

from pathlib import Path

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

SMALL = small_training("iql")
pytestmark = pytest.mark.usefixtures("restore_torch_threads")


def test_iql_pendulum_trains_from_a_store_resumes_then_evaluates_and_exports_with_parity(
    runner: CliRunner, offline_stores: Path, in_tmp: Path
) -> None:
    store = str(offline_stores / "pendulum.zarr")
    trained = runner.invoke(app, ["train", "iql_pendulum", "--memory", store, "--no-live",
                                  "--run-dir", "run", "--steps", "20", *SMALL])  # fmt: skip
    assert trained.exit_code == 0, trained.output
    resumed = runner.invoke(app, ["train", "--resume", "--run-dir", "run", "--memory", store,
                                  "--no-live", "--steps", "40", "--device", "cpu",
                                  "--threads", "1", "-q"])  # fmt: skip
    assert resumed.exit_code == 0, resumed.output
    latest, checkpoint = load_latest_checkpoint(in_tmp / "run")
    assert latest.name == "checkpoint_40.tar"
    assert set(checkpoint["callbacks"]) >= {"iql_target", "value", "q", "policy"}
    by_run, exported, by_onnx = evaluate_and_export(runner, "run", "iql.onnx")
    assert by_run["lengths"] == [200]
    assert exported["inputs"] == ["obs", "epsilon"]
    assert by_onnx["mean_return"] == pytest.approx(by_run["mean_return"], rel=1e-4)
    # The graph is the checkpoint's policy: tanh(mean + std * epsilon).
    assert_gaussian_graph("iql.onnx", checkpoint["callbacks"]["policy"]["network_state_dict"])


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
    runner: CliRunner, offline_stores: Path, tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    assert_refused(runner, tmp_path, "iql_pendulum", args, message, stores=offline_stores)
