"""What ``emote memory inspect`` reports about any memory source; it never changes the source."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from emote_core.stores.sources import FORMATS, detect_format, length_key, read_source
from emote_core.stores.summary import bytes_on_disk, summarize_stored


def inspect_source(
    location: str | os.PathLike[str],
    *,
    source_format: str | None = None,
    trust_pickle: bool = False,
) -> dict[str, Any]:
    """The ``emote memory inspect`` report of any source; never changes it.

    A Zarr store's report reads only its episode tables; other sources are read whole.

    Returns:
        A JSON-compatible dict with at least ``format``, ``format_version``, ``location``,
        ``episodes``, ``transitions``, ``columns`` (name -> ``{dtype, shape, kind}``),
        ``episode_length`` and ``episode_return`` (``{min, mean, max}``), ``end_states``,
        ``spaces``, ``shards``, ``bytes_on_disk`` and ``producer``.

    Raises:
        FormatError: As :func:`read_source`.
        UnsafePickleError: As :func:`read_source`.
    """
    text = os.fspath(location)
    name = source_format or detect_format(text)
    if name == "zarr":
        from emote_core.stores.zarr_store import MemoryStore

        report = MemoryStore(text).info()
        report["location"] = report.pop("store", text)
        return report
    name, stored = read_source(text, source_format=name, trust_pickle=trust_pickle)
    key = length_key(stored)
    report = summarize_stored(stored, key)
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
        "bytes_on_disk": bytes_on_disk(text) if Path(text).exists() else None,
    }


__all__ = ["inspect_source"]
