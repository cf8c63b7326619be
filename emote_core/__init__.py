"""emote: episode memory, a callback training engine and a CLI for reinforcement learning.

The names a library user starts from are importable from here (``from emote_core import
Trainer``): the training engine, the memory table and proxy, the emote-memory store, the
algorithm registry and emote's families. Each loads on first use, so ``import emote_core``
imports neither torch nor zarr; the rest of the library lives in its subpackages.
"""

from __future__ import annotations

import importlib
import json
from importlib.metadata import PackageNotFoundError, distribution, version
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

if TYPE_CHECKING:  # the names of the lazy table below, for type checkers and the API reference
    from emote_core.algorithms.dqn.family import DoubleDQN, DqnConfig
    from emote_core.algorithms.registry import (
        AddOn,
        AlgorithmFamily,
        get_algorithm,
        register_addon,
        register_algorithm,
    )
    from emote_core.algorithms.sac.family import SacConfig, SoftActorCritic
    from emote_core.callback import Callback, Order
    from emote_core.errors import EmoteError
    from emote_core.memory.builders import DictObsMemoryTable
    from emote_core.memory.loaders import MemoryLoader
    from emote_core.memory.proxy import MemoryTableProxy
    from emote_core.memory.table import ArrayMemoryTable
    from emote_core.stores.zarr_store.reader import MemoryStore
    from emote_core.stores.zarr_store.tables import load_table, save_table
    from emote_core.stores.zarr_store.writer import ShardWriter, create_store
    from emote_core.trainer import StateDict, Trainer

DISTRIBUTION = "emote-toolkit"
"""The name emote is installed under (``pip install emote-toolkit``). The name ``emote`` on the
package index is an unrelated package, and ``emote-rl`` is Embark's upstream emote; the import
packages (``emote_core``, ``emote_cli``) and the ``emote`` command keep their names."""

try:
    __version__ = version(DISTRIBUTION)
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"


def install_command(extra: str) -> str:
    """The pip command that adds the optional dependencies ``extra`` to this emote.

    From a clone installed in editable mode (or run from its own tree) that is
    ``pip install -e "<clone>[extra]"``; from a folder or a built wheel installed by path,
    ``pip install "<that path>[extra]"``; from a source tree that was not installed,
    ``pip install -e ".[extra]"`` (run in the tree); and from a package index that serves
    emote, ``pip install "emote-toolkit[extra]"``.

    Args:
        extra: The name of an optional-dependency group in ``pyproject.toml`` (``minari``).

    Returns:
        A command a user can paste into a shell.
    """
    try:
        installed = distribution(DISTRIBUTION)
    except PackageNotFoundError:
        return f'pip install -e ".[{extra}]"'
    direct_url = installed.read_text("direct_url.json")
    if direct_url is None:  # metadata in a source tree (setuptools' egg-info) or from an index
        tree = Path(str(installed.locate_file(""))).resolve()
        if (tree / "pyproject.toml").is_file() and (tree / "emote_core").is_dir():
            return f'pip install -e "{tree}[{extra}]"'
        return f'pip install "{DISTRIBUTION}[{extra}]"'
    source = _local_source(direct_url)
    if source is None:
        return f'pip install "{DISTRIBUTION}[{extra}]"'
    path, editable = source
    return f'pip install {"-e " if editable else ""}"{path}[{extra}]"'


def _local_source(direct_url: str) -> tuple[str, bool] | None:
    """``(path, editable)`` of an install from a local folder or file (a built wheel), from
    PEP 610's ``direct_url.json``; ``None`` for anything else."""
    try:
        data = json.loads(direct_url or "{}")
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    url = urlparse(str(data.get("url", "")))
    if url.scheme != "file":
        return None
    dir_info = data.get("dir_info")
    editable = isinstance(dir_info, dict) and bool(dir_info.get("editable"))
    return unquote(url.path), editable


# The public face: each name and the module it lives in, imported on first use (PEP 562).
# Modules inside emote_core never import these names from here (tests/test_architecture.py).
_EXPORTS: dict[str, str] = {
    "AddOn": "emote_core.algorithms.registry",
    "AlgorithmFamily": "emote_core.algorithms.registry",
    "ArrayMemoryTable": "emote_core.memory.table",
    "Callback": "emote_core.callback",
    "DictObsMemoryTable": "emote_core.memory.builders",
    "DoubleDQN": "emote_core.algorithms.dqn.family",
    "DqnConfig": "emote_core.algorithms.dqn.family",
    "EmoteError": "emote_core.errors",
    "MemoryLoader": "emote_core.memory.loaders",
    "MemoryStore": "emote_core.stores.zarr_store.reader",
    "MemoryTableProxy": "emote_core.memory.proxy",
    "Order": "emote_core.callback",
    "SacConfig": "emote_core.algorithms.sac.family",
    "ShardWriter": "emote_core.stores.zarr_store.writer",
    "SoftActorCritic": "emote_core.algorithms.sac.family",
    "StateDict": "emote_core.trainer",
    "Trainer": "emote_core.trainer",
    "create_store": "emote_core.stores.zarr_store.writer",
    "get_algorithm": "emote_core.algorithms.registry",
    "load_table": "emote_core.stores.zarr_store.tables",
    "register_addon": "emote_core.algorithms.registry",
    "register_algorithm": "emote_core.algorithms.registry",
    "save_table": "emote_core.stores.zarr_store.tables",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'emote_core' has no attribute '{name}'")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = [
    "DISTRIBUTION",
    "AddOn",
    "AlgorithmFamily",
    "ArrayMemoryTable",
    "Callback",
    "DictObsMemoryTable",
    "DoubleDQN",
    "DqnConfig",
    "EmoteError",
    "MemoryLoader",
    "MemoryStore",
    "MemoryTableProxy",
    "Order",
    "SacConfig",
    "ShardWriter",
    "SoftActorCritic",
    "StateDict",
    "Trainer",
    "__version__",
    "create_store",
    "get_algorithm",
    "install_command",
    "load_table",
    "register_addon",
    "register_algorithm",
    "save_table",
]
