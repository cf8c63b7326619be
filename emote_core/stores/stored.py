"""What every table reader produces, and the one all-or-nothing way it replaces a table's content.

Readers turn a file into a :class:`StoredTable`: column schemas, episodes as
``(identity, {column: array}, end_state)`` and, where the format has them, the strategies' types
and state. :func:`restore_stored` then checks the episodes against the table's rules before
touching it, and swaps the content in; if anything fails the table is put back as it was.
"""

from __future__ import annotations

import logging
import zipfile
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from emote_core.errors import FormatError, MemoryTableError
from emote_core.memory.columns import Column, TagColumn, VirtualColumn
from emote_core.memory.schema import TableSchema
from emote_core.typing import EpisodeState

if TYPE_CHECKING:
    from emote_core.memory.table import ArrayMemoryTable

log = logging.getLogger(__name__)

EpisodeRecord = tuple[int, dict[str, np.ndarray], EpisodeState]
"""One episode as readers return it: ``(identity, {column: array}, end_state)``."""

COLUMN_KINDS = ("Column", "TagColumn", "VirtualColumn")
"""Column kinds by their class names, as upstream emote's files spell them."""

_INT64_MIN, _INT64_LIMIT, _UINT64_LIMIT = -(2**63), 2**63, 2**64


@dataclass(frozen=True)
class ColumnSchema:
    """A column as a file describes it.

    Attributes:
        name: The column's name.
        kind: ``"Column"``, ``"TagColumn"`` or ``"VirtualColumn"``.
        shape: The shape of one step's (or, for tags, the episode's) value.
        dtype: The stored dtype.
        target_name: The column a virtual column reads, if any.
        mapper: A description of a virtual column's mapper (``{"type": ...}``), if known.
    """

    name: str
    kind: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    target_name: str | None = None
    mapper: dict[str, Any] | None = None

    @classmethod
    def of(cls, column: Column | TagColumn | VirtualColumn) -> ColumnSchema:
        """The schema of a table's column."""
        if isinstance(column, VirtualColumn):
            return cls(
                column.name,
                "VirtualColumn",
                tuple(column.shape),
                np.dtype(column.dtype),
                column.target_name,
                column.mapper.describe(),
            )
        kind = "TagColumn" if isinstance(column, TagColumn) else "Column"
        return cls(column.name, kind, tuple(column.shape), np.dtype(column.dtype))

    @property
    def stored(self) -> bool:
        """Whether the column holds data in the file (not virtual)."""
        return self.kind != "VirtualColumn"

    def describe(self) -> str:
        return f"{self.kind} of shape {self.shape} and dtype {self.dtype}"


@dataclass
class StoredTable:
    """Everything a reader got from a file.

    Attributes:
        source: The file, for messages.
        format: What the file was read as (``"emote-v1"``, ``"emote-legacy"``, ``"legacy-pickle"``).
        columns: The file's column schemas.
        episodes: The episodes, oldest first.
        length_key: The column whose rows count an episode's transitions, if recorded.
        maxlen: The capacity of the table that wrote the file, if recorded.
        ejector_type: The class name of the writer's ejection strategy, if recorded.
        ejector_state: Its saved state, if any.
        sampler_type: The class name of the writer's sample strategy, if recorded.
        sampler_state: Its saved state, if any.
        spaces: The MDP spaces as :meth:`emote_core.spaces.MDPSpace.to_json` writes them, if known.
        metadata: Anything else the source recorded that is worth keeping (JSON-compatible).
    """

    source: str
    format: str
    columns: list[ColumnSchema]
    episodes: list[EpisodeRecord] = field(default_factory=list)
    length_key: str | None = None
    maxlen: int | None = None
    ejector_type: str | None = None
    ejector_state: dict[str, Any] | None = None
    sampler_type: str | None = None
    sampler_state: dict[str, Any] | None = None
    spaces: dict[str, Any] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


ENVIRONMENT = "environment"
"""The :attr:`StoredTable.metadata` key of the environment a source was recorded on, where it
says: ``{"id", "kwargs", "max_episode_steps"}`` (what ``gymnasium.make`` needs to rebuild it)."""


