"""Episode memory: tables of whole episodes, their strategies, builders, proxies and loaders.

The pieces most users need are importable from here; each lives in a module of its own role.
"""

from emote_core.memory.adaptors import (
    Adaptor,
    DictObsAdaptor,
    KeyCastAdaptor,
    KeyScaleAdaptor,
    SamplePreprocessor,
    TerminalAdaptor,
)
from emote_core.memory.builders import DictObsMemoryTable, DictObsNStepMemoryTable
from emote_core.memory.callbacks import MemoryImporterCallback, MemoryWarmup
from emote_core.memory.columns import Column, TagColumn, VirtualColumn
from emote_core.memory.loaders import (
    JointMemoryLoader,
    JointMemoryLoaderWithDataGroup,
    MemoryLoader,
)
from emote_core.memory.logging_wrapper import LoggingProxyWrapper
from emote_core.memory.mappers import (
    NextElementMapper,
    OnlyLastMapper,
    SyntheticDones,
    SyntheticMasks,
)
from emote_core.memory.proxy import Episode, MemoryTableProxy
from emote_core.memory.strategies import (
    CoverageBasedSampleStrategy,
    FifoEjectionStrategy,
    FifoSampleStrategy,
    PrioritizedSampleStrategy,
    UniformSampleStrategy,
)
from emote_core.memory.table import ArrayMemoryTable
from emote_core.memory.wrappers import (
    MemoryExporterProxyWrapper,
    MemoryProxyWrapper,
    MemoryTableProxyWrapper,
)

__all__ = [
    "Adaptor",
    "ArrayMemoryTable",
    "Column",
    "CoverageBasedSampleStrategy",
    "DictObsAdaptor",
    "DictObsMemoryTable",
    "DictObsNStepMemoryTable",
    "Episode",
    "FifoEjectionStrategy",
    "FifoSampleStrategy",
    "JointMemoryLoader",
    "JointMemoryLoaderWithDataGroup",
    "KeyCastAdaptor",
    "KeyScaleAdaptor",
    "LoggingProxyWrapper",
    "MemoryExporterProxyWrapper",
    "MemoryImporterCallback",
    "MemoryLoader",
    "MemoryProxyWrapper",
    "MemoryTableProxy",
    "MemoryTableProxyWrapper",
    "MemoryWarmup",
    "NextElementMapper",
    "OnlyLastMapper",
    "PrioritizedSampleStrategy",
    "SamplePreprocessor",
    "SyntheticDones",
    "SyntheticMasks",
    "TagColumn",
    "TerminalAdaptor",
    "UniformSampleStrategy",
    "VirtualColumn",
]
