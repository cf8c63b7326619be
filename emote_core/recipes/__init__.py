"""Recipes: typed, validated descriptions of a training run, loaded from TOML.

The tables of algorithms and add-ons are declared by those plug-ins
(:mod:`emote_core.algorithms.registry`); :mod:`emote_core.assembly` turns a recipe into running
parts.
"""

from emote_core.recipes.loading import (
    available_recipes,
    find_recipe,
    load_recipe,
    recipe_from_dict,
    recipe_to_toml,
)
from emote_core.recipes.schema import (
    EnvConfig,
    EvalConfig,
    LoggingConfig,
    MemoryConfig,
    Recipe,
    TrainingConfig,
    WandbMode,
)

__all__ = [
    "EnvConfig",
    "EvalConfig",
    "LoggingConfig",
    "MemoryConfig",
    "Recipe",
    "TrainingConfig",
    "WandbMode",
    "available_recipes",
    "find_recipe",
    "load_recipe",
    "recipe_from_dict",
    "recipe_to_toml",
]
