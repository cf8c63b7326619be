"""A user's own env through the command line: trained from its file beside the recipe, the run
rebuilding it from any directory, ``--env`` overrides, and bad env input as one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import gymnasium
import pytest
from typer.testing import CliRunner

from emote_cli.app import app

POINT_ENV = """
import os

import gymnasium as gym
import numpy as np

if os.environ.get("POINT_ENV_FORBIDDEN"):  # a file to leave as proof of the import
    open(os.environ["POINT_ENV_FORBIDDEN"], "w").close()
    raise RuntimeError("the env module was imported")


class PointEnv(gym.Env):
    def __init__(self, scale=1.0, render_mode=None):
        self.scale, self.render_mode = scale, render_mode
        self.observation_space = gym.spaces.Box(-100, 100, (2,), np.float32)
        self.action_space = gym.spaces.Box(-1, 1, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = (self.np_random.uniform(-1, 1, 2) * self.scale).astype(np.float32)
        self.t = 0
        return self.pos.copy(), {}

    def step(self, action):
        self.pos = (self.pos + 0.1 * np.asarray(action, np.float32)).astype(np.float32)
        self.t += 1
        return self.pos.copy(), -float(np.abs(self.pos).sum()), False, self.t >= 10, {}


class NanEnv(PointEnv):
    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        obs[1] = np.nan if self.t == 3 else obs[1]
        return obs, reward, terminated, truncated, info


class OldApiEnv(PointEnv):
    def step(self, action):
        return super().step(action)[:4]


def make_nothing(**kwargs):
    return "not an env"


NOT_CALLABLE = 3
gym.register(__name__ + "/Point-v0", entry_point=PointEnv)
"""

FAST = """
[memory]
warmup_steps = 30
batch_size = 8

[training]
bp_steps = 10
checkpoint_interval = 10

[eval]
episodes = 1
"""


@dataclass
class OwnEnv:
    module: str
    folder: Path  # the module and the recipe
    recipe: Path
    work: Path  # where train runs
    other: Path  # a third directory

    def forget(self) -> None:
        """What the process imported of the module and registered: the next command imports it
        again, from wherever it finds it."""
        sys.modules.pop(self.module, None)
        for env_id in [i for i in gymnasium.registry if i.startswith(f"{self.module}/")]:
            del gymnasium.registry[env_id]

    def write_recipe(self, env_table: str, name: str = "point.toml") -> Path:
        path = self.folder / name
        path.write_text(f'algorithm = "sac"\n\n[env]\n{env_table}\n{FAST}')
        return path


@pytest.fixture
def own_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_torch_thread: None
) -> Iterator[OwnEnv]:
    """A PointEnv module and its recipe in ``envs/``; the test starts in ``work/``."""
    module = f"pointenv_{uuid.uuid4().hex[:8]}"
    folder, work, other = (tmp_path / name for name in ("envs", "work", "other"))
    for made in (folder, work, other):
        made.mkdir()
    (folder / f"{module}.py").write_text(POINT_ENV)
    env = OwnEnv(module, folder, folder / "point.toml", work, other)
    env.write_recipe(f'entry_point = "{module}:PointEnv"\nkwargs = {{ scale = 2.0 }}')
    monkeypatch.chdir(work)
    yield env
    env.forget()


def run_json(runner: CliRunner, *args: str) -> dict:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_an_own_env_trains_beside_its_recipe_and_its_run_rebuilds_it_from_anywhere(
    runner: CliRunner, own_env: OwnEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    module_file = own_env.folder / f"{own_env.module}.py"
    trained = run_json(runner, "train", "../envs/point.toml", "--run-dir", "run")
    run = own_env.work / "run"
    assert trained["steps"] == 10
    record = json.loads((run / "run.json").read_text())["env"]
    assert record["kind"] == "entry_point"
    assert record["entry_point"] == f"{own_env.module}:PointEnv"
    assert record["kwargs"] == {"scale": 2.0}
    (module,) = record["modules"]
    assert module["file"] == str(module_file.resolve()) and len(module["sha256"]) == 64

    monkeypatch.chdir(own_env.other)  # neither the module's nor the run's directory
    own_env.forget()
    evaluated = run_json(runner, "eval", str(run), "--episodes", "1")
    assert evaluated["env"] == f"{own_env.module}:PointEnv" and evaluated["episodes"] == 1
    own_env.forget()
    exported = run_json(runner, "export", "onnx", str(run), "--out", "policy.onnx")
    assert exported["out"] == "policy.onnx" and Path("policy.onnx").is_file()
    own_env.forget()
    collected = run_json(runner, "collect", "--policy", str(run), "--out", "s.zarr",
                         "--episodes", "2")  # fmt: skip
    assert collected["episodes"] == 2
    own_env.forget()
    resumed = run_json(runner, "train", "--resume", "--run-dir", str(run), "--steps", "20")
    assert resumed["steps"] == 20 and resumed["updates"] == 10
    own_env.forget()
    onnx_eval = run_json(runner, "eval", "policy.onnx", "--episodes", "1")  # by its run's record
    assert onnx_eval["env"] == f"{own_env.module}:PointEnv"

    # The store records the same env record in its provenance, besides env_id for old readers.
    inspected = run_json(runner, "memory", "inspect", "s.zarr")
    (session,) = [s for sessions in inspected["provenance"]["shards"].values() for s in sessions]
    assert session["env_id"] == f"{own_env.module}:PointEnv"
    assert session["env"]["modules"][0]["sha256"] == module["sha256"]

    # A changed module is a warning; a vanished one is one line naming it and where it was.
    module_file.write_text(module_file.read_text() + "\n# tuned\n")
    own_env.forget()
    changed = runner.invoke(
        app, ["collect", "--policy", str(run), "--out", "c.zarr", "--episodes", "1"]
    )  # collect reads the run's recipe twice (its env, its policy): one warning all the same
    assert changed.exit_code == 0, changed.output
    warned = f"warning: env module file '{module_file.resolve()}' changed since the run recorded"
    assert [line for line in changed.stderr.splitlines() if line.startswith(warned)] != []
    assert len([line for line in changed.stderr.splitlines() if "warning: env" in line]) == 1
    module_file.unlink()
    own_env.forget()
    for command in (["eval", str(run)], ["export", "onnx", str(run), "--out", "again.onnx"],
                    ["collect", "--policy", str(run), "--out", "t.zarr", "--episodes", "1"],
                    ["train", "--resume", "--run-dir", str(run), "--steps", "30"]):  # fmt: skip
        gone = runner.invoke(app, command)
        assert gone.exit_code == 1, (command, gone.output)
        assert gone.stderr.strip() == (
            f"error: env module '{own_env.module}' was recorded at '{module_file.resolve()}', "
            "which no longer exists (moved or deleted); put the file back there to rebuild the "
            "run's env"
        ), command
    assert not Path("again.onnx").exists() and not Path("t.zarr").exists()


def test_env_overrides_the_recipe_on_train_collect_and_eval(
    runner: CliRunner, own_env: OwnEnv
) -> None:
    pendulum = own_env.write_recipe('id = "Pendulum-v1"', name="pendulum.toml")
    entry = f"{own_env.module}:PointEnv"
    run_json(runner, "train", str(pendulum), "--env", entry, "--run-dir", "run")
    assert json.loads(Path("run/run.json").read_text())["env"]["entry_point"] == entry
    assert f'entry_point = "{entry}"' in Path("run/recipe.toml").read_text()

    by_id = f"{own_env.module}:{own_env.module}/Point-v0"  # gymnasium's module:EnvId
    evaluated = run_json(runner, "eval", "run", "--env", by_id, "--episodes", "1")
    assert evaluated["env"] == by_id

    collected = run_json(runner, "collect", str(pendulum), "--env", entry, "--out", "s.zarr",
                         "--episodes", "1")  # fmt: skip
    assert collected["episodes"] == 1
    inspected = run_json(runner, "memory", "inspect", "s.zarr")
    assert inspected["provenance"]["env_id"] == entry

    resumed = runner.invoke(app, ["train", "--resume", "--run-dir", "run", "--env", entry])
    assert resumed.exit_code == 2 and "a resumed run keeps the env it began with" in resumed.stderr
    unnamed = runner.invoke(app, ["collect", "--out", "u.zarr", "--episodes", "1"])
    assert unnamed.exit_code == 2 and "RECIPE is needed with --policy random" in unnamed.stderr
    assert not Path("u.zarr").exists()

    # Without --run-dir, the run's name says which env it ran on.
    named = run_json(runner, "train", str(pendulum), "--env", entry)
    assert Path(named["run_dir"]).name.startswith(f"pendulum-{own_env.module}_PointEnv-")


def test_imports_register_the_recipes_id(runner: CliRunner, own_env: OwnEnv) -> None:
    recipe = own_env.write_recipe(
        f'id = "{own_env.module}/Point-v0"\nimports = ["{own_env.module}"]', name="imports.toml"
    )
    collected = run_json(runner, "collect", str(recipe), "--out", "s.zarr", "--episodes", "2")
    assert collected["episodes"] == 2 and collected["transitions"] == 20


def test_the_memory_commands_never_import_env_code(
    runner: CliRunner, own_env: OwnEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_json(runner, "collect", str(own_env.recipe), "--out", "s.zarr", "--episodes", "2")
    own_env.forget()
    imported = own_env.other / "imported"
    monkeypatch.setenv("POINT_ENV_FORBIDDEN", str(imported))  # importing it now leaves this
    monkeypatch.syspath_prepend(str(own_env.folder))  # and it would be found
    inspected = run_json(runner, "memory", "inspect", "s.zarr")
    assert inspected["episodes"] == 2
    assert run_json(runner, "memory", "verify", "s.zarr")["ok"] is True
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(own_env.other / "datasets"))
    for target in (["copy.zarr"], ["copy.npz"], ["own/point-v0", "--to", "minari"]):
        converted = runner.invoke(app, ["memory", "convert", "s.zarr", *target])
        assert converted.exit_code == 0, converted.output
    assert "an env made from a user's module, which converting never imports" in converted.stderr
    assert not imported.exists() and own_env.module not in sys.modules


@pytest.mark.parametrize(
    ("env_table", "message"),
    [
        ('entry_point = "{module}"', "env entry point must be 'package.module:callable'"),
        (
            'entry_point = "no_such_env_module:Env"',
            "env entry point module 'no_such_env_module' is not importable: not found on "
            "PYTHONPATH, {folder}, {work}; put the file beside the recipe",
        ),
        (
            'entry_point = "{module}:PointEnvv"',
            "env entry point '{module}:PointEnvv': module '{module}' has no attribute 'PointEnvv'; "
            "did you mean PointEnv?",
        ),
        ('entry_point = "{module}:NOT_CALLABLE"', "is a value of type int, not callable"),
        (
            'entry_point = "{module}:make_nothing"',
            "env entry point '{module}:make_nothing' returned a value of type str, not a "
            "gymnasium.Env or a PettingZoo ParallelEnv",
        ),
        (
            'entry_point = "{module}:OldApiEnv"',
            "env '{module}:OldApiEnv': step() returned a tuple of 4 values; gymnasium envs "
            "return 5",
        ),
        (
            'entry_point = "{module}:NanEnv"',
            "env '{module}:NanEnv': step() returned an observation with NaN or inf at index [1]",
        ),
        (
            'id = "{module}:Pointt-v0"',
            "module '{module}' imports but registers no gymnasium id 'Pointt-v0'; did you mean "
            "{module}/Point-v0?",
        ),
    ],
)
@pytest.mark.parametrize("command", ["train", "collect"])
def test_bad_env_input_is_one_line_and_leaves_nothing_behind(
    runner: CliRunner, own_env: OwnEnv, env_table: str, message: str, command: str
) -> None:
    names = {"module": own_env.module, "folder": own_env.folder.resolve(), "work": own_env.work}
    recipe = own_env.write_recipe(env_table.format(**names), name="bad.toml")
    if command == "train":
        args = ["train", str(recipe), "--run-dir", "out"]
    else:
        args = ["collect", str(recipe), "--out", "out", "--episodes", "3"]
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert message.format(**names) in line
    assert "Traceback" not in result.output and "warning:" not in result.stderr
    assert not Path("out").exists()


@pytest.mark.slow  # a real local Ray starts: tens of seconds
def test_ray_workers_rebuild_an_own_env_found_beside_the_recipe(own_env: OwnEnv) -> None:
    """Workers import the module from where the driver found it (the recipe's directory, not
    the current one), through a real local Ray that the command starts."""
    environment = {**os.environ, "COLUMNS": "200", "RAY_AUTH_MODE": "disabled"}
    command = ["collect", "../envs/point.toml", "--out", "r.zarr", "--episodes", "4",
               "--workers", "2", "--json"]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "emote_cli", *command],
        cwd=own_env.work, env=environment, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["episodes"] == 4 and summary["lost_workers"] == []
    assert [worker["status"] for worker in summary["workers"]] == ["finished", "finished"]
