"""Algorithms and add-ons plug in by name, with no edit to emote's assembly, eval, collect or
export code: a throwaway algorithm and a throwaway add-on are defined and registered here, then
trained through `emote train` with a recipe file, evaluated, exported, run from the ONNX file,
collected with and resumed, as a user would. A second package's algorithm is found through the
entry points by the `emote` command itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import onnxruntime
import pytest
import torch
from tensorboard.backend.event_processing import event_accumulator as ea
from torch import Tensor, nn
from typer.testing import CliRunner

from emote_cli.app import app
from emote_core.algorithms.registry import (
    AddOn,
    AlgorithmFamily,
    BuildContext,
    Networks,
    TrainingParts,
    register_addon,
    register_algorithm,
    unregister_addon,
    unregister_algorithm,
)
from emote_core.callbacks.checkpointing import load_checkpoint
from emote_core.callbacks.loss import LossCallback
from emote_core.errors import ConfigurationError
from emote_core.nn.inputs import flatten_observation, observation_dim
from emote_core.onnx.graph import KeyedInputs, PolicyGraph, policy_graph
from emote_core.proxies import GenericAgentProxy
from emote_core.spaces import DiscreteSpace, MDPSpace
from emote_core.stores.zarr_store import MemoryStore

ROOT = Path(__file__).parents[2]


@dataclass
class RwrConfig:
    """Reward-weighted regression: the recipe table ``[rwr_throwaway]``."""

    learning_rate: float = 3e-3
    """Adam learning rate of the policy."""
    temperature: float = 1.0
    """Rewards are divided by it before the softmax that weighs the sampled transitions."""


class TanhLinear(nn.Module):
    """A linear deterministic policy with actions in ``[-1, 1]``."""

    def __init__(self, observation_dim: int, action_dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(observation_dim, action_dim)

    def forward(self, features: Tensor) -> Tensor:
        return torch.tanh(self.linear(features))


@dataclass
class RwrNetworks(Networks):
    policy: nn.Module

    @property
    def acting(self) -> nn.Module:
        return self.policy


class Acting(KeyedInputs):
    """One input per observation key -> actions."""

    def __init__(self, policy: nn.Module, keys: Sequence[str]) -> None:
        super().__init__(keys)
        self.policy = policy

    def forward(self, *observations: Tensor) -> Tensor:
        return self.policy(self.features(observations))


class RwrLoss(LossCallback):
    """Regresses the policy onto the sampled actions, weighted by the softmax of their rewards."""

    def __init__(self, *, policy: nn.Module, keys: Sequence[str], config: RwrConfig) -> None:
        optimizer = torch.optim.Adam(policy.parameters(), lr=config.learning_rate)
        super().__init__(name="policy", network=policy, optimizer=optimizer)
        self.keys = list(keys)
        self.temperature = config.temperature

    def loss(self, observation: Mapping[str, Tensor], actions: Tensor, rewards: Tensor) -> Tensor:
        predicted = self.network(flatten_observation(observation, self.keys))
        weights = torch.softmax(rewards.reshape(-1) / self.temperature, dim=0)
        return (weights * (predicted - actions).pow(2).sum(-1)).sum()


class RewardWeightedRegression(AlgorithmFamily):
    name: ClassVar[str] = "rwr_throwaway"
    config_class: ClassVar[type] = RwrConfig
    summary: ClassVar[str] = "a throwaway algorithm registered by a test"
    acting_callback: ClassVar[str] = "policy"

    def check_spaces(self, spaces: MDPSpace, *, env_id: str) -> None:
        if isinstance(spaces.actions, DiscreteSpace):
            raise ConfigurationError(f"rwr_throwaway needs Box actions; '{env_id}' has discrete")

    def make_networks(self, config: RwrConfig, context: BuildContext) -> RwrNetworks:
        action_dim = int(context.spaces.actions.shape[0])
        policy = TanhLinear(observation_dim(context.spaces), action_dim)
        return RwrNetworks(policy=policy.to(context.device))

    def training_parts(
        self, config: RwrConfig, networks: RwrNetworks, context: BuildContext
    ) -> TrainingParts:
        keys = context.spaces.state.keys()
        loss = RwrLoss(policy=networks.policy, keys=keys, config=config)
        agent = self.acting_agent(config, networks, context, deterministic=False)
        return TrainingParts(callbacks=[loss], agent=agent)

    def acting_agent(
        self, config: RwrConfig, networks: RwrNetworks, context: BuildContext, *, deterministic
    ) -> Any:
        keys = context.spaces.state.keys()
        return GenericAgentProxy(
            policy=Acting(networks.acting, keys), device=context.device, input_keys=keys,
            output_keys=["actions"], spaces=context.spaces, seed=context.seed,
        )  # fmt: skip

    def policy_graph(self, acting: nn.Module, spaces: MDPSpace) -> PolicyGraph:
        return policy_graph(Acting(acting, spaces.state.keys()), algorithm=self.name, spaces=spaces)


@dataclass
class ActionL2Config:
    """The recipe table ``[action_l2_throwaway]``."""

    weight: float = 0.1
    """How strongly actions are pulled towards zero."""
    learning_rate: float = 1e-3


class ActionL2Loss(LossCallback):
    def __init__(self, *, network: nn.Module, config: ActionL2Config, keys: Sequence[str]) -> None:
        optimizer = torch.optim.SGD(network.parameters(), lr=config.learning_rate)
        super().__init__(name="action_l2", network=network, optimizer=optimizer)
        self.keys = list(keys)

    def loss(self, observation: Mapping[str, Tensor]) -> Tensor:
        actions = self.network(flatten_observation(observation, self.keys))
        return self.network.l2_weight * actions.pow(2).mean()


class ActionL2(AddOn):
    """Pulls the acting network's actions towards zero with a loss of its own; its weight lives
    in the network as a buffer, so evaluation and export must rebuild the network with it."""

    name: ClassVar[str] = "action_l2_throwaway"
    config_class: ClassVar[type] = ActionL2Config

    def validate(self, config: ActionL2Config, *, source: str) -> None:
        if config.weight < 0:
            raise ConfigurationError(f"{source}: 'action_l2_throwaway.weight' must be >= 0")

    def check(
        self, config: Any, algorithm: AlgorithmFamily, spaces: MDPSpace, *, env_id: str
    ) -> None:
        if isinstance(spaces.actions, DiscreteSpace):
            raise ConfigurationError(
                f"action_l2_throwaway needs continuous actions; '{env_id}' has discrete ones"
            )

    def adapt_networks(self, config: ActionL2Config, networks: Networks, context) -> Networks:
        networks.acting.register_buffer("l2_weight", torch.tensor(config.weight))
        return networks

    def callbacks(self, config, networks: Networks, parts, context: BuildContext) -> list:
        return [
            ActionL2Loss(network=networks.acting, config=config, keys=context.spaces.state.keys())
        ]


@pytest.fixture
def plugins() -> Iterator[None]:
    register_algorithm(RewardWeightedRegression)
    register_addon(ActionL2)
    yield
    unregister_algorithm(RewardWeightedRegression.name)
    unregister_addon(ActionL2.name)


RECIPE = """\
algorithm = "rwr_throwaway"
addons = ["action_l2_throwaway"]
seed = 3

