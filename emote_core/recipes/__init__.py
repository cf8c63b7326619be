"""Recipes: typed, validated descriptions of a training run, loaded from TOML."""

from emote_core.recipes.loading import (
    available_recipes,
    find_recipe,
    load_recipe,
    recipe_from_dict,
    recipe_to_toml,
)
from emote_core.recipes.schema import (
    Algorithm,
    DqnConfig,
    EnvConfig,
    EvalConfig,
    MemoryConfig,
    Recipe,
    SacConfig,
    TrainingConfig,
)

__all__ = [
    "Algorithm",
    "DqnConfig",
    "EnvConfig",
    "EvalConfig",
    "MemoryConfig",
    "Recipe",
    "SacConfig",
    "TrainingConfig",
    "available_recipes",
    "find_recipe",
    "load_recipe",
    "recipe_from_dict",
    "recipe_to_toml",
]
