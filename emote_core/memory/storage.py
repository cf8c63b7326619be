"""Where a table's data lives: per-column ring arrays, the episode index and the row allocator.

Every episode occupies one contiguous run of rows in every per-step column: ``N + 1`` rows for an
episode of ``N`` transitions (columns holding only ``N`` values leave the last row unused). So
step ``t``'s next observation is the row after it, and a window of ``L`` steps is ``L``
consecutive rows: sampling is one fancy-index gather per column, whatever the batch.

Rows are handed out like a ring: episodes are placed one after another and the write position
wraps to the start when an episode does not fit before the end. When the place a new episode
needs is still held by live episodes (too small a buffer, or episodes ejected out of insertion
order), all arrays are reallocated larger with the live episodes packed together.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from emote_core.errors import ConfigurationError
from emote_core.utils.arrays import aligned_empty
from emote_core.utils.memory_budget import check_memory_fits

_GROWTH = 1.125


def torch_dtype(dtype: np.dtype[Any]) -> torch.dtype:
    """The torch dtype that holds numpy ``dtype`` values."""
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


def check_rows_fit(
    *, rows: int, maxlen: int, columns: Sequence[tuple[tuple[int, ...], Any]], device: torch.device
) -> None:
    """Refuses a table whose rows cannot fit in memory before anything is allocated.

    Arrays on the CPU are only committed as rows are written, so without this check a table
    too large for the machine fails (or is killed) hours into a run, when it fills up.

    Args:
        rows: Rows each column will hold.
        maxlen: The table's ``maxlen``, for the message.
        columns: ``(shape, dtype)`` of each stored per-step column.
        device: Where the rows will live.

    Raises:
        ConfigurationError: Naming the estimate, the memory available and the largest
            ``maxlen`` that fits.
    """
    per_row = sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
                  for shape, dtype in columns)  # fmt: skip

    def fix(available: int) -> str:
        fits = max(0, (available // max(per_row, 1) - 64) * 64 // 65)  # maxlen whose rows fit
        return f"lower maxlen (memory.maxlen in a recipe) to at most {fits:,}"

    check_memory_fits(
        rows * per_row, device, what=f"a memory table of maxlen {maxlen:,}", fix=fix,
        detail=f"{per_row:,} bytes per transition",
    )  # fmt: skip


def host_to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """``array`` as a tensor on ``device`` (shared with it on the CPU).

    To CUDA the copy goes through pinned memory without blocking: a plain ``.to("cuda")`` from
    pageable memory waits for every kernel already queued (the previous update), a host sync on
    every sample. Torch's pinned-memory allocator keeps the staging buffer until the copy ran.
    """
    tensor = torch.from_numpy(array)
    if device.type == "cpu":
        return tensor
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


class RingArray:
    """A fixed-capacity array of rows for one column, on the CPU or a CUDA device.

    On the CPU the rows live in a numpy array shared with a torch tensor, so gathers are numpy
    ``take`` calls and results cross to torch without copies. On CUDA they live in a torch tensor
    on the device and gathers run there.
    """

    def __init__(
        self, *, shape: tuple[int, ...], dtype: np.dtype[Any], capacity: int, device: torch.device
    ) -> None:
        self.shape = shape
        self.dtype = np.dtype(dtype)
        self.device = device
        self._allocate(capacity)

    def _allocate(self, capacity: int) -> None:
        self.capacity = capacity
        if self.device.type == "cpu":
            # page-aligned: stores load into these rows about twice as fast (utils/arrays.py)
            self.host: np.ndarray | None = aligned_empty((capacity, *self.shape), self.dtype)
            self.tensor = torch.from_numpy(self.host)
        else:
            self.host = None
            self.tensor = torch.empty(
                (capacity, *self.shape), dtype=torch_dtype(self.dtype), device=self.device
            )

    @property
    def nbytes(self) -> int:
        """Bytes allocated for the rows (virtual on the CPU until written)."""
        return self.capacity * int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def write(self, start: int, values: np.ndarray) -> None:
        """Writes ``values`` into rows ``start, start + 1, ...``."""
        if self.host is not None:
            self.host[start : start + len(values)] = values
        else:
            self.tensor[start : start + len(values)] = torch.from_numpy(
                np.ascontiguousarray(values)
            ).to(self.device)

    def gather(self, rows: np.ndarray, device_rows: torch.Tensor | None = None) -> torch.Tensor:
        """The rows at ``rows`` as a new tensor on this array's device."""
        if self.host is not None:
            return torch.from_numpy(self.host.take(rows, axis=0))
        index = device_rows if device_rows is not None else host_to_device(rows, self.device)
        return self.tensor.index_select(0, index)

    def read(self, start: int, stop: int) -> np.ndarray:
        """A host copy of rows ``start:stop``."""
        if self.host is not None:
            return self.host[start:stop].copy()
        return self.tensor[start:stop].cpu().numpy()

    def relocate(self, capacity: int, moves: list[tuple[int, int, int]]) -> None:
        """Reallocates to ``capacity`` rows, copying ``(old_start, new_start, rows)`` runs."""
        old_host, old_tensor = self.host, self.tensor
        self._allocate(capacity)
        for old_start, new_start, count in moves:
            if old_host is not None and self.host is not None:
                self.host[new_start : new_start + count] = old_host[old_start : old_start + count]
            else:
                self.tensor[new_start : new_start + count] = old_tensor[
                    old_start : old_start + count
                ]


