"""Recipes: typed, validated descriptions of a training run, loaded from TOML.

The tables of algorithms and add-ons are declared by those plug-ins
(:mod:`emote_core.algorithms.registry`); :mod:`emote_core.assembly` turns a recipe into running
parts.

The functions of :mod:`emote_core.recipes.loading` are imported on first use: loading a recipe
needs the algorithm registry (and torch), while finding recipes by name
(:mod:`emote_core.recipes.locations`) must stay cheap enough for ``emote train --help``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from emote_core.recipes.locations import available_recipes
from emote_core.recipes.schema import (
    EnvConfig,
    EvalConfig,
    LoggingConfig,
    MemoryConfig,
    Recipe,
    SamplerKind,
    TrainingConfig,
    WandbMode,
)

if TYPE_CHECKING:
    from emote_core.recipes.loading import (
        find_recipe,
        load_recipe,
        recipe_from_dict,
        recipe_to_toml,
    )

_LOADING = frozenset({"find_recipe", "load_recipe", "recipe_from_dict", "recipe_to_toml"})


def __getattr__(name: str) -> Any:
    if name in _LOADING:
        value = getattr(importlib.import_module("emote_core.recipes.loading"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "EnvConfig",
    "EvalConfig",
    "LoggingConfig",
    "MemoryConfig",
    "Recipe",
    "SamplerKind",
    "TrainingConfig",
    "WandbMode",
    "available_recipes",
    "find_recipe",
    "load_recipe",
    "recipe_from_dict",
    "recipe_to_toml",
]
