"""Discrete action masks through the command line: train DQN on a masked env, evaluate it, export
it with an ``action_masks`` input, and refuse masks that do not fit."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import onnxruntime
import pytest
import torch
from gymnasium import spaces as gym_spaces
from typer.testing import CliRunner

from emote_cli.app import app
from emote_core.assembly.builders import load_trained_agent
from emote_core.env import MaskedGrid
from emote_core.stores.zarr_store import MemoryStore

RECIPE = """\
algorithm = "dqn"
seed = 0

[env]
id = "{env}"

[memory]
maxlen = 5_000
batch_size = 16
warmup_steps = 40

[training]
bp_steps = 40
checkpoint_interval = 40
export_interval = 40
log_interval = 20

[dqn]
hidden_dims = [16]
target_update_interval = 10
epsilon_decay_steps = 20

[eval]
episodes = 3
"""


class ShortMask(MaskedGrid):
    """A grid whose mask has 3 entries for its 4 actions."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.observation_space = gym_spaces.Dict(
            {"obs": self.observation_space["obs"], "action_mask": gym_spaces.MultiBinary(3)}
        )


class DeadEnd(MaskedGrid):
    """A grid that masks every move after the first step, while the episode goes on."""

    def action_mask(self) -> np.ndarray:
        mask = super().action_mask()
        return mask if np.all(self._position == 0) else np.zeros_like(mask)


class MaskedPoint(gymnasium.Env):
    """Continuous actions with an ``action_mask`` observation, which fits no action."""

    def __init__(self, **kwargs: Any) -> None:
        self.observation_space = gym_spaces.Dict(
            {"obs": gym_spaces.Box(-1.0, 1.0, (1,)), "action_mask": gym_spaces.MultiBinary(2)}
        )
        self.action_space = gym_spaces.Box(-1.0, 1.0, (2,))


TEST_ENVS = {
    "emote-test/ShortMask-v0": ShortMask,
    "emote-test/DeadEnd-v0": DeadEnd,
    "emote-test/MaskedPoint-v0": MaskedPoint,
}


@pytest.fixture(scope="module", autouse=True)
def test_envs() -> Iterator[None]:
    for env_id, env_class in TEST_ENVS.items():
        gymnasium.register(id=env_id, entry_point=env_class)
    yield
    for env_id in TEST_ENVS:
        gymnasium.registry.pop(env_id, None)


