"""Validators of arguments: each returns the value it accepts or raises one
:class:`~emote_core.errors.ConfigurationError` line ``"<owner>: <what> must ...; got <value>"``.

``owner`` names who takes the argument (a class, a callback's name, a recipe file) and ``what``
the argument or recipe key, so the message says where to look. Integers come back as ``int``
(numpy's included); ``bool`` is never taken for a number.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from typing import Any, TypeVar

import numpy as np

from emote_core.errors import ConfigurationError

T = TypeVar("T")


def _is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def int_at_least(owner: str, what: str, value: Any, least: int) -> int:
    """``value`` if it is an ``int`` of at least ``least``.

    Raises:
        ConfigurationError: ``"<owner>: <what> must be an integer of at least <least>; got ..."``.
    """
    if not _is_int(value) or value < least:
        raise ConfigurationError(
            f"{owner}: {what} must be an integer of at least {least}; got {value!r}"
        )
    return int(value)


def positive_int(owner: str, what: str, value: Any) -> int:
    """``value`` if it is an ``int`` of at least 1.

    Raises:
        ConfigurationError: ``"<owner>: <what> must be a positive integer; got ..."``.
    """
    if not _is_int(value) or value < 1:
        raise ConfigurationError(f"{owner}: {what} must be a positive integer; got {value!r}")
    return int(value)


def non_negative_int(owner: str, what: str, value: Any) -> int:
    """``value`` if it is an ``int`` of at least 0.

    Raises:
        ConfigurationError: ``"<owner>: <what> must be a non-negative integer; got ..."``.
    """
    if not _is_int(value) or value < 0:
        raise ConfigurationError(f"{owner}: {what} must be a non-negative integer; got {value!r}")
    return int(value)


def positive_ints(owner: str, what: str, values: Iterable[Any], *, allow_empty: bool) -> list[int]:
    """``values`` as a list if every entry is a positive ``int`` (and, unless ``allow_empty``,
    there is at least one).

    Raises:
        ConfigurationError: ``"<owner>: <what> must hold positive integers; got ..."`` or
            ``"<owner>: <what> needs at least one entry; got []"``.
    """
    values = list(values)
    if not allow_empty and not values:
        raise ConfigurationError(f"{owner}: {what} needs at least one entry; got []")
    if not all(_is_int(value) and value >= 1 for value in values):
        raise ConfigurationError(f"{owner}: {what} must hold positive integers; got {values!r}")
    return [int(value) for value in values]


def finite_number(
    owner: str,
    what: str,
    value: Any,
    low: float = -math.inf,
    high: float = math.inf,
    *,
    low_open: bool = False,
) -> float:
    """``value`` as a float if it is a finite ``int`` or ``float`` in ``[low, high]`` (``(low,
    high]`` with ``low_open``). The bounds appear in messages as given: pass ``0`` for "0".

    Raises:
        ConfigurationError: ``"<owner>: <what> must be a finite number; got ..."`` (with the
            interval when it is bounded) or ``"<owner>: <what> must be in [low, high]; got ..."``.
    """
    bounded = math.isfinite(low) or math.isfinite(high)
    interval = f"{'(' if low_open else '['}{low}, {high}]"
    if not _is_number(value) or not math.isfinite(value):
        where = f" in {interval}" if bounded else ""
        raise ConfigurationError(f"{owner}: {what} must be a finite number{where}; got {value!r}")
    if not (low < value if low_open else low <= value) or value > high:
        raise ConfigurationError(f"{owner}: {what} must be in {interval}; got {value!r}")
    return float(value)


def non_negative_number(owner: str, what: str, value: Any) -> float:
    """``value`` as a float if it is a finite number of at least 0 (a weight, a scale).

    Raises:
        ConfigurationError: ``"<owner>: <what> must be finite and >= 0; got ..."``.
    """
    if not _is_number(value) or not (math.isfinite(value) and value >= 0):
        raise ConfigurationError(f"{owner}: {what} must be finite and >= 0; got {value!r}")
    return float(value)


def one_of(owner: str, what: str, value: T, choices: Collection[T]) -> T:
    """``value`` if it is one of ``choices``.

    Raises:
        ConfigurationError: ``"<owner>: <what> must be one of 'a', 'b'; got ..."``.
    """
    if value not in choices:
        known = ", ".join(repr(choice) for choice in choices)
        raise ConfigurationError(f"{owner}: {what} must be one of {known}; got {value!r}")
    return value


def non_empty_string(owner: str, what: str, value: Any) -> str:
    """``value`` if it is a ``str`` with at least one character.

    Raises:
        ConfigurationError: ``"<owner>: <what> must be a non-empty string; got ..."``.
    """
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"{owner}: {what} must be a non-empty string; got {value!r}")
    return value


__all__ = [
    "finite_number",
    "int_at_least",
    "non_empty_string",
    "non_negative_int",
    "non_negative_number",
    "one_of",
    "positive_int",
    "positive_ints",
]
