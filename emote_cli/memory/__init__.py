"""``emote memory``: inspect, verify and convert episode memories (Zarr stores and other formats).

One module per subcommand; none imports numpy, zarr or torch at module level.
"""

from __future__ import annotations

import typer

from emote_cli._help import EmoteCommand, EmoteGroup
from emote_cli.memory import convert, inspect, verify

__all__ = ["app"]

app = typer.Typer(
    cls=EmoteGroup,
    name="memory",
    help=(
        "Inspect, verify and convert episode memories: emote's Zarr stores, upstream emote zips "
        "and pickles, and other tools' replay buffers and datasets."
    ),
    no_args_is_help=True,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_show_locals=False,
)

app.command("inspect", cls=EmoteCommand)(inspect.inspect)
app.command("verify", cls=EmoteCommand)(verify.verify)
app.command("convert", cls=EmoteCommand)(convert.convert)
