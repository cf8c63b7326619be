"""``emote memory convert``: any memory source into a Zarr store or another format, atomically.

The library (:func:`emote_core.integrations.convert.convert`) writes the target under a
temporary name next to DST and renames it into place when complete; this module parses the
command line, shows progress on stderr and prints the summary.
"""

from __future__ import annotations

import sys
from enum import StrEnum
from typing import Annotated

import typer

from emote_cli._common import (
    AllowNonfiniteOption,
    DebugOption,
    JsonOption,
    QuietOption,
    SkipDamagedOption,
    emit_json,
    handle_errors,
    setup_logging,
    stdout_console,
)
from emote_cli._text import printable
from emote_cli.memory.inspect import FromOption, TrustPickleOption, trust_pickle_warning
from emote_cli.progress import ProgressDisplay

__all__ = ["TargetFormat", "convert"]


class TargetFormat(StrEnum):
    """The formats ``--to`` accepts (the writable entries of the library's format registry)."""

    ZARR = "zarr"
    EMOTE_V1 = "emote-v1"
    NPZ = "npz"
    PT = "pt"
    CSV = "csv"
    MINARI = "minari"


def convert(
    source: Annotated[
        str,
        typer.Argument(
            metavar="SOURCE", help="A store, memory file or dataset id.", show_default=False
        ),
    ],
    destination: Annotated[
        str,
        typer.Argument(
            metavar="DST",
            help="The store or file to write (a dataset id for --to minari).",
            show_default=False,
        ),
    ],
    source_format: FromOption = None,
    target_format: Annotated[
        TargetFormat,
        typer.Option("--to", help="The format to write.", case_sensitive=False),
    ] = TargetFormat.ZARR,
    trust_pickle: TrustPickleOption = False,
    force: Annotated[bool, typer.Option("--force", help="Replace DST if it exists.")] = False,
    skip_damaged: SkipDamagedOption = False,
    allow_nonfinite: AllowNonfiniteOption = False,
    json_output: JsonOption = False,
    quiet: QuietOption = False,
    debug: DebugOption = False,
) -> None:
    """Convert a memory from any format emote reads into a Zarr store (or another format).

    Formats are detected from content (--from overrides). DST is replaced only with --force.
    """
    setup_logging(quiet=quiet, debug=debug)
    with handle_errors(debug=debug, json_output=json_output):
        from emote_core.integrations.convert import convert as convert_memory

        if trust_pickle:
            trust_pickle_warning(source)
        with ProgressDisplay("convert", "episode", quiet=quiet) as display:
            display.status(f"reading {source}")  # on a terminal, until writing starts
            summary = convert_memory(
                source,
                destination,
                source_format=source_format.value if source_format else None,
                target_format=target_format.value,
                trust_pickle=trust_pickle,
                force=force,
                progress=lambda done, total: display.update(done, total, force=done >= total),
                skip_damaged=skip_damaged,
                allow_nonfinite=allow_nonfinite,
                command=sys.argv,
            )
        if json_output:
            emit_json(summary)
        else:
            stdout_console().print(
                f"converted {summary['episodes']:,} episodes ({summary['transitions']:,} "
                f"transitions) from {summary['source_format']} '{printable(source)}' to "
                f"{summary['target_format']} '{printable(destination)}' in "
                f"{summary['seconds']:.2f} s",
                soft_wrap=True,
                highlight=False,
                markup=False,
            )
