"""Uniform and coverage-based ejection: random whole episodes leave, in proportion to length
(and, for coverage, to how little they were sampled); their state and generator checkpoint."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from emote_core.errors import ConfigurationError, MemoryTableError
from emote_core.memory.columns import Column
from emote_core.memory.strategies import (
    CoverageBasedEjectionStrategy,
    CoverageBasedSampleStrategy,
    EjectionStrategy,
    SampleStrategy,
    UniformEjectionStrategy,
    UniformSampleStrategy,
)
from emote_core.memory.table import ArrayMemoryTable
from emote_core.utils.random_state import capture, restore


def make_table(
    ejector: EjectionStrategy, sampler: SampleStrategy | None = None, maxlen: int = 100
) -> ArrayMemoryTable:
    return ArrayMemoryTable(
        columns=[Column("obs", (1,), np.float32), Column("rewards", (1,), np.float32)],
        maxlen=maxlen,
        sampler=sampler or UniformSampleStrategy(),
        ejector=ejector,
        length_key="rewards",
        seed=0,
    )


def add(table: ArrayMemoryTable, identity: int, length: int) -> None:
    obs = np.full((length + 1, 1), identity, dtype=np.float32)
    table.add_sequence(identity, {"obs": obs, "rewards": np.ones((length, 1))})


def held(table: ArrayMemoryTable) -> list[int]:
    return [identity for identity, _, _ in table.episodes()]


def ejected_first(ejector_factory, lengths: list[int], trials: int) -> Counter:
    """Which episode a full table ejects first, over ``trials`` tables with different seeds."""
    counts: Counter = Counter()
    for seed in range(trials):
        table = make_table(ejector_factory(seed), maxlen=sum(lengths))
        for identity, length in enumerate(lengths):
            add(table, identity, length)
        add(table, 99, 1)  # needs room for one transition: exactly one episode leaves
        (gone,) = set(range(len(lengths))) - set(held(table))
        counts[gone] += 1
    return counts


def test_uniform_ejection_removes_episodes_in_proportion_to_their_length() -> None:
    counts = ejected_first(lambda seed: UniformEjectionStrategy(seed=seed), [10, 30, 60], 600)
    shares = np.array([counts[k] for k in range(3)]) / 600
    np.testing.assert_allclose(shares, [0.1, 0.3, 0.6], atol=0.06)
    assert counts[0] < counts[2]  # not FIFO, which would always eject episode 0


def test_uniform_ejection_keeps_the_table_within_maxlen_with_whole_episodes() -> None:
    table = make_table(UniformEjectionStrategy(seed=1), maxlen=50)
    for identity in range(40):
        add(table, identity, 1 + identity % 7)
        assert table.size() <= 50
    for identity, data, _ in table.episodes():
        assert np.all(data["obs"] == identity)
    assert 39 in held(table) and table.full()


def test_an_empty_table_has_nothing_to_eject() -> None:
    ejector = UniformEjectionStrategy()
    make_table(ejector)
    with pytest.raises(MemoryTableError, match="no episode to eject"):
        ejector.choose()


def test_same_seed_same_ejections_and_state_restores_the_generator() -> None:
    def run(ejector: UniformEjectionStrategy) -> list[int]:
        table = make_table(ejector, maxlen=30)
        for identity in range(20):
            add(table, identity, 5)
        return held(table)

    assert run(UniformEjectionStrategy(seed=4)) == run(UniformEjectionStrategy(seed=4))
    first = UniformEjectionStrategy(seed=4)
    saved = json.loads(json.dumps(first.state()))
    draws = first.rng.random(3)
    second = UniformEjectionStrategy(seed=5)
    second.load_state(saved)
    np.testing.assert_array_equal(second.rng.random(3), draws)


def test_the_tables_checkpointed_generators_include_the_ejectors() -> None:
    table = make_table(UniformEjectionStrategy(seed=2), maxlen=30)
    saved = capture(table.random_generators())
    draws = table.ejector.rng.random(4)
    restore(table.random_generators(), saved, owner="the memory")
    np.testing.assert_array_equal(table.ejector.rng.random(4), draws)


def test_coverage_ejection_protects_episodes_that_sampling_drew_often() -> None:
    def trial(seed: int) -> int:
        sampler = CoverageBasedSampleStrategy()
        ejector = CoverageBasedEjectionStrategy(alpha=0.5, sampler=sampler, seed=seed)
        table = make_table(ejector, sampler, maxlen=20)
        add(table, 0, 10)
        table.sample(90, 1)  # episode 0, alone, is drawn 90 times
        add(table, 1, 10)
        add(table, 2, 1)
        (gone,) = {0, 1} - set(held(table))
        return gone

    outcomes = Counter(trial(seed) for seed in range(300))
    # Weights 10 * 91**-0.5 for episode 0 against 10 for the never-drawn episode 1.
    assert outcomes[1] / 300 == pytest.approx(1 / (1 + 91**-0.5), abs=0.05)


def test_coverage_ejection_without_a_sampler_ejects_as_the_uniform_one() -> None:
    def factory(seed: int) -> CoverageBasedEjectionStrategy:
        return CoverageBasedEjectionStrategy(seed=seed)

    uniform = ejected_first(lambda seed: UniformEjectionStrategy(seed=seed), [10, 30, 60], 200)
    coverage = ejected_first(factory, [10, 30, 60], 200)
    assert coverage == uniform  # same generator, same weights: the same draws


def test_coverage_ejection_checks_its_arguments() -> None:
    with pytest.raises(ConfigurationError, match="alpha must be a finite number >= 0"):
        CoverageBasedEjectionStrategy(alpha=-1.0)
    with pytest.raises(ConfigurationError, match="sampler must be the table's Coverage"):
        CoverageBasedEjectionStrategy(sampler=UniformSampleStrategy())  # type: ignore[arg-type]
    foreign = CoverageBasedSampleStrategy()
    make_table(UniformEjectionStrategy(), foreign)
    table = make_table(CoverageBasedEjectionStrategy(sampler=foreign), maxlen=5)
    add(table, 0, 5)
    with pytest.raises(ConfigurationError, match="belongs to another table"):
        add(table, 1, 1)
