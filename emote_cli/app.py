"""The root ``emote`` Typer app and the console entry point :func:`main`.

Every command lives in its own module (a group in a subpackage with its own ``typer.Typer``) and
is registered below in one line; its function's docstring is its help. Typer's rich markup
reflows only a help text's first paragraph, so keep each later paragraph on one line. Every
command module is imported when ``emote`` starts, so none may import torch, numpy, gymnasium,
zarr, onnx, onnxruntime or tensorboard at module level.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from emote_cli import collect, env, export, memory, train
from emote_cli import eval as evaluate
from emote_cli._help import EmoteCommand, EmoteGroup, RecipeCommand
from emote_cli._json import json_requested, write_json_error

__all__ = ["app", "main"]


class _RootGroup(EmoteGroup):
    """The root command group; under ``--json`` a usage error is also a JSON document on stdout.

    Typer finds usage errors (an unknown option, a bad value, a missing argument) before a
    command's body runs, so the body's ``handle_errors(json_output=...)`` never sees them.
    """

    _JSON_KEY = "emote_json_output"

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        ctx.meta[self._JSON_KEY] = json_requested(args)
        try:
            return super().parse_args(ctx, args)
        except typer.TyperException as error:
            self._write_json(ctx, error)
            raise

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except typer.TyperException as error:
            self._write_json(ctx, error)
            raise

    def _write_json(self, ctx: typer.Context, error: typer.TyperException) -> None:
        if ctx.meta.get(self._JSON_KEY):
            message = " ".join(error.format_message().split())
            write_json_error(message, error.exit_code)


app = typer.Typer(
    name="emote",
    cls=_RootGroup,
    help=(
        "[bold]emote[/bold]: Embark's Modular Training Engine, a reinforcement-learning toolkit "
        "with episode memories in Zarr stores and a callback training engine.\n\n"
        "Every command takes [bold]--json[/bold] (exactly one JSON document on stdout), "
        "[bold]--quiet[/bold] and [bold]--debug[/bold]. Exit codes: 0 success, 1 error, "
        "2 usage error, 3 threshold not met, 130 interrupted."
    ),
    no_args_is_help=True,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
    # An error that escapes a command must never dump local variables (paths, tokens) to a log.
    pretty_exceptions_show_locals=False,
)

# Commands, one module each, in emote's help style (emote_cli._help). Those that take a RECIPE
# list the recipes found at the end of --help.
app.command("collect", cls=RecipeCommand)(collect.collect)
app.command("train", cls=RecipeCommand)(train.train)
app.command("eval", cls=EmoteCommand)(evaluate.evaluate)
app.add_typer(env.app, name="env")
app.add_typer(memory.app, name="memory")
app.add_typer(export.app, name="export")


def _print_version(value: bool) -> None:
    if value:
        from emote_core import __version__

        typer.echo(f"emote {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print the emote version and exit.",
        ),
    ] = False,
) -> None:
    # A callback keeps `emote` a group even while it has a single command: Typer would otherwise
    # collapse that command into the root and `emote env` would stop working.
    pass


def main() -> None:
    """Run the ``emote`` command line (the console script's entry point)."""
    app(prog_name="emote")
