"""What watches a training run: evaluation while it trains, hyperparameters, Weights & Biases."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import torch

from emote_core.algorithms.registry import Networks
from emote_core.assembly.builders import make_agent
from emote_core.assembly.evaluation import evaluate, run_reference_returns, with_normalised_score
from emote_core.callback import Callback
from emote_core.callbacks.checkpointing import Checkpointer
from emote_core.callbacks.evaluation import Evaluator, HParam
from emote_core.recipes.loading import recipe_to_dict
from emote_core.recipes.schema import Recipe
from emote_core.runs import RunDirectory
from emote_core.spaces import MDPSpace
from emote_core.stores.provenance import ReferenceReturns

log = logging.getLogger(__name__)


def training_evaluation(
    recipe: Recipe,
    networks: Networks | dict[str, Networks],
    spaces: MDPSpace | dict[str, MDPSpace],
    device: torch.device,
    group_env: Any = None,
    references: ReferenceReturns | None = None,
) -> Callable[[], dict[str, Any]]:
    """A function that evaluates the networks being trained as the recipe's ``[eval]`` says.

    Every call plays the same episodes (the env seeded with ``eval.seed``) with a fresh acting
    agent whose generator is seeded with ``eval.seed`` too, so evaluations differ only by the
    policy. The training's random streams are left as they were: torch's global generator is
    forked around the call, and nothing else of the training's is touched. A run of several
    agent groups passes ``networks`` and ``spaces`` by group and its env as ``group_env``. With
    ``references``, each report has its ``normalised_score``.
    """
    config = recipe.eval
    seeded = dataclasses.replace(recipe, seed=config.seed)
    devices = [device.index or 0] if device.type == "cuda" else []

    def acting() -> Any:
        deterministic = config.deterministic
        if group_env is None:
            return make_agent(seeded, networks, spaces, device, deterministic=deterministic)  # type: ignore[arg-type]
        from emote_core.env.multi_agent import GroupAgents

        return GroupAgents(
            group_env,
            {
                group: make_agent(seeded, nets, spaces[group], device, deterministic=deterministic)  # type: ignore[index]
                for group, nets in networks.items()  # type: ignore[union-attr]
            },
        )

    def run() -> dict[str, Any]:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(config.seed)
            report = evaluate(acting(), recipe, episodes=config.episodes, seed=config.seed)
        report["deterministic"] = config.deterministic
        if references is not None:
            with_normalised_score(report, references, origin="the reference returns of the stores")
        return report

    return run


def recipe_hparams(recipe: Recipe) -> dict[str, HParam]:
    """The recipe's scalar values by dotted key (``sac.learning_rate``), for TensorBoard's
    HParams view; lists and unset values are left out."""
    flat: dict[str, HParam] = {}

    def visit(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                visit(f"{prefix}.{key}" if prefix else str(key), item)
        elif isinstance(value, bool | int | float | str):
            flat[prefix] = value

    visit("", recipe_to_dict(recipe))
    return flat


def env_step_counter(collector: Any | None) -> Callable[[], int] | None:
    """The collector's environment step count as a function (``None`` without a collector)."""
    if collector is None:
        return None
    return lambda: int(collector.env_steps)


def monitoring_callbacks(
    recipe: Recipe,
    *,
    run: RunDirectory,
    networks: Networks | dict[str, Networks],
    spaces: MDPSpace | dict[str, MDPSpace],
    device: torch.device,
    writer: Any,
    checkpointer: Checkpointer,
    collector: Any | None,
    loggables: list[Any],
    group_env: Any = None,
) -> list[Callback]:
    """The evaluator of a training run and, when the recipe turns it on, its W&B logger. The
    evaluator logs the normalised score too when the run's stores record reference returns.

    Raises:
        ConfigurationError: If W&B logging is on and ``wandb`` is missing or cannot start.
    """
    references, why = run_reference_returns(run.path)
    if why is not None:
        log.warning("no normalised score in evaluations: %s", why)
    evaluator = Evaluator(
        evaluate=training_evaluation(recipe, networks, spaces, device, group_env, references),
        interval=recipe.eval.interval, writer=writer, env_steps=env_step_counter(collector),
        checkpointer=checkpointer, write_report=run.write_eval,
        min_return=recipe.eval.min_return, hparams=recipe_hparams(recipe),
    )  # fmt: skip
    callbacks: list[Callback] = [evaluator]
    settings = recipe.logging
    if settings.wandb:
        from emote_core.callbacks.wandb_logger import WandbLogger, start_wandb_run

        wandb_run = start_wandb_run(
            directory=run.path, project=settings.wandb_project, entity=settings.wandb_entity,
            mode=str(settings.wandb_mode), name=run.path.name, config=recipe_to_dict(recipe),
        )  # fmt: skip
        logger = WandbLogger(
            callbacks=loggables, run=wandb_run, log_interval=recipe.training.log_interval
        )
        evaluator.reporters.append(logger.log_metrics)
        callbacks.append(logger)
    return callbacks


__all__ = ["env_step_counter", "monitoring_callbacks", "recipe_hparams", "training_evaluation"]
