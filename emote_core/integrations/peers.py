"""Files other RL libraries write, read into (and written from) emote's :class:`StoredTable`.

Readers (each returns a :class:`~emote_core.stores.stored.StoredTable` with columns
``obs`` (``N + 1`` rows per episode), ``actions`` and ``rewards`` (float32, ``(1,)``)):

- ``"sb3-replay-buffer"``: Stable-Baselines3 ``save_replay_buffer`` pickles
  (:func:`read_sb3_replay_buffer`);
- ``"skrl-memory"``: skrl and rofunc ``Memory.save`` exports, ``.pt``/``.npz``/``.csv``
  (:func:`read_skrl_memory`);
- ``"tmrl-dataset"``: tmrl ``data.pkl`` datasets (:func:`read_tmrl_dataset`).

Writers: :func:`write_skrl_memory` writes any table as a skrl export (``npz``, ``pt``, ``csv``).
:func:`detect_peer_format` tells the formats apart without unpickling anything. Every pickle is
read through :mod:`emote_core.stores.safe_pickle`; ``.pt`` files through
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import os

from emote_core.errors import FormatError
from emote_core.stores.peers.detect import detect_peer_format
from emote_core.stores.peers.sb3 import SB3_FORMAT, read_sb3_replay_buffer
from emote_core.stores.peers.skrl import SKRL_FORMAT, read_skrl_memory
from emote_core.stores.peers.skrl_writer import (
    WRITE_FORMATS,
    SkrlLayout,
    skrl_tensors,
    write_skrl_memory,
)
from emote_core.stores.peers.tmrl import TMRL_FORMAT, read_tmrl_dataset
from emote_core.stores.stored import StoredTable

PEER_FORMATS = (SB3_FORMAT, SKRL_FORMAT, TMRL_FORMAT)
"""The peer formats emote reads."""


def read_peer_file(
    path: str | os.PathLike[str], format: str | None = None, *, trust_pickle: bool = False
) -> StoredTable:
    """Reads a peer's file with the reader for ``format`` (detected when ``None``).

    Raises:
        FormatError: If the format is unknown or cannot be detected, or the file is damaged.
        UnsafePickleError: If a pickle names a global outside the allowlist; nothing ran.
    """
    chosen = format or detect_peer_format(path)
    if chosen == SB3_FORMAT:
        return read_sb3_replay_buffer(path, trust_pickle=trust_pickle)
    if chosen == SKRL_FORMAT:
        return read_skrl_memory(path, trust_pickle=trust_pickle)
    if chosen == TMRL_FORMAT:
        return read_tmrl_dataset(path, trust_pickle=trust_pickle)
    if format is not None:
        raise FormatError(f"unknown peer format {format!r}; choose one of {list(PEER_FORMATS)}")
    raise FormatError(
        f"'{path}' is not a file emote recognises as one of {list(PEER_FORMATS)} (missing, empty, "
        "or another kind of file); name its format with --from"
    )


__all__ = [
    "PEER_FORMATS",
    "SB3_FORMAT",
    "SKRL_FORMAT",
    "TMRL_FORMAT",
    "WRITE_FORMATS",
    "SkrlLayout",
    "detect_peer_format",
    "read_peer_file",
    "read_sb3_replay_buffer",
    "read_skrl_memory",
    "read_tmrl_dataset",
    "skrl_tensors",
    "write_skrl_memory",
]
