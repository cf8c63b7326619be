"""Telling the peers' files (SB3, skrl, tmrl) apart without loading them, and reading one.

Nothing here unpickles: pickles are inspected opcode by opcode (:func:`pickletools.genops` only
parses), zips by their member names, ``.npy`` members not at all, ``.csv`` files by their header.
"""

from __future__ import annotations

import io
import os
import pickletools
import zipfile
from pathlib import Path

from emote_core.errors import FormatError
from emote_core.integrations.sb3.replay_buffer import SB3_FORMAT, read_sb3_replay_buffer
from emote_core.integrations.skrl.reader import (
    FLAG_TENSORS,
    PRIMARY_OBSERVATIONS,
    SKRL_FORMAT,
    read_skrl_memory,
)
from emote_core.integrations.tmrl.dataset import DATASET_FILE, TMRL_FORMAT, read_tmrl_dataset
from emote_core.stores.stored import StoredTable

PEER_FORMATS = (SB3_FORMAT, SKRL_FORMAT, TMRL_FORMAT)
"""The peer formats :func:`detect_peer_format` tells apart."""

_SB3_MODULE = "stable_baselines3.common.buffers"
_PEEK_OPCODES = 200
_PEEK_BYTES = 1 << 16
# A torch.save zip's data.pkl holds only the structure (about 35 opcodes per tensor; the data is
# in other members), so its names are read further: a PPO memory has 9 tensors.
_PEEK_TORCH_OPCODES = 10_000
_PEEK_TORCH_BYTES = 1 << 20
_STRINGS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING"}
_FRAMING = {"PROTO", "FRAME"}


def _peek_pickle(
    stream: io.BufferedIOBase, limit: int = _PEEK_OPCODES
) -> tuple[list[str], str | None, set[str]]:
    """The first two opcodes after the framing, the first global (``module.name``), strings."""
    first: list[str] = []
    found, strings = None, set()
    recent: list[str] = []
    try:
        for count, (opcode, argument, _) in enumerate(pickletools.genops(stream)):
            if count >= limit:
                break
            if opcode.name in _FRAMING:
                continue
            if len(first) < 2:
                first.append(opcode.name)
            if opcode.name in _STRINGS and isinstance(argument, str):
                recent.append(argument)
                strings.add(argument)
            elif opcode.name == "GLOBAL" and isinstance(argument, str):
                found = found or argument.replace(" ", ".")
            elif opcode.name == "STACK_GLOBAL" and len(recent) >= 2:
                found = found or f"{recent[-2]}.{recent[-1]}"
    except (ValueError, EOFError):  # a truncated pickle: judge by what was seen
        pass
    return first, found, strings


def _has_skrl_names(names: set[str]) -> bool:
    """An off-policy memory (an observation/next-observation pair), or an on-policy one: its
    observations and an end flag but no next observations. The reader refuses the latter with
    the reason, which beats calling it a file of no known format."""
    if "rewards" not in names or "actions" not in names:
        return False
    if any(n in names and f"next_{n}" in names for n in PRIMARY_OBSERVATIONS):
        return True
    observed = any(n in names for n in PRIMARY_OBSERVATIONS)
    return observed and any(flag in names for flag in FLAG_TENSORS)


def _zip_format(path: Path) -> str | None:
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.namelist()
            if members and all(name.endswith(".npy") for name in members):
                return SKRL_FORMAT if _has_skrl_names({n[:-4] for n in members}) else None
            pickles = [name for name in members if name.endswith("/data.pkl")]
            if len(pickles) != 1:
                return None  # emote's own zips, or other archives
            with archive.open(pickles[0]) as member:  # at most 1 MiB inflated
                head = io.BytesIO(member.read(_PEEK_TORCH_BYTES))
            _, _, strings = _peek_pickle(head, _PEEK_TORCH_OPCODES)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return None
    return SKRL_FORMAT if _has_skrl_names(strings) else None


def _csv_format(head: bytes) -> str | None:
    line = head.split(b"\n", 1)[0].strip().decode("utf-8", errors="replace")
    fields = [field.strip() for field in line.split(",")]
    if not fields or not all("." in field for field in fields):
        return None
    return SKRL_FORMAT if _has_skrl_names({f.rsplit(".", 1)[0] for f in fields}) else None


def detect_peer_format(path: str | os.PathLike[str]) -> str | None:
    """Which peer wrote ``path``, judged from its content (and, for text, its header).

    Returns:
        ``"sb3-replay-buffer"`` (a pickle whose first global is an SB3 buffer class),
        ``"tmrl-dataset"`` (a pickle of a list: its content is checked when read),
        ``"skrl-memory"`` (an ``.npz``, ``torch.save`` zip or ``.csv`` holding ``rewards``,
        ``actions`` and an observation/next-observation pair, or observations and an end flag
        as on-policy agents write them), or ``None`` for anything else, including missing, empty
        and emote's own files. A folder is ``"tmrl-dataset"`` when it holds a ``data.pkl`` that is
        one (tmrl's ``dataset_path``), else ``None``.
    """
    resolved = Path(path)
    if resolved.is_dir():
        pickled = resolved / DATASET_FILE
        if pickled.is_file() and detect_peer_format(pickled) == TMRL_FORMAT:
            return TMRL_FORMAT
        return None
    try:
        with resolved.open("rb") as file:
            head = file.read(4096)
            if not head:
                return None
            if head[:1] == b"\x80":
                file.seek(0)
                # From memory: a file's read(n) allocates the n bytes a length opcode declares.
                first, found, _ = _peek_pickle(io.BytesIO(file.read(_PEEK_BYTES)))
                if found is not None and found.startswith(f"{_SB3_MODULE}."):
                    return SB3_FORMAT
                top_list = first[:1] == ["EMPTY_LIST"] or first == ["MARK", "LIST"]
                return TMRL_FORMAT if top_list else None
    except OSError:
        return None
    if head.startswith(b"PK"):
        return _zip_format(resolved)
    return _csv_format(head)


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
        "or another kind of file); name its format with `format`"
    )


__all__ = ["PEER_FORMATS", "detect_peer_format", "read_peer_file"]
