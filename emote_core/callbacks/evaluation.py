"""Evaluation while training: the policy plays whole episodes every ``interval`` updates and once
more when training ends.

Each evaluation is written to TensorBoard twice, against updates (``eval_bp_step/mean_return``
at global step ``bp_step``) and against environment steps (``eval_env_step/mean_return`` at the
collector's step count), for the keys in :data:`EVAL_METRICS`. The best evaluation so far is kept
as a checkpoint, ``checkpoints/best.tar``; when training ends the last evaluation becomes the run's
report (``eval.json``) and the TensorBoard hyperparameters' metric.

The callback plays no episodes itself: it calls an ``evaluate`` function (the assembly builds one
that plays a recipe's environment with its own seeds), so it knows no environment or algorithm.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams as hparams_summaries

from emote_core.callback import Callback, Order
from emote_core.callbacks.checkpointing import (
    BEST_CHECKPOINT_NAME,
    Checkpointer,
    load_checkpoint,
)
from emote_core.callbacks.logging import tag_for
from emote_core.errors import CheckpointError, ConfigurationError

log = logging.getLogger(__name__)

EVAL_METRICS = (
    "eval/mean_return",
    "eval/std_return",
    "eval/lowest_return",
    "eval/highest_return",
    "eval/mean_length",
)
"""The keys each evaluation logs (and :data:`NORMALISED_SCORE` when its report has one)."""
NORMALISED_SCORE = "eval/normalised_score"
"""The key of an evaluation's normalised score (0 = random, 100 = expert), logged when the
report holds a ``normalised_score``."""
HPARAM_METRIC = "hparam/eval_mean_return"
"""The TensorBoard hyperparameters' metric: the mean return of the evaluation at the end."""
HParam = bool | int | float | str

Evaluate = Callable[[], Mapping[str, Any]]
"""Plays the episodes of one evaluation and returns at least ``returns`` and ``lengths`` (one
per episode) and ``mean_return``; the rest of its report goes into ``eval.json`` as it is."""
Reporter = Callable[[Mapping[str, float], int], None]
"""Receives each evaluation's metrics and its ``bp_step`` (a W&B logger's ``log_metrics``)."""


def evaluation_metrics(report: Mapping[str, Any]) -> dict[str, float]:
    """The :data:`EVAL_METRICS` of an evaluation report, and :data:`NORMALISED_SCORE` when the
    report holds a ``normalised_score``."""
    returns = np.asarray(report["returns"], dtype=np.float64)
    lengths = np.asarray(report["lengths"], dtype=np.float64)
    metrics = {
        "eval/mean_return": float(returns.mean()),
        "eval/std_return": float(returns.std()),
        "eval/lowest_return": float(returns.min()),
        "eval/highest_return": float(returns.max()),
        "eval/mean_length": float(lengths.mean()),
    }
    if report.get("normalised_score") is not None:
        metrics[NORMALISED_SCORE] = float(report["normalised_score"])
    return metrics


