"""Fixtures of the command-line tests, and what the tests of the offline families (bc, iql,
cql) share: their stores, collected once per session, a tiny training run's options, the check
of a refusal and of an exported Gaussian policy."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh working directory: what a command writes by relative path lands in it."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="session")
def offline_stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Random-policy stores that ``emote collect`` made (seed 3): ``pendulum.zarr`` of 2
    Pendulum episodes and ``cartpole.zarr`` of 3 CartPole episodes. Tests only read them."""
    from emote_cli.app import app
    from tests.conftest import kept_logging

    root = tmp_path_factory.mktemp("offline_stores")
    runner = CliRunner(env={"COLUMNS": "200"})
    with kept_logging():
        for recipe, out, episodes in (("sac_pendulum", "pendulum.zarr", "2"),
                                      ("dqn_cartpole", "cartpole.zarr", "3")):  # fmt: skip
            args = ["collect", recipe, "--out", str(root / out), "--episodes", episodes]
            collected = runner.invoke(app, [*args, "--seed", "3", "-q"])
            assert collected.exit_code == 0, collected.output
    return root


def small_training(family: str, *more: str) -> tuple[str, ...]:
    """The options of a tiny training run of ``family``'s recipe on the CPU, on one torch thread
    (use the ``restore_torch_threads`` fixture): batches of 32, hidden layers of 16, one
    evaluation episode at the end only, a checkpoint every 20 updates, quiet; then ``more``."""
    return ("--device", "cpu", "--threads", "1", "--set", "memory.batch_size=32",
            "--set", "eval.episodes=1", "--set", "eval.interval=0",
            "--set", f"{family}.hidden_dims=[16]", "--set", "training.checkpoint_interval=20",
            "-q", *more)  # fmt: skip


def assert_refused(
    runner: CliRunner, where: Path, recipe: str, args: Sequence[str], message: str, *, stores: Path
) -> None:
    """``emote train recipe *args`` (``{stores}`` in them replaced by ``stores``) into
    ``where/run`` fails with exit 1 or 2 and one error line that says ``message`` (whitespace
    folded), and leaves no run directory."""
    from emote_cli.app import app

    args = [arg.format(stores=stores) for arg in args]
    result = runner.invoke(app, ["train", recipe, *args, "--run-dir", str(where / "run"),
                                 "--steps", "2", "--device", "cpu"])  # fmt: skip
    assert result.exit_code in (1, 2), result.output
    errors = [line for line in result.stderr.splitlines() if line.lower().startswith("error")]
    assert len(errors) == 1 and message in " ".join(result.stderr.split()), result.stderr
    assert not (where / "run").exists()


def evaluate_and_export(runner: CliRunner, run: str, onnx: str) -> tuple[Any, Any, Any]:
    """``emote eval`` of the run, ``emote export onnx`` of it to ``onnx`` and ``emote eval`` of
    that file, each with ``--json``: their three documents."""
    from emote_cli.app import app

    def json_of(*args: str) -> Any:
        result = runner.invoke(app, list(args))
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    by_run = json_of("eval", run, "--json", "--min-return", "-1e9")
    exported = json_of("export", "onnx", run, "--out", onnx, "--json")
    by_onnx = json_of("eval", onnx, "--json", "--min-return", "-1e9")
    return by_run, exported, by_onnx


def assert_gaussian_graph(
    onnx: str, state: dict[str, Any], *, log_std: tuple[float, float] = (-20.0, 2.0)
) -> None:
    """The graph in ``onnx`` is the Pendulum policy of ``state`` (a ``GaussianMlpPolicy`` of
    hidden layers of 16 and that log-std clamp): ``tanh(mean + std * epsilon)`` on two rows."""
    import onnxruntime
    import torch

    from emote_core.nn import GaussianMlpPolicy

    policy = GaussianMlpPolicy(observation_dim=3, action_dim=1, hidden_dims=[16],
                               log_std_min=log_std[0], log_std_max=log_std[1])  # fmt: skip
    policy.load_state_dict(state)
    policy.eval()
    obs = np.array([[1.0, 0.0, 0.5], [0.0, 1.0, -2.0]], dtype=np.float32)
    epsilon = np.array([[0.3], [-1.0]], dtype=np.float32)
    (actions,) = onnxruntime.InferenceSession(onnx).run(None, {"obs": obs, "epsilon": epsilon})
    with torch.no_grad():
        expected = policy(torch.from_numpy(obs), torch.from_numpy(epsilon)).numpy()
    np.testing.assert_allclose(actions, expected, atol=1e-5)
