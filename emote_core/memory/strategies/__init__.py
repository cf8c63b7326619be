"""Sampling and ejection strategies for memory tables."""

from emote_core.memory.strategies.base import (
    EjectionStrategy,
    SampledWindows,
    SampleStrategy,
    Strategy,
)
from emote_core.memory.strategies.coverage import (
    CoverageBasedEjectionStrategy,
    CoverageBasedSampleStrategy,
)
from emote_core.memory.strategies.fifo import FifoEjectionStrategy, FifoSampleStrategy
from emote_core.memory.strategies.prioritized import PrioritizedSampleStrategy
from emote_core.memory.strategies.segment_tree import MinSegmentTree, SumSegmentTree
from emote_core.memory.strategies.uniform import UniformEjectionStrategy, UniformSampleStrategy

__all__ = [
    "CoverageBasedEjectionStrategy",
    "CoverageBasedSampleStrategy",
    "EjectionStrategy",
    "FifoEjectionStrategy",
    "FifoSampleStrategy",
    "MinSegmentTree",
    "PrioritizedSampleStrategy",
    "SampleStrategy",
    "SampledWindows",
    "Strategy",
    "SumSegmentTree",
    "UniformEjectionStrategy",
    "UniformSampleStrategy",
]