def signed_identity(value: Any, *, source: str) -> int:
    """An episode id as int64; ids written unsigned (upstream's ``id + 2**64``) wrap back.

    Raises:
        FormatError: If ``value`` is not an integer within the int64/uint64 range.
    """
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise FormatError(f"{source} has episode id {value!r}; episode ids must be integers")
    identity = int(value)
    if not _INT64_MIN <= identity < _UINT64_LIMIT:
        raise FormatError(f"{source} has episode id {identity}, outside the 64-bit range")
    return identity - _UINT64_LIMIT if identity >= _INT64_LIMIT else identity


MAX_EXPANSION = 200
"""A member may decompress to at most this many times its compressed size..."""
EXPANSION_FLOOR = 64 << 20
"""...once it declares more than this many bytes (small members may compress as well as they
like: a column of zeros does)."""


def read_member(archive: zipfile.ZipFile, name: str, *, source: str) -> bytes:
    """The bytes of one zip member, refusing decompression bombs before reading.

    A member that declares more than :data:`EXPANSION_FLOOR` bytes and more than
    :data:`MAX_EXPANSION` times its compressed size is refused unread; no member yields more
    bytes than its header declares (zipfile stops there, and checks the CRC). What the whole
    archive may expand to is the readers' :class:`~emote_core.stores.budget.AllocationBudget`.

    Raises:
        FormatError: If the member is missing, cannot be read (truncated or corrupt archive), or
            would expand beyond the limits.
    """
    try:
        info = archive.getinfo(name)
        declared, packed = int(info.file_size), int(info.compress_size)
        if declared > EXPANSION_FLOOR and declared > MAX_EXPANSION * max(packed, 1):
            raise FormatError(
                f"{source}: member '{name}' declares {declared:,} bytes from {packed:,} "
                f"compressed ({declared / max(packed, 1):,.0f}x); emote reads no member that "
                f"expands over {MAX_EXPANSION}x beyond {EXPANSION_FLOOR >> 20} MiB (a "
                "decompression bomb or a damaged header)"
            )
        return archive.read(info)
    except KeyError:
        raise FormatError(
            f"{source} has no member '{name}'; members: {sorted(archive.namelist())[:20]}"
        ) from None
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError) as error:
        raise FormatError(
            f"{source} is damaged: member '{name}' cannot be read ({error})"
        ) from error


def check_schema(table: ArrayMemoryTable, columns: Sequence[ColumnSchema], *, source: str) -> None:
    """Checks that the file holds every stored and tag column of ``table``, with equal schemas.

    Raises:
        FormatError: Naming the first column that is missing or differs, with both schemas.
    """
    found = {column.name: column for column in columns}
    for column in (*table.stored, *table.tags):
        expected = ColumnSchema.of(column)
        have = found.get(column.name)
        if have is None or not have.stored:
            stored = sorted(c.name for c in columns if c.stored)
            raise FormatError(
                f"{source} does not store column '{column.name}' that the table needs "
                f"({expected.describe()}); the file stores {stored} — build the table with the "
                "file's columns"
            )
        if (have.kind, have.shape, have.dtype) != (expected.kind, expected.shape, expected.dtype):
            raise FormatError(
                f"column '{column.name}' differs: {source} holds a {have.describe()}, the table "
                f"expects a {expected.describe()} — build the table with the file's schema"
            )
    unused = sorted(c.name for c in columns if c.stored and c.name not in table.columns)
    if unused:
        log.warning("%s stores columns %s that the table does not have; skipped", source, unused)


