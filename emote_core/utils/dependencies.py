"""Optional packages: the extra of emote that installs each, and one-line errors for missing ones.

gymnasium reports a missing simulator as ``DependencyNotInstalled`` and Python a missing package
as ``ImportError``; :func:`missing_dependency` turns either into a
:class:`MissingDependencyError` whose message names the package and the pip command that adds it.
"""

from __future__ import annotations

import re
import sys

from emote_core import install_command
from emote_core.errors import EmoteError

EXTRAS: dict[str, str] = {
    "mujoco": "mujoco",
    "ray": "ray",
    "minari": "minari",
    "wandb": "wandb",
    "s3fs": "s3",
    "skrl": "skrl",
    "imageio": "video",
    "imageio_ffmpeg": "video",
    "zlib_ng": "fast",
    "pettingzoo": "multiagent",
    "mpe2": "multiagent",
}
"""Import name of an optional package -> the extra of emote (pyproject.toml) that installs it."""

_PIP_NAMES = {"imageio_ffmpeg": "imageio-ffmpeg", "zlib_ng": "zlib-ng", "Box2D": "box2d"}
_GYMNASIUM_EXTRA = re.compile(r"gymnasium\[([\w-]+)\]")


class MissingDependencyError(EmoteError):
    """An optional package that a recipe, an environment or an option needs is not installed."""


def dependency_error(needed_by: str, module: str) -> MissingDependencyError:
    """The one-line error for ``module`` missing, with the command that installs it.

    Args:
        needed_by: What needs it, as the start of the message (``"env 'Hopper-v5'"``).
        module: The import name of the missing package (``"mujoco"``, ``"imageio_ffmpeg"``).

    Returns:
        The error, naming emote's extra when one installs the package, else the package itself.
    """
    top = module.split(".")[0]
    package = _PIP_NAMES.get(top, top)
    extra = EXTRAS.get(top)
    fix = install_command(extra) if extra else f"pip install {package}"
    return MissingDependencyError(
        f"{needed_by} needs the optional dependency {package}, which is not installed: {fix}"
    )


def missing_dependency(error: BaseException, needed_by: str) -> MissingDependencyError | None:
    """``error`` as a :class:`MissingDependencyError` when it says an optional package is missing.

    That is gymnasium's ``DependencyNotInstalled`` (any package) or an ``ImportError`` of a
    package in :data:`EXTRAS`; anything else (a bug in a user's module, say) gives ``None``.

    Args:
        error: What was raised.
        needed_by: What needs the package, as the start of the message.

    Returns:
        The one-line error, or ``None``.
    """
    gymnasium_errors = sys.modules.get("gymnasium.error")  # not imported: not gymnasium's error
    not_installed = getattr(gymnasium_errors, "DependencyNotInstalled", None)
    if not_installed is not None and isinstance(error, not_installed):
        cause = error.__cause__
        module = cause.name if isinstance(cause, ImportError) and cause.name else None
        if module is None or module.split(".")[0] not in EXTRAS:
            wanted = _GYMNASIUM_EXTRA.search(str(error))
            package = module or str(error).split(" ", 1)[0]
            if wanted is not None:  # gymnasium's own fix, for what no extra of emote installs
                return MissingDependencyError(
                    f"{needed_by} needs the optional dependency {package}, which is not "
                    f'installed: pip install "gymnasium[{wanted.group(1)}]"'
                )
            return dependency_error(needed_by, package)
        return dependency_error(needed_by, module)
    if isinstance(error, ImportError) and error.name and error.name.split(".")[0] in EXTRAS:
        return dependency_error(needed_by, error.name)
    return None


__all__ = ["EXTRAS", "MissingDependencyError", "dependency_error", "missing_dependency"]