def invoke(*args: str) -> Any:
    return CliRunner(env={"COLUMNS": "200"}).invoke(app, list(args))


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny DQN run on emote/MaskedGrid-v0 (40 updates), checkpointed and exported."""
    root = tmp_path_factory.mktemp("masked")
    recipe = root / "masked.toml"
    recipe.write_text(RECIPE.format(env="emote/MaskedGrid-v0"))
    result = invoke("train", str(recipe), "--run-dir", str(root / "run"), "--json", "-q")
    assert result.exit_code == 0, result.output
    return root / "run"


def test_a_masked_run_evaluates_and_exports_a_graph_that_honours_the_mask(
    trained: Path, tmp_path: Path
) -> None:
    evaluated = invoke("eval", str(trained), "--episodes", "4", "--json", "-q")
    assert evaluated.exit_code == 0, evaluated.output
    by_run = json.loads(evaluated.stdout)
    assert len(by_run["returns"]) == 4 and min(by_run["returns"]) > -1.0  # no forfeit

    out = tmp_path / "policy.onnx"
    exported = invoke("export", "onnx", str(trained), "--out", str(out), "--json", "-q")
    assert exported.exit_code == 0, exported.output
    summary = json.loads(exported.stdout)
    assert summary["inputs"] == ["obs", "action_masks"]
    assert summary["outputs"] == ["actions", "q_values"]
    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert [(i.name, i.shape, i.type) for i in session.get_inputs()] == [
        ("obs", ["batch", 2], "tensor(float)"), ("action_masks", ["batch", 4], "tensor(float)")
    ]  # fmt: skip
    props = session.get_modelmeta().custom_metadata_map
    assert props["format_version"] == "2" and props["action_mask_key"] == "action_mask"

    # onnxruntime's greedy actions equal the torch agent's, and are never masked.
    rng = np.random.default_rng(0)
    obs = rng.random((500, 2), dtype=np.float32)
    masks = (rng.random((500, 4)) < 0.5).astype(np.int8)
    masks[np.arange(500), rng.integers(0, 4, 500)] = 1
    _, _, agent, _, _ = load_trained_agent(trained, device=torch.device("cpu"))
    by_torch = agent.act_batch({"obs": obs, "action_mask": masks})
    (by_onnx,) = session.run(["actions"], {"obs": obs, "action_masks": masks.astype(np.float32)})
    assert np.array_equal(by_onnx, by_torch)
    assert np.all(masks[np.arange(500), by_onnx[:, 0]] == 1)
    unmasked = session.run(["actions"], {"obs": obs, "action_masks": np.ones((500, 4), np.float32)})
    assert np.any(masks[np.arange(500), unmasked[0][:, 0]] == 0)  # the mask changed choices

    by_file = invoke("eval", str(out), "--episodes", "4", "--json", "-q")
    assert by_file.exit_code == 0, by_file.output
    assert json.loads(by_file.stdout)["returns"] == by_run["returns"]

    during_training = sorted((trained / "exports").glob("**/*.onnx"))
    assert during_training
    for path in during_training:
        inputs = onnxruntime.InferenceSession(str(path)).get_inputs()
        assert [i.name for i in inputs] == ["obs", "action_masks"]


def test_a_fully_masked_step_is_one_line_not_a_nan_action(trained: Path, tmp_path: Path) -> None:
    out = tmp_path / "policy.onnx"
    assert invoke("export", "onnx", str(trained), "--out", str(out), "-q").exit_code == 0
    for target in (str(trained), str(out)):
        result = invoke("eval", target, "--env", "emote-test/DeadEnd-v0", "--episodes", "1")
        assert result.exit_code == 1, result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ")
        assert "allows none of the 4 actions" in lines[0]


def test_random_collection_and_warm_up_take_only_allowed_actions(tmp_path: Path) -> None:
    recipe = tmp_path / "masked.toml"
    recipe.write_text(RECIPE.format(env="emote/MaskedGrid-v0"))
    store = tmp_path / "random.zarr"
    result = invoke("collect", str(recipe), "--out", str(store), "--episodes", "30", "-q")
    assert result.exit_code == 0, result.output
    episodes = list(MemoryStore(store).episodes())
    assert len(episodes) >= 30
    for _, columns, _ in episodes:
        actions = columns["actions"][:, 0]
        allowed = columns["action_mask"][np.arange(len(actions)), actions]
        assert np.all(allowed == 1)  # so no episode was forfeited
        assert np.all(columns["rewards"] > -1.0)


@pytest.mark.parametrize(
    ("env_id", "algorithm", "message"),
    [
        ("emote-test/ShortMask-v0", "dqn", "'action_mask' has shape (3,)"),
        ("emote-test/MaskedPoint-v0", "sac", "'action_mask' masks discrete actions"),
    ],
)
def test_a_mask_that_fits_no_action_is_refused_before_anything_is_left_behind(
    tmp_path: Path, env_id: str, algorithm: str, message: str
) -> None:
    recipe = tmp_path / "bad.toml"
    text = RECIPE.format(env=env_id)
    if algorithm == "sac":
        text = text.replace('algorithm = "dqn"', 'algorithm = "sac"').split("[dqn]")[0]
    recipe.write_text(text)
    run_dir = tmp_path / "run"
    result = invoke("train", str(recipe), "--run-dir", str(run_dir))
    assert result.exit_code in (1, 2), result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]
    assert not run_dir.exists()
    store = tmp_path / "store.zarr"
    collected = invoke("collect", str(recipe), "--out", str(store), "--episodes", "1")
    assert collected.exit_code in (1, 2), collected.output
    assert message in collected.output and not store.exists()
