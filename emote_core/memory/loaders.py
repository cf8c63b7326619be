"""Loaders: endless iterables of sampled batches for the :class:`~emote_core.trainer.Trainer`.

A :class:`MemoryLoader` samples one table and yields DESIGN.md's batch layout::

    {data_group: {**table.sample(rollout_count, rollout_length), size_key: n}, size_key: n}

with ``n = rollout_count * rollout_length``. :class:`JointMemoryLoader` merges several loaders'
batches (one data group each) into one, and :class:`JointMemoryLoaderWithDataGroup` nests that
merged batch under a data group of its own. Loaders never wait for data: a warm-up callback
fills the tables before training starts, and sampling a table too early raises its
:class:`~emote_core.errors.SamplingError`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from emote_core.errors import ConfigurationError
from emote_core.utils.checks import non_empty_string


@runtime_checkable
class SampledTable(Protocol):
    """What a :class:`MemoryLoader` needs of a table (an ``ArrayMemoryTable`` has it all)."""

    index: Any
    """The episode index; its ``lengths`` array gives each held episode's transitions."""

    def size(self) -> int:
        """Transitions held."""
        ...

    def sample(self, count: int, sequence_length: int) -> dict[str, Any]:
        """Samples ``count`` windows of ``sequence_length`` transitions."""
        ...


@runtime_checkable
class GroupLoader(Protocol):
    """A loader whose batches hold one data group and a top-level sample count."""

    data_group: str
    size_key: str

    def is_ready(self) -> bool:
        """Whether the loader can produce a batch now."""
        ...

    def __iter__(self) -> Iterator[dict[str, Any]]: ...


class MemoryLoader:
    """Samples ``rollout_count`` windows of ``rollout_length`` transitions per batch, forever.

    Args:
        table: The table to sample.
        rollout_count: Windows per batch.
        rollout_length: Transitions per window.
        size_key: The key holding the batch's sample count ``rollout_count * rollout_length``,
            inside the data group and at the top level (the trainer's ``batch_size_key``).
        data_group: The data group the batch is yielded under.
        batches_per_sample: Batches drawn by one table sample and handed out in turn. On a GPU
            table one large gather costs little more than a small one, so this divides the
            per-sample host work; the last batch of a draw is ``batches_per_sample - 1`` updates
            older than the newest data. Prioritized tables take 1 (their feedback is about the
            most recent sample).

    Raises:
        ConfigurationError: If a count is not a positive integer, or a key is empty or the data
            group and size key coincide.
    """

    def __init__(
        self,
        *,
        table: SampledTable,
        rollout_count: int,
        rollout_length: int,
        size_key: str = "batch_size",
        data_group: str = "default",
        batches_per_sample: int = 1,
    ) -> None:
        counts = (
            ("rollout_count", rollout_count), ("rollout_length", rollout_length),
            ("batches_per_sample", batches_per_sample),
        )  # fmt: skip
        for what, value in counts:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(
                    f"MemoryLoader's {what} must be a positive integer; got {value!r}"
                )
        non_empty_string("MemoryLoader", "size_key", size_key)
        non_empty_string("MemoryLoader", "data_group", data_group)
        if size_key == data_group:
            raise ConfigurationError(
                f"MemoryLoader's data_group and size_key are both '{size_key}'; the batch needs "
                "them as two different keys"
            )
        self.table = table
        self.rollout_count = rollout_count
        self.rollout_length = rollout_length
        self.size_key = size_key
        self.data_group = data_group
        if batches_per_sample > 1 and getattr(table, "prioritized", False):
            raise ConfigurationError(
                "a prioritized table takes batches_per_sample = 1: its priorities are fed back "
                "for the most recent sample"
            )
        self.batches_per_sample = batches_per_sample
        self._drawn: deque[dict[str, Any]] = deque()

    @property
    def batch_size(self) -> int:
        """Transitions per batch: ``rollout_count * rollout_length``."""
        return self.rollout_count * self.rollout_length

    def is_ready(self) -> bool:
        """Whether the table holds a batch's worth of transitions and an episode long enough.

        True when the table holds at least ``rollout_count * rollout_length`` transitions and
        at least one episode of ``rollout_length`` transitions or more.
        """
        if self.table.size() < self.batch_size:
            return False
        lengths = np.asarray(self.table.index.lengths)
        return bool(lengths.max(initial=0) >= self.rollout_length)

    def sample(self) -> dict[str, Any]:
        """One batch in the loader's layout.

        Raises:
            SamplingError: The table cannot yet be sampled (empty, or no episode long enough).
        """
        if not self._drawn:
            if self.batches_per_sample == 1:
                self._drawn.append(self.table.sample(self.rollout_count, self.rollout_length))
            else:
                self._drawn.extend(self._draw_several())
        data = self._drawn.popleft()
        n = self.batch_size
        data[self.size_key] = n
        return {self.data_group: data, self.size_key: n}

    def _draw_several(self) -> list[dict[str, Any]]:
        """``batches_per_sample`` batches from one table sample: per-step columns split into
        runs of ``rollout_count * rollout_length`` rows, per-window ones into ``rollout_count``
        (observation dicts key by key)."""
        k, count, length = self.batches_per_sample, self.rollout_count, self.rollout_length

        def split(key: str, value: Any) -> list[Any]:
            if isinstance(value, dict):
                parts = {inner: split(f"{key}.{inner}", item) for inner, item in value.items()}
                return [{inner: pieces[i] for inner, pieces in parts.items()} for i in range(k)]
            rows = value.shape[0] if isinstance(value, torch.Tensor | np.ndarray) else None
            for size in (count * length, count):
                if rows == k * size:
                    return [value[i * size : (i + 1) * size] for i in range(k)]
            raise ConfigurationError(
                f"batches_per_sample = {k}: the table's '{key}' has "
                f"{'no rows' if rows is None else f'{rows} rows'}, neither one per step nor one "
                "per window, so its sample cannot be split; use batches_per_sample = 1"
            )

        whole = self.table.sample(count * k, length)
        columns = {key: split(key, value) for key, value in whole.items()}
        return [{key: parts[i] for key, parts in columns.items()} for i in range(k)]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while True:
            yield self.sample()

    def __repr__(self) -> str:
        return (
            f"MemoryLoader(rollout_count={self.rollout_count}, "
            f"rollout_length={self.rollout_length}, data_group={self.data_group!r})"
        )


