"""Help text computed when it is shown: the recipes a command can take by name.

Only Typer and :mod:`emote_core.recipes.locations` (standard library) are imported, so help stays
fast; the listing is made when help is rendered, from the current directory's ``recipes/`` and
the ones shipped with emote.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperCommand

__all__ = ["RecipeCommand", "recipes_epilog"]


def recipes_epilog() -> str:
    """One paragraph naming the recipes found, or saying where none were found."""
    from emote_core.recipes.locations import available_recipes, recipe_directories

    names = available_recipes()
    if not names:
        places = ", ".join(str(path) for path in recipe_directories())
        return f"Recipes: none found by name (looked in {places}); pass a recipe file."
    return f"Recipes (RECIPE by name): {', '.join(names)}. A path to a .toml file works too."


class RecipeCommand(TyperCommand):
    """A command whose help ends with the recipes it can take by name."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self.epilog = recipes_epilog()
        super().format_help(ctx, formatter)
