"""Fixtures for the upstream file tests: tables shaped like the files in data/."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from emote_core.memory.columns import Column, TagColumn, VirtualColumn
from emote_core.memory.mappers import NextElementMapper, SyntheticDones
from emote_core.memory.strategies import FifoEjectionStrategy, UniformSampleStrategy
from emote_core.memory.table import ArrayMemoryTable


def _table(columns: list[Any], length_key: str, maxlen: int) -> ArrayMemoryTable:
    return ArrayMemoryTable(
        columns=columns,
        maxlen=maxlen,
        sampler=UniformSampleStrategy(),
        ejector=FifoEjectionStrategy(),
        length_key=length_key,
        seed=0,
    )


def _dones_and_masks(target: str) -> list[VirtualColumn]:
    return [
        VirtualColumn("dones", (1,), bool, target, SyntheticDones()),
        VirtualColumn("masks", (1,), np.float32, target, SyntheticDones.as_mask()),
    ]


@pytest.fixture
def fixture_table() -> Callable[..., ArrayMemoryTable]:
    """Tables shaped like upstream's V1 fixture: scalar observation and reward."""

    def make(
        *, reward_shape: tuple[int, ...] = (), obs_dtype: Any = np.float32, maxlen: int = 10_000
    ) -> ArrayMemoryTable:
        columns = [
            Column("observation", (), obs_dtype),
            Column("reward", reward_shape, np.float32),
            *_dones_and_masks("reward"),
        ]
        return _table(columns, "reward", maxlen)

    return make


@pytest.fixture
def legacy_table() -> Callable[..., ArrayMemoryTable]:
    """Tables shaped like the Legacy zips in data/ (upstream's DictObsTable with a terminal tag)."""

    def make(*, obs_shape: tuple[int, ...] = (3,), maxlen: int = 1_000) -> ArrayMemoryTable:
        columns = [
            Column("actions", (2,), np.float32),
            Column("rewards", (1,), np.float32),
            Column("obs", obs_shape, np.float32),
            VirtualColumn("next_obs", obs_shape, np.float32, "obs", NextElementMapper()),
            TagColumn("terminal", (), np.float32),
            *_dones_and_masks("actions"),
        ]
        return _table(columns, "actions", maxlen)

    return make


@pytest.fixture
def dump_table() -> Callable[..., ArrayMemoryTable]:
    """Tables for the legacy .pickle dump's episodes (obs[3], actions[2], rewards[1])."""

    def make(*, maxlen: int = 1_000) -> ArrayMemoryTable:
        columns = [
            Column("obs", (3,), np.float32),
            Column("actions", (2,), np.float32),
            Column("rewards", (1,), np.float32),
            VirtualColumn("next_obs", (3,), np.float32, "obs", NextElementMapper()),
            *_dones_and_masks("actions"),
        ]
        return _table(columns, "actions", maxlen)

    return make


def snapshot(table: ArrayMemoryTable) -> list[tuple[int, dict[str, list[Any]], str]]:
    """The table's episodes as plain values, to compare before and after an operation."""
    return [
        (identity, {k: np.asarray(v).tolist() for k, v in data.items()}, end.name)
        for identity, data, end in table.episodes()
    ]


@pytest.fixture
def table_snapshot() -> Callable[[ArrayMemoryTable], list[Any]]:
    return snapshot
