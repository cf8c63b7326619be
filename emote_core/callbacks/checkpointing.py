"""Checkpoints: periodic, atomic snapshots of every restoree's state, and resuming from them.

A checkpoint is ``<run_dir>/checkpoints/checkpoint_<bp_step>.tar``, the ``state_dict()`` of each
:class:`Restoree` written to a temporary name and renamed into place (layout and readers:
:mod:`emote_core.callbacks.checkpoint_files`). ``best.tar`` (:data:`BEST_CHECKPOINT_NAME`) has
the same layout but is never one of the numbered checkpoints. Upstream emote's argument names
are accepted; each checkpoint records its ``checkpoint_index``.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch

from emote_core.callback import Callback, Order
from emote_core.callbacks.checkpoint_files import (
    BEST_CHECKPOINT_NAME,
    CHECKPOINT_DIRECTORY,
    CHECKPOINT_FORMAT,
    CheckpointVersion,
    is_loadable_checkpoint,
    is_torch_file,
    list_checkpoints,
    load_checkpoint,
    load_latest_checkpoint,
)
from emote_core.callbacks.checkpoint_loading import CheckpointLoader
from emote_core.callbacks.restoree import (
    InvalidCheckpointLocation,
    Restoree,
    checkpoint_index_argument,
    restorees_argument,
    run_directory_argument,
    subdirectory_argument,
)
from emote_core.errors import CheckpointError, ConfigurationError

log = logging.getLogger(__name__)


class Checkpointer(Callback):
    """Writes a checkpoint every ``checkpoint_interval`` steps and once more when training ends.

    The final checkpoint is skipped when training ends with an error (the networks may be half
    updated). The state then holds ``latest_checkpoint`` and ``checkpoint_index``.

    Args:
        callbacks: The restorees whose ``state_dict()`` goes into each checkpoint.
        run_dir: The run directory.
        checkpoint_interval: Steps between checkpoints.
        keep_last: Keep only this many newest checkpoints (``None`` keeps all).
        name: Unique name.
        restorees: Upstream emote's name for ``callbacks`` (pass one of the two).
        run_root: Upstream emote's name for ``run_dir`` (pass one of the two).
        checkpoint_index: The index the first checkpoint records, each later one the next (a
            resumed run continues after its checkpoint's index when that is higher).
        storage_subdirectory: The folder of the run directory the checkpoints go to.

    Raises:
        ConfigurationError: If restorees or the run directory are missing or given twice, a
            restoree lacks the protocol, or names repeat.
        CheckpointError: When a checkpoint for a step already exists (a new run pointed at an old
            run directory); resume from it, or choose another run directory.
    """

    order: ClassVar[int] = Order.CHECKPOINT

    def __init__(
        self,
        *,
        callbacks: Sequence[Restoree] | None = None,
        run_dir: str | os.PathLike[str] | None = None,
        checkpoint_interval: int,
        keep_last: int | None = None,
        name: str = "checkpointer",
        restorees: Sequence[Restoree] | None = None,
        run_root: str | os.PathLike[str] | None = None,
        checkpoint_index: int = 0,
        storage_subdirectory: str = CHECKPOINT_DIRECTORY,
    ) -> None:
        super().__init__(name=name, cycle=checkpoint_interval)
        owner = f"checkpointer '{name}'"
        if keep_last is not None and keep_last < 1:
            raise ConfigurationError(f"keep_last must be at least 1 or None; got {keep_last}")
        self.callbacks = restorees_argument(owner, callbacks, restorees)
        self.run_dir = run_directory_argument(owner, run_dir, run_root)
        self.storage_subdirectory = subdirectory_argument(owner, storage_subdirectory)
        self.directory = self.run_dir / self.storage_subdirectory
        self.checkpoint_index = checkpoint_index_argument(owner, checkpoint_index)
        """The index the next numbered checkpoint records."""
        self.keep_last = keep_last
        self.last_saved_step = 0

    def _clean_leftovers(self) -> None:
        """Removes the temporary files of checkpoint writes that were killed (this run's own)."""
        if not self.directory.is_dir():
            return
        best_stem = Path(BEST_CHECKPOINT_NAME).stem
        for pattern in (".checkpoint_*.tmp", f".{best_stem}.*.tmp"):
            for leftover in self.directory.glob(pattern):
                leftover.unlink(missing_ok=True)
                log.info("removed '%s', left by a checkpoint write that was cut off", leftover)

    def begin_training(self, bp_step: int, checkpoint_index: int | None = None) -> None:
        self.last_saved_step = bp_step  # a resumed run has its starting step on disk already
        if checkpoint_index is not None:  # restored: number on after the checkpoint resumed from
            self.checkpoint_index = max(self.checkpoint_index, checkpoint_index + 1)
        self._clean_leftovers()

    def end_cycle(self, bp_step: int, bp_samples: int) -> dict[str, Any]:
        index = self.checkpoint_index
        path = self.save(bp_step=bp_step, bp_samples=bp_samples)
        return {"latest_checkpoint": str(path), "checkpoint_index": index}

    def end_training(
        self, bp_step: int, bp_samples: int, training_error: BaseException | None = None
    ) -> dict[str, Any] | None:
        if training_error is not None:
            # The failing step may have updated some networks and not others: not a state to
            # resume from. The last periodic checkpoint stays the newest.
            log.debug("no final checkpoint: training ended with %r", training_error)
            return None
        if bp_step > self.last_saved_step:
            return self.end_cycle(bp_step, bp_samples)
        return None

    def save(self, *, bp_step: int, bp_samples: int) -> Path:
        """Writes ``checkpoint_<bp_step>.tar`` atomically and returns its path."""
        self.directory.mkdir(parents=True, exist_ok=True)
        target = self.directory / f"checkpoint_{bp_step}.tar"
        if target.exists() and not is_loadable_checkpoint(target):
            # A checkpoint this run could not load (the resume fell back past it): kept aside.
            aside = target.with_name(f"{target.name}.damaged-{int(time.time())}")
            os.rename(target, aside)
            log.warning("moved the unreadable checkpoint '%s' aside to '%s'", target, aside.name)
        if target.exists():
            raise CheckpointError(
                f"'{target}' already exists; this run would overwrite a checkpoint of an earlier "
                "run — resume from it, or use a new run directory"
            )
        self.write(
            target, bp_step=bp_step, bp_samples=bp_samples, checkpoint_index=self.checkpoint_index
        )
        self.last_saved_step = bp_step
        log.info("wrote checkpoint %s (index %d)", target, self.checkpoint_index)
        self.checkpoint_index += 1
        self._prune()
        return target

    def write(
        self,
        target: Path,
        *,
        bp_step: int,
        bp_samples: int,
        extra: Mapping[str, dict[str, Any]] | None = None,
        checkpoint_index: int | None = None,
    ) -> None:
        """Writes the checkpoint of this moment to ``target`` atomically: into a temporary file
        beside it, flushed to disk, then renamed into place.

        Args:
            target: The checkpoint file (``checkpoint_<bp_step>.tar``, or ``best.tar``).
            bp_step: The step the checkpoint is of.
            bp_samples: The samples trained on up to it.
            extra: Further entries for the checkpoint's ``callbacks`` table, by name.
            checkpoint_index: The index a numbered checkpoint records (``None`` records none).
        """
        from emote_core import __version__

        target.parent.mkdir(parents=True, exist_ok=True)
        rng: dict[str, Any] = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        data = {
            "format": CHECKPOINT_FORMAT,
            "format_version": int(CheckpointVersion.LATEST),
            "emote_version": __version__,
            "bp_step": int(bp_step),
            "bp_samples": int(bp_samples),
            "rng": rng,
            "callbacks": {c.name: c.state_dict() for c in self.callbacks} | dict(extra or {}),
        }
        if checkpoint_index is not None:
            data["checkpoint_index"] = int(checkpoint_index)
        descriptor, temporary = tempfile.mkstemp(
            prefix=f".{target.stem}.", suffix=".tmp", dir=target.parent
        )
        try:
            with os.fdopen(descriptor, "wb") as stream:
                torch.save(data, stream)
                stream.flush()
                os.fsync(stream.fileno())
            os.replace(temporary, target)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise

    def _prune(self) -> None:
        if self.keep_last is None:
            return
        checkpoints = list_checkpoints(self.run_dir, self.storage_subdirectory)
        for _, path in checkpoints[: -self.keep_last]:
            path.unlink(missing_ok=True)


__all__ = [
    "BEST_CHECKPOINT_NAME",
    "CHECKPOINT_DIRECTORY",
    "CHECKPOINT_FORMAT",
    "CheckpointLoader",
    "CheckpointVersion",
    "Checkpointer",
    "InvalidCheckpointLocation",
    "Restoree",
    "is_torch_file",
    "list_checkpoints",
    "load_checkpoint",
    "load_latest_checkpoint",
]
