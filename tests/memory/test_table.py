"""ArrayMemoryTable: episodes in, windows out, and nothing lost or mixed on the way."""

from __future__ import annotations

from collections import OrderedDict

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from emote_core.errors import (
    ConfigurationError,
    DuplicateEpisodeError,
    MemoryTableError,
    SamplingError,
    SchemaError,
)
from emote_core.memory.columns import Column, TagColumn, VirtualColumn
from emote_core.memory.mappers import (
    NextElementMapper,
    OnlyLastMapper,
    SyntheticDones,
)
from emote_core.memory.strategies import FifoEjectionStrategy, UniformSampleStrategy
from emote_core.memory.table import ArrayMemoryTable
from emote_core.typing import EpisodeState


def columns(extra: tuple = ()) -> list:
    """obs = (episode serial, step); actions = step + 0.5; rewards = step: windows are checkable."""
    return [
        Column("obs", (2,), np.float64),
        Column("actions", (1,), np.float32),
        Column("rewards", (1,), np.float32),
        TagColumn("goal", (1,), np.float32),
        VirtualColumn("next_obs", (2,), np.float64, "obs", NextElementMapper()),
        VirtualColumn("dones", (1,), np.float32, "rewards", SyntheticDones()),
        VirtualColumn("masks", (1,), np.float32, "rewards", SyntheticDones.as_mask()),
        *extra,
    ]


def make_table(maxlen: int = 1000, extra: tuple = (), seed: int = 0) -> ArrayMemoryTable:
    return ArrayMemoryTable(
        columns=columns(extra),
        maxlen=maxlen,
        sampler=UniformSampleStrategy(),
        ejector=FifoEjectionStrategy(),
        length_key="rewards",
        seed=seed,
    )


def episode(serial: int, length: int) -> dict[str, np.ndarray]:
    steps = np.arange(length + 1, dtype=np.float64)
    return {
        "obs": np.stack([np.full(length + 1, serial, dtype=np.float64), steps], axis=1),
        "actions": (steps[:length] + 0.5).reshape(-1, 1),
        "rewards": steps[:length].reshape(-1, 1),
        "goal": np.array([serial * 10.0]),
    }


def check_windows(batch: dict, count: int, length: int, model: dict[int, tuple]) -> None:
    """Every window is `length` consecutive steps of one held episode, with the right extras."""
    obs = batch["obs"].numpy().reshape(count, length, 2)
    next_obs = batch["next_obs"].numpy().reshape(count, length, 2)
    rewards = batch["rewards"].numpy().reshape(count, length)
    actions = batch["actions"].numpy().reshape(count, length)
    dones = batch["dones"].numpy().reshape(count, length)
    masks = batch["masks"].numpy().reshape(count, length)
    goals = batch["goal"].numpy().reshape(count)
    for w in range(count):
        serial = int(obs[w, 0, 0])
        assert serial in model, "sampled an episode that is not held"
        n, end_state = model[serial]
        assert np.all(obs[w, :, 0] == serial), "window mixes episodes"
        steps = obs[w, :, 1]
        assert np.array_equal(steps, steps[0] + np.arange(length)), "window is not consecutive"
        assert steps[0] >= 0 and steps[-1] <= n - 1, "window crosses the episode's end"
        assert np.array_equal(next_obs[w, :, 1], steps + 1)
        assert np.array_equal(next_obs[w, :, 0], obs[w, :, 0])
        assert np.array_equal(rewards[w], steps) and np.array_equal(actions[w], steps + 0.5)
        expected_dones = steps == n - 1
        assert np.array_equal(dones[w], expected_dones)
        terminal = end_state == EpisodeState.TERMINAL
        assert np.array_equal(masks[w], 1.0 - (expected_dones & terminal))
        assert goals[w] == serial * 10.0


