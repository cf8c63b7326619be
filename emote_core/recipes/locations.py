"""Where recipes are found by name. Standard library only, so ``emote train --help`` can list
the recipes without importing torch or the algorithms."""

from __future__ import annotations

import sys
from pathlib import Path

RECIPE_SUFFIX = ".toml"


def recipe_directories() -> list[Path]:
    """Where recipe names are looked up: ``./recipes``, then the recipes shipped with emote.

    The shipped recipes are the source tree's ``recipes/`` in a checkout or an editable install,
    and ``<prefix>/share/emote/recipes`` in an installed wheel.
    """
    source_tree = Path(__file__).resolve().parents[2] / "recipes"
    installed = Path(sys.prefix) / "share" / "emote" / "recipes"
    return [Path.cwd() / "recipes", source_tree, installed]


def available_recipes() -> list[str]:
    """Names of the recipes found in :func:`recipe_directories`."""
    names = set()
    for directory in recipe_directories():
        if directory.is_dir():
            names.update(p.stem for p in directory.glob(f"*{RECIPE_SUFFIX}"))
    return sorted(names)


__all__ = ["RECIPE_SUFFIX", "available_recipes", "recipe_directories"]
