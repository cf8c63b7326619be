"""How ``emote`` help is shown: one style for every command and group.

- Flags show no value placeholder (Typer would print ``<bool>``); options that take a value show
  the metavar they declare, or one by their type (``--steps N``, ``--min-return X``,
  ``--run-dir PATH``), never Typer's ``<int range>``.
- Usage lines name positional arguments by their metavar, in upper case, in square brackets
  when optional: ``emote train [OPTIONS] [RECIPE]``, ``emote memory convert [OPTIONS] SOURCE DST``.
- Commands that take a RECIPE end their help with the recipes found when it is shown.

Only Typer and :mod:`emote_core.recipes.locations` (standard library) are imported, so help stays
fast.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

__all__ = ["EmoteCommand", "EmoteGroup", "RecipeCommand", "recipes_epilog"]


def recipes_epilog() -> str:
    """One paragraph naming the recipes found, or saying where none were found."""
    from emote_core.recipes.locations import available_recipes, recipe_directories

    names = available_recipes()
    if not names:
        places = ", ".join(str(path) for path in recipe_directories())
        return f"Recipes: none found by name (looked in {places}); pass a recipe file."
    return f"Recipes (RECIPE by name): {', '.join(names)}. A path to a .toml file works too."


def _no_type(ctx: Any) -> None:
    return None


def _metavar(option: Any) -> str | None:
    """``N``, ``X``, ``PATH`` or ``TEXT`` by an option's type; ``None`` for choices (Typer lists
    them)."""
    described = option.type_descriptor
    if described.is_choice:
        return None
    if described.is_path:
        return "PATH"
    kind = described.ranged_type_name if described.is_ranged else option.bare_type()
    return {"int": "N", "float": "X"}.get(kind, "TEXT")


def _tidy(params: list[Any]) -> list[Any]:
    """Blank the type placeholder of flags (they take no value), give valued options a metavar in
    upper case (``N``, ``X``, ``PATH``, ``TEXT``) and name arguments in upper case, without a
    type beside the name, in place."""
    for param in params:
        if isinstance(param, TyperOption) and param.metavar is None:
            param.metavar = "" if param.is_flag else _metavar(param)
        elif isinstance(param, TyperArgument):
            if param.metavar is None:
                param.metavar = param.name.upper()
            param.display_type_rich = _no_type  # the name says it; Typer adds ``<str>``
    return params


def _usage_pieces(command: Any, ctx: Any) -> list[str]:
    pieces = [command.options_metavar] if command.options_metavar else []
    for param in command.get_params(ctx):
        if not isinstance(param, TyperArgument):
            pieces.extend(param.get_usage_pieces(ctx))
            continue
        name = param.metavar or param.name.upper()
        if param.nargs != 1:
            name += "..."
        pieces.append(name if param.required else f"[{name}]")
    return pieces


class EmoteCommand(TyperCommand):
    """A command in emote's help style (see the module docstring)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _tidy(super().get_params(ctx))

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return _usage_pieces(self, ctx)


class EmoteGroup(TyperGroup):
    """A command group in emote's help style (see the module docstring)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _tidy(super().get_params(ctx))


class RecipeCommand(EmoteCommand):
    """A command whose help ends with the recipes it can take by name."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self.epilog = recipes_epilog()
        super().format_help(ctx, formatter)
