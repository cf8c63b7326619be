"""Termination functions by name: each rule on healthy and unhealthy rows, CartPole's against the
real environment, and the registry's lookup, suggestions and registration."""

from __future__ import annotations

import math
from collections.abc import Iterator

import gymnasium as gym
import numpy as np
import pytest
import torch

from emote_core.errors import ConfigurationError
from emote_core.models import (
    TERMINATION_FUNCTIONS,
    register_termination_function,
    termination_function,
)
from emote_core.models import termination as termination_module


def ends(name: str, rows: list[list[float]]) -> list[bool]:
    """The named function's verdict per row (actions are never read by the built-in rules)."""
    observation = torch.tensor(rows, dtype=torch.float32)
    result = termination_function(name)(torch.zeros(len(rows), 1), observation)
    assert result.dtype == torch.bool and result.shape == (len(rows), 1)
    return result[:, 0].tolist()


@pytest.fixture
def registry() -> Iterator[None]:
    """Restores the registry after a test that registers functions."""
    saved = dict(termination_module._REGISTRY)
    yield
    termination_module._REGISTRY.clear()
    termination_module._REGISTRY.update(saved)


@pytest.mark.parametrize("name", ["none", "pendulum"])
def test_none_and_pendulum_never_terminate(name: str) -> None:
    rows = [[0.0, 0.0, 0.0], [1e9, -1e9, 5.0], [math.nan, math.inf, 0.0]]
    assert ends(name, rows) == [False, False, False]


def test_inverted_pendulum_ends_beyond_0_2_radians_or_on_a_non_finite_value() -> None:
    # [cart x, pole angle, cart velocity, pole angular velocity]
    rows = [
        [0.0, 0.19, 0.0, 0.0],
        [0.9, -0.2, 3.0, -3.0],  # exactly at the limit: still upright
        [0.0, 0.21, 0.0, 0.0],
        [0.0, -0.25, 0.0, 0.0],
        [5.0, 0.0, 0.0, 0.0],  # the cart's position is not part of the rule
        [0.0, 0.0, math.inf, 0.0],
        [0.0, 0.0, 0.0, math.nan],
    ]
    assert ends("inverted_pendulum", rows) == [False, False, True, True, False, True, True]


def double_pendulum_row(first: float, second: float, width: int) -> list[float]:
    """``[x, sin θ1, sin θ2, cos θ1, cos θ2, 0...]`` (θ2 relative to the first pole)."""
    angles = [math.sin(first), math.sin(second), math.cos(first), math.cos(second)]
    return [0.3, *angles] + [0.0] * (width - 5)


@pytest.mark.parametrize("width", [9, 11])
def test_inverted_double_pendulum_ends_when_the_tip_is_at_or_below_height_1(width: int) -> None:
    cases = {
        (0.0, 0.0): False,  # upright: the tip at 1.2
        (0.5, -0.5): False,  # second pole straight up again: 0.6 cos 0.5 + 0.6 = 1.13
        (0.5, 0.5): True,  # bends further: 0.6 cos 0.5 + 0.6 cos 1.0 = 0.85
        (0.58, 0.0): False,  # 1.2 cos 0.58 = 1.004
        (-0.58, 0.0): False,
        (0.6, 0.0): True,  # 1.2 cos 0.6 = 0.990
        (math.acos(0.5), -2 * math.acos(0.5)): True,  # 0.6 * 0.5 + 0.6 * 0.5 = 0.6
    }
    rows = [double_pendulum_row(a, b, width) for a, b in cases]
    assert ends("inverted_double_pendulum", rows) == list(cases.values())


def hopper_row(z: float, angle: float, **others: float) -> list[float]:
    """An 11-value Hopper observation; ``others`` sets entries by index (``i3=150.0``)."""
    row = [z, angle] + [0.0] * 9
    for key, value in others.items():
        row[int(key[1:])] = value
    return row


def test_hopper_ends_outside_its_default_healthy_ranges() -> None:
    rows = [
        hopper_row(1.25, 0.0),
        hopper_row(0.71, 0.19, i4=99.0, i10=10.0),
        hopper_row(0.7, 0.0),  # the ranges are open: z must exceed 0.7
        hopper_row(0.3, 0.0),
        hopper_row(1.25, 0.2),
        hopper_row(1.25, -0.25),
        hopper_row(1.25, 0.0, i3=150.0),  # a joint angle outside (-100, 100)
        hopper_row(math.nan, 0.0),
        hopper_row(math.inf, 0.0),
    ]
    assert ends("hopper", rows) == [False, False, True, True, True, True, True, True, True]


def walker_row(z: float, angle: float) -> list[float]:
    return [z, angle] + [50.0] * 15  # other values are not part of Walker2d's rule


