"""Sampling and ejection strategies for memory tables."""

from emote_core.memory.strategies.base import (
    EjectionStrategy,
    SampledWindows,
    SampleStrategy,
    Strategy,
)
from emote_core.memory.strategies.fifo import FifoEjectionStrategy, FifoSampleStrategy
from emote_core.memory.strategies.uniform import UniformSampleStrategy

__all__ = [
    "EjectionStrategy",
    "FifoEjectionStrategy",
    "FifoSampleStrategy",
    "SampleStrategy",
    "SampledWindows",
    "Strategy",
    "UniformSampleStrategy",
]
