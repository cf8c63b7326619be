"""What offline training refuses, for every registered offline-only family that ships a
``<family>_pendulum`` recipe: a store whose actions do not fit, a store of one episode, training
live, a store with NaN rewards. Each is one line on stderr, exit 1 or 2, and no run directory."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from emote_cli.app import app
from emote_core.algorithms.registry import AlgorithmFamily, algorithm_names, discover, get_algorithm
from emote_core.errors import ConfigurationError
from emote_core.integrations.convert import write_target
from emote_core.recipes.locations import available_recipes
from emote_core.stores.zarr_store import MemoryStore


def offline_families() -> list[str]:
    """The registered offline-only families with a ``<family>_pendulum`` recipe, sorted."""
    import emote_core.algorithms  # noqa: F401 - registers emote's own families

    discover()
    recipes = set(available_recipes())
    return [
        name
        for name in algorithm_names()
        if get_algorithm(name).offline_only and f"{name}_pendulum" in recipes
    ]


FAMILIES = offline_families()


def test_the_offline_families_are_found_through_the_registry() -> None:
    assert "bc" in FAMILIES
    assert all(get_algorithm(name).offline_only for name in FAMILIES)


@pytest.fixture(scope="module")
def stores(offline_stores: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Stores made from ``offline_stores``' Pendulum one (which tests read from there): of 1
    episode, and of 2 episodes with a NaN reward."""
    root = tmp_path_factory.mktemp("offline_inputs")
    stored = MemoryStore(offline_stores / "pendulum.zarr").read()
    write_target(dataclasses.replace(stored, episodes=stored.episodes[:1]),
                 root / "one_episode.zarr")  # fmt: skip
    identity, data, end = stored.episodes[1]
    rewards = np.array(data["rewards"], copy=True)
    rewards[17] = np.nan
    stored.episodes[1] = (identity, {**data, "rewards": rewards}, end)
    write_target(stored, root / "nan_rewards.zarr")
    return root


def cartpole_refusal(family: AlgorithmFamily) -> str | None:
    """What the family says about CartPole's discrete actions (``None``: it takes them)."""
    import gymnasium

    from emote_core.spaces import MDPSpace

    env = gymnasium.make("CartPole-v1")
    spaces = MDPSpace.from_gymnasium(env.observation_space, env.action_space)
    env.close()
    try:
        family.check_spaces(spaces, env_id="CartPole-v1")
    except ConfigurationError as error:
        return str(error)
    return None


def refused(runner: CliRunner, where: Path, family: str, *args: str) -> str:
    """Trains ``<family>_pendulum`` with ``args``; checks the refusal is one error line, the last
    on stderr (after what was read), and left no run; returns stderr, whitespace folded."""
    result = runner.invoke(app, ["train", f"{family}_pendulum", *args, "--run-dir",
                                 str(where / "run"), "--steps", "2", "--device", "cpu",
                                 "--set", "memory.batch_size=256"])  # fmt: skip
    assert result.exit_code in (1, 2), result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and result.stderr.strip().endswith(errors[0]), result.stderr
    assert "Traceback" not in result.output
    assert not (where / "run").exists()
    return " ".join(result.stderr.split())


@pytest.mark.parametrize("family", FAMILIES)
def test_a_discrete_store_does_not_fit(runner, tmp_path, offline_stores, family):
    cartpole = str(offline_stores / "cartpole.zarr")
    message = refused(runner, tmp_path, family, "--memory", cartpole, "--no-live")
    assert "collected on CartPole-v1" in message  # the recipe's env is Pendulum-v1
    why = cartpole_refusal(get_algorithm(family))
    if why is None:  # the family acts on discrete actions too: CartPole is no bad input to it
        return
    message = refused(runner, tmp_path, family, "--memory", cartpole, "--no-live",
                      "--set", 'env.id="CartPole-v1"')  # fmt: skip
    assert " ".join(why.split()) in message


@pytest.mark.parametrize("family", FAMILIES)
def test_a_store_of_one_episode_is_too_small_for_a_batch(runner, tmp_path, stores, family):
    message = refused(runner, tmp_path, family, "--memory", str(stores / "one_episode.zarr"),
                      "--no-live")  # fmt: skip
    assert (
        "the stores hold 200 transitions in 1 episode, fewer than the 256 of one batch "
        "('memory.batch_size' = 256 windows of 'memory.rollout_length' = 1 transition); pass "
        "stores of more episodes, or lower 'memory.batch_size'" in message
    ), message


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(
    "args", [(), ("--memory", "{stores}/pendulum.zarr"), ("--memory", "{stores}/pendulum.zarr",
                                                           "--live")]
)  # fmt: skip
def test_training_live_is_refused(runner, tmp_path, offline_stores, family, args):
    args = tuple(arg.format(stores=offline_stores) for arg in args)
    message = refused(runner, tmp_path, family, *args)
    assert f"'{family}' learns from stored episodes only" in message


@pytest.mark.parametrize("family", FAMILIES)
def test_a_store_with_nan_rewards_is_refused(runner, tmp_path, stores, family):
    poisoned = stores / "nan_rewards.zarr"
    message = refused(runner, tmp_path, family, "--memory", str(poisoned), "--no-live")
    assert (
        f"store '{poisoned}': column 'rewards' holds 1 non-finite value (NaN or inf) in 1 "
        "episode" in message
    )
    assert "at row 17" in message and "--allow-nonfinite" in message
