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
UPSTREAM_CONFIG_KEYS = ("wandb_project", "wandb_run")
"""The keys of upstream emote's ``WBLogger`` config that name the run; the rest is its config."""


class WandbNotInstalledError(ConfigurationError, ImportError):
    """W&B logging was asked for but the ``wandb`` package cannot be imported."""

    def __init__(self, message: str) -> None:
        ImportError.__init__(self, message)  # sets ``msg``, as Python's own ImportErrors have


def _import_wandb() -> Any:
    try:
        import wandb
    except ImportError as error:
        raise WandbNotInstalledError(
            "Weights & Biases logging is on but the wandb package is not installed; install it "
            f"with `{WANDB_INSTALL}` from a clone of emote (or `pip install wandb`), or turn the "
            "logging off"
        ) from error
    return wandb


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
        WandbNotInstalledError: If ``wandb`` is not installed (a ``ConfigurationError`` and an
            ``ImportError``).
        ConfigurationError: If the run cannot start.
    """
    wandb = _import_wandb()
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
        config: Instead of ``run``, upstream emote's config: the logger starts the run itself in
            the working directory, named by ``wandb_project`` and ``wandb_run``, with the other
            keys as the run's config, online unless ``WANDB_MODE`` says otherwise.

    Raises:
        WandbNotInstalledError: If ``config`` is given and ``wandb`` is not installed.
        ConfigurationError: If not exactly one of ``run`` and ``config`` is given, ``config``
            lacks a key, ``log_interval`` is not a positive integer or an entry of ``callbacks``
            is not a :class:`LoggingMixin`.
    """

    order: ClassVar[int] = Order.LOGGING

    def __init__(
        self,
        *,
        callbacks: list[LoggingMixin],
        run: Any = None,
        log_interval: int,
        name: str = "wandb_logger",
        config: Mapping[str, Any] | None = None,
    ) -> None:
        log_interval = positive_int(f"logger '{name}'", "log_interval", log_interval)
        super().__init__(name=name, cycle=log_interval)
        self.callbacks = check_loggers(callbacks, name)
        if (run is None) == (config is None):
            raise ConfigurationError(
                f"logger '{name}' takes a started run (run=start_wandb_run(...)) or upstream's "
                f"config (config={{'wandb_project': ..., 'wandb_run': ...}}); got "
                f"{'both' if run is not None else 'neither'}"
            )
        if config is not None:
            run = _start_from_config(name, config)
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


def _start_from_config(owner: str, config: Mapping[str, Any]) -> Any:
    """Starts the run upstream emote's ``WBLogger(config=...)`` started."""
    _import_wandb()  # before the keys: a missing package is the first thing to fix
    missing = [key for key in UPSTREAM_CONFIG_KEYS if key not in config]
    if missing:
        raise ConfigurationError(
            f"logger '{owner}': config has no {missing} (it has {sorted(config)}); give the W&B "
            "project and run name under 'wandb_project' and 'wandb_run'"
        )
    rest = {k: v for k, v in config.items() if k not in UPSTREAM_CONFIG_KEYS}
    return start_wandb_run(
        directory=Path.cwd(), project=str(config["wandb_project"]), entity=None, mode="online",
        name=str(config["wandb_run"]), config=rest,
    )  # fmt: skip


__all__ = [
    "UPSTREAM_CONFIG_KEYS",
    "WANDB_INSTALL",
    "WandbLogger",
    "WandbNotInstalledError",
    "start_wandb_run",
]
