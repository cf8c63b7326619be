"""``emote eval``: evaluate a trained agent over whole episodes."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from emote_cli._common import (
    DebugOption,
    DeviceOption,
    EnvOption,
    ExitCode,
    JsonOption,
    QuietOption,
    abort,
    emit_json,
    handle_errors,
    setup_logging,
    stdout_console,
)
from emote_cli._text import printable
from emote_cli.progress import ProgressDisplay, episode_progress

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
    env_id: EnvOption = None,
    episodes: Annotated[
        int | None, typer.Option("--episodes", min=1, help="Episodes (recipe's eval.episodes).")
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option("--seed", help="Seed of the evaluation env (the recipe's eval.seed)."),
    ] = None,
    min_return: Annotated[
        float | None,
        typer.Option(
            "--min-return",
            help="Exit 3 when the mean return is below this (the recipe's eval.min_return).",
        ),
    ] = None,
    stochastic: Annotated[
        bool, typer.Option("--stochastic", help="Sample actions instead of acting greedily.")
    ] = False,
    device: DeviceOption = "auto",
    video: Annotated[
        Path | None,
        typer.Option(
            "--video",
            metavar="DIR",
            help="Record every episode as an MP4 file in DIR (created; files already there are "
            "kept and the videos take new names); needs the video extra.",
        ),
    ] = None,
    json_output: JsonOption = False,
    quiet: QuietOption = False,
    debug: DebugOption = False,
) -> None:
    """Run a trained agent for whole episodes and report its returns (deterministic by default).

    Appends to eval.json in the run directory when given one. An .onnx policy runs in
    onnxruntime alone, on the environment of the recipe stored in it (or --recipe / --env);
    an export of --profile ml-agents acts with its deterministic_* outputs (unless --stochastic).
    Without --min-return the recipe's \\[eval] min_return is the threshold (not with --env).
    A run rebuilds its env as its run.json records it (the env's module files are found where
    training found them, from any directory).
    On a multi-agent (PettingZoo) env an episode is the env's and its return the team return
    (all agents' returns summed); each agent group's mean return per agent is reported too.
    """
    setup_logging(quiet=quiet, debug=debug)
    with handle_errors(debug=debug, json_output=json_output):
        from emote_core.assembly.builders import load_trained_agent
        from emote_core.assembly.evaluation import PolicyKind, policy_kind
        from emote_core.assembly.evaluation import evaluate as run_episodes
        from emote_core.assembly.export import recipe_from_policy
        from emote_core.onnx.agent import OnnxAgentProxy
        from emote_core.recipes import EvalConfig, load_recipe
        from emote_core.recipes.loading import with_env
        from emote_core.runs import RunDirectory
        from emote_core.utils.devices import resolve_device

        extra = {}
        if policy_kind(target) is PolicyKind.ONNX:  # onnxruntime alone: no torch network
            noise_seed = seed if seed is not None else EvalConfig().seed
            agent = OnnxAgentProxy(target, deterministic=not stochastic, seed=noise_seed)
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
        threshold, threshold_from = _threshold(min_return, loaded, target, recipe, env_id)
        if env_id is not None:
            loaded = with_env(loaded, env_id)
        env_seed = seed if seed is not None else loaded.eval.seed
        count = episodes or loaded.eval.episodes
        with ProgressDisplay("eval", "episode", quiet=quiet) as display:
            report = run_episodes(
                agent,
                loaded,
                episodes=count,
                seed=env_seed,
                on_episode=episode_progress(display, count),
                video_dir=video,
            )
        report["checkpoint"] = str(checkpoint) if checkpoint is not None else None
        report["deterministic"] = not stochastic
        report.update(extra)
        report.update(
            source="emote eval", threshold=threshold, threshold_from=threshold_from,
            passed=None if threshold is None else report["mean_return"] >= threshold,
        )  # fmt: skip
        if target.is_dir():
            RunDirectory(target).write_eval(report)
        if json_output:
            emit_json(report)
        else:
            stdout_console().print(  # the env id may come from an ONNX file's metadata
                printable(
                    f"{report['episodes']} episodes of {report['env']}: mean "
                    f"{'team ' if 'groups' in report else ''}return "
                    f"{report['mean_return']:.2f} ± {report['std_return']:.2f}"
                ),
                markup=False, highlight=False, soft_wrap=True,
            )  # fmt: skip
            for name, group in (report.get("groups") or {}).items():  # a multi-agent env's
                stdout_console().print(
                    printable(
                        f"group {name} ({', '.join(group['agents'])}): mean return per agent "
                        f"{group['mean_return']:.2f} over {len(group['returns'])} agent lives"
                    ),
                    markup=False, highlight=False, soft_wrap=True,
                )  # fmt: skip
            if video is not None:
                stdout_console().print(
                    printable(f"videos: {len(report['videos'])} MP4 file(s) in {video}"),
                    markup=False, highlight=False, soft_wrap=True,
                )  # fmt: skip
        if report["passed"] is False:
            below = (
                f"--min-return {threshold}"
                if min_return is not None
                else f"{threshold}, the {threshold_from}; pass --min-return X to judge by another"
            )
            abort(
                f"mean return {report['mean_return']:.2f} is below {below}",
                ExitCode.THRESHOLD_NOT_MET,
            )


def _threshold(
    given: float | None, recipe: Any, target: Path, recipe_option: str | None, env_id: str | None
) -> tuple[float | None, str | None]:
    """The mean return to reach and where it came from: ``--min-return``, else the recipe's
    ``[eval] min_return`` (which is for the recipe's env, so not with ``--env``)."""
    if given is not None:
        return given, "--min-return"
    if recipe.eval.min_return is None or env_id is not None:
        return None, None
    if recipe_option is not None:
        where = f"recipe '{recipe_option}'"
    elif target.suffix.lower() == ".onnx":
        where = f"recipe stored in '{target}'"
    else:
        run_path = target if target.is_dir() else target.parent.parent
        where = f"run's recipe '{run_path / 'recipe.toml'}'"
    return recipe.eval.min_return, f"[eval] min_return of the {where}"
