"""From a recipe to running parts: environments, networks, agents, tables and callbacks."""

from __future__ import annotations

import copy
import difflib
import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from emote_core.callback import Callback
from emote_core.errors import CheckpointError, ConfigurationError
from emote_core.recipes.loading import load_recipe
from emote_core.recipes.schema import Algorithm, Recipe
from emote_core.spaces import DiscreteSpace, MDPSpace

log = logging.getLogger(__name__)


def check_env_id(env_id: str) -> None:
    """Checks ``env_id`` is registered with gymnasium, suggesting the closest ids if not.

    Raises:
        ConfigurationError: If it is not registered.
    """
    import gymnasium

    import emote_core.env  # noqa: F401 - registers emote's own environments

    if env_id in gymnasium.registry:
        return
    close = difflib.get_close_matches(env_id, list(gymnasium.registry), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise ConfigurationError(f"'{env_id}' is not a registered gymnasium environment{hint}")


def make_env(recipe: Recipe, *, num_envs: int | None = None) -> Any:
    """The recipe's environment as a ``DictGymWrapper`` over a gymnasium vector env."""
    from emote_core.env import DictGymWrapper, make_vector_env

    check_env_id(recipe.env.id)
    kwargs = dict(recipe.env.kwargs)
    if recipe.env.max_episode_steps is not None:
        kwargs["max_episode_steps"] = recipe.env.max_episode_steps
    try:
        vector = make_vector_env(recipe.env.id, num_envs=num_envs or recipe.env.num_envs, **kwargs)
    except TypeError as error:  # an env constructor that does not take a given keyword
        raise ConfigurationError(f"env '{recipe.env.id}' rejected env.kwargs: {error}") from error
    return DictGymWrapper(vector)


@dataclass
class Networks:
    """The networks of one algorithm (SAC: policy, q1, q2 and targets; DQN: q and its target)."""

    algorithm: Algorithm
    policy: nn.Module | None = None
    q1: nn.Module | None = None
    q2: nn.Module | None = None
    q: nn.Module | None = None
    ln_alpha: torch.Tensor | None = None
    targets: dict[str, nn.Module] = field(default_factory=dict)

    @property
    def acting(self) -> nn.Module:
        """The network agents act with (the policy, or DQN's Q network)."""
        network = self.policy if self.algorithm is Algorithm.SAC else self.q
        assert network is not None
        return network


def _check_spaces(recipe: Recipe, spaces: MDPSpace) -> None:
    discrete = isinstance(spaces.actions, DiscreteSpace)
    if recipe.algorithm is Algorithm.SAC and discrete:
        raise ConfigurationError(
            f"SAC needs continuous (Box) actions; '{recipe.env.id}' has discrete actions — "
            'use algorithm = "dqn"'
        )
    if recipe.algorithm is Algorithm.DQN and not discrete:
        raise ConfigurationError(
            f"DQN needs discrete actions; '{recipe.env.id}' has continuous actions — use "
            'algorithm = "sac"'
        )


def make_networks(recipe: Recipe, spaces: MDPSpace, device: torch.device) -> Networks:
    """Fresh networks for the recipe's algorithm, seeded with the recipe's seed."""
    from emote_core.nn import (
        ActionValueMlp,
        DiscreteActionValueMlp,
        GaussianMlpPolicy,
        observation_dim,
    )

    _check_spaces(recipe, spaces)
    torch.manual_seed(recipe.seed)
    obs_dim = observation_dim(spaces)
    if recipe.algorithm is Algorithm.SAC:
        action_dim = int(spaces.actions.shape[0])
        hidden = recipe.sac.hidden_dims
        policy = GaussianMlpPolicy(
            observation_dim=obs_dim, action_dim=action_dim, hidden_dims=hidden
        )
        q1, q2 = (
            ActionValueMlp(observation_dim=obs_dim, action_dim=action_dim, hidden_dims=hidden)
            for _ in range(2)
        )
        networks = Networks(
            Algorithm.SAC,
            policy=policy.to(device),
            q1=q1.to(device),
            q2=q2.to(device),
            ln_alpha=torch.zeros(1, device=device, requires_grad=True),
        )
        networks.targets = {"q1": copy.deepcopy(networks.q1), "q2": copy.deepcopy(networks.q2)}
        return networks
    assert isinstance(spaces.actions, DiscreteSpace)
    q = DiscreteActionValueMlp(
        observation_dim=obs_dim, num_actions=spaces.actions.n, hidden_dims=recipe.dqn.hidden_dims
    ).to(device)
    return Networks(Algorithm.DQN, q=q, targets={"q": copy.deepcopy(q)})


def make_agent(
    recipe: Recipe,
    networks: Networks,
    spaces: MDPSpace,
    device: torch.device,
    *,
    deterministic: bool = False,
    epsilon: Any = None,
) -> Any:
    """The agent proxy acting with the recipe's networks."""
    from emote_core.proxies import EpsilonGreedyAgentProxy, MultiKeyAgentProxy

    keys = spaces.state.keys()
    if recipe.algorithm is Algorithm.SAC:
        return MultiKeyAgentProxy(
            policy=networks.acting, device=device, input_keys=keys, spaces=spaces,
            deterministic=deterministic, seed=recipe.seed,
        )  # fmt: skip
    if len(keys) != 1:
        raise ConfigurationError(f"DQN recipes take one observation key; the env gives {keys}")
    assert isinstance(spaces.actions, DiscreteSpace)
    if deterministic:
        epsilon = 0.0
    elif epsilon is None:  # acting outside training: explore as much as training ended with
        epsilon = recipe.dqn.epsilon_end
    return EpsilonGreedyAgentProxy(
        q_network=networks.acting, device=device, num_actions=spaces.actions.n,
        epsilon=epsilon, input_key=keys[0], seed=recipe.seed,
    )  # fmt: skip


def acting_state(checkpoint: dict[str, Any], algorithm: Algorithm) -> dict[str, Any]:
    """The acting network's weights inside a training checkpoint."""
    name = "policy" if algorithm is Algorithm.SAC else "q"
    try:
        return checkpoint["callbacks"][name]["network_state_dict"]
    except KeyError as error:
        raise CheckpointError(
            f"the checkpoint holds no '{name}' network state (callbacks: "
            f"{sorted(checkpoint.get('callbacks', {}))}); was it written by a {algorithm} run?"
        ) from error


def resolve_checkpoint(target: Path) -> tuple[Path, Path]:
    """``(checkpoint file, run directory)`` for a checkpoint file or a run directory.

    Raises:
        CheckpointError: If there is no checkpoint there.
    """
    from emote_core.runs import RunDirectory

    if target.is_dir():
        latest = RunDirectory(target).latest_checkpoint()
        if latest is None:
            raise CheckpointError(f"run directory '{target}' holds no checkpoints")
        return latest, target
    if not target.is_file():
        raise CheckpointError(f"'{target}' is neither a checkpoint file nor a run directory")
    return target, target.parent.parent


def load_trained_agent(
    target: Path,
    *,
    device: torch.device,
    recipe: Recipe | str | Path | None = None,
    deterministic: bool = True,
) -> tuple[Recipe, Networks, Any, MDPSpace, Path]:
    """Rebuilds the acting network of a run from its recipe and a checkpoint.

    Returns:
        ``(recipe, networks, agent, spaces, checkpoint path)``.

    Raises:
        CheckpointError: If the checkpoint or the run's recipe is missing or does not fit.
    """
    from emote_core.callbacks.checkpointing import load_checkpoint

    checkpoint_path, run_path = resolve_checkpoint(target)
    if recipe is None:
        recipe_file = run_path / "recipe.toml"
        if not recipe_file.is_file():
            raise CheckpointError(
                f"no recipe.toml in '{run_path}' to rebuild the networks of '{checkpoint_path}'; "
                "pass --recipe"
            )
        recipe = recipe_file
    if not isinstance(recipe, Recipe):
        recipe = load_recipe(recipe)
    data = load_checkpoint(checkpoint_path)
    env = make_env(recipe, num_envs=1)
    spaces = env.spaces
    env.close()
    networks = make_networks(recipe, spaces, device)
    try:
        networks.acting.load_state_dict(acting_state(data, recipe.algorithm))
    except RuntimeError as error:
        raise CheckpointError(
            f"checkpoint '{checkpoint_path}' does not fit the recipe's networks: "
            f"{str(error).splitlines()[0]}"
        ) from error
    agent = make_agent(recipe, networks, spaces, device, deterministic=deterministic)
    return recipe, networks, agent, spaces, checkpoint_path


def algorithm_callbacks(
    recipe: Recipe, networks: Networks, spaces: MDPSpace
) -> tuple[list[Callback], Any]:
    """The loss and target callbacks of the recipe's algorithm, and DQN's epsilon schedule."""
    if recipe.algorithm is Algorithm.SAC:
        from emote_core.algorithms.sac import AlphaLoss, PolicyLoss, QLoss, QTarget

        config = recipe.sac
        assert networks.policy and networks.q1 and networks.q2 and networks.ln_alpha is not None
        # Fused Adam (one kernel for all parameters) measured ~5-8% more updates/s on the CPU.
        adam = functools.partial(torch.optim.Adam, fused=True)
        action_dim = int(spaces.actions.shape[0])
        callbacks: list[Callback] = [
            QTarget(
                policy=networks.policy, ln_alpha=networks.ln_alpha,
                q1_target=networks.targets["q1"], q2_target=networks.targets["q2"],
                q1=networks.q1, q2=networks.q2, gamma=config.gamma,
                reward_scale=config.reward_scale, target_q_tau=config.tau,
                rollout_length=recipe.memory.rollout_length,
            ),
            QLoss(name="q1", q=networks.q1, max_grad_norm=config.max_grad_norm,
                  optimizer=adam(networks.q1.parameters(), lr=config.learning_rate)),
            QLoss(name="q2", q=networks.q2, max_grad_norm=config.max_grad_norm,
                  optimizer=adam(networks.q2.parameters(), lr=config.learning_rate)),
            PolicyLoss(policy=networks.policy, ln_alpha=networks.ln_alpha, q1=networks.q1,
                       q2=networks.q2, max_grad_norm=config.max_grad_norm,
                       optimizer=adam(networks.policy.parameters(), lr=config.learning_rate)),
            AlphaLoss(policy=networks.policy, ln_alpha=networks.ln_alpha, action_dim=action_dim,
                      target_entropy=config.target_entropy, max_alpha=config.max_alpha,
                      optimizer=adam([networks.ln_alpha], lr=config.learning_rate)),
        ]  # fmt: skip
        return callbacks, None
    from emote_core.algorithms.dqn import QLoss as DqnLoss
    from emote_core.algorithms.dqn import QTarget as DqnTarget
    from emote_core.schedules import LinearSchedule

    config = recipe.dqn
    assert networks.q is not None
    epsilon = LinearSchedule(config.epsilon_start, config.epsilon_end, config.epsilon_decay_steps)
    callbacks = [
        DqnTarget(q=networks.q, q_target_network=networks.targets["q"], gamma=config.gamma,
                  target_update_interval=config.target_update_interval,
                  rollout_length=recipe.memory.rollout_length),
        DqnLoss(q=networks.q, max_grad_norm=config.max_grad_norm,
                optimizer=torch.optim.Adam(networks.q.parameters(), lr=config.learning_rate,
                                           fused=True)),
    ]  # fmt: skip
    return callbacks, epsilon


def stores_spaces_match(stores: Sequence[Any], spaces: MDPSpace, recipe: Recipe) -> None:
    """Checks that memory stores hold what the recipe's environment produces.

    Raises:
        ConfigurationError: Naming the store and the mismatch.
    """
    expected = {key: tuple(space.shape) for key, space in spaces.state.spaces.items()}
    expected["actions"] = tuple(spaces.actions.shape)
    for store in stores:
        held = {s.name: tuple(s.shape) for s in store.schemas() if s.stored}
        for name, shape in expected.items():
            if name not in held:
                raise ConfigurationError(
                    f"store '{store.url}' has no '{name}' column, which '{recipe.env.id}' needs "
                    f"(it holds {sorted(held)})"
                )
            if held[name] != shape:
                raise ConfigurationError(
                    f"store '{store.url}' column '{name}' has shape {held[name]}; "
                    f"'{recipe.env.id}' gives {shape} — the store was collected on another env"
                )


__all__ = [
    "Networks",
    "acting_state",
    "algorithm_callbacks",
    "check_env_id",
    "load_trained_agent",
    "make_agent",
    "make_env",
    "make_networks",
    "resolve_checkpoint",
    "stores_spaces_match",
]