class Evaluator(Callback):
    """Evaluates the policy every ``interval`` updates and when training ends.

    Args:
        evaluate: Plays one evaluation (see :data:`Evaluate`). It must leave the training's
            random streams alone: its own environment, seeds and generators.
        interval: Updates between evaluations; 0 evaluates only when training ends.
        writer: TensorBoard writer for the metrics and, at the end, the hyperparameters.
        env_steps: The environment steps collected so far (the collector's count), for the
            second axis; ``None`` when nothing is collected (training from stores only).
        checkpointer: Writes ``best.tar`` into its checkpoint folder, in its format, whenever an
            evaluation beats the best so far (a resumed run keeps the best of earlier starts).
        write_report: Receives the final report (``RunDirectory.write_eval``).
        min_return: The mean return the run should reach; the report says whether it did.
        hparams: Hyperparameters for TensorBoard's HParams view, written at the end with the
            final mean return as :data:`HPARAM_METRIC`.
        reporters: Further receivers of each evaluation's metrics.
        name: Unique name (keys this callback's entry in ``best.tar``).

    Raises:
        ConfigurationError: If ``interval`` is not a non-negative integer.
    """

    order: ClassVar[int] = Order.EVALUATION

    def __init__(
        self,
        *,
        evaluate: Evaluate,
        interval: int = 0,
        writer: SummaryWriter | None = None,
        env_steps: Callable[[], int] | None = None,
        checkpointer: Checkpointer | None = None,
        write_report: Callable[[dict[str, Any]], None] | None = None,
        min_return: float | None = None,
        hparams: Mapping[str, HParam] | None = None,
        reporters: Sequence[Reporter] = (),
        name: str = "evaluation",
    ) -> None:
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 0:
            raise ConfigurationError(
                f"evaluator '{name}' got interval={interval!r}; it must be a number of updates "
                "(0 evaluates only when training ends)"
            )
        super().__init__(name=name, cycle=interval or None)
        self.evaluate = evaluate
        self.interval = interval
        self.writer = writer
        self.env_steps = env_steps
        self.checkpointer = checkpointer
        self.write_report = write_report
        self.min_return = min_return
        self.hparams = dict(hparams) if hparams is not None else None
        self.reporters = list(reporters)
        self.best: dict[str, Any] | None = None
        """``{bp_step, env_steps, mean_return}`` of the best evaluation so far."""
        self.last: dict[str, Any] | None = None
        """The latest evaluation's report, with its ``bp_step``, ``env_steps`` and metrics."""
        self.report: dict[str, Any] | None = None
        """The final report (:meth:`final_report`) once training ended with an evaluation;
        ``None`` before, and when training failed or was interrupted."""

    @property
    def best_path(self) -> Path | None:
        """Where the best evaluation's checkpoint goes (``None`` without a checkpointer)."""
        if self.checkpointer is None:
            return None
        return self.checkpointer.directory / BEST_CHECKPOINT_NAME

    # Hooks.

    def begin_training(self) -> None:
        """Takes the best so far from an earlier start's ``best.tar``, when there is one."""
        self.best, self.last, self.report = None, None, None
        path = self.best_path
        if path is None or not path.exists():
            return
        try:
            saved = load_checkpoint(path)["callbacks"][self.name]["best"]
        except (CheckpointError, KeyError, TypeError) as error:
            log.warning("'%s' does not say how good it was (%s); the next evaluation replaces "
                        "it", path, error)  # fmt: skip
            return
        self.best = dict(saved)
        log.info("best evaluation so far: mean return %.4g at bp_step %d (%s)",
                 self.best["mean_return"], self.best["bp_step"], path)  # fmt: skip

    def end_cycle(self, bp_step: int, bp_samples: int) -> None:
        """Evaluates after the updates of every ``interval``-th step."""
        self.run_evaluation(bp_step=bp_step, bp_samples=bp_samples)

    def end_training(
        self,
        bp_step: int,
        bp_samples: int,
        training_error: BaseException | None = None,
        shutdown_signal: threading.Event | None = None,
    ) -> None:
        """Evaluates the final policy (unless the last evaluation was of it) and reports.

        Nothing is evaluated when training ended with an error or was interrupted (Ctrl-C):
        ``emote eval`` evaluates such a run later.
        """
        if training_error is not None:
            # the error itself is what the user is told; this is the why of a missing result
            log.debug("no final evaluation: training ended with %r", training_error)
            return
        if shutdown_signal is not None and shutdown_signal.is_set():
            log.info("no final evaluation: training was interrupted; `emote eval` the run later")
            return
        last = self.last
        if last is None or last["bp_step"] != bp_step:
            last = self.run_evaluation(bp_step=bp_step, bp_samples=bp_samples)
        report = self.final_report(last)
        self.report = report
        if self.write_report is not None:
            self.write_report(report)
        if self.writer is not None and self.hparams is not None:
            _write_hparams(self.writer, self.hparams, report["mean_return"], bp_step)

    # Evaluating.

    def run_evaluation(self, *, bp_step: int, bp_samples: int) -> dict[str, Any]:
        """Plays one evaluation now, logs it, and keeps ``best.tar`` when it is the best."""
        report = dict(self.evaluate())
        metrics = evaluation_metrics(report)
        env_steps = self.env_steps() if self.env_steps is not None else None
        report.update(bp_step=bp_step, env_steps=env_steps)
        self.last = report
        if self.writer is not None:
            for key, value in metrics.items():
                self.writer.add_scalar(tag_for(key, "bp_step"), value, bp_step)
                if env_steps is not None:
                    self.writer.add_scalar(tag_for(key, "env_step"), value, env_steps)
            self.writer.flush()
        for reporter in self.reporters:
            reporter(metrics, bp_step)
        mean = metrics["eval/mean_return"]
        improved = self.best is None or mean > self.best["mean_return"]
        if improved:
            self.best = {"bp_step": bp_step, "env_steps": env_steps, "mean_return": mean}
            if self.checkpointer is not None and self.best_path is not None:
                self.checkpointer.write(
                    self.best_path, bp_step=bp_step, bp_samples=bp_samples,
                    extra={self.name: self.state_dict()},
                )  # fmt: skip
        log.info(
            "evaluation at bp_step %d: mean return %.4g ± %.3g over %d episodes%s",
            bp_step, mean, metrics["eval/std_return"], len(report["returns"]),
            " (best so far)" if improved else "",
        )  # fmt: skip
        return report

    def final_report(self, last: Mapping[str, Any]) -> dict[str, Any]:
        """The end-of-training report: ``last`` with its spread, the threshold and the best."""
        metrics = evaluation_metrics(last)
        report = dict(last)
        report.update(
            source="training",
            mean_return=metrics["eval/mean_return"],
            std_return=metrics["eval/std_return"],
            lowest_return=metrics["eval/lowest_return"],
            highest_return=metrics["eval/highest_return"],
            threshold=self.min_return,
            passed=None
            if self.min_return is None
            else metrics["eval/mean_return"] >= self.min_return,
        )
        if self.best is not None:
            best_path = self.best_path
            on_disk = best_path is not None and best_path.exists()
            report["best"] = dict(self.best, checkpoint=str(best_path) if on_disk else None)
        return report

    # Checkpoints.

    def state_dict(self) -> dict[str, Any]:
        """The best evaluation so far (what ``best.tar`` records about itself)."""
        return {"best": dict(self.best) if self.best is not None else None}

    def load_state_dict(
        self,
        state_dict: dict[str, Any],
        load_network: bool = True,
        load_optimizer: bool = True,
        load_hparams: bool = True,
    ) -> None:
        """Restores the best evaluation so far."""
        best = state_dict.get("best")
        self.best = dict(best) if best is not None else None


def _write_hparams(
    writer: SummaryWriter, hparams: dict[str, HParam], final_return: float, bp_step: int
) -> None:
    metrics = {HPARAM_METRIC: final_return}
    experiment, session_start, session_end = hparams_summaries(hparams, metrics)
    # Into the run's own event file, so that TensorBoard's HParams view shows this run with its
    # curves; SummaryWriter.add_hparams would open a second run in a sub-folder. This is what
    # add_hparams itself writes.
    file_writer = writer._get_file_writer()
    for summary in (experiment, session_start, session_end):
        file_writer.add_summary(summary, bp_step)
    writer.add_scalar(HPARAM_METRIC, final_return, bp_step)
    writer.flush()


__all__ = [
    "EVAL_METRICS",
    "HPARAM_METRIC",
    "NORMALISED_SCORE",
    "Evaluate",
    "Evaluator",
    "HParam",
    "Reporter",
    "evaluation_metrics",
]
