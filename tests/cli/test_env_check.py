"""``emote env check``: the checklist and its JSON on recipes, ids and entry points; exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emote_cli._common import ExitCode
from emote_cli.app import app

CHECKS = [
    "made", "gymnasium_checker", "spaces", "step", "observations", "seeding", "episodes_end",
    "observation_scale", "step_time",
]  # fmt: skip

ENV_MODULE = '''
import gymnasium as gym
import numpy as np
from gymnasium import spaces


class PointEnv(gym.Env):
    """A point steered towards the origin; observations in raw units of a few hundred."""

    def __init__(self, scale=1.0, nan_at=None):
        self.observation_space = spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.scale = scale
        self.nan_at = nan_at

    def _observation(self):
        observation = (self.position * self.scale).astype(np.float32)
        if self.nan_at is not None and self.t >= self.nan_at:
            observation[1] = np.nan
        return observation

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position = self.np_random.uniform(-1.0, 1.0, size=2)
        self.t = 0
        return self._observation(), {}

    def step(self, action):
        self.t += 1
        self.position = self.position + 0.1 * np.asarray(action, dtype=np.float64)
        reward = -float(np.linalg.norm(self.position))
        return self._observation(), reward, self.t >= 25, False, {}
'''


def check(runner: CliRunner, *args: str) -> tuple[int, dict]:
    """Runs ``emote env check ... --json``: its exit code and its one JSON document."""
    result = runner.invoke(app, ["env", "check", *args, "--json"])
    return result.exit_code, json.loads(result.stdout)


def statuses(document: dict) -> dict[str, str]:
    return {item["name"]: item["status"] for item in document["checks"]}


def write_module(directory: Path, name: str) -> None:
    (directory / f"{name}.py").write_text(ENV_MODULE, encoding="utf-8")


@pytest.mark.parametrize(
    ("recipe", "env_id", "space"),
    [
        ("sac_pendulum", "Pendulum-v1", "Box(1,) float32"),
        ("dqn_cartpole", "CartPole-v1", "Discrete(2)"),
    ],
)
def test_a_shipped_recipe_passes_as_text_and_json(
    runner: CliRunner, recipe: str, env_id: str, space: str
) -> None:
    result = runner.invoke(app, ["env", "check", recipe, "--steps", "300"])
    assert result.exit_code == ExitCode.OK, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"env check: {env_id} (recipe ")
    assert lines[0].endswith(f"{recipe}.toml)")
    assert [line.split()[0] for line in lines[1:-1]] == ["ok"] * len(CHECKS)
    assert f"actions {space}" in result.stdout
    assert lines[-1] == "passed"

    code, document = check(runner, recipe, "--steps", "300")
    assert code == ExitCode.OK
    assert document["env"] == env_id and document["passed"] is True
    assert document["recipe"].endswith(f"recipes/{recipe}.toml")
    assert [item["name"] for item in document["checks"]] == CHECKS
    assert set(statuses(document).values()) == {"pass"}


def test_a_gymnasium_id(runner: CliRunner) -> None:
    code, document = check(runner, "MountainCarContinuous-v0", "--steps", "200")
    assert code == ExitCode.OK
    assert document["recipe"] is None
    assert document["checks"][0]["detail"] == "Continuous_MountainCarEnv (gymnasium Env)"
    episodes = next(item for item in document["checks"] if item["name"] == "episodes_end")
    assert episodes == {
        "name": "episodes_end",
        "status": "warn",
        "detail": "no episode ended in 200 steps of random actions",
        "fix": "set [env] max_episode_steps",
    }


def test_an_entry_point_in_the_current_directory_writes_no_file(
    runner: CliRunner, in_tmp: Path
) -> None:
    write_module(in_tmp, "cli_point_env")
    before = sorted(p.name for p in in_tmp.rglob("*"))
    code, document = check(runner, "cli_point_env:PointEnv", "--steps", "100")
    assert code == ExitCode.OK, document
    assert document["env"] == "cli_point_env:PointEnv"
    assert document["checks"][0]["detail"] == "PointEnv (gymnasium Env)"
    assert statuses(document)["episodes_end"] == "pass"
    assert sorted(p.name for p in in_tmp.rglob("*")) == before  # not even __pycache__


def test_a_failing_check_exits_1_with_its_fix(runner: CliRunner, tmp_path: Path) -> None:
    write_module(tmp_path, "cli_nan_env")
    recipe = tmp_path / "nan.toml"
    recipe.write_text(
        'algorithm = "sac"\n[env]\nentry_point = "cli_nan_env:PointEnv"\nkwargs = { nan_at = 3 }\n',
        encoding="utf-8",
    )
    result = runner.invoke(app, ["env", "check", str(recipe), "--steps", "50"])
    assert result.exit_code == ExitCode.ERROR
    lines = result.stdout.splitlines()
    failed = lines.index("  FAIL  observations: step 3: observation 'obs' holds NaN or inf")
    assert (
        lines[failed + 1]
        == "        fix: return finite observations (no NaN or inf) from reset and step"
    )
    assert "  skip  episodes end: not run: the observations check failed" in lines
    assert lines[-1] == "FAILED: 1 check failed"
    assert result.stderr == (
        "error: env 'cli_nan_env:PointEnv' failed 1 check (observations); the checklist gives "
        "the fix for each\n"
    )

    code, document = check(runner, str(recipe), "--steps", "50")
    assert code == ExitCode.ERROR
    assert document["passed"] is False and document["exit_code"] == ExitCode.ERROR
    assert document["error"].startswith("env 'cli_nan_env:PointEnv' failed 1 check")


def test_the_recipe_directory_holds_the_module_and_its_normalisation_counts(
    runner: CliRunner, tmp_path: Path, in_tmp: Path
) -> None:
    folder = tmp_path / "game"
    folder.mkdir()
    write_module(folder, "cli_raw_env")
    recipe = folder / "raw.toml"
    table = '[env]\nentry_point = "cli_raw_env:PointEnv"\nkwargs = { scale = 400.0 }\n'
    recipe.write_text(f'algorithm = "sac"\n{table}', encoding="utf-8")
    code, document = check(runner, str(recipe), "--steps", "100")
    assert code == ExitCode.OK  # a warning does not fail
    scale = next(item for item in document["checks"] if item["name"] == "observation_scale")
    assert scale["status"] == "warn"
    assert scale["fix"] == "set [env] normalize_observations = true"

    recipe.write_text(
        f'algorithm = "sac"\n{table}normalize_observations = true\n', encoding="utf-8"
    )
    code, document = check(runner, str(recipe), "--steps", "100")
    assert statuses(document)["observation_scale"] == "pass"


def test_an_env_that_cannot_be_made_fails_the_made_check(runner: CliRunner, in_tmp: Path) -> None:
    code, document = check(runner, "no_such_module_h2:Game")
    assert code == ExitCode.ERROR
    assert [(item["name"], item["status"]) for item in document["checks"]] == [("made", "fail")]
    assert "'no_such_module_h2' is not importable" in document["checks"][0]["detail"]

    result = runner.invoke(app, ["env", "check", "no_such_module_h2:Game"])
    assert result.exit_code == ExitCode.ERROR
    assert result.stdout.splitlines()[1].startswith("  FAIL  made: env entry point module")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["sac_pendlum"],
            "ENV_OR_RECIPE 'sac_pendlum' is neither a recipe nor a registered "
            "gymnasium id; did you mean sac_pendulum,",
        ),
        (["CartPole-v1", "--steps", "0"], "Invalid value for '--steps'"),
        ([], "Missing argument 'ENV_OR_RECIPE'"),
    ],
)
def test_usage_errors_exit_2(runner: CliRunner, args: list[str], message: str) -> None:
    result = runner.invoke(app, ["env", "check", *args])
    assert result.exit_code == ExitCode.USAGE
    assert message in " ".join(result.stderr.split())

    as_json = runner.invoke(app, ["env", "check", *args, "--json"])
    assert as_json.exit_code == ExitCode.USAGE
    document = json.loads(as_json.stdout)
    assert document["exit_code"] == ExitCode.USAGE and message in document["error"]


def test_a_pettingzoo_entry_point_keeps_stdout_one_document(runner: CliRunner) -> None:
    code, document = check(runner, "mpe2.simple_spread_v3:parallel_env", "--steps", "60")
    assert code == ExitCode.OK, document
    assert document["checks"][0]["detail"] == "raw_env (PettingZoo ParallelEnv)"
    assert statuses(document)["pettingzoo_api"] == "pass"
    spaces = next(item for item in document["checks"] if item["name"] == "spaces")
    assert spaces["detail"] == (
        "group 'agent' (3 agents): observations Box(18,) float32, actions Discrete(5)"
    )