def test_walker2d_ends_outside_its_default_healthy_ranges() -> None:
    rows = [
        walker_row(1.25, 0.0),
        walker_row(1.99, -0.99),
        walker_row(0.8, 0.0),
        walker_row(2.0, 0.0),
        walker_row(0.5, 0.0),
        walker_row(1.25, 1.0),
        walker_row(1.25, -1.5),
        walker_row(math.nan, 0.0),
    ]
    assert ends("walker2d", rows) == [False, False, True, True, True, True, True, True]


@pytest.mark.parametrize("name", ["cartpole", "cartpole_continuous"])
def test_cartpole_ends_past_2_4_or_12_degrees(name: str) -> None:
    twelve_degrees = math.radians(12)
    rows = [
        [0.0, 5.0, 0.0, -5.0],
        [2.39, 0.0, twelve_degrees - 1e-3, 0.0],
        [2.41, 0.0, 0.0, 0.0],
        [-2.5, 0.0, 0.0, 0.0],
        [0.0, 0.0, twelve_degrees + 1e-3, 0.0],
        [0.0, 0.0, -0.3, 0.0],
    ]
    assert ends(name, rows) == [False, False, True, True, True, True]


def test_cartpole_rule_agrees_with_the_real_environment_at_every_step() -> None:
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(0)
    observations, flags = [], []
    for episode in range(20):
        env.reset(seed=episode)
        terminated = truncated = False
        while not (terminated or truncated):
            obs, _, terminated, truncated, _ = env.step(int(rng.integers(2)))
            observations.append(obs)
            flags.append(terminated)
    env.close()
    predicted = termination_function("cartpole")(
        torch.zeros(len(flags), 1), torch.as_tensor(np.array(observations))
    )
    assert sum(flags) == 20
    assert predicted[:, 0].tolist() == flags


@pytest.mark.parametrize(
    ("name", "width"),
    [
        ("hopper", 12),
        ("walker2d", 11),
        ("inverted_pendulum", 11),
        ("inverted_double_pendulum", 4),
        ("cartpole", 17),
    ],
)
def test_a_rule_given_another_environment_s_observations_says_so(name: str, width: int) -> None:
    with pytest.raises(ConfigurationError, match=rf"'{name}' reads .* got rows of {width}"):
        termination_function(name)(torch.zeros(2, 1), torch.zeros(2, width))


def test_the_registry_holds_the_documented_names_and_is_read_only() -> None:
    assert {
        "none",
        "pendulum",
        "inverted_pendulum",
        "inverted_double_pendulum",
        "hopper",
        "walker2d",
        "cartpole_continuous",
    } <= set(TERMINATION_FUNCTIONS)
    assert TERMINATION_FUNCTIONS["pendulum"] is TERMINATION_FUNCTIONS["none"]
    with pytest.raises(TypeError):
        TERMINATION_FUNCTIONS["mine"] = TERMINATION_FUNCTIONS["none"]  # type: ignore[index]


def test_an_unknown_name_suggests_the_closest_and_lists_the_known_ones() -> None:
    with pytest.raises(ConfigurationError) as raised:
        termination_function("pendulm")
    message = str(raised.value)
    assert "no termination function named 'pendulm'; did you mean 'pendulum'?" in message
    assert "(known: cartpole, cartpole_continuous, hopper," in message
    with pytest.raises(ConfigurationError, match=r"named 'zzzz'; \(known: "):
        termination_function("zzzz")


@pytest.mark.usefixtures("registry")
def test_register_adds_a_function_and_refuses_to_overwrite_without_replace() -> None:
    def far_right(actions: torch.Tensor, next_observation: torch.Tensor) -> torch.Tensor:
        return next_observation[:, :1] > 1.0

    register_termination_function("far_right", far_right)
    assert termination_function("far_right") is far_right
    assert "far_right" in TERMINATION_FUNCTIONS

    def far_left(actions: torch.Tensor, next_observation: torch.Tensor) -> torch.Tensor:
        return next_observation[:, :1] < -1.0

    with pytest.raises(
        ConfigurationError, match=r"'far_right' is already registered.*replace=True"
    ):
        register_termination_function("far_right", far_left)
    assert termination_function("far_right") is far_right
    with pytest.raises(ConfigurationError, match="'hopper' is already registered"):
        register_termination_function("hopper", far_left)
    register_termination_function("far_right", far_left, replace=True)
    assert termination_function("far_right") is far_left


@pytest.mark.usefixtures("registry")
@pytest.mark.parametrize(("name", "fn"), [("", lambda a, o: o), ("ok", "hopper"), (3, print)])
def test_register_refuses_bad_names_and_non_callables(name: object, fn: object) -> None:
    before = dict(TERMINATION_FUNCTIONS)
    with pytest.raises(ConfigurationError):
        register_termination_function(name, fn)  # type: ignore[arg-type]
    assert dict(TERMINATION_FUNCTIONS) == before