class JointMemoryLoader:
    """Merges the batches of several loaders, each under its own data group.

    Yields ``{group_a: {...}, group_b: {...}, size_key: total}`` where ``total`` sums the loaders'
    sample counts. Each group keeps its own loader's sample count under that loader's size key.

    Args:
        loaders: Loaders with distinct data groups.
        size_key: The top-level key of the summed sample count.

    Raises:
        ConfigurationError: If there are no loaders, two share a data group, or a data group is
            named like ``size_key``.
    """

    def __init__(self, loaders: Sequence[GroupLoader], *, size_key: str = "batch_size") -> None:
        non_empty_string("JointMemoryLoader", "size_key", size_key)
        self.loaders = list(loaders)
        if not self.loaders:
            raise ConfigurationError("JointMemoryLoader needs at least one loader to join")
        groups: set[str] = set()
        for loader in self.loaders:
            group = loader.data_group
            if group in groups:
                raise ConfigurationError(
                    f"JointMemoryLoader got two loaders with data group '{group}'; each loader "
                    "needs its own data group — pass data_group=... when making the loaders"
                )
            if group == size_key:
                raise ConfigurationError(
                    f"a joined loader's data group '{group}' is the joint size_key; rename one"
                )
            groups.add(group)
        self.size_key = size_key

    @property
    def data_groups(self) -> list[str]:
        """The joined loaders' data groups, in order."""
        return [loader.data_group for loader in self.loaders]

    def is_ready(self) -> bool:
        """Whether every joined loader is ready."""
        return all(loader.is_ready() for loader in self.loaders)

    def _merged(self, iterators: list[Iterator[dict[str, Any]]]) -> dict[str, Any] | None:
        merged: dict[str, Any] = {}
        total = 0
        for loader, iterator in zip(self.loaders, iterators, strict=True):
            batch = next(iterator, None)
            if batch is None:
                return None
            merged[loader.data_group] = batch[loader.data_group]
            total += int(batch[loader.size_key])
        merged[self.size_key] = total
        return merged

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Yields merged batches until any joined loader runs out (memory loaders never do)."""
        iterators = [iter(loader) for loader in self.loaders]
        while (merged := self._merged(iterators)) is not None:
            yield merged

    def __repr__(self) -> str:
        return f"JointMemoryLoader(data_groups={self.data_groups!r})"


class JointMemoryLoaderWithDataGroup(JointMemoryLoader):
    """A :class:`JointMemoryLoader` whose merged batch is nested under one more data group.

    Yields ``{data_group: {group_a: {...}, group_b: {...}, size_key: total}, size_key: total}``,
    for callbacks that read several sources from one group. It keeps yielding as long as its
    loaders do (memory loaders never stop).

    Args:
        loaders: Loaders with distinct data groups.
        data_group: The group the merged batch is nested under.
        size_key: The key of the summed sample count, inside the group and at the top level.

    Raises:
        ConfigurationError: As :class:`JointMemoryLoader`, or if ``data_group`` is empty or
            named like ``size_key``.
    """

    def __init__(
        self, loaders: Sequence[GroupLoader], data_group: str, *, size_key: str = "batch_size"
    ) -> None:
        super().__init__(loaders, size_key=size_key)
        non_empty_string("JointMemoryLoaderWithDataGroup", "data_group", data_group)
        if data_group == size_key:
            raise ConfigurationError(
                f"JointMemoryLoaderWithDataGroup's data_group and size_key are both "
                f"'{size_key}'; the batch needs them as two different keys"
            )
        self.data_group = data_group

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for merged in super().__iter__():
            yield {self.data_group: merged, self.size_key: merged[self.size_key]}

    def __repr__(self) -> str:
        return (
            f"JointMemoryLoaderWithDataGroup(data_group={self.data_group!r}, "
            f"data_groups={self.data_groups!r})"
        )


__all__ = [
    "GroupLoader",
    "JointMemoryLoader",
    "JointMemoryLoaderWithDataGroup",
    "MemoryLoader",
    "SampledTable",
]
