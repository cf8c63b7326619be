"""Making a user's env by id, ``module:EnvId`` or entry point, recording how, and rebuilding it."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import gymnasium
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from emote_core.env import make_vector_env
from emote_core.env.making import (
    EnvSource,
    check_env_record,
    env_factory,
    env_record,
    is_entry_point_text,
    is_parallel_env,
)
from emote_core.errors import ConfigurationError

POINT_ENV = """
import gymnasium as gym
import numpy as np

ID = __name__ + "/Point-v0"


class PointEnv(gym.Env):
    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, scale=1.0, render_mode=None, arity=5, nan_at=None):
        self.scale, self.render_mode, self.arity, self.nan_at = scale, render_mode, arity, nan_at
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
        obs = self.pos.copy()
        if self.nan_at == self.t:
            obs[1] = np.nan
        result = (obs, -float(np.abs(self.pos).sum()), False, self.t >= 50, {})
        return result[:4] if self.arity == 4 else result

    def render(self):
        return np.zeros((4, 4, 3), np.uint8)


def make_list(**kwargs):
    return [1, 2]


NOT_CALLABLE = 3
gym.register(ID, entry_point=PointEnv)
"""


@pytest.fixture
def user_module(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A PointEnv module in its own directory (not on sys.path), named uniquely; forgotten and
    its ids unregistered afterwards."""
    name = f"pointenv_{uuid.uuid4().hex[:8]}"
    folder = tmp_path / "envs"
    folder.mkdir()
    (folder / f"{name}.py").write_text(POINT_ENV)
    yield name, folder
    sys.modules.pop(name, None)
    for env_id in [i for i in gymnasium.registry if i.startswith(f"{name}/")]:
        del gymnasium.registry[env_id]


def test_an_entry_point_makes_the_env_with_its_kwargs_from_the_search_paths(
    user_module: tuple[str, Path],
) -> None:
    name, folder = user_module
    before = list(sys.path)
    source = EnvSource(entry_point=f"{name}:PointEnv", kwargs={"scale": 50.0},
                       max_episode_steps=3, search_paths=(str(folder),))  # fmt: skip
    make = env_factory(source)
    env = make(render_mode="rgb_array")
    assert env.unwrapped.scale == 50.0 and env.unwrapped.render_mode == "rgb_array"
    env.reset(seed=0)
    ends = [env.step(env.action_space.sample())[3] for _ in range(3)]
    assert ends == [False, False, True]  # max_episode_steps cut the episode
    assert sys.path == before  # the search paths were put there only while importing

    record = env_record(source)
    assert record["kind"] == "entry_point" and record["entry_point"] == f"{name}:PointEnv"
    assert record["kwargs"] == {"scale": 50.0} and record["max_episode_steps"] == 3
    (module,) = record["modules"]
    assert module["name"] == name
    assert module["file"] == str((folder / f"{name}.py").resolve())
    assert len(module["sha256"]) == 64 and module["version"] is None


def test_module_colon_id_and_imports_make_registered_envs(user_module: tuple[str, Path]) -> None:
    name, folder = user_module
    by_module = env_factory(EnvSource(id=f"{name}:{name}/Point-v0", search_paths=(str(folder),)))
    assert type(by_module().unwrapped).__name__ == "PointEnv"
    sys.modules.pop(name)
    del gymnasium.registry[f"{name}/Point-v0"]
    by_imports = EnvSource(id=f"{name}/Point-v0", imports=(name,), search_paths=(str(folder),))
    assert type(env_factory(by_imports)().unwrapped).__name__ == "PointEnv"
    assert [m["name"] for m in env_record(by_imports)["modules"]] == [name]


