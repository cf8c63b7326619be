"""``emote export``: write trained policies in formats that run outside emote.

One module per subcommand; none imports torch, onnx or onnxruntime at module level.
"""

from __future__ import annotations

import typer

from emote_cli._help import EmoteCommand, EmoteGroup
from emote_cli.export import onnx

__all__ = ["app"]

app = typer.Typer(
    cls=EmoteGroup,
    name="export",
    help="Export trained policies to run outside emote: ONNX for onnxruntime and game engines.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_show_locals=False,
)

app.command("onnx", cls=EmoteCommand)(onnx.onnx)
