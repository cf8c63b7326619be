"""emote: episode memory, a callback training engine and a CLI for reinforcement learning."""

from __future__ import annotations

import json
from importlib.metadata import PackageNotFoundError, distribution, version
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

    From a clone installed in editable mode that is ``pip install -e "<clone>[extra]"``; from
    a source tree that was not installed, ``pip install -e ".[extra]"`` (run in the tree); and
    from the package index, ``pip install "emote-toolkit[extra]"``.

    Args:
        extra: The name of an optional-dependency group in ``pyproject.toml`` (``minari``).

    Returns:
        A command a user can paste into a shell.
    """
    try:
        installed = distribution(DISTRIBUTION)
    except PackageNotFoundError:
        return f'pip install -e ".[{extra}]"'
    clone = _editable_source(installed.read_text("direct_url.json"))
    if clone is not None:
        return f'pip install -e "{clone}[{extra}]"'
    return f'pip install "{DISTRIBUTION}[{extra}]"'


def _editable_source(direct_url: str | None) -> str | None:
    """The local directory of an editable install, from PEP 610's ``direct_url.json``."""
    try:
        data = json.loads(direct_url or "{}")
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    dir_info, url = data.get("dir_info"), urlparse(str(data.get("url", "")))
    if isinstance(dir_info, dict) and dir_info.get("editable") and url.scheme == "file":
        return unquote(url.path)
    return None


__all__ = ["DISTRIBUTION", "__version__", "install_command"]