class EpisodeIndex:
    """Per-episode facts in slot arrays that strategies read vectorised.

    Attributes:
        ids: Episode identity per slot.
        starts: First row per slot.
        lengths: Transitions per slot (0 for free slots).
        terminal: Whether the episode ended TERMINAL (else INTERRUPTED).
        live: Whether the slot holds an episode.
        version: Incremented on every add and removal, so strategies can cache derived arrays.
    """

    def __init__(self, capacity: int = 64) -> None:
        self.ids = np.zeros(capacity, dtype=np.int64)
        self.starts = np.zeros(capacity, dtype=np.int64)
        self.lengths = np.zeros(capacity, dtype=np.int64)
        self.terminal = np.zeros(capacity, dtype=bool)
        self.live = np.zeros(capacity, dtype=bool)
        self.slot_of: dict[int, int] = {}
        self._free: list[int] = list(range(capacity - 1, -1, -1))
        self.version = 0

    @property
    def capacity(self) -> int:
        return len(self.live)

    def __len__(self) -> int:
        return len(self.slot_of)

    def add(self, identity: int, start: int, length: int, terminal: bool) -> int:
        """Records an episode and returns its slot."""
        if not self._free:
            self._grow()
        slot = self._free.pop()
        self.ids[slot] = identity
        self.starts[slot] = start
        self.lengths[slot] = length
        self.terminal[slot] = terminal
        self.live[slot] = True
        self.slot_of[identity] = slot
        self.version += 1
        return slot

    def add_block(
        self, identities: np.ndarray, starts: np.ndarray, lengths: np.ndarray, terminal: np.ndarray
    ) -> np.ndarray:
        """Records episodes in the empty index, in slots 0, 1, 2, ... as :meth:`add` hands them
        out after :meth:`clear`; returns the slots.

        Raises:
            ValueError: The index holds episodes.
        """
        if self.slot_of:
            raise ValueError("add_block needs an empty index")
        count = len(identities)
        while self.capacity < count:
            self._grow()
        slots = np.arange(count, dtype=np.int64)
        self.ids[:count], self.starts[:count] = identities, starts
        self.lengths[:count], self.terminal[:count] = lengths, terminal
        self.live[:count] = True
        self.slot_of = dict(zip(np.asarray(identities).tolist(), range(count), strict=True))
        self._free = list(range(self.capacity - 1, count - 1, -1))
        self.version += 1
        return slots

    def remove(self, slot: int) -> None:
        """Frees ``slot``."""
        del self.slot_of[int(self.ids[slot])]
        self.live[slot] = False
        self.lengths[slot] = 0
        self._free.append(slot)
        self.version += 1

    def clear(self) -> None:
        """Frees every slot. The version keeps counting, so no cache outlives the clear."""
        self.live[:] = False
        self.lengths[:] = 0
        self.slot_of.clear()
        self._free = list(range(self.capacity - 1, -1, -1))
        self.version += 1

    def live_slots(self) -> np.ndarray:
        """The slots that hold episodes."""
        return np.flatnonzero(self.live)

    def _grow(self) -> None:
        old = self.capacity
        new = old * 2
        for name in ("ids", "starts", "lengths", "terminal", "live"):
            array = getattr(self, name)
            grown = np.zeros(new, dtype=array.dtype)
            grown[:old] = array
            setattr(self, name, grown)
        self._free.extend(range(new - 1, old - 1, -1))


