"""The argument validators: what each accepts and returns, and the one line each refusal says."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from emote_core.errors import ConfigurationError, EmoteError
from emote_core.utils.checks import (
    finite_number,
    int_at_least,
    non_empty_string,
    non_negative_int,
    non_negative_number,
    one_of,
    positive_int,
    positive_ints,
)


def refusal(call) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigurationError) as caught:
        call()
    assert isinstance(caught.value, EmoteError)
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(("value", "expected"), [(1, 1), (7, 7), (np.int64(3), 3)])
def test_positive_int_returns_a_python_int(value: object, expected: int) -> None:
    accepted = positive_int("Owner", "size", value)
    assert accepted == expected and type(accepted) is int


@pytest.mark.parametrize("value", [0, -1, 2.0, True, "3", None, np.float32(2)])
def test_positive_int_refuses_naming_owner_argument_and_value(value: object) -> None:
    message = refusal(lambda: positive_int("Owner", "size", value))
    assert message == f"Owner: size must be a positive integer; got {value!r}"


def test_non_negative_int_takes_zero_and_refuses_below() -> None:
    assert non_negative_int("Owner", "steps", 0) == 0
    assert non_negative_int("Owner", "steps", np.int32(5)) == 5
    for value in (-1, 1.5, False):
        message = refusal(lambda value=value: non_negative_int("Owner", "steps", value))
        assert message == f"Owner: steps must be a non-negative integer; got {value!r}"


def test_int_at_least_uses_its_bound() -> None:
    assert int_at_least("Net", "num_bins", 2, 2) == 2
    message = refusal(lambda: int_at_least("Net", "num_bins", 1, 2))
    assert message == "Net: num_bins must be an integer of at least 2; got 1"
    message = refusal(lambda: int_at_least("Net", "num_bins", True, 0))
    assert message == "Net: num_bins must be an integer of at least 0; got True"


def test_positive_ints_returns_a_list_and_refuses_any_bad_entry() -> None:
    assert positive_ints("Enc", "widths", (4, np.int64(2)), allow_empty=False) == [4, 2]
    assert positive_ints("Enc", "widths", [], allow_empty=True) == []
    message = refusal(lambda: positive_ints("Enc", "widths", [], allow_empty=False))
    assert message == "Enc: widths needs at least one entry; got []"
    message = refusal(lambda: positive_ints("Enc", "widths", [4, 0], allow_empty=True))
    assert message == "Enc: widths must hold positive integers; got [4, 0]"
    message = refusal(lambda: positive_ints("Enc", "widths", [True], allow_empty=True))
    assert message == "Enc: widths must hold positive integers; got [True]"


def test_finite_number_returns_a_float_inside_its_interval() -> None:
    assert finite_number("Loss", "gamma", 1, 0.0, 1.0) == 1.0
    assert type(finite_number("Loss", "scale", -3)) is float
    assert finite_number("Loss", "tau", 1, 0, 1, low_open=True) == 1.0


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (("gamma", 1.5, 0.0, 1.0), "Loss: gamma must be in [0.0, 1.0]; got 1.5"),
        (("gamma", -0.1, 0.0, 1.0), "Loss: gamma must be in [0.0, 1.0]; got -0.1"),
        (
            ("gamma", math.nan, 0.0, 1.0),
            "Loss: gamma must be a finite number in [0.0, 1.0]; got nan",
        ),
        (("scale", math.inf), "Loss: scale must be a finite number; got inf"),
        (("scale", "1"), "Loss: scale must be a finite number; got '1'"),
        (("scale", True), "Loss: scale must be a finite number; got True"),
        (("std", -1.0, 0, math.inf), "Loss: std must be in [0, inf]; got -1.0"),
    ],
)
def test_finite_number_refusals_show_the_interval(arguments: tuple, message: str) -> None:
    assert refusal(lambda: finite_number("Loss", *arguments)) == message


def test_an_open_lower_bound_refuses_the_bound_itself() -> None:
    message = refusal(lambda: finite_number("Aug", "size", 0.0, 0, 1, low_open=True))
    assert message == "Aug: size must be in (0, 1]; got 0.0"


def test_non_negative_number_takes_zero_and_refuses_negative_or_non_finite() -> None:
    assert non_negative_number("Loss", "beta", 0) == 0.0
    for value in (-1.0, math.nan, math.inf, True):
        message = refusal(lambda value=value: non_negative_number("Loss", "beta", value))
        assert message == f"Loss: beta must be finite and >= 0; got {value!r}"


def test_one_of_lists_the_choices() -> None:
    assert one_of("Net", "activation", "relu", {"elu": 1, "relu": 2}) == "relu"
    message = refusal(lambda: one_of("Net", "activation", "gelu", ("elu", "relu")))
    assert message == "Net: activation must be one of 'elu', 'relu'; got 'gelu'"


@pytest.mark.parametrize("value", ["", None, 3])
def test_non_empty_string_refuses_empty_and_non_strings(value: object) -> None:
    message = refusal(lambda: non_empty_string("Loader", "data_group", value))
    assert re.fullmatch(r"Loader: data_group must be a non-empty string; got .+", message)
    assert message.endswith(repr(value))
    assert non_empty_string("Loader", "data_group", "default") == "default"
