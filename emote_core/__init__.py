"""emote: episode memory, a callback training engine and a CLI for reinforcement learning."""

from __future__ import annotations

import json
from importlib.metadata import PackageNotFoundError, distribution, version
from pathlib import Path
from urllib.parse import unquote, urlparse

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


__all__ = ["DISTRIBUTION", "__version__", "install_command"]
