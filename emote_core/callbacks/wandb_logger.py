"""Weights & Biases: the scalars the TensorBoard logger writes, sent to a W&B run as well.

``wandb`` is an optional extra (``pip install -e ".[wandb]"`` from a clone); nothing here imports
it until :func:`start_wandb_run` is called. Runs are offline unless asked otherwise: the W&B run
is written into ``<run_dir>/wandb/`` and ``wandb sync`` uploads it later, so training never waits
on a network or an account.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from emote_core.callback import Callback, Order
from emote_core.callbacks.logging import check_loggers
from emote_core.callbacks.logging_mixin import LoggingMixin
from emote_core.errors import ConfigurationError
from emote_core.utils.checks import positive_int

log = logging.getLogger(__name__)

WANDB_INSTALL = 'pip install -e ".[wandb]"'
"""How to install the extra from a clone of emote."""


def start_wandb_run(
    *,
    directory: Path,
    project: str,
    entity: str | None,
    mode: str,
    name: str,
    config: Mapping[str, Any],
) -> Any:
    """Starts a W&B run whose files go into ``directory/wandb``.

    Args:
        directory: The training run's directory.
        project: The W&B project.
        entity: The W&B user or team (``None``: the default one).
        mode: ``"offline"`` or ``"online"``; a ``WANDB_MODE`` environment variable wins.
        name: The run's display name.
        config: The run's configuration (the recipe).

    Returns:
        The ``wandb`` run.

    Raises:
        ConfigurationError: If ``wandb`` is not installed, or the run cannot start.
    """
    try:
        import wandb
    except ImportError as error:
        raise ConfigurationError(
            "Weights & Biases logging is on ([logging] wandb = true) but the wandb "
            f"package is not installed; install it with `{WANDB_INSTALL}` from a clone of emote "
            "(or `pip install wandb`), or turn the logging off"
        ) from error
    chosen = os.environ.get("WANDB_MODE") or mode
    try:
        run = wandb.init(
            # Absolute: W&B's service process, shared by the runs of one process, may have
            # started in another working directory.
            project=project, entity=entity, name=name, dir=str(directory.resolve()), mode=chosen,
            config=dict(config),
            # W&B must not wrap stdout (``--json`` keeps it for one document) or print banners.
            settings=wandb.Settings(console="off", silent=True),
        )  # fmt: skip
    except Exception as error:  # wandb raises many kinds (network, auth, usage)
        detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ConfigurationError(
            f"Weights & Biases could not start a '{chosen}' run: {detail} — log in with `wandb "
            'login`, or keep the run offline (logging.wandb_mode = "offline", or WANDB_MODE='
            "offline) and `wandb sync` it later"
        ) from error
    where = getattr(run, "dir", None) or directory
    log.info("W&B run '%s' (%s) in %s", name, chosen, where)
    return run


class WandbLogger(Callback):
    """Sends the scalars of :class:`LoggingMixin` callbacks to a W&B run every ``log_interval``.

    It reads what :class:`~emote_core.callbacks.logging.TensorboardLogger` reads: every scalar,
    the mean of every windowed scalar and its cumulative sum (``<key>_cumulative``), logged at
    W&B step ``bp_step``. :meth:`log_metrics` sends other values (an evaluation's) at a step.
    ``end_training`` sends the steps after the last cycle and finishes the run.

    Args:
        callbacks: The objects whose logs to send.
        run: A started ``wandb`` run (:func:`start_wandb_run`).
        log_interval: Send every this many training steps.
        name: The callback's name.

    Raises:
        ConfigurationError: If ``log_interval`` is not a positive integer or an entry of
            ``callbacks`` is not a :class:`LoggingMixin`.
    """

    order: ClassVar[int] = Order.LOGGING

    def __init__(
        self,
        *,
        callbacks: list[LoggingMixin],
        run: Any,
        log_interval: int,
        name: str = "wandb_logger",
    ) -> None:
        log_interval = positive_int(f"logger '{name}'", "log_interval", log_interval)
        super().__init__(name=name, cycle=log_interval)
        self.callbacks = check_loggers(callbacks, name)
        self.run = run
        self.log_interval = log_interval
        self._last_bp_step = 0

    def begin_training(self, bp_step: int) -> None:
        self._last_bp_step = bp_step

    def end_cycle(self, bp_step: int) -> None:
        """Sends every callback's scalars."""
        values: dict[str, float] = {}
        for callback in self.callbacks:
            values.update(callback.scalar_logs)
            values.update(callback.windowed_means())
            for key, total in callback.windowed_scalar_cumulative.items():
                values[f"{key}_cumulative"] = total
        self.log_metrics(values, bp_step)
        self._last_bp_step = bp_step

    def log_metrics(self, metrics: Mapping[str, float], bp_step: int) -> None:
        """Sends ``metrics`` at W&B step ``bp_step``."""
        if metrics:
            self.run.log(dict(metrics), step=bp_step)

    def end_training(self, bp_step: int, training_error: BaseException | None = None) -> None:
        """Sends the steps after the last cycle, then finishes the run, however training ends."""
        try:
            if bp_step > self._last_bp_step:
                self.end_cycle(bp_step)
        finally:
            self.run.finish(exit_code=0 if training_error is None else 1)


__all__ = ["WANDB_INSTALL", "WandbLogger", "start_wandb_run"]
