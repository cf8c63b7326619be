"""Small general-purpose helpers: thread-safe containers, block timers and deprecation."""

from __future__ import annotations

from emote_core.utils.deprecation import deprecated
from emote_core.utils.threading import AtomicContainer, AtomicInt, LockedResource
from emote_core.utils.timers import (
    BlockTimers,
    MovingWindowStatistics,
    TimedBlock,
    WelfordStatistics,
)

__all__ = [
    "AtomicContainer",
    "AtomicInt",
    "BlockTimers",
    "LockedResource",
    "MovingWindowStatistics",
    "TimedBlock",
    "WelfordStatistics",
    "deprecated",
]