def test_a_factory_makes_a_vector_env_with_wrappers_and_render_mode(
    user_module: tuple[str, Path],
) -> None:
    name, folder = user_module
    make = env_factory(EnvSource(entry_point=f"{name}:PointEnv", search_paths=(str(folder),)))
    wrapped = []

    def wrapper(env: gymnasium.Env) -> gymnasium.Wrapper:
        wrapped.append(env)
        return gymnasium.wrappers.ClipAction(env)

    vector = make_vector_env(make, num_envs=3, wrappers=[wrapper], render_mode="rgb_array")
    assert vector.num_envs == 3 and len(wrapped) == 3
    assert vector.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    assert all(env.unwrapped.render_mode == "rgb_array" for env in vector.envs)
    observations, _ = vector.reset(seed=0)
    assert observations.shape == (3, 2)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({"entry_point": "no_colon"}, "env entry point must be 'package.module:callable'"),
        (
            {"entry_point": "no_such_module_xyz:Env"},
            "env entry point module 'no_such_module_xyz' is not importable: not found on "
            "PYTHONPATH, ",
        ),
        ({"entry_point": "{name}:PointEnb"}, "has no attribute 'PointEnb'; did you mean PointEnv?"),
        ({"entry_point": "{name}:NOT_CALLABLE"}, "is a value of type int, not callable"),
        ({"entry_point": "{name}:make_list"}, "returned a value of type list, not a gymnasium.Env"),
        (
            {"entry_point": "{name}:PointEnv", "kwargs": {"arity": 4}},
            "step() returned a tuple of 4 values; gymnasium envs return 5",
        ),
        (
            {"entry_point": "{name}:PointEnv", "kwargs": {"nan_at": 2}},
            "step() returned an observation with NaN or inf at index [1]",
        ),
        (
            {"entry_point": "{name}:PointEnv", "kwargs": {"colour": 1}},
            "rejected env.kwargs: PointEnv.__init__() got an unexpected keyword argument 'colour'",
        ),
        (
            {"id": "{name}:Pont-v0"},
            "module '{name}' imports but registers no gymnasium id 'Pont-v0'; did you mean "
            "{name}/Point-v0?",
        ),
        ({"id": "{name}:{name}/Point-v0", "kwargs": {"arity": 4}}, "step() returned a tuple of 4"),
        ({"id": "Pendulum-v9"}, "'Pendulum-v9' is not a registered gymnasium environment"),
        ({"imports": ("missing_mod_xyz",)}, "env.imports module 'missing_mod_xyz' is not "),
    ],
)
def test_bad_env_sources_are_one_line_errors(
    user_module: tuple[str, Path], source: dict, message: str
) -> None:
    name, folder = user_module
    fields = {key: (value.format(name=name) if isinstance(value, str) else value)
              for key, value in source.items()}  # fmt: skip
    fields.setdefault("id", "Pendulum-v1")
    with pytest.raises(ConfigurationError) as raised:
        env = env_factory(EnvSource(search_paths=(str(folder),), **fields))()
        env.reset(seed=0)
        for _ in range(3):
            env.step(env.action_space.sample())
    text = str(raised.value)
    assert message.format(name=name) in text and "\n" not in text
    if "not importable" in message:
        assert str(folder) in text  # where it was looked for


def test_a_record_is_checked_against_the_files_now(
    user_module: tuple[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    name, folder = user_module
    record = env_record(EnvSource(entry_point=f"{name}:PointEnv", search_paths=(str(folder),)))
    sys.modules.pop(name)
    del gymnasium.registry[f"{name}/Point-v0"]
    rebuilt = EnvSource.from_record(record)  # no search path given: the record has it
    assert rebuilt.search_paths == (str(folder.resolve()),)
    assert type(env_factory(rebuilt)().unwrapped).__name__ == "PointEnv"

    file = folder / f"{name}.py"
    file.write_text(file.read_text() + "\n# changed\n")
    with caplog.at_level(logging.WARNING):
        check_env_record(record)
    assert f"env module file '{file.resolve()}' changed" in caplog.text

    file.rename(tmp_path / "elsewhere.py")
    with pytest.raises(ConfigurationError, match=f"env module '{name}' was recorded at '{file}"):
        EnvSource.from_record(record)


def test_entry_points_and_ids_are_told_apart() -> None:
    assert is_entry_point_text("myenv:PointEnv") and is_entry_point_text("a.b:make.env")
    assert not is_entry_point_text("myenv:PointEnv-v0")
    assert not is_entry_point_text("Pendulum-v1") and not is_entry_point_text("ns/Env-v0")


def test_parallel_envs_are_detected_and_gymnasium_envs_never_import_pettingzoo() -> None:
    code = textwrap.dedent(
        """
        import sys, gymnasium
        from emote_core.env.making import is_parallel_env
        assert not is_parallel_env(gymnasium.make("Pendulum-v1"))
        print("pettingzoo" in sys.modules)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    from mpe2 import simple_spread_v3

    assert is_parallel_env(simple_spread_v3.parallel_env())
    assert not is_parallel_env(simple_spread_v3.env())  # the AEC API is not played
    assert not is_parallel_env(np.zeros(3))


def test_an_entry_point_in_a_package_of_an_extra_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from emote_core.utils.dependencies import MissingDependencyError

    for name in ["mpe2", *(m for m in sys.modules if m.startswith("mpe2."))]:
        monkeypatch.setitem(sys.modules, name, None)  # as if the multiagent extra were missing
    source = EnvSource(id="Pendulum-v1", entry_point="mpe2.simple_spread_v3:parallel_env")
    with pytest.raises(MissingDependencyError) as raised:
        env_factory(source)()
    text = str(raised.value)
    assert "needs the optional dependency mpe2" in text and "multiagent" in text
    assert "\n" not in text
