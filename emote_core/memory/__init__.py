"""Episode memory: tables of whole episodes, their strategies, builders, proxies and loaders.

The pieces most users need are importable from here; each lives in a module of its own role.
Names load on first use, so importing one submodule (the column schema, say) does not import
torch and the rest. Files and stores of episodes are :mod:`emote_core.stores`, and other
libraries' memory interfaces (``SkrlMemory``, ``TmrlEpisodeMemory``) are
:mod:`emote_core.integrations`; both build on this package.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "Adaptor": "emote_core.memory.adaptors",
    "ArrayMemoryTable": "emote_core.memory.table",
    "Column": "emote_core.memory.columns",
    "CoverageBasedEjectionStrategy": "emote_core.memory.strategies",
    "CoverageBasedSampleStrategy": "emote_core.memory.strategies",
    "DictObsAdaptor": "emote_core.memory.adaptors",
    "DictMemoryTable": "emote_core.memory.builders",
    "DictObsMemoryTable": "emote_core.memory.builders",
    "DictObsNStepMemoryTable": "emote_core.memory.builders",
    "Episode": "emote_core.memory.proxy",
    "FifoEjectionStrategy": "emote_core.memory.strategies",
    "FifoSampleStrategy": "emote_core.memory.strategies",
    "JointMemoryLoader": "emote_core.memory.loaders",
    "JointMemoryLoaderWithDataGroup": "emote_core.memory.loaders",
    "KeyCastAdaptor": "emote_core.memory.adaptors",
    "KeyScaleAdaptor": "emote_core.memory.adaptors",
    "LoggingProxyWrapper": "emote_core.memory.logging_wrapper",
    "MemoryLoader": "emote_core.memory.loaders",
    "MemoryProxyWrapper": "emote_core.memory.wrappers",
    "MemoryTableProxy": "emote_core.memory.proxy",
    "MemoryTableProxyWrapper": "emote_core.memory.wrappers",
    "MemoryWarmup": "emote_core.memory.callbacks",
    "NextElementMapper": "emote_core.memory.mappers",
    "OnlyLastMapper": "emote_core.memory.mappers",
    "PrioritizedSampleStrategy": "emote_core.memory.strategies",
    "SamplePreprocessor": "emote_core.memory.adaptors",
    "SyntheticDones": "emote_core.memory.mappers",
    "SyntheticMasks": "emote_core.memory.mappers",
    "TagColumn": "emote_core.memory.columns",
    "TerminalAdaptor": "emote_core.memory.adaptors",
    "UniformEjectionStrategy": "emote_core.memory.strategies",
    "UniformSampleStrategy": "emote_core.memory.strategies",
    "VirtualColumn": "emote_core.memory.columns",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'emote_core.memory' has no attribute '{name}'")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = [
    "Adaptor",
    "ArrayMemoryTable",
    "Column",
    "CoverageBasedEjectionStrategy",
    "CoverageBasedSampleStrategy",
    "DictMemoryTable",
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
    "UniformEjectionStrategy",
    "UniformSampleStrategy",
    "VirtualColumn",
]
