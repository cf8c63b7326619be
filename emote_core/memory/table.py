"""ArrayMemoryTable: whole episodes in RAM or on a GPU, sampled as fixed-length windows."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from emote_core.errors import (
    ConfigurationError,
    MemoryTableError,
)
from emote_core.memory.adaptors import Adaptor
from emote_core.memory.columns import AnyColumn, TagColumn, VirtualColumn
from emote_core.memory.mappers import SampleContext
from emote_core.memory.schema import TableSchema
from emote_core.memory.storage import (
    BaseStorage,
    ColumnValues,
    EpisodeIndex,
    RingArray,
    RowAllocator,
    TagStorage,
    VirtualStorage,
    check_rows_fit,
)
from emote_core.memory.strategies.base import EjectionStrategy, SampledWindows, SampleStrategy
from emote_core.memory.table_bulk import TableBulkFill
from emote_core.memory.table_sampling import (
    IMPORTANCE_WEIGHTS_KEY,
    TableSampling,
    synchronized,
)
from emote_core.typing import EpisodeState

log = logging.getLogger(__name__)


class NonfiniteValues(NamedTuple):
    """Where a float column of a table holds NaN or infinities (see ``find_nonfinite``).

    Attributes:
        column: The column.
        count: How many such values it holds.
        episodes: How many episodes hold any.
        episode: The id of the first (oldest) such episode.
        row: The first such row within it.
    """

    column: str
    count: int
    episodes: int
    episode: int
    row: int


def _headroom(maxlen: int) -> int:
    """Rows to allocate for ``maxlen`` transitions: one extra row per episode needs a margin."""
    return maxlen + maxlen // 64 + 64


class _FullQuery:
    """What ``table.full`` gives: call it (``table.full()``); its truth value is refused.

    Upstream emote's ``full`` is a method; were it a plain property here, ``table.full()`` would
    fail, and were it a plain method, code written as ``if table.full:`` would always be true.
    """

    __slots__ = ("_table",)

    def __init__(self, table: ArrayMemoryTable) -> None:
        self._table = table

    def __call__(self) -> bool:
        with self._table._lock:
            return self._table._is_full()

    def __bool__(self) -> bool:
        raise MemoryTableError(
            "table.full is a method (as in upstream emote): write table.full(), not table.full"
        )

    def __repr__(self) -> str:
        return f"<method full of {self._table!r}>"


class ArrayMemoryTable(TableSampling, TableBulkFill):
    """A table of whole episodes, sampled as windows that never cross an episode boundary.

    Args:
        columns: The stored (:class:`Column`, :class:`TagColumn`) and derived
            (:class:`VirtualColumn`) columns.
        maxlen: The most transitions held; whole episodes are ejected to stay within it.
        sampler: Chooses sampled windows.
        ejector: Chooses which episode to eject.
        length_key: The column whose length is an episode's transition count (its rewards).
        adaptors: Functions applied, in order, to every sampled batch.
        device: Where the data lives and batches are returned: ``"cpu"`` or ``"cuda[:n]"``.
        seed: Seed of the table's random generator (sampling), for reproducible runs.

    Raises:
        ConfigurationError: If columns clash, a virtual column's target is missing, or
            ``length_key`` is not a stored per-step column.
    """

    def __init__(
        self,
        *,
        columns: Sequence[AnyColumn],
        maxlen: int,
        sampler: SampleStrategy,
        ejector: EjectionStrategy,
        length_key: str,
        adaptors: Sequence[Adaptor] = (),
        device: str | torch.device = "cpu",
        seed: int | None = None,
    ) -> None:
        if not isinstance(maxlen, int) or maxlen < 1:
            raise ConfigurationError(
                f"maxlen must be a positive number of transitions; got {maxlen!r}"
            )
        self.schema = TableSchema(columns, length_key)
        self.columns = self.schema.columns
        self.stored, self.tags, self.virtual = (
            self.schema.stored,
            self.schema.tags,
            self.schema.virtual,
        )
        hidden = {column.target_name for column in self.virtual if column.mapper.hides_target}
        self.sampled = [column for column in self.stored if column.name not in hidden]
        """The stored columns that batches hold (not the frames that frame stacks are built
        from)."""
        self.maxlen = maxlen
        self.length_key = length_key
        self.sampler = sampler
        self.ejector = ejector
        self.adaptors = list(adaptors)
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ConfigurationError("device 'cuda' was asked for but torch sees no CUDA device")
        self.rng = np.random.default_rng(seed)
        self.index = EpisodeIndex()
        check_rows_fit(
            rows=_headroom(maxlen), maxlen=maxlen, columns=self._shapes(), device=self.device
        )
        self._allocator = RowAllocator(_headroom(maxlen))
        self._arrays = {
            c.name: RingArray(
                shape=c.shape, dtype=c.dtype, capacity=self._allocator.capacity, device=self.device
            )
            for c in self.stored
        }
        self._tag_values = {
            c.name: np.zeros((self.index.capacity, *c.shape), dtype=c.dtype) for c in self.tags
        }
        self._lock = threading.RLock()
        self._size = 0
        self._filled = False
        self._last_sample: SampledWindows | None = None
        self._last_identities = np.zeros(0, dtype=np.int64)
        self._last_sequence_length = 0
        sampler.attach(self.index)
        ejector.attach(self.index)

    # Size.

    def size(self) -> int:
        """Transitions held."""
        return self._size

    def __len__(self) -> int:
        return self._size

    @property
    def episode_count(self) -> int:
        """Episodes held."""
        return len(self.index)

    @property
    def full(self) -> _FullQuery:
        """``table.full()``: whether the table is saturated, as upstream emote's ``full()``.

        True once the table has ejected episodes to make room (or holds exactly ``maxlen``
        transitions), until :meth:`clear`. As tables hold and eject whole episodes, a full
        table usually holds fewer than ``maxlen`` transitions. ``full`` is a method, as
        upstream's: using it without the call (``if table.full:``) raises instead of being
        always true.
        """
        return _FullQuery(self)

    def _is_full(self) -> bool:
        return self._filled or self._size >= self.maxlen

    def random_generators(self) -> dict[str, np.random.Generator | torch.Generator]:
        """The sampling generator and those of adaptors that draw (image shifts), for
        checkpoints."""
        from emote_core.utils.random_state import generators_of

        generators: dict[str, np.random.Generator | torch.Generator] = {"sampling": self.rng}
        generators.update(generators_of(self.ejector, "ejector."))  # random ejection
        for position, adaptor in enumerate(self.adaptors):
            generators.update(generators_of(adaptor, f"adaptor{position}."))
        return generators

    # Adding.

    def add_sequence(
        self,
        identity: int,
        sequence: Mapping[str, Any],
        *,
        end_state: EpisodeState = EpisodeState.TERMINAL,
    ) -> None:
        """Adds one whole episode, ejecting old episodes to stay within ``maxlen``.

        Args:
            identity: The episode's id (any int64, unique among held episodes).
            sequence: One array per stored column: ``N`` or ``N + 1`` rows for per-step columns
                (``N`` = rows of ``length_key``), one value for tag columns.
            end_state: ``TERMINAL`` (masks 0 at the last transition) or ``INTERRUPTED`` (1).

        Raises:
            SchemaError: A column is missing, unknown, or has the wrong shape, dtype or length;
                the table is unchanged.
            DuplicateEpisodeError: ``identity`` is already held; the table is unchanged.
        """
        sequence = self.stored_sequence(sequence)
        with self._lock:
            identity = self.schema.check_identity(identity, self.index.slot_of)
            values, length = self.schema.validate(identity, sequence, self.maxlen, end_state)
            self._insert(identity, values, length, end_state)

    def stored_sequence(self, sequence: Mapping[str, Any]) -> Mapping[str, Any]:
        """The episode ``sequence`` as this table stores it (what :meth:`episodes` gives back and
        stores hold). The same sequence here; tables that store an entry in another form than
        agents see it (frame stacks as single frames) convert it. :meth:`add_sequence` takes
        either form.
        """
        return sequence

    @property
    def stores_as_given(self) -> bool:
        """Whether :meth:`stored_sequence` gives every sequence back unchanged."""
        return True

    def _insert(
        self, identity: int, values: dict[str, Any], length: int, end_state: EpisodeState
    ) -> None:
        self._make_room(length)
        rows = length + 1
        place = self._allocator.find(rows)
        if place is None:
            self._compact(extra_rows=rows)
            place = self._allocator.find(rows)
            if place is None:  # compaction always leaves room at the end
                raise MemoryTableError("internal error: no room after compaction")
        start, lap = place
        for column in self.stored:
            self._arrays[column.name].write(start, values[column.name])
        slot = self.index.add(identity, start, length, end_state == EpisodeState.TERMINAL)
        self._sync_tag_capacity()
        for column in self.tags:
            self._tag_values[column.name][slot] = values[column.name]
        self._allocator.commit(slot, start, rows, lap)
        self.sampler.track(slot=slot, identity=identity)
        self.ejector.track(slot=slot, identity=identity)
        self._size += length

    def _make_room(self, length: int) -> None:
        while self._size + length > self.maxlen:
            self._remove(self.ejector.choose())
            self._filled = True

    def _remove(self, slot: int) -> None:
        identity = int(self.index.ids[slot])
        self.sampler.forget(slot=slot, identity=identity)
        self.ejector.forget(slot=slot, identity=identity)
        self._allocator.release(slot)
        self._size -= int(self.index.lengths[slot])
        self.index.remove(slot)

    def _compact(self, extra_rows: int, minimum: int = 0, shrink: bool = False) -> None:
        capacity, moves = self._allocator.plan_compaction(self.index, extra_rows, minimum, shrink)
        log.debug("memory table reallocated to %d rows (%d episodes moved)", capacity, len(moves))
        for array in self._arrays.values():
            array.relocate(capacity, moves)
        self.sampler.relocated(moves)
        self.ejector.relocated(moves)

    def _sync_tag_capacity(self) -> None:
        for name, values in self._tag_values.items():
            if len(values) < self.index.capacity:
                grown = np.zeros((self.index.capacity, *values.shape[1:]), dtype=values.dtype)
                grown[: len(values)] = values
                self._tag_values[name] = grown

    # Capacity.

    @synchronized
    def resize(self, maxlen: int) -> None:
        """Changes ``maxlen``; shrinking ejects whole episodes (by the ejector) and frees memory."""
        if not isinstance(maxlen, int) or maxlen < 1:
            raise ConfigurationError(
                f"maxlen must be a positive number of transitions; got {maxlen!r}"
            )
        target = _headroom(maxlen)
        if target > self._allocator.capacity:
            check_rows_fit(rows=target, maxlen=maxlen, columns=self._shapes(), device=self.device)
        self.maxlen = maxlen
        self._make_room(0)
        if target != self._allocator.capacity:
            self._compact(extra_rows=0, minimum=target, shrink=True)

    def _shapes(self) -> list[tuple[tuple[int, ...], Any]]:
        return [(column.shape, column.dtype) for column in self.stored]

    @synchronized
    def clear(self) -> None:
        """Removes every episode and resets the strategies' state."""
        self.index.clear()
        self._allocator.clear()
        self.sampler.clear()
        self.ejector.clear()
        self.schema.extra_rows.clear()
        self._size = 0
        self._filled = False
        self._last_sample = None

    # Reading back.

    def episodes(self) -> Iterator[tuple[int, dict[str, np.ndarray], EpisodeState]]:
        """Every held episode as ``(identity, {column: array}, end_state)``, oldest first.

        The episodes are copied when iteration starts, so the table may change meanwhile.
        """
        with self._lock:
            held = [self._read_episode(int(slot)) for slot in self.live_slots_in_order()]
        yield from held

    def column_data(self, name: str) -> ColumnValues:
        """Every held episode's values of column ``name``, keyed by episode id, oldest first.

        A snapshot of copies. Stored per-step columns give a :class:`BaseStorage` of
        ``(rows, *shape)`` arrays, tags a :class:`TagStorage` of one value each, and virtual
        columns a :class:`VirtualStorage` of what sampling derives over each whole episode.

        Raises:
            MemoryTableError: If the table has no column ``name``.
        """
        column = self.columns.get(name)
        if column is None:
            raise MemoryTableError(
                f"the table has no column '{name}'; its columns are {sorted(self.columns)}"
            )
        with self._lock:
            slots = [int(slot) for slot in self.live_slots_in_order()]
            ids = [int(self.index.ids[slot]) for slot in slots]
            if isinstance(column, TagColumn):
                values = [self._tag_values[name][slot].copy() for slot in slots]
                return TagStorage(zip(ids, values, strict=True), column.shape, column.dtype)
            if isinstance(column, VirtualColumn):
                values = [self._derive(column, slot) for slot in slots]
                return VirtualStorage(zip(ids, values, strict=True), column.shape, column.dtype)
            extra = self.schema.extra_rows.get(name, 0)
            values = []
            for slot in slots:
                start, length = int(self.index.starts[slot]), int(self.index.lengths[slot])
                values.append(self._arrays[name].read(start, start + length + extra))
            return BaseStorage(zip(ids, values, strict=True), column.shape, column.dtype)

    def _derive(self, column: VirtualColumn, slot: int) -> np.ndarray:
        """``column``'s values over the whole episode in ``slot``, as one sampled window."""
        length = int(self.index.lengths[slot])
        context = SampleContext(
            slots=np.array([slot]),
            offsets=np.zeros(1, dtype=np.int64),
            sequence_length=length,
            starts=self.index.starts[[slot]],
            lengths=self.index.lengths[[slot]],
            terminal=self.index.terminal[[slot]],
            device=self.device,
        )
        target = self._arrays.get(column.target_name)
        values = column.mapper.map(context, target, column.shape, column.dtype)
        return values.detach().cpu().numpy().copy()

    def _read_episode(self, slot: int) -> tuple[int, dict[str, np.ndarray], EpisodeState]:
        start, length = int(self.index.starts[slot]), int(self.index.lengths[slot])
        data = {
            c.name: self._arrays[c.name].read(
                start, start + length + self.schema.extra_rows[c.name]
            )
            for c in self.stored
        }
        for column in self.tags:
            data[column.name] = self._tag_values[column.name][slot].copy()
        end = EpisodeState.TERMINAL if self.index.terminal[slot] else EpisodeState.INTERRUPTED
        return int(self.index.ids[slot]), data, end

    def store(self, path: Any) -> None:
        """Refused: upstream emote's ``table.store(path)`` is a function of the stores here.

        Raises:
            MemoryTableError: Always, naming the call to write instead.
        """
        raise MemoryTableError(
            f"table.store({path!r}) is upstream emote's table method; emote writes tables with "
            "emote_core.integrations.upstream.store_table(table, path) (note: it writes the "
            "exact name given, where upstream appended '.zip') or into an emote-memory Zarr store"
        )

    def restore(self, path: Any) -> None:
        """Refused: upstream emote's ``table.restore(path)`` is a function of the stores here.

        Raises:
            MemoryTableError: Always, naming the call to write instead.
        """
        raise MemoryTableError(
            f"table.restore({path!r}) is upstream emote's table method; emote reads tables with "
            "emote_core.integrations.upstream.restore_table(table, path), which accepts the path "
            "with or without '.zip'"
        )

    @synchronized
    def write_steps(self, identity: int, name: str, *, offset: int, values: np.ndarray) -> None:
        """Overwrites rows ``offset, offset + 1, ...`` of a stored column of a held episode.

        For values computed after an episode was added (skrl's on-policy agents set returns
        and advantages in place).

        Raises:
            MemoryTableError: The episode is not held, the column is not stored, or the rows do
                not fit the episode.
        """
        slot = self.index.slot_of.get(int(identity))
        if slot is None:
            raise MemoryTableError(f"episode {identity} is not in the table")
        if name not in self._arrays:
            raise MemoryTableError(
                f"column '{name}' is not a stored column; stored columns are {sorted(self._arrays)}"
            )
        values = np.asarray(values)
        rows = int(self.index.lengths[slot]) + self.schema.extra_rows.get(name, 0)
        if offset < 0 or offset + len(values) > rows:
            raise MemoryTableError(
                f"rows {offset}..{offset + len(values) - 1} do not fit column '{name}' of "
                f"episode {identity}, which has {rows} rows"
            )
        self._arrays[name].write(int(self.index.starts[slot]) + offset, values)

    def nbytes(self) -> int:
        """Bytes allocated for stored columns (CPU pages count only once written)."""
        return sum(array.nbytes for array in self._arrays.values())

    def find_nonfinite(self) -> NonfiniteValues | None:
        """The first float column (in schema order) whose held rows hold NaN or infinities.

        Columns are scanned in pieces of about 64 MiB, on the table's device.

        Returns:
            ``None`` when every held value is finite.
        """
        with self._lock:
            slots = self.live_slots_in_order()
            if len(slots) == 0:
                return None
            starts = self.index.starts[slots].astype(np.int64)
            lengths = self.index.lengths[slots].astype(np.int64)
            for column in self.stored:
                if np.dtype(column.dtype).kind not in "fc":
                    continue
                held = lengths + self.schema.extra_rows.get(column.name, 0)
                ends = np.cumsum(held)
                firsts = ends - held
                rows = np.repeat(starts - firsts, held) + np.arange(int(ends[-1]))
                count, flagged = self._nonfinite_rows(self._arrays[column.name], rows)
                if count:
                    episode_of = np.searchsorted(ends, flagged, side="right")
                    k = int(episode_of[0])
                    return NonfiniteValues(
                        column.name, count, len(np.unique(episode_of)),
                        int(self.index.ids[slots[k]]), int(flagged[0] - firsts[k]),
                    )  # fmt: skip
        return None

    @staticmethod
    def _nonfinite_rows(array: RingArray, rows: np.ndarray) -> tuple[int, np.ndarray]:
        """Non-finite values among ``rows`` of ``array``, and which of ``rows`` hold any."""
        row_bytes = max(int(np.prod(array.shape, dtype=np.int64)) * array.dtype.itemsize, 1)
        step = max(1, (64 << 20) // row_bytes)
        count, flagged = 0, []
        for first in range(0, len(rows), step):
            chunk = rows[first : first + step]
            if array.host is not None:
                bad = ~np.isfinite(array.host.take(chunk, axis=0).reshape(len(chunk), -1))
                count += int(bad.sum())
                flagged.append(np.flatnonzero(bad.any(axis=1)) + first)
            else:
                index = torch.from_numpy(chunk).to(array.device)
                found = ~torch.isfinite(array.tensor.index_select(0, index).reshape(len(chunk), -1))
                count += int(found.sum())
                flagged.append(torch.nonzero(found.any(dim=1)).flatten().cpu().numpy() + first)
        return count, np.concatenate(flagged) if flagged else np.zeros(0, np.int64)

    def __repr__(self) -> str:
        return (
            f"ArrayMemoryTable(episodes={self.episode_count}, transitions={self._size}, "
            f"maxlen={self.maxlen}, columns={list(self.columns)}, device={self.device})"
        )


__all__ = ["IMPORTANCE_WEIGHTS_KEY", "ArrayMemoryTable", "NonfiniteValues"]
