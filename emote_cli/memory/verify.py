"""``emote memory verify``: prove a Zarr memory store intact, or name what is damaged.

Only reads: commit records, episode tables, every committed chunk and per-episode checksums.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from emote_cli._common import (
    DebugOption,
    JsonOption,
    QuietOption,
    abort,
    emit_json,
    handle_errors,
    setup_logging,
    stdout_console,
)
from emote_cli._text import printable

__all__ = ["verify"]

log = logging.getLogger(__name__)

_MAX_PROBLEMS = 5
_ONLY_STORES = (
    "verify checks emote memory stores; convert other formats into one first: "
    "emote memory convert {store} STORE.zarr"
)


def verify(
    store: Annotated[
        str,
        typer.Argument(
            metavar="STORE", help="The emote memory store (path or URL).", show_default=False
        ),
    ],
    json_output: JsonOption = False,
    quiet: QuietOption = False,
    debug: DebugOption = False,
) -> None:
    """Check a memory store's commit records, chunks and checksums; never changes the store.

    Exit 0 when intact, 1 naming the damaged episodes and chunks otherwise.
    """
    setup_logging(quiet=quiet, debug=debug)
    with handle_errors(debug=debug, json_output=json_output):
        from emote_core.errors import FormatError
        from emote_core.integrations.formats import detect_format
        from emote_core.stores.zarr_store.verify import verify_store

        try:
            found = detect_format(store)
        except FormatError as error:
            if "://" not in store and not Path(store).exists():
                raise
            error.add_note(_ONLY_STORES.format(store=store))
            raise
        if found != "zarr":
            raise FormatError(
                f"'{store}' is not an emote memory store (its format is {found}); "
                + _ONLY_STORES.format(store=store)
            )
        report = verify_store(store)
        document = report.to_json()
        for note in report.notes:
            log.info("%s", printable(note))
        if json_output:
            emit_json(document)
        if not report.ok:
            shown = "; ".join(report.problems[:_MAX_PROBLEMS])
            more = len(report.problems) - _MAX_PROBLEMS
            abort(
                f"store '{store}' is damaged: {shown}"
                + (f" (and {more} more problems)" if more > 0 else "")
                + " — the store was not changed; re-collect or re-convert the damaged episodes"
            )
        if not json_output:
            rate = document["mb_per_second"]
            stdout_console().print(
                f"store '{printable(store)}' is intact: {report.episodes:,} episodes, "
                f"{report.transitions:,} transitions, {report.bytes_checked / 1e6:,.1f} MB checked "
                f"in {report.seconds:.2f} s" + (f" ({rate:,.0f} MB/s)" if rate is not None else ""),
                soft_wrap=True,
                markup=False,
                highlight=False,
            )
