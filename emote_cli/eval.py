"""``emote eval``: evaluate a trained agent over whole episodes."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from emote_cli._common import (
    DebugOption,
    ExitCode,
    JsonOption,
    QuietOption,
    abort,
    emit_json,
    handle_errors,
    setup_logging,
    stdout_console,
)

__all__ = ["evaluate"]


def evaluate(
    target: Annotated[
        Path,
        typer.Argument(
            help="A checkpoint file, a run directory, or an exported .onnx policy.",
            show_default=False,
        ),
    ],
    recipe: Annotated[
        str | None, typer.Option("--recipe", help="The recipe (default: the run's recipe.toml).")
    ] = None,
    env_id: Annotated[
        str | None, typer.Option("--env", help="Evaluate on another registered env id.")
    ] = None,
    episodes: Annotated[
        int | None, typer.Option("--episodes", min=1, help="Episodes (recipe's eval.episodes).")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the evaluation env.")] = 1_000,
    min_return: Annotated[
        float | None,
        typer.Option("--min-return", help="Exit 3 when the mean return is below this."),
    ] = None,
    stochastic: Annotated[
        bool, typer.Option("--stochastic", help="Sample actions instead of acting greedily.")
    ] = False,
    device: Annotated[str, typer.Option("--device", help="auto, cpu or cuda[:n].")] = "cpu",
    json_output: JsonOption = False,
    quiet: QuietOption = False,
    debug: DebugOption = False,
) -> None:
    """Run a trained agent for whole episodes and report its returns (deterministic by default).

    Writes eval.json into the run directory when given one. An .onnx policy runs in onnxruntime
    alone, on the environment of the recipe stored in it (or --recipe / --env).
    """
    setup_logging(quiet=quiet, debug=debug)
    with handle_errors(debug=debug):
        from dataclasses import replace

        from emote_core.assembly.builders import load_trained_agent
        from emote_core.assembly.evaluation import PolicyKind, policy_kind
        from emote_core.assembly.evaluation import evaluate as run_episodes
        from emote_core.assembly.export import recipe_from_policy
        from emote_core.onnx.agent import OnnxAgentProxy
        from emote_core.recipes import load_recipe
        from emote_core.runs import RunDirectory
        from emote_core.utils.devices import resolve_device

        extra = {}
        if policy_kind(target) is PolicyKind.ONNX:  # onnxruntime alone: no torch network
            agent = OnnxAgentProxy(target, deterministic=not stochastic, seed=seed)
            loaded = (
                load_recipe(recipe)
                if recipe
                else recipe_from_policy(agent.metadata, source=str(target))
            )
            checkpoint = agent.metadata.source_checkpoint or None
            extra["policy"] = str(target)
        else:
            loaded, _, agent, _, checkpoint = load_trained_agent(
                target, device=resolve_device(device),
                recipe=load_recipe(recipe) if recipe else None, deterministic=not stochastic,
            )  # fmt: skip
        if env_id is not None:
            loaded = replace(loaded, env=replace(loaded.env, id=env_id))
        report = run_episodes(agent, loaded, episodes=episodes or loaded.eval.episodes, seed=seed)
        report["checkpoint"] = str(checkpoint) if checkpoint is not None else None
        report["deterministic"] = not stochastic
        report.update(extra)
        if target.is_dir():
            RunDirectory(target).write_eval(report)
        if json_output:
            emit_json(report)
        else:
            stdout_console().print(
                f"{report['episodes']} episodes of {report['env']}: mean return "
                f"{report['mean_return']:.2f} ± {report['std_return']:.2f}"
            )
        if min_return is not None and report["mean_return"] < min_return:
            abort(
                f"mean return {report['mean_return']:.2f} is below --min-return {min_return}",
                ExitCode.THRESHOLD_NOT_MET,
            )
