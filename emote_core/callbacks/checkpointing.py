"""Checkpoints: periodic, atomic snapshots of every callback's state, and resuming from them.

A checkpoint is ``<run_dir>/checkpoints/checkpoint_<bp_step>.tar``, written with ``torch.save`` to
a temporary name and renamed into place, holding only tensors, numbers, strings, lists and dicts so
it loads with ``torch.load(weights_only=True)``.

``checkpoints/best.tar`` (:data:`BEST_CHECKPOINT_NAME`), written by the evaluation callback, is a
checkpoint of the same layout taken at the best evaluation so far. It is never one of a run's
numbered checkpoints: :func:`list_checkpoints`, the latest checkpoint and resuming ignore it.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import time
import zipfile
from collections.abc import Mapping, Sequence
from enum import IntEnum
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch

from emote_core.callback import Callback, Order, repeated_names
from emote_core.errors import CheckpointError, ConfigurationError

log = logging.getLogger(__name__)

CHECKPOINT_FORMAT = "emote-checkpoint"
CHECKPOINT_DIRECTORY = "checkpoints"
BEST_CHECKPOINT_NAME = "best.tar"
"""The checkpoint of a run's best evaluation, in ``checkpoints/``."""
_CHECKPOINT_NAME = re.compile(r"^checkpoint_(\d+)\.tar$")


class CheckpointVersion(IntEnum):
    """Versions of the checkpoint layout."""

    V1 = 1
    """``{format, format_version, emote_version, bp_step, bp_samples, rng, callbacks}`` with
    ``callbacks`` mapping each callback's name to its ``state_dict()``."""
    LATEST = V1


