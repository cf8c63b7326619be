"""`emote export onnx RUN --profile ml-agents`, then `emote eval` on the file, as a user runs
them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emote_cli.app import app
from tests.onnx.test_ml_agents import Behaviour, unity_load_checks


def run(runner: CliRunner, *args: str):
    return runner.invoke(app, list(args))


def train(directory: Path, recipe: str, steps: int) -> Path:
    run_dir = directory / recipe
    result = CliRunner(env={"COLUMNS": "200"}).invoke(
        app, ["train", recipe, "--steps", str(steps), "--run-dir", str(run_dir), "--json", "-q"]
    )
    assert result.exit_code == 0, result.output
    return run_dir


@pytest.fixture(scope="module")
def sac_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny sac_hit_the_middle run: 2 floats in, 1 continuous action out."""
    return train(tmp_path_factory.mktemp("runs"), "sac_hit_the_middle", 30)


@pytest.fixture(scope="module")
def dqn_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny dqn_cartpole run: 4 floats in, one branch of 2 discrete actions out."""
    return train(tmp_path_factory.mktemp("runs"), "dqn_cartpole", 20)


def evaluate(runner: CliRunner, target: Path | str) -> dict:
    result = run(runner, "eval", str(target), "--episodes", "3", "--min-return", "-1000",
                 "--json", "-q")  # fmt: skip
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize(
    ("fixture", "behaviour", "inputs", "actions"),
    [
        ("sac_run", Behaviour(sensors=[(2,)], continuous=1), ["obs_0", "epsilon"], "continuous"),
        ("dqn_run", Behaviour(sensors=[(4,)], branches=[2]), ["obs_0", "action_masks"],
         "discrete"),
    ],
)  # fmt: skip
def test_a_run_exports_what_unity_loads_and_eval_runs_it_as_the_run(
    runner: CliRunner, in_tmp: Path, request: pytest.FixtureRequest, fixture: str,
    behaviour: Behaviour, inputs: list[str], actions: str,
) -> None:  # fmt: skip
    trained: Path = request.getfixturevalue(fixture)
    result = run(runner, "export", "onnx", str(trained), "--out", "policy.onnx",
                 "--profile", "ml-agents", "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["profile"] == "ml-agents" and summary["opset"] == 15
    assert summary["inputs"] == inputs and summary["observation_keys"] == ["obs"]
    assert summary["outputs"] == [
        "version_number", "memory_size", f"{actions}_actions",
        f"{actions}_action_output_shape", f"deterministic_{actions}_actions",
    ]  # fmt: skip
    assert 0.0 <= summary["max_abs_diff"] < 1e-5
    assert sorted(p.name for p in in_tmp.iterdir()) == ["policy.onnx"]
    for deterministic in (True, False):
        assert unity_load_checks(Path("policy.onnx"), behaviour, deterministic=deterministic) == []

    from_file, from_run = evaluate(runner, "policy.onnx"), evaluate(runner, trained)
    assert from_file["env"] == from_run["env"] and from_file["policy"] == "policy.onnx"
    assert from_file["returns"] == pytest.approx(from_run["returns"], abs=1e-4)
    recipe = trained.name  # the runs are named after their recipes
    collected = run(runner, "collect", recipe, "--policy", "policy.onnx", "--out", "c.zarr",
                    "--episodes", "2", "--json", "-q")  # fmt: skip
    assert collected.exit_code == 0, collected.output
    assert json.loads(collected.stdout)["episodes"] == 2


def test_the_text_summary_names_the_profile_and_the_tensors(
    runner: CliRunner, sac_run: Path, in_tmp: Path
) -> None:
    result = run(runner, "export", "onnx", str(sac_run), "--out", "unity.onnx", "--profile",
                 "ml-agents", "--opset", "9")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "to unity.onnx: opset 9, obs_0, epsilon -> version_number, memory_size" in result.stdout
    assert unity_load_checks(Path("unity.onnx"), Behaviour([(2,)], continuous=1),
                             deterministic=True) == []  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--opset", "18"], "--opset 18 is not one Unity's inference engine (Sentis) loads"),
        (["--profile", "unity"], "'unity' is not one of"),
    ],
)
def test_a_profile_or_opset_unity_cannot_load_is_a_usage_error(
    runner: CliRunner, sac_run: Path, in_tmp: Path, args: list[str], message: str
) -> None:
    full = ["--profile", "ml-agents", *args] if args[0] == "--opset" else args
    result = run(runner, "export", "onnx", str(sac_run), "--out", "policy.onnx", *full)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert list(in_tmp.iterdir()) == []


COUNTER_ENV = '''
import gymnasium
import numpy as np
from gymnasium import spaces


class Counter(gymnasium.Env):
    """Integer counts in (int64), one float action out."""

    observation_space = spaces.Box(0, 100, shape=(2,), dtype=np.int64)
    action_space = spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0, 0], dtype=np.int64), {}

    def step(self, action):
        self.t += 1
        observation = np.array([self.t, 1], dtype=np.int64)
        return observation, float(-abs(action[0])), False, self.t >= 5, {}
'''

COUNTER_RECIPE = """
algorithm = "sac"
seed = 0

[env]
entry_point = "counter_env:Counter"

[memory]
warmup_steps = 10
batch_size = 8

[sac]
hidden_dims = [8]
"""


def test_observations_unity_cannot_send_are_refused_in_one_line(
    runner: CliRunner, in_tmp: Path
) -> None:
    (in_tmp / "counter_env.py").write_text(COUNTER_ENV)
    (in_tmp / "counter.toml").write_text(COUNTER_RECIPE)
    trained = run(runner, "train", "counter.toml", "--steps", "5", "--run-dir", "r", "-q")
    assert trained.exit_code == 0, trained.output
    result = run(runner, "export", "onnx", "r", "--out", "policy.onnx", "--profile", "ml-agents")
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        "error: --profile ml-agents cannot express observation 'obs' of dtype int64: Unity sends "
        "floats (and uint8 images as floats in [0, 1]); wrap the env to give float32, or export "
        "with --profile emote"
    ]
    files = sorted(p.name for p in in_tmp.iterdir() if p.is_file())
    assert files == ["counter.toml", "counter_env.py"]  # no policy.onnx, no temporary file
    emote = run(runner, "export", "onnx", "r", "--out", "policy.onnx", "--json")
    assert emote.exit_code == 0 and json.loads(emote.stdout)["profile"] == "emote"


def test_a_normalising_run_sends_raw_observations_through_its_ml_agents_file(
    runner: CliRunner, in_tmp: Path
) -> None:
    trained = run(runner, "train", "sac_hit_the_middle", "--steps", "30", "--run-dir", "norm",
                  "--set", "env.normalize_observations=true", "-q")  # fmt: skip
    assert trained.exit_code == 0, trained.output
    result = run(runner, "export", "onnx", "norm", "--out", "policy.onnx", "--profile",
                 "ml-agents", "-q")  # fmt: skip
    assert result.exit_code == 0, result.output
    from_file, from_run = evaluate(runner, "policy.onnx"), evaluate(runner, "norm")
    assert from_file["returns"] == pytest.approx(from_run["returns"], abs=1e-4)
