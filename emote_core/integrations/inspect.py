"""What ``emote memory inspect`` reports about any memory source; it never changes the source."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from emote_core.integrations.formats import FORMATS, detect_format, read_source
from emote_core.stores.inspect import store_report
from emote_core.stores.sources import length_key
from emote_core.stores.summary import bytes_on_disk, stored_action_coverage, summarize_stored


def inspect_source(
    location: str | os.PathLike[str],
    *,
    source_format: str | None = None,
    trust_pickle: bool = False,
    actions: bool = False,
) -> dict[str, Any]:
    """The ``emote memory inspect`` report of any source; never changes it.

    A Zarr store's report reads only its episode tables (its return distribution too), and its
    actions column for ``actions``; other sources are read whole.

    Args:
        location: The source.
        source_format: Read it as this format instead of detecting it.
        trust_pickle: Unpickle without restrictions (runs the file's code).
        actions: Add ``actions``, the coverage of the actions taken
            (:class:`~emote_core.stores.summary.ActionCoverage`; ``None`` without an actions
            column).

    Returns:
        A JSON-compatible dict with at least ``format``, ``format_version``, ``location``,
        ``episodes``, ``transitions``, ``columns`` (name -> ``{dtype, shape, kind}``),
        ``episode_length`` and ``episode_return`` (``{min, mean, max}``), ``end_states``,
        ``episode_ends`` (``{terminal, truncated}``), ``returns`` (the distribution of episode
        returns, :func:`~emote_core.stores.summary.return_distribution`), ``spaces``,
        ``shards``, ``bytes_on_disk``, ``producer``, ``provenance`` and ``reference_returns``
        (``None`` but for stores); stores also ``agents`` (see
        :func:`~emote_core.stores.inspect.store_report`).

    Raises:
        FormatError: As :func:`read_source`.
        UnsafePickleError: As :func:`read_source`.
    """
    text = os.fspath(location)
    name = source_format or detect_format(text)
    if name == "zarr":
        return store_report(text, actions=actions)
    name, stored = read_source(text, source_format=name, trust_pickle=trust_pickle)
    key = length_key(stored)
    report = summarize_stored(stored, key)
    if actions:
        report["actions"] = stored_action_coverage(stored)
    if stored.episodes:
        from emote_core.stores.zarr_store import store_columns

        for column in store_columns(stored.columns, stored.episodes[0], key):
            report["columns"][column.name]["rows"] = column.rows
    return {
        **report,
        "format": name,
        "format_version": stored.metadata.get("format_version", FORMATS[name].version),
        "location": text,
        "length_key": key,
        "source": stored.metadata.get("source"),
        "producer": stored.metadata.get("producer"),
        "shards": None,
        "provenance": None,
        "reference_returns": None,
        "bytes_on_disk": bytes_on_disk(text) if Path(text).exists() else None,
    }


__all__ = ["inspect_source"]