@dataclass
class _Placement:
    slot: int
    start: int
    rows: int
    lap: int


class RowAllocator:
    """Hands out contiguous runs of rows in ring order, and plans reallocations."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._placements: deque[_Placement] = deque()
        self._current: dict[int, _Placement] = {}
        self._write = 0
        self._lap = 0

    def clear(self) -> None:
        self._placements.clear()
        self._current.clear()
        self._write = 0
        self._lap = 0

    def find(self, rows: int) -> tuple[int, int] | None:
        """Where ``rows`` new rows go as ``(start, lap)``; ``None`` when live episodes hold them."""
        if rows > self.capacity:
            return None
        start, lap = self._write, self._lap
        if start + rows > self.capacity:
            start, lap = 0, lap + 1
        self._drop_dead()
        for placement in self._placements:
            if placement.lap >= lap or placement.start >= start + rows:
                break  # everything from here on lies behind the write position or past the run
            if placement.start + placement.rows > start and self._is_live(placement):
                return None
        return start, lap

    def commit(self, slot: int, start: int, rows: int, lap: int) -> None:
        """Records that ``slot`` now holds rows ``start:start + rows`` (from :meth:`find`)."""
        placement = _Placement(slot, start, rows, lap)
        self._placements.append(placement)
        self._current[slot] = placement
        self._write, self._lap = start + rows, lap

    def commit_block(self, slots: np.ndarray, starts: np.ndarray, rows: np.ndarray) -> None:
        """:meth:`commit` of each slot in turn, on lap 0 (an empty table filled in bulk)."""
        placements = [
            _Placement(slot, start, count, 0)
            for slot, start, count in zip(
                slots.tolist(), starts.tolist(), rows.tolist(), strict=True
            )
        ]
        self._placements.extend(placements)
        self._current.update((p.slot, p) for p in placements)
        if placements:
            self._write, self._lap = placements[-1].start + placements[-1].rows, 0

    def release(self, slot: int) -> None:
        """Forgets the rows of an ejected episode; they are reused when the ring comes round."""
        self._current.pop(slot, None)

    def used_rows(self) -> int:
        """Rows held by live episodes."""
        return sum(p.rows for p in self._current.values())

    def slots_in_order(self) -> list[int]:
        """The slots of live episodes in the order they were placed (added)."""
        return [p.slot for p in self._placements if self._is_live(p)]

    def plan_compaction(
        self, index: EpisodeIndex, extra_rows: int, minimum: int, shrink: bool = False
    ) -> tuple[int, list[tuple[int, int, int]]]:
        """A new capacity and the moves that pack live episodes at its start, oldest first.

        The capacity grows to fit live rows plus ``extra_rows`` with a margin, and never falls
        below ``minimum``, nor (unless ``shrink``) below the current capacity. Updates the episode
        starts in ``index``; the caller must apply the moves to every array.
        """
        self._drop_dead()
        live = [p for p in self._placements if self._is_live(p)]
        used = sum(p.rows for p in live)
        capacity = max(minimum, int((used + extra_rows) * _GROWTH) + 1)
        if not shrink:
            capacity = max(capacity, self.capacity)
        moves = []
        position = 0
        self.clear()
        for placement in live:
            moves.append((placement.start, position, placement.rows))
            index.starts[placement.slot] = position
            self.commit(placement.slot, position, placement.rows, 0)
            position += placement.rows
        self.capacity = capacity
        return capacity, moves

    def _drop_dead(self) -> None:
        while self._placements and not self._is_live(self._placements[0]):
            self._placements.popleft()

    def _is_live(self, placement: _Placement) -> bool:
        return self._current.get(placement.slot) is placement


class ColumnValues(dict[int, np.ndarray]):
    """One column's values of every held episode, keyed by episode id, oldest first.

    A snapshot (see ``ArrayMemoryTable.column_data``): the arrays are copies, so changing them
    or the table afterwards changes nothing in the other.

    Attributes:
        shape: The shape of one step's value (of the episode's value, for tags).
        dtype: The column's dtype.
    """

    def __init__(self, values: Mapping[int, np.ndarray], shape: tuple[int, ...], dtype: Any):
        super().__init__(values)
        self.shape = shape
        self.dtype = np.dtype(dtype)


class BaseStorage(ColumnValues):
    """A stored per-step column's values: episode id -> ``(rows, *shape)`` array."""