[env]
id = "emote/HitTheMiddle-v0"

[memory]
batch_size = 32
warmup_steps = 64

[training]
bp_steps = 40
checkpoint_interval = 20
log_interval = 10
export_interval = 20

[rwr_throwaway]
temperature = 0.5

[action_l2_throwaway]
weight = 0.25
"""


def cli(runner: CliRunner, *args: str) -> Any:
    return runner.invoke(app, list(args))


def scalar_tags(logdir: Path) -> set[str]:
    accumulator = ea.EventAccumulator(str(logdir), size_guidance={ea.SCALARS: 0})
    accumulator.Reload()
    return set(accumulator.Tags()["scalars"])


def test_a_throwaway_algorithm_and_addon_run_the_whole_lifecycle_through_the_cli(
    plugins: None, runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("rwr.toml").write_text(RECIPE)
    trained = cli(runner, "train", "rwr.toml", "--run-dir", "run", "--device", "cpu", "--json")
    assert trained.exit_code == 0, trained.output

    # The recipe in the run holds both plug-in tables, typed and resolved.
    recipe_text = Path("run/recipe.toml").read_text()
    assert "[rwr_throwaway]" in recipe_text and "temperature = 0.5" in recipe_text
    assert "[action_l2_throwaway]" in recipe_text and "weight = 0.25" in recipe_text
    # Both plug-ins' callbacks trained and were checkpointed and logged.
    checkpoint = load_checkpoint(Path("run/checkpoints/checkpoint_40.tar"))
    assert checkpoint["bp_step"] == 40
    assert {"policy", "action_l2"} <= set(checkpoint["callbacks"])
    policy_state = checkpoint["callbacks"]["policy"]["network_state_dict"]
    assert float(policy_state["l2_weight"]) == pytest.approx(0.25)
    torch.manual_seed(3)  # the recipe's seed: the network as it was before training
    assert not torch.equal(policy_state["linear.weight"], TanhLinear(2, 1).linear.weight)
    assert {"loss_bp_step/policy", "loss_bp_step/action_l2"} <= scalar_tags(Path("run/tensorboard"))
    # The periodic ONNX exports went through the family's graph.
    assert sorted(p.name for p in Path("run/exports").glob("*.onnx"))

    evaluated = cli(runner, "eval", "run", "--episodes", "2", "--seed", "5", "--json")
    assert evaluated.exit_code == 0, evaluated.output
    report = json.loads(evaluated.stdout)
    assert report["episodes"] == 2

    exported = cli(runner, "export", "onnx", "run", "--out", "rwr.onnx", "--json")
    assert exported.exit_code == 0, exported.output
    export = json.loads(exported.stdout)
    assert export["inputs"] == ["obs"] and export["outputs"] == ["actions"]
    session = onnxruntime.InferenceSession("rwr.onnx", providers=["CPUExecutionProvider"])
    assert session.get_modelmeta().custom_metadata_map["algorithm"] == "rwr_throwaway"
    from_onnx = cli(runner, "eval", "rwr.onnx", "--episodes", "2", "--seed", "5", "--json")
    assert from_onnx.exit_code == 0, from_onnx.output
    assert json.loads(from_onnx.stdout)["mean_return"] == pytest.approx(
        report["mean_return"], rel=1e-4, abs=1e-4
    )

    collected = cli(
        runner, "collect", "rwr.toml", "--out", "rwr.zarr", "--episodes", "2", "--policy", "run"
    )
    assert collected.exit_code == 0, collected.output
    assert MemoryStore("rwr.zarr").episode_count == 2

    resumed = cli(runner, "train", "rwr.toml", "--run-dir", "run", "--resume", "--steps", "60")
    assert resumed.exit_code == 0, resumed.output
    assert Path("run/checkpoints/checkpoint_60.tar").is_file()


def test_a_misspelt_algorithm_or_addon_is_one_line_naming_the_registered_ones(
    plugins: None, runner: CliRunner, tmp_path: Path
) -> None:
    recipe = tmp_path / "typo.toml"
    recipe.write_text(RECIPE.replace('"rwr_throwaway"', '"rwr_throwawy"'))
    result = cli(runner, "train", str(recipe), "--run-dir", str(tmp_path / "r"))
    assert result.exit_code == 1
    assert "no algorithm named 'rwr_throwawy'; did you mean 'rwr_throwaway'?" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    recipe.write_text(RECIPE.replace('["action_l2_throwaway"]', '["action_l3_throwaway"]'))
    result = cli(runner, "train", str(recipe), "--run-dir", str(tmp_path / "r"))
    assert result.exit_code == 1 and "no add-on named 'action_l3_throwaway'" in result.stderr
    recipe.write_text(RECIPE.replace("weight = 0.25", "weight = -1.0"))
    result = cli(runner, "train", str(recipe), "--run-dir", str(tmp_path / "r"))
    assert result.exit_code == 1 and "'action_l2_throwaway.weight' must be >= 0" in result.stderr
    assert not (tmp_path / "r").exists()


def test_an_addon_refuses_an_environment_it_cannot_work_with(
    plugins: None, runner: CliRunner, tmp_path: Path
) -> None:
    recipe = tmp_path / "cartpole.toml"
    recipe.write_text(
        'algorithm = "dqn"\naddons = ["action_l2_throwaway"]\n[env]\nid = "CartPole-v1"\n'
    )
    result = cli(runner, "train", str(recipe), "--run-dir", str(tmp_path / "r"), "--steps", "5")
    assert result.exit_code == 1
    assert "action_l2_throwaway needs continuous actions; 'CartPole-v1'" in result.stderr


def test_prioritized_replay_with_an_algorithm_that_feeds_no_td_errors_back_is_refused(
    plugins: None, runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("rwr.toml").write_text(RECIPE)
    result = cli(runner, "train", "rwr.toml", "--run-dir", "run", "--set",
                 "memory.sampler=prioritized")  # fmt: skip
    assert result.exit_code == 1
    assert "'rwr_throwaway' adds no PriorityUpdater to its training callbacks" in result.stderr
    assert 'set memory.sampler = "uniform"' in result.stderr


def test_another_packages_algorithm_is_found_by_the_emote_command_through_entry_points(
    tmp_path: Path,
) -> None:
    """A separate process knows nothing registered here: the entry point brings it in."""
    site = tmp_path / "site"
    dist_info = site / "emote_rwr_plugin-0.1.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: emote-rwr-plugin\nVersion: 0.1\n"
    )
    (dist_info / "entry_points.txt").write_text(
        "[emote.algorithms]\nrwr_throwaway = test_plugins:RewardWeightedRegression\n\n"
        "[emote.addons]\naction_l2_throwaway = test_plugins:ActionL2\n"
    )
    (tmp_path / "rwr.toml").write_text(RECIPE)
    pythonpath = os.pathsep.join([str(site), str(Path(__file__).parent), str(ROOT)])
    env = {**os.environ, "PYTHONPATH": pythonpath, "COLUMNS": "200"}
    command = [sys.executable, "-m", "emote_cli", "train", "rwr.toml", "--run-dir", "run"]
    command += ["--steps", "20", "--threads", "1", "--json", "-q"]
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["steps"] == 20
    assert (tmp_path / "run" / "checkpoints" / "checkpoint_20.tar").is_file()
    listed = subprocess.run(
        [sys.executable, "-m", "emote_cli", "env", "--json"], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    plugins = json.loads(listed.stdout)["plugins"]
    assert {"dqn", "rwr_throwaway", "sac"} <= set(plugins["algorithms"])
    assert "action_l2_throwaway" in plugins["addons"]
    # Without the entry points the same command says what it does not know, in one line.
    env["PYTHONPATH"] = str(ROOT)
    command[command.index("run")] = "run2"
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 1
    assert "no algorithm named 'rwr_throwaway'" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
