"""Provenance records for the sessions that write stores: a collect, a training run's export.

The record type lives with the stores (:mod:`emote_core.stores.provenance`); this module fills it
from a recipe, the command line and the policy that acts.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from emote_core.assembly.builders import env_source
from emote_core.env.making import env_record
from emote_core.recipes.loading import recipe_to_toml
from emote_core.recipes.schema import Recipe
from emote_core.stores.provenance import PolicyRecord, Provenance


def session_provenance(
    recipe: Recipe,
    *,
    policy: PolicyRecord | None,
    num_envs: int | None = None,
    command: Sequence[str] | None = None,
) -> Provenance:
    """Who writes a store in this session, from the recipe it runs (with how its env is made:
    :func:`emote_core.env.making.env_record`).

    Args:
        recipe: The resolved recipe (``--seed`` and ``--set`` applied).
        policy: What acts.
        num_envs: Environments stepped together, when their first-reset seeds are the recipe's
            seed plus their index (gymnasium's rule for a seeded vector reset).
        command: The command line; ``sys.argv`` when not given.
    """
    env_seeds = tuple(recipe.seed + index for index in range(num_envs or 0))
    return Provenance(
        command=tuple(sys.argv if command is None else command),
        env_id=recipe.env.name,
        env=env_record(env_source(recipe)),
        recipe_name=recipe.name,
        recipe_toml=recipe_to_toml(recipe),
        seed=recipe.seed,
        env_seeds=env_seeds,
        policy=policy,
    )


__all__ = ["session_provenance"]