class TableMachine(RuleBasedStateMachine):
    """Random adds, samples, resizes and clears against a plain FIFO model."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlen = 60
        self.table = make_table(self.maxlen)
        self.model: OrderedDict[int, tuple[int, EpisodeState]] = OrderedDict()  # by serial
        self.identities: dict[int, int] = {}  # serial -> the int64 identity it was added under
        self.next_serial = 0

    @rule(
        length=st.integers(1, 25),
        terminal=st.booleans(),
        identity=st.integers(-(2**63), 2**63 - 1),
    )
    def add(self, length: int, terminal: bool, identity: int) -> None:
        if identity in self.identities.values():
            with pytest.raises(DuplicateEpisodeError):
                self.table.add_sequence(identity, episode(0, length))
            return
        serial = self.next_serial
        self.next_serial += 1
        end = EpisodeState.TERMINAL if terminal else EpisodeState.INTERRUPTED
        if length > self.maxlen:
            with pytest.raises(SchemaError):
                self.table.add_sequence(identity, episode(serial, length), end_state=end)
            return
        self.table.add_sequence(identity, episode(serial, length), end_state=end)
        self.model[serial] = (length, end)
        self.identities[serial] = identity
        self._eject()

    def _eject(self) -> None:
        while sum(n for n, _ in self.model.values()) > self.maxlen:
            serial, _ = self.model.popitem(last=False)
            del self.identities[serial]

    @rule(count=st.integers(1, 16), length=st.integers(1, 6))
    def sample(self, count: int, length: int) -> None:
        if not any(n >= length for n, _ in self.model.values()):
            with pytest.raises(SamplingError):
                self.table.sample(count, length)
            return
        batch = self.table.sample(count, length)
        check_windows(batch, count, length, self.model)
        identities, offsets = self.table.last_sample_indices
        first_steps = batch["obs"].numpy().reshape(count, length, 2)[:, 0, :]
        serials = first_steps[:, 0].astype(int)
        assert identities.tolist() == [self.identities[s] for s in serials]
        assert offsets.tolist() == first_steps[:, 1].astype(int).tolist()

    @rule(maxlen=st.integers(25, 120))
    def resize(self, maxlen: int) -> None:
        self.table.resize(maxlen)
        self.maxlen = maxlen
        self._eject()

    @precondition(lambda self: self.next_serial % 7 == 6)
    @rule()
    def clear(self) -> None:
        self.table.clear()
        self.model.clear()
        self.identities.clear()

    @invariant()
    def holds_exactly_the_model(self) -> None:
        assert self.table.size() == sum(n for n, _ in self.model.values())
        assert self.table.episode_count == len(self.model)
        held = list(self.table.episodes())
        assert [identity for identity, _, _ in held] == [self.identities[s] for s in self.model]
        for (_, data, end), serial in zip(held, self.model, strict=True):
            n, model_end = self.model[serial]
            expected = episode(serial, n)
            assert end == model_end
            for key in ("obs", "actions", "rewards", "goal"):
                np.testing.assert_array_equal(data[key], expected[key])


TableMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip
test_table_state_machine = TableMachine.TestCase


def test_short_episodes_are_never_sampled_and_never_crash_sampling() -> None:
    table = make_table()
    table.add_sequence(0, episode(0, 2))
    table.add_sequence(1, episode(1, 10))
    batch = table.sample(200, 5)
    assert set(batch["obs"].numpy()[:, 0]) == {1.0}
    with pytest.raises(SamplingError, match="no episode holds a window of 11"):
        table.sample(1, 11)


def test_interrupted_episodes_keep_mask_one_at_their_end() -> None:
    table = make_table()
    table.add_sequence(0, episode(0, 3), end_state=EpisodeState.INTERRUPTED)
    table.add_sequence(1, episode(1, 3), end_state=EpisodeState.TERMINAL)
    batch = table.sample_all()
    assert batch["dones"].numpy().ravel().tolist() == [0, 0, 1, 0, 0, 1]
    assert batch["masks"].numpy().ravel().tolist() == [1, 1, 1, 1, 1, 0]


def test_whole_oldest_episodes_are_ejected_at_maxlen() -> None:
    table = make_table(maxlen=25)
    for serial in range(5):
        table.add_sequence(serial, episode(serial, 10))
    assert [identity for identity, _, _ in table.episodes()] == [3, 4]
    table.add_sequence(5, episode(5, 5))
    assert table.size() == 25


def test_full_is_upstreams_method_true_once_the_table_ejected() -> None:
    table = make_table(maxlen=25)
    table.add_sequence(0, episode(0, 10))
    table.add_sequence(1, episode(1, 10))
    assert table.full() is False
    table.add_sequence(2, episode(2, 10))  # ejects episode 0
    # Like upstream emote: saturated once it had to eject, though it holds fewer than maxlen.
    assert table.size() == 20 and table.full() is True
    table.clear()
    assert table.full() is False
    table.add_sequence(3, episode(3, 25))
    assert table.full() is True  # exactly maxlen held


def test_full_used_without_the_call_is_refused() -> None:
    table = make_table(maxlen=25)
    with pytest.raises(MemoryTableError, match=r"write table.full\(\)"):
        if table.full:  # the bug upstream-style code would hide: a method is always truthy
            pass


@pytest.mark.parametrize("method", ["store", "restore"])
def test_upstream_store_and_restore_methods_name_the_stores_functions(method: str) -> None:
    table = make_table()
    with pytest.raises(MemoryTableError, match=f"{method}_table\\(table, path\\)"):
        getattr(table, method)("memory/table")


def test_compaction_keeps_every_episode_intact() -> None:
    table = make_table(maxlen=10_000)
    rng = np.random.default_rng(1)
    for serial in range(400):  # lengths vary, so the ring fragments and compacts
        table.add_sequence(serial, episode(serial, int(rng.integers(1, 80))))
    model = {i: (len(d["rewards"]), e) for i, d, e in table.episodes()}
    for identity, data, _ in table.episodes():
        np.testing.assert_array_equal(data["obs"], episode(identity, model[identity][0])["obs"])
    check_windows(table.sample(500, 1), 500, 1, model)


def test_n_step_only_last_gives_the_observation_after_each_window() -> None:
    extra = (VirtualColumn("bootstrap", (2,), np.float64, "obs", OnlyLastMapper()),)
    table = make_table(extra=extra)
    table.add_sequence(0, episode(0, 12))
    batch = table.sample(32, 4)
    steps = batch["obs"].numpy().reshape(32, 4, 2)[:, :, 1]
    assert batch["bootstrap"].shape == (32, 2)
    np.testing.assert_array_equal(batch["bootstrap"].numpy()[:, 1], steps[:, -1] + 1)


def test_n_ahead_clamps_at_the_final_observation() -> None:
    extra = (VirtualColumn("ahead", (2,), np.float64, "obs", NextElementMapper.with_n(3)),)
    table = make_table(extra=extra)
    table.add_sequence(0, episode(0, 5))
    batch = table.sample_all()
    assert batch["ahead"].numpy()[:, 1].tolist() == [3, 4, 5, 5, 5]


def test_sample_by_index_and_mini_batches_cover_everything() -> None:
    table = make_table()
    table.add_sequence(-5, episode(-5, 6))
    table.add_sequence(2**62, episode(7, 4))
    batch = table.sample_by_index([2**62, -5], [1, 3], 2)
    assert batch["obs"].numpy()[:, 1].tolist() == [1, 2, 3, 4]
    with pytest.raises(SamplingError, match="does not fit episode"):
        table.sample_by_index([-5], [5], 2)
    with pytest.raises(SamplingError, match=r"not in the table"):
        table.sample_by_index([3], [0], 1)
    seen = [tuple(row) for b in table.mini_batches(3) for row in b["obs"].numpy()]
    assert len(seen) == 10 and len(set(seen)) == 10


def test_bad_input_is_refused_and_leaves_the_table_as_it_was() -> None:
    table = make_table()
    table.add_sequence(1, episode(1, 4))
    before = [(i, {k: v.copy() for k, v in d.items()}, e) for i, d, e in table.episodes()]
    bad = episode(2, 4)
    bad["obs"] = bad["obs"][:, :1]
    with pytest.raises(SchemaError, match=r"column 'obs' of episode 2 has per-step shape \(1,\)"):
        table.add_sequence(2, bad)
    bad = episode(2, 4)
    bad["actions"] = np.full((4, 1), 1j, dtype=np.complex64)
    with pytest.raises(SchemaError, match="complex64 values that change"):
        table.add_sequence(2, bad)
    bad = episode(2, 4)
    bad["obs"] = bad["obs"][:3]
    with pytest.raises(SchemaError, match="'obs' of episode 2 has 3 rows"):
        table.add_sequence(2, bad)
    bad = episode(2, 4)
    del bad["goal"]
    bad["extra"] = np.zeros(4)
    with pytest.raises(SchemaError, match=r"missing \['goal'\]; unknown \['extra'\]"):
        table.add_sequence(2, bad)
    with pytest.raises(DuplicateEpisodeError, match="episode 1 is already in the table"):
        table.add_sequence(1, episode(1, 4))
    with pytest.raises(SchemaError, match="must be an integer"):
        table.add_sequence("x", episode(3, 4))  # type: ignore[arg-type]
    after = list(table.episodes())
    assert len(after) == len(before) == 1
    for (i, d, e), (i2, d2, e2) in zip(before, after, strict=True):
        assert (i, e) == (i2, e2)
        for key in d:
            np.testing.assert_array_equal(d[key], d2[key])


def test_observation_column_must_hold_the_final_observation() -> None:
    table = make_table()
    short = episode(0, 4)
    short["obs"] = short["obs"][:4]
    with pytest.raises(SchemaError, match="needs 5 rows for 4 transitions"):
        table.add_sequence(0, short)


def test_empty_table_sampling_is_a_clear_error() -> None:
    with pytest.raises(SamplingError, match="empty memory table"):
        make_table().sample(4, 1)


def test_bad_construction_is_named() -> None:
    with pytest.raises(ConfigurationError, match="length_key 'nope'"):
        ArrayMemoryTable(
            columns=columns(), maxlen=10, sampler=UniformSampleStrategy(),
            ejector=FifoEjectionStrategy(), length_key="nope",
        )  # fmt: skip
    with pytest.raises(ConfigurationError, match="reads 'missing'"):
        ArrayMemoryTable(
            columns=[Column("rewards", (1,)),
                     VirtualColumn("n", (1,), np.float32, "missing", NextElementMapper())],
            maxlen=10, sampler=UniformSampleStrategy(), ejector=FifoEjectionStrategy(),
            length_key="rewards",
        )  # fmt: skip


def test_resize_shrinks_memory_and_keeps_newest_episodes() -> None:
    table = make_table(maxlen=100_000)
    for serial in range(100):
        table.add_sequence(serial, episode(serial, 100))
    big = table.nbytes()
    table.resize(1_000)
    assert table.nbytes() < big / 10
    assert [i for i, _, _ in table.episodes()] == list(range(90, 100))
    check_windows(
        table.sample(64, 3), 64, 3, {i: (100, EpisodeState.TERMINAL) for i in range(90, 100)}
    )


def test_same_seed_gives_the_same_samples() -> None:
    tables = [make_table(seed=42), make_table(seed=42)]
    for table in tables:
        for serial in range(5):
            table.add_sequence(serial, episode(serial, 20))
    a, b = (t.sample(16, 2)["obs"] for t in tables)
    assert torch.equal(a, b)


@pytest.mark.gpu
def test_cuda_table_keeps_data_and_batches_on_the_gpu() -> None:
    table = ArrayMemoryTable(
        columns=columns(), maxlen=1000, sampler=UniformSampleStrategy(),
        ejector=FifoEjectionStrategy(), length_key="rewards", device="cuda",
    )  # fmt: skip
    for serial in range(10):
        table.add_sequence(serial, episode(serial, 30))
    batch = table.sample(64, 4)
    assert all(t.is_cuda for t in batch.values())
    cpu = {k: v.cpu() for k, v in batch.items()}
    check_windows(cpu, 64, 4, {i: (30, EpisodeState.TERMINAL) for i in range(10)})


def test_priority_updates_skip_windows_whose_episode_was_ejected_since_the_sample() -> None:
    from emote_core.memory.strategies import PrioritizedSampleStrategy

    table = ArrayMemoryTable(
        columns=columns(), maxlen=10, sampler=PrioritizedSampleStrategy(alpha=0.6),
        ejector=FifoEjectionStrategy(), length_key="rewards", seed=0,
    )  # fmt: skip
    table.add_sequence(1, episode(1, 5))
    table.add_sequence(2, episode(2, 5))
    table.sample(64, 1)
    table.add_sequence(3, episode(3, 5))  # ejects episode 1; its slot is reused by episode 3
    table.update_priorities(np.full(64, 1000.0))
    identities, _ = table.last_sample_indices
    assert set(identities.tolist()) == {1, 2}  # the ids as sampled, not the slots' new tenants
    table.sample(2000, 1)
    drawn, _ = table.last_sample_indices
    assert np.mean(drawn == 3) < 0.1  # episode 3 kept its own (low) priority


def test_a_table_that_cannot_fit_in_ram_is_refused_before_anything_is_allocated() -> None:
    import psutil

    available = psutil.virtual_memory().available
    per_transition = 2 * 8 + 4 + 4  # obs float64 x2, actions and rewards float32
    too_many = 4 * available // per_transition
    with pytest.raises(ConfigurationError) as caught:
        make_table(maxlen=too_many)
    message = str(caught.value)
    assert f"a memory table of maxlen {too_many:,} needs about" in message
    assert f"({per_transition} bytes per transition)" in message
    assert "GiB of RAM available; lower maxlen (memory.maxlen in a recipe) to at most" in message
    fits = int(message.rsplit("at most ", 1)[1].replace(",", ""))
    assert available // 2 // per_transition < fits <= available // per_transition
    table = make_table(maxlen=1000)
    with pytest.raises(ConfigurationError, match="needs about"):
        table.resize(too_many)
    assert table.maxlen == 1000  # a refused resize leaves the table as it was


def test_a_strategy_ported_with_upstreams_track_signature_fails_at_the_first_episode() -> None:
    from emote_core.memory.strategies import FifoEjectionStrategy, UniformSampleStrategy

    class UpstreamStyle(UniformSampleStrategy):
        def track(self, identity: int, sequence_length: int) -> None:  # type: ignore[override]
            self.tracked = (identity, sequence_length)

    table = ArrayMemoryTable(
        columns=[Column("reward", (), np.float32)], maxlen=10, length_key="reward",
        sampler=UpstreamStyle(), ejector=FifoEjectionStrategy(),
    )  # fmt: skip
    with pytest.raises(TypeError, match="slot"):
        table.add_sequence(5, {"reward": np.zeros(3, np.float32)})
