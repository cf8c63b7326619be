"""Small general-purpose helpers: block timers and upstream emote's utilities (:mod:`.compat`);
:mod:`.math` holds the numeric helpers of model-based RL (imported from there)."""

from __future__ import annotations

from typing import Any

from emote_core.utils.compat import WeakReference, deprecated
from emote_core.utils.timers import (
    BlockTimers,
    MovingWindowStatistics,
    TimedBlock,
    WelfordStatistics,
)

__all__ = [
    "BlockTimers",
    "MovingWindowStatistics",
    "TimedBlock",
    "WeakReference",
    "WelfordStatistics",
    "deprecated",
    "discount",
    "discount_all_steps",
    "make_gamma_matrix",
    "split_rollouts",
]

# The gamma-matrix helpers need torch; they load on first use so that importing emote_core.utils
# (timers, threading) stays light.
_GAMMA_MATRIX_NAMES = ("discount", "discount_all_steps", "make_gamma_matrix", "split_rollouts")


def __getattr__(name: str) -> Any:
    if name in _GAMMA_MATRIX_NAMES:
        from emote_core.utils import gamma_matrix

        return getattr(gamma_matrix, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
