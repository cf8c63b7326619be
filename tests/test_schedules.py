from __future__ import annotations

import itertools
import math
from abc import ABC
from collections.abc import Callable

import pytest

from emote_core.errors import CheckpointError, ConfigurationError
from emote_core.schedules import (
    BPStepScheduler,
    ConstantSchedule,
    CosineAnnealing,
    CosineAnnealingWarmRestarts,
    CyclicMode,
    CyclicSchedule,
    LinearSchedule,
)


def values(schedule: BPStepScheduler, count: int) -> list[float]:
    """The values at steps 0 .. count - 1, stepping after each read."""
    out = []
    for _ in range(count):
        out.append(schedule.value)
        schedule.step()
    return out


def test_base_is_a_real_abc() -> None:
    assert issubclass(BPStepScheduler, ABC)
    with pytest.raises(TypeError):
        BPStepScheduler()  # type: ignore[abstract]


def test_constant() -> None:
    schedule = ConstantSchedule(0.3)
    assert values(schedule, 5) == [0.3] * 5
    assert schedule.steps_taken == 5


def test_linear_midpoint_and_hold() -> None:
    schedule = LinearSchedule(1.0, 0.0, 10)
    seq = values(schedule, 15)
    assert seq[0] == 1.0
    assert seq[5] == pytest.approx(0.5)
    assert seq[:11] == pytest.approx([1.0 - i / 10 for i in range(11)])
    assert seq[10:] == [0.0] * 5


def test_linear_can_increase() -> None:
    assert values(LinearSchedule(2.0, 4.0, 4), 6) == pytest.approx([2.0, 2.5, 3.0, 3.5, 4.0, 4.0])


def test_linear_staircase_plateaus() -> None:
    schedule = LinearSchedule(1.0, 0.0, 10, use_staircase=True, staircase_steps=5)
    expected = [1.0, 1.0, 0.8, 0.8, 0.6, 0.6, 0.4, 0.4, 0.2, 0.2, 0.0, 0.0]
    assert values(schedule, 12) == pytest.approx(expected)


def test_linear_staircase_uneven_steps_has_equal_value_gaps() -> None:
    seq = values(LinearSchedule(0.0, 3.0, 7, use_staircase=True, staircase_steps=3), 9)
    assert sorted(set(round(v, 9) for v in seq)) == [0.0, 1.0, 2.0, 3.0]
    assert seq[7] == 3.0
    assert seq[6] == pytest.approx(2.0)


def test_cyclic_triangular() -> None:
    schedule = CyclicSchedule(0.0, 1.0, 4)
    seq = values(schedule, 17)
    assert seq[:9] == pytest.approx([0, 0.25, 0.5, 0.75, 1.0, 0.75, 0.5, 0.25, 0.0])
    assert seq[8:17] == pytest.approx(seq[:9])  # every cycle is the same
    assert schedule.mode is CyclicMode.TRIANGULAR


def test_cyclic_triangular2_halves_amplitude_each_cycle() -> None:
    schedule = CyclicSchedule(1.0, 3.0, 2, mode=CyclicMode.TRIANGULAR2)
    seq = values(schedule, 13)
    peaks = [seq[2], seq[6], seq[10]]
    assert peaks == pytest.approx([3.0, 2.0, 1.5])  # 1 + 2, 1 + 2/2, 1 + 2/4
    assert seq[0] == seq[4] == seq[8] == seq[12] == 1.0
    assert seq[5] == pytest.approx(1.5)


def test_cosine_annealing() -> None:
    schedule = CosineAnnealing(1.0, 0.2, 10)
    seq = values(schedule, 14)
    assert seq[0] == pytest.approx(1.0)
    assert seq[5] == pytest.approx((1.0 + 0.2) / 2)
    assert seq[10:] == [0.2] * 4
    assert all(a > b for a, b in itertools.pairwise(seq[:11]))  # strictly decreasing
    assert seq[2] == pytest.approx(0.2 + 0.8 * (1 + math.cos(math.pi * 0.2)) / 2)


def test_cosine_warm_restarts_return_to_initial() -> None:
    schedule = CosineAnnealingWarmRestarts(1.0, 0.0, 4)
    seq = values(schedule, 13)
    assert seq[0] == seq[4] == seq[8] == seq[12] == pytest.approx(1.0)
    assert seq[2] == pytest.approx(0.5)
    assert seq[3] < seq[2] < seq[1] < seq[0]
    assert seq[4:8] == pytest.approx(seq[0:4])