def list_checkpoints(run_dir: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """The checkpoints of a run directory as ``(bp_step, path)``, oldest first."""
    directory = Path(run_dir) / CHECKPOINT_DIRECTORY
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        match = _CHECKPOINT_NAME.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def is_torch_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a file ``torch.save`` could have written, judged without loading it:
    a zip archive holding a ``data.pkl`` (torch's format), or a pickle (its legacy format)."""
    try:
        with open(path, "rb") as stream:
            head = stream.read(4)
        if head.startswith(b"PK\x03\x04"):
            with zipfile.ZipFile(path) as archive:
                return any(name.rpartition("/")[2] == "data.pkl" for name in archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False
    return head[:1] == b"\x80"  # the PROTO opcode every pickle of protocol 2 or above starts with


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Loads a checkpoint file safely (``weights_only``) onto the CPU and checks its format.

    Raises:
        CheckpointError: If the file is missing, not a checkpoint, or from a newer emote.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint '{path}' does not exist")
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise CheckpointError(
            f"'{path}' is not a readable emote checkpoint ({type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else 'no detail'})"
        ) from error
    if not isinstance(data, dict) or data.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"'{path}' is not an emote checkpoint (no '{CHECKPOINT_FORMAT}' tag)")
    version = data.get("format_version")
    if not isinstance(version, int) or version > CheckpointVersion.LATEST:
        raise CheckpointError(
            f"checkpoint '{path}' has format_version {version!r}; this emote reads up to "
            f"{int(CheckpointVersion.LATEST)} — upgrade emote"
        )
    return data


def load_latest_checkpoint(run_dir: str | os.PathLike[str]) -> tuple[Path, dict[str, Any]]:
    """The newest checkpoint of a run that loads, and its content.

    A checkpoint that does not load (truncated by a full disk, damaged) is skipped with a
    warning naming it and why; the one before it is tried.

    Raises:
        CheckpointError: If the run has no checkpoints, or none of them loads.
    """
    available = list_checkpoints(run_dir)
    if not available:
        raise CheckpointError(f"run directory '{run_dir}' holds no checkpoints")
    skipped = []
    for _, path in reversed(available):
        try:
            data = load_checkpoint(path)
        except CheckpointError as error:
            log.warning("skipping checkpoint '%s': %s", path, error)
            skipped.append(path.name)
            continue
        if skipped:
            log.warning("using checkpoint '%s' (newer ones do not load: %s)", path, skipped)
        return path, data
    raise CheckpointError(
        f"none of the {len(available)} checkpoints in '{run_dir}' loads ({', '.join(skipped)})"
    )


def _loads(path: Path) -> bool:
    try:
        load_checkpoint(path)
    except CheckpointError:
        return False
    return True


def _check_unique_names(callbacks: Sequence[Callback], owner: str) -> None:
    duplicated = repeated_names(callbacks)
    if duplicated:
        raise ConfigurationError(
            f"{owner}: callback names key checkpoint entries and must be unique; {duplicated} "
            "appear more than once"
        )


class Checkpointer(Callback):
    """Writes a checkpoint every ``checkpoint_interval`` steps and once more when training ends.

    The final checkpoint is skipped when training ends with an error (``training_error`` in the
    state), since the failed step may have left the networks half updated.

    Args:
        callbacks: The callbacks whose ``state_dict()`` goes into each checkpoint.
        run_dir: The run directory; checkpoints go to its ``checkpoints/`` folder.
        checkpoint_interval: Steps between checkpoints.
        keep_last: Keep only this many newest checkpoints (``None`` keeps all).
        name: Unique name.

    Raises:
        CheckpointError: When a checkpoint for a step already exists (a new run pointed at an old
            run directory); resume from it, or choose another run directory.
    """

    order: ClassVar[int] = Order.CHECKPOINT

    def __init__(
        self,
        *,
        callbacks: Sequence[Callback],
        run_dir: str | os.PathLike[str],
        checkpoint_interval: int,
        keep_last: int | None = None,
        name: str = "checkpointer",
    ) -> None:
        super().__init__(name=name, cycle=checkpoint_interval)
        if keep_last is not None and keep_last < 1:
            raise ConfigurationError(f"keep_last must be at least 1 or None; got {keep_last}")
        _check_unique_names(callbacks, f"checkpointer '{name}'")
        self.callbacks = list(callbacks)
        self.run_dir = Path(run_dir)
        self.directory = self.run_dir / CHECKPOINT_DIRECTORY
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

    def begin_training(self, bp_step: int) -> None:
        self.last_saved_step = bp_step  # a resumed run has its starting step on disk already
        self._clean_leftovers()

    def end_cycle(self, bp_step: int, bp_samples: int) -> None:
        self.save(bp_step=bp_step, bp_samples=bp_samples)

    def end_training(
        self, bp_step: int, bp_samples: int, training_error: BaseException | None = None
    ) -> None:
        if training_error is not None:
            # The failing step may have updated some networks and not others: not a state to
            # resume from. The last periodic checkpoint stays the newest.
            log.warning("no final checkpoint: training ended with %r", training_error)
            return
        if bp_step > self.last_saved_step:
            self.save(bp_step=bp_step, bp_samples=bp_samples)

    def save(self, *, bp_step: int, bp_samples: int) -> Path:
        """Writes ``checkpoint_<bp_step>.tar`` atomically and returns its path."""
        self.directory.mkdir(parents=True, exist_ok=True)
        target = self.directory / f"checkpoint_{bp_step}.tar"
        if target.exists() and not _loads(target):
            # A checkpoint this run could not load (the resume fell back past it): kept aside.
            aside = target.with_name(f"{target.name}.damaged-{int(time.time())}")
            os.rename(target, aside)
            log.warning("moved the unreadable checkpoint '%s' aside to '%s'", target, aside.name)
        if target.exists():
            raise CheckpointError(
                f"'{target}' already exists; this run would overwrite a checkpoint of an earlier "
                "run — resume from it, or use a new run directory"
            )
        self.write(target, bp_step=bp_step, bp_samples=bp_samples)
        self.last_saved_step = bp_step
        log.info("wrote checkpoint %s", target)
        self._prune()
        return target

    def write(
        self,
        target: Path,
        *,
        bp_step: int,
        bp_samples: int,
        extra: Mapping[str, dict[str, Any]] | None = None,
    ) -> None:
        """Writes the checkpoint of this moment to ``target`` atomically: into a temporary file
        beside it, flushed to disk, then renamed into place.

        Args:
            target: The checkpoint file (``checkpoint_<bp_step>.tar``, or ``best.tar``).
            bp_step: The step the checkpoint is of.
            bp_samples: The samples trained on up to it.
            extra: Further entries for the checkpoint's ``callbacks`` table, by name.
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
        for _, path in list_checkpoints(self.run_dir)[: -self.keep_last]:
            path.unlink(missing_ok=True)


class CheckpointLoader(Callback):
    """Restores callbacks (and the step counters) from a checkpoint before training starts.

    Args:
        callbacks: The callbacks to restore, matched to checkpoint entries by name.
        run_dir: The run directory whose ``checkpoints/`` to read.
        checkpoint: A step number, or ``"latest"`` for the newest checkpoint.
        load_network: Restore network weights.
        load_optimizer: Restore optimizer state.
        load_hparams: Restore hyperparameters such as learning rates.
        reset_training_steps: Start counting steps from zero instead of the checkpoint's step
            (fine-tuning from weights rather than resuming).
        name: Unique name.

    Raises:
        CheckpointError: (in ``restore_state``) if no such checkpoint exists or it lacks an entry
            for one of ``callbacks``.
    """

    order: ClassVar[int] = Order.RESTORE

    def __init__(
        self,
        *,
        callbacks: Sequence[Callback],
        run_dir: str | os.PathLike[str],
        checkpoint: int | Literal["latest"] = "latest",
        load_network: bool = True,
        load_optimizer: bool = True,
        load_hparams: bool = True,
        reset_training_steps: bool = False,
        name: str = "checkpoint_loader",
    ) -> None:
        super().__init__(name=name)
        _check_unique_names(callbacks, f"checkpoint loader '{name}'")
        if checkpoint != "latest" and (not isinstance(checkpoint, int) or checkpoint < 0):
            raise ConfigurationError(
                f"checkpoint must be a step number or 'latest'; got {checkpoint!r}"
            )
        self.callbacks = list(callbacks)
        self.run_dir = Path(run_dir)
        self.checkpoint = checkpoint
        self.load_network = load_network
        self.load_optimizer = load_optimizer
        self.load_hparams = load_hparams
        self.reset_training_steps = reset_training_steps

    def resolve(self) -> Path:
        """The path of the checkpoint this loader will read."""
        available = list_checkpoints(self.run_dir)
        if not available:
            raise CheckpointError(f"run directory '{self.run_dir}' holds no checkpoints to load")
        if self.checkpoint == "latest":
            return available[-1][1]
        for step, path in available:
            if step == self.checkpoint:
                return path
        steps = [step for step, _ in available]
        raise CheckpointError(
            f"run directory '{self.run_dir}' has no checkpoint for bp_step {self.checkpoint}; "
            f"it has {steps}"
        )

    def restore_state(self) -> dict[str, Any] | None:
        if self.checkpoint == "latest":
            path, data = load_latest_checkpoint(self.run_dir)
        else:
            path = self.resolve()
            data = load_checkpoint(path)
        saved = data["callbacks"]
        # A callback that checkpoints grew to hold later may say how it starts without its entry.
        missing = [
            c.name for c in self.callbacks
            if c.name not in saved and not hasattr(c, "restore_without_state")
        ]  # fmt: skip
        if missing:
            raise CheckpointError(
                f"checkpoint '{path}' has no state for callbacks {missing}; it holds "
                f"{sorted(saved)}"
            )
        for callback in self.callbacks:
            if callback.name not in saved:
                log.warning("checkpoint '%s' holds no state for '%s'", path, callback.name)
                callback.restore_without_state()  # type: ignore[attr-defined]
                continue
            callback.load_state_dict(
                saved[callback.name], self.load_network, self.load_optimizer, self.load_hparams
            )
        log.info("restored %d callbacks from %s", len(self.callbacks), path)
        if self.reset_training_steps:
            return None
        torch.set_rng_state(data["rng"]["torch"])
        if "cuda" in data["rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(data["rng"]["cuda"])
        return {"bp_step": data["bp_step"], "bp_samples": data["bp_samples"]}


__all__ = [
    "BEST_CHECKPOINT_NAME",
    "CHECKPOINT_DIRECTORY",
    "CHECKPOINT_FORMAT",
    "CheckpointLoader",
    "CheckpointVersion",
    "Checkpointer",
    "is_torch_file",
    "list_checkpoints",
    "load_checkpoint",
    "load_latest_checkpoint",
]