class TagStorage(ColumnValues):
    """A tag column's values: episode id -> the episode's one value, of the column's shape."""


class VirtualStorage(ColumnValues):
    """A virtual column's values as sampling derives them: episode id -> ``(rows, *shape)``
    (one row per episode for mappers that give one value per window)."""


class NextNElementView:
    """One episode's per-step values read ``n`` steps ahead: ``view[i]`` is ``values[i + n]``.

    Integer keys, slices with non-negative bounds and tuples of integers (each shifted by ``n``)
    are accepted. Reading past the end raises ``IndexError``, for slices too (numpy would
    return a shorter or empty array).

    Args:
        values: The episode's values, steps along the first axis.
        n: Steps ahead.
    """

    def __init__(self, values: Any, n: int) -> None:
        self._values = values
        self.n = n

    @property
    def shape(self) -> tuple[int, ...]:
        """The episode's values' shape (not shifted)."""
        return tuple(self._values.shape)

    def _shift(self, key: Any) -> int:
        if isinstance(key, bool) or not isinstance(key, int | np.integer):
            raise TypeError(
                f"a next-element view takes integers, slices or tuples of integers; got "
                f"{type(key).__name__} {key!r}"
            )
        if key < 0:
            raise IndexError(f"index {key} is negative; a next-element view reads from step 0")
        return int(key) + self.n

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, tuple):
            return self._values[tuple(self._shift(k) for k in key)]
        if isinstance(key, slice):
            length = len(self._values)
            start = self.n if key.start is None else self._shift(key.start)
            stop = length if key.stop is None else self._shift(key.stop)
            if key.step is not None and key.step < 1:
                raise IndexError(f"slice step {key.step} must be positive")
            if start >= length or stop > length:
                raise IndexError(
                    f"slice {key.start}:{key.stop} read {self.n} steps ahead is rows "
                    f"{start}:{stop}, past the {length} rows held"
                )
            return self._values[start : stop : key.step]
        return self._values[self._shift(key)]


def _steps_ahead(n: Any) -> int:
    """``n`` as a number of steps ahead: a non-negative integer.

    Raises:
        ConfigurationError: If it is not one.
    """
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
        raise ConfigurationError(f"n must be a non-negative integer of steps ahead; got {n!r}")
    return int(n)


class NextNElementWrapper:
    """Per-episode values read ``n`` steps ahead: ``wrapper[episode][i]`` is
    ``storage[episode][i + n]``, with reads past the episode's end refused (``IndexError``).

    Upstream emote's ``NextNElementWrapper``. ``storage`` is anything indexed by episode that
    gives per-step arrays: a :class:`BaseStorage` from ``table.column_data(name)``, or an array
    with episodes along its first axis. For a table's virtual column use
    :class:`~emote_core.memory.mappers.NextElementMapper` ``(n)`` instead, which is sampled with
    the batch.

    Args:
        storage: The per-episode values.
        shape: The shape of one step's value.
        dtype: Its dtype.
        n: Steps ahead (0 reads the values as they are).

    Raises:
        ConfigurationError: If ``n`` is not a non-negative integer.
    """

    def __init__(self, storage: Any, shape: tuple[int, ...], dtype: Any, *, n: int = 1) -> None:
        self._storage = storage
        self.n = _steps_ahead(n)
        self.value_shape = tuple(shape)
        self.dtype = np.dtype(dtype)

    @classmethod
    def with_n(cls, n: int) -> Callable[[Any, tuple[int, ...], Any], NextNElementWrapper]:
        """A constructor ``(storage, shape, dtype)`` of wrappers reading ``n`` steps ahead."""
        return functools.partial(cls, n=_steps_ahead(n))

    @property
    def shape(self) -> tuple[int, ...]:
        """The wrapped storage's shape."""
        return tuple(self._storage.shape)

    def __getitem__(self, episode: Any) -> NextNElementView:
        return NextNElementView(self._storage[episode], self.n)

    def sequence_length_transform(self, length: int) -> int:
        """Rows read for a window of ``length`` steps: ``length``."""
        return length


__all__ = [
    "BaseStorage",
    "ColumnValues",
    "EpisodeIndex",
    "NextNElementView",
    "NextNElementWrapper",
    "RingArray",
    "RowAllocator",
    "TagStorage",
    "VirtualStorage",
    "check_rows_fit",
    "host_to_device",
    "torch_dtype",
]
