"""Evaluating an agent on a recipe's environment: returns over whole episodes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from emote_core.assembly.builders import make_env
from emote_core.recipes.schema import Recipe


def evaluate(
    agent: Any,
    recipe: Recipe,
    *,
    episodes: int,
    seed: int,
    on_episode: Callable[[list[float]], None] | None = None,
) -> dict[str, Any]:
    """Runs ``agent`` on one environment for ``episodes`` whole episodes.

    Args:
        agent: Acts on the environment's observations.
        recipe: Names the environment.
        episodes: How many episodes to run.
        seed: Seeds the environment's first reset.
        on_episode: Called with the returns so far each time an episode ends (for progress).

    Returns:
        ``{env, seed, episodes, returns, lengths, mean_return, std_return, lowest_return,
        highest_return}``.
    """
    env = make_env(recipe, num_envs=1)
    returns: list[float] = []
    lengths: list[int] = []
    try:
        observations = env.reset(seed=seed)
        while len(returns) < episodes:
            observations = env.step(agent(observations))
            finished = env.drain_completed_episodes()
            for episode_return, length in finished:
                returns.append(float(episode_return))
                lengths.append(int(length))
            if finished and on_episode is not None:
                on_episode(returns[:episodes])
    finally:
        env.close()
    returns, lengths = returns[:episodes], lengths[:episodes]
    return {
        "env": recipe.env.id,
        "seed": seed,
        "episodes": len(returns),
        "returns": returns,
        "lengths": lengths,
        "mean_return": float(np.mean(returns)),
        "std_return": float(np.std(returns)),
        "lowest_return": float(np.min(returns)),
        "highest_return": float(np.max(returns)),
    }


__all__ = ["evaluate"]
