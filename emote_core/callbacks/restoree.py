"""What checkpoints hold: the :class:`Restoree` protocol, and the checks of the arguments that
:class:`~emote_core.callbacks.checkpointing.Checkpointer` and
:class:`~emote_core.callbacks.checkpoint_loading.CheckpointLoader` share, including the upstream
emote names they accept (``restorees``, ``run_root``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from emote_core.errors import CheckpointError, ConfigurationError
from emote_core.utils.compat import upstream_alias


@runtime_checkable
class Restoree(Protocol):
    """What a checkpoint holds the state of, and a loader restores: usually a callback.

    Attributes:
        name: Keys its entry in the checkpoint; unique among one checkpointer's restorees.
    """

    name: str

    def state_dict(self) -> dict[str, Any]:
        """Its state, made of tensors, numbers, strings, lists and dicts."""
        ...

    def load_state_dict(
        self,
        state_dict: dict[str, Any],
        load_network: bool = True,
        load_optimizer: bool = True,
        load_hparams: bool = True,
    ) -> Any:
        """Restores what :meth:`state_dict` saved; the flags choose which parts."""
        ...


class InvalidCheckpointLocation(CheckpointError, ValueError):
    """The checkpoint folder a loader was pointed at does not exist (upstream emote's name)."""


def restorees_argument(owner: str, callbacks: Any, restorees: Any) -> list[Restoree]:
    """The restorees given under either name, checked: each fits :class:`Restoree`, names unique."""
    chosen = upstream_alias(owner, ("callbacks", callbacks), ("restorees", restorees))
    if chosen is None:
        raise ConfigurationError(f"{owner}: pass the restorees to checkpoint, as restorees=[...]")
    chosen = list(chosen)
    for entry in chosen:
        if not isinstance(entry, Restoree):
            raise ConfigurationError(
                f"{owner}: {entry!r} ({type(entry).__name__}) is not a Restoree; each entry "
                "needs a 'name', state_dict() and load_state_dict()"
            )
    names = [entry.name for entry in chosen]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise ConfigurationError(
            f"{owner}: restoree names key checkpoint entries and must be unique; {duplicated} "
            "appear more than once"
        )
    return chosen


def run_directory_argument(owner: str, run_dir: Any, run_root: Any) -> Path:
    """The run directory given as ``run_dir`` or (upstream) ``run_root``."""
    chosen = upstream_alias(owner, ("run_dir", run_dir), ("run_root", run_root))
    if chosen is None:
        raise ConfigurationError(f"{owner}: pass the run directory, as run_dir=...")
    return Path(chosen)


def subdirectory_argument(owner: str, storage_subdirectory: Any) -> str:
    """A checked ``storage_subdirectory``."""
    if not isinstance(storage_subdirectory, str) or not storage_subdirectory.strip():
        raise ConfigurationError(
            f"{owner}: storage_subdirectory must be a folder name such as 'checkpoints'; got "
            f"{storage_subdirectory!r}"
        )
    return storage_subdirectory


def checkpoint_index_argument(owner: str, value: Any) -> int:
    """A checked ``checkpoint_index``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(
            f"{owner}: checkpoint_index must be an integer >= 0; got {value!r}"
        )
    return value


__all__ = [
    "InvalidCheckpointLocation",
    "Restoree",
    "checkpoint_index_argument",
    "restorees_argument",
    "run_directory_argument",
    "subdirectory_argument",
]