def fit_episodes(
    table: ArrayMemoryTable, episodes: Iterable[EpisodeRecord], *, source: str
) -> list[EpisodeRecord]:
    """Checks every episode against the table's rules, without touching the table.

    Keeps only the table's stored and tag columns and applies the checks of
    :meth:`ArrayMemoryTable.add_sequence` up front, on a scratch copy of the table's schema:
    unique int64 ids, a TERMINAL or INTERRUPTED end, ``1..maxlen`` transitions, shapes and
    dtypes, ``N`` or ``N + 1`` rows per step column (the same choice in every episode) and the
    rows virtual columns read.

    Returns:
        The episodes with their arrays converted to the columns' dtypes.

    Raises:
        FormatError: Naming the source, the episode, the column and the rule it breaks.
    """
    scratch = TableSchema(list(table.columns.values()), table.length_key)
    wanted = {column.name for column in (*table.stored, *table.tags)}
    seen: set[int] = set()
    fitted: list[EpisodeRecord] = []
    for identity, data, end_state in episodes:
        sequence = {name: value for name, value in data.items() if name in wanted}
        try:
            identity = scratch.check_identity(identity, seen)
            values, _ = scratch.validate(identity, sequence, table.maxlen, end_state)
        except MemoryTableError as error:
            raise FormatError(f"{source} cannot fill the table: {error}") from error
        seen.add(identity)
        fitted.append((identity, values, EpisodeState(end_state)))
    return fitted


def restore_stored(table: ArrayMemoryTable, stored: StoredTable) -> None:
    """Replaces ``table``'s content with ``stored``'s episodes, all or nothing.

    The strategies' saved state is loaded when the file's strategy types match the table's;
    otherwise the table's strategies start from the restored episodes in file order.

    Raises:
        FormatError: If an episode breaks the table's rules, or restoring fails midway (the
            table is then put back as it was).
    """
    source = stored.source
    check_schema(table, stored.columns, source=source)
    episodes = fit_episodes(table, stored.episodes, source=source)
    if stored.length_key is not None and stored.length_key != table.length_key:
        log.warning(
            "%s counts transitions by '%s'; the table by '%s'",
            source,
            stored.length_key,
            table.length_key,
        )
    total = sum(len(data[table.length_key]) for _, data, _ in episodes)
    if total > table.maxlen:
        log.warning(
            "%s holds %d transitions, more than the table's maxlen %d: the oldest "
            "episodes are ejected while restoring",
            source,
            total,
            table.maxlen,
        )
    ejector_state = _state_for(table.ejector, stored.ejector_type, stored.ejector_state, source)
    sampler_state = _state_for(table.sampler, stored.sampler_type, stored.sampler_state, source)
    replace_content(
        table, episodes, ejector_state=ejector_state, sampler_state=sampler_state, source=source
    )


def _state_for(strategy: Any, saved_type: str | None, state: Any, source: str) -> Any:
    if saved_type is None or state is None:
        return None
    if saved_type != type(strategy).__name__:
        log.warning(
            "%s was written with a %s; the table uses a %s, which starts fresh",
            source,
            saved_type,
            type(strategy).__name__,
        )
        return None
    return state


def replace_content(
    table: ArrayMemoryTable,
    episodes: Sequence[EpisodeRecord],
    *,
    ejector_state: dict[str, Any] | None = None,
    sampler_state: dict[str, Any] | None = None,
    source: str,
) -> None:
    """Clears ``table``, adds ``episodes`` in order and loads the strategies' state.

    If anything fails (or the process is interrupted) midway, the table's previous episodes
    and strategy state are put back before the error propagates.

    Raises:
        FormatError: Wrapping the error that stopped the restore.
    """
    backup = None
    if table.episode_count:
        backup = (list(table.episodes()), table.sampler.state(), table.ejector.state())
    try:
        table.clear()
        for identity, data, end_state in episodes:
            table.add_sequence(identity, data, end_state=end_state)
        if ejector_state is not None:
            table.ejector.load_state(ejector_state)
        if sampler_state is not None:
            table.sampler.load_state(sampler_state)
    except BaseException as error:
        table.clear()
        if backup is not None:
            previous, sampler, ejector = backup
            for identity, data, end_state in previous:
                table.add_sequence(identity, data, end_state=end_state)
            table.ejector.load_state(ejector)
            table.sampler.load_state(sampler)
        if isinstance(error, Exception) and not isinstance(error, FormatError):
            raise FormatError(
                f"restoring {source} failed ({type(error).__name__}: {error}); the table was left "
                "as it was"
            ) from error
        raise


__all__ = [
    "COLUMN_KINDS",
    "ENVIRONMENT",
    "ColumnSchema",
    "EpisodeRecord",
    "StoredTable",
    "check_schema",
    "fit_episodes",
    "read_member",
    "replace_content",
    "restore_stored",
    "signed_identity",
]
