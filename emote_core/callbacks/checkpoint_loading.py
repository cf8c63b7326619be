"""Resuming: the :class:`CheckpointLoader` callback, which restores a checkpoint before training.

It accepts upstream emote's arguments under their names with their meaning (``restorees``,
``run_root``, ``checkpoint_index``, ``load_weights``, ``load_optimizers``,
``storage_subdirectory``), besides emote's own.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch

from emote_core.callback import Callback, Order
from emote_core.callbacks.checkpoint_files import (
    CHECKPOINT_DIRECTORY,
    list_checkpoints,
    load_checkpoint,
    load_latest_checkpoint,
    recorded_checkpoint_index,
)
from emote_core.callbacks.restoree import (
    InvalidCheckpointLocation,
    Restoree,
    checkpoint_index_argument,
    restorees_argument,
    run_directory_argument,
    subdirectory_argument,
)
from emote_core.errors import CheckpointError, ConfigurationError
from emote_core.utils.compat import upstream_alias

log = logging.getLogger(__name__)


class CheckpointLoader(Callback):
    """Restores restorees (and the step counters) from a checkpoint before training starts.

    Args:
        callbacks: The restorees to restore, matched to checkpoint entries by name.
        run_dir: The run directory.
        checkpoint: A step number, or ``"latest"`` for the newest checkpoint.
        load_network: Restore network weights (default on).
        load_optimizer: Restore optimizer state (default on).
        load_hparams: Restore hyperparameters such as learning rates.
        reset_training_steps: Count steps from zero (keeping the random state); left out,
            steps are restored when ``load_hparams`` is on, as upstream emote does.
        name: Unique name.
        restorees: Upstream emote's name for ``callbacks`` (pass one of the two).
        run_root: Upstream emote's name for ``run_dir`` (pass one of the two).
        checkpoint_index: Load the checkpoint that records this index (see
            :class:`Checkpointer`) instead of choosing by ``checkpoint``.
        load_weights: Upstream emote's name for ``load_network``.
        load_optimizers: Upstream emote's name for ``load_optimizer``.
        storage_subdirectory: The folder of the run directory the checkpoints are in.

    Raises:
        ConfigurationError: On missing, doubled or malformed arguments.
        InvalidCheckpointLocation: (in ``restore_state``) if the checkpoint folder is missing.
        CheckpointError: (in ``restore_state``) if no such checkpoint exists or it lacks an entry
            for one of the restorees.
    """

    order: ClassVar[int] = Order.RESTORE

    def __init__(
        self,
        *,
        callbacks: Sequence[Restoree] | None = None,
        run_dir: str | os.PathLike[str] | None = None,
        checkpoint: int | Literal["latest"] = "latest",
        load_network: bool | None = None,
        load_optimizer: bool | None = None,
        load_hparams: bool = True,
        reset_training_steps: bool | None = None,
        name: str = "checkpoint_loader",
        restorees: Sequence[Restoree] | None = None,
        run_root: str | os.PathLike[str] | None = None,
        checkpoint_index: int | None = None,
        load_weights: bool | None = None,
        load_optimizers: bool | None = None,
        storage_subdirectory: str = CHECKPOINT_DIRECTORY,
    ) -> None:
        super().__init__(name=name)
        owner = f"checkpoint loader '{name}'"
        self.callbacks = restorees_argument(owner, callbacks, restorees)
        self.run_dir = run_directory_argument(owner, run_dir, run_root)
        self.storage_subdirectory = subdirectory_argument(owner, storage_subdirectory)
        if checkpoint != "latest" and (
            isinstance(checkpoint, bool) or not isinstance(checkpoint, int) or checkpoint < 0
        ):
            raise ConfigurationError(
                f"checkpoint must be a step number or 'latest'; got {checkpoint!r}"
            )
        if checkpoint_index is not None:
            checkpoint_index_argument(owner, checkpoint_index)
            if checkpoint != "latest":
                raise ConfigurationError(
                    f"{owner}: got checkpoint={checkpoint!r} (a step) and checkpoint_index="
                    f"{checkpoint_index} (an index); pass only one"
                )
        self.checkpoint = checkpoint
        self.checkpoint_index = checkpoint_index
        weights = upstream_alias(
            owner, ("load_network", load_network), ("load_weights", load_weights)
        )
        optimizers = upstream_alias(
            owner, ("load_optimizer", load_optimizer), ("load_optimizers", load_optimizers)
        )
        self.load_network = True if weights is None else bool(weights)
        self.load_optimizer = True if optimizers is None else bool(optimizers)
        self.load_hparams = load_hparams
        self.reset_training_steps = (
            not load_hparams if reset_training_steps is None else reset_training_steps
        )

    @property
    def directory(self) -> Path:
        """The folder the checkpoints are read from."""
        return self.run_dir / self.storage_subdirectory

    def _available(self) -> list[tuple[int, Path]]:
        if not self.directory.is_dir():
            raise InvalidCheckpointLocation(
                f"run directory '{self.run_dir}' holds no checkpoints: its checkpoint folder "
                f"'{self.directory}' does not exist — check run_dir and storage_subdirectory"
            )
        available = list_checkpoints(self.run_dir, self.storage_subdirectory)
        if not available:
            raise CheckpointError(f"run directory '{self.run_dir}' holds no checkpoints to load")
        return available

    def resolve(self) -> Path:
        """The path of the checkpoint this loader will read."""
        available = self._available()
        if self.checkpoint_index is not None:
            found = {path: recorded_checkpoint_index(path) for _, path in available}
            for path, index in found.items():
                if index == self.checkpoint_index:
                    return path
            recorded = sorted(i for i in found.values() if i is not None)
            raise CheckpointError(
                f"'{self.directory}' has no checkpoint with checkpoint_index "
                f"{self.checkpoint_index}; its checkpoints record {recorded} (checkpoints from "
                "before emote recorded indices have none) — pass one of those, or "
                f"checkpoint=<bp_step> with one of {[step for step, _ in available]}"
            )
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
        if self.checkpoint == "latest" and self.checkpoint_index is None:
            self._available()
            path, data = load_latest_checkpoint(self.run_dir, self.storage_subdirectory)
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
        restored = {"bp_step": data["bp_step"], "bp_samples": data["bp_samples"]}
        restored["latest_checkpoint"] = str(path)
        if isinstance(data.get("checkpoint_index"), int):
            restored["checkpoint_index"] = data["checkpoint_index"]
        return restored


__all__ = ["CheckpointLoader"]