SCHEDULE_FACTORIES = [
    lambda: ConstantSchedule(1.5),
    lambda: LinearSchedule(1.0, 0.0, 10),
    lambda: LinearSchedule(1.0, 0.0, 10, use_staircase=True, staircase_steps=3),
    lambda: CyclicSchedule(0.1, 1.0, 3, mode=CyclicMode.TRIANGULAR2),
    lambda: CosineAnnealing(1.0, 0.0, 9),
    lambda: CosineAnnealingWarmRestarts(1.0, 0.0, 5),
]


@pytest.mark.parametrize("make", SCHEDULE_FACTORIES)
def test_state_dict_round_trip_resumes_the_same_sequence(
    make: Callable[[], BPStepScheduler],
) -> None:
    uninterrupted = values(make(), 25)
    first = make()
    head = values(first, 7)
    state = first.state_dict()
    assert all(type(v) in (int, float) for v in state.values())
    resumed = make()
    resumed.load_state_dict(dict(state))
    assert resumed.steps_taken == 7
    assert head + values(resumed, 18) == uninterrupted


@pytest.mark.parametrize("make", SCHEDULE_FACTORIES)
def test_evaluate_at_gives_the_value_at_any_step_without_moving_the_schedule(
    make: Callable[[], BPStepScheduler],
) -> None:
    sequence = values(make(), 25)
    schedule = make()
    values(schedule, 4)
    assert [schedule.evaluate_at(step) for step in range(25)] == sequence
    assert schedule.steps_taken == 4
    assert schedule.value == sequence[4]


@pytest.mark.parametrize("bp_step", [-1, 2.5, True])
def test_evaluate_at_refuses_a_step_that_is_not_a_count(bp_step: object) -> None:
    with pytest.raises(
        ConfigurationError, match=rf"bp_step must be an integer >= 0, got {bp_step}"
    ):
        LinearSchedule(1.0, 0.0, 10).evaluate_at(bp_step)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "state, message",
    [
        ({}, "no 'steps_taken' key"),
        ({"steps_taken": -1}, "steps_taken=-1"),
        ({"steps_taken": 2.5}, "steps_taken=2.5"),
    ],
)
def test_bad_state_is_rejected(state: dict[str, float], message: str) -> None:
    schedule = LinearSchedule(1.0, 0.0, 10)
    with pytest.raises(CheckpointError, match=message):
        schedule.load_state_dict(state)
    assert schedule.steps_taken == 0


@pytest.mark.parametrize(
    "build, pattern",
    [
        (
            lambda: LinearSchedule(1.0, 0.0, 0),
            r"LinearSchedule: steps must be an integer >= 1, got 0",
        ),
        (lambda: LinearSchedule(1.0, 0.0, 2.5), r"steps must be an integer >= 1, got 2\.5"),
        (
            lambda: LinearSchedule(1.0, 0.0, 10, use_staircase=True, staircase_steps=0),
            r"staircase_steps must be an integer >= 1, got 0",
        ),
        (lambda: LinearSchedule(math.nan, 0.0, 10), r"initial must be a finite number, got nan"),
        (lambda: ConstantSchedule(math.inf), r"value must be a finite number, got inf"),
        (
            lambda: CyclicSchedule(0.0, 1.0, -2),
            r"half_period_steps must be an integer >= 1, got -2",
        ),
        (lambda: CyclicSchedule(0.0, 1.0, 2, mode="triangular"), r"mode must be one of"),
        (lambda: CosineAnnealing(1.0, 0.0, 0), r"CosineAnnealing: steps must be .* got 0"),
        (
            lambda: CosineAnnealingWarmRestarts(1.0, "0", 5),
            r"final must be a finite number, got '0'",
        ),
    ],
)
def test_bad_arguments_raise_configuration_error(build: Callable[[], object], pattern: str) -> None:
    with pytest.raises(ConfigurationError, match=pattern):
        build()


def test_bp_step_scheduler_called_as_upstream_is_its_truncated_linear_ramp() -> None:
    from emote_core.schedules import BPStepScheduler, TruncatedLinearSchedule

    # Upstream emote: BPStepScheduler(bp_step_begin, bp_step_end, value_min, value_max).
    ramp = BPStepScheduler(10, 30, 1.0, 5.0)
    assert isinstance(ramp, TruncatedLinearSchedule)
    assert [ramp.evaluate_at(s) for s in (0, 10, 20, 30, 99)] == [1.0, 1.0, 3.0, 5.0, 5.0]
    assert ramp.value == 1.0  # evaluate_at leaves the position alone
    for _ in range(25):
        ramp.step()
    assert ramp.value == 4.0
    assert BPStepScheduler(5, 5, 1.0, 7.0).evaluate_at(0) == 7.0  # an empty ramp is value_max
    with pytest.raises(TypeError):
        BPStepScheduler()  # the base class itself stays abstract
