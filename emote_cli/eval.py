"""``emote eval``: evaluate a trained agent over whole episodes."""

from __future__ import annotations

import logging
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

log = logging.getLogger("emote_cli.eval")


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
    random_return: Annotated[
        float | None,
        typer.Option(
            "--random-return",
            help="The mean return of a random policy: with --expert-return, the scale of the "
            "normalised score (default: the reference returns of the stores the run trained on).",
            show_default=False,
        ),
    ] = None,
    expert_return: Annotated[
        float | None,
        typer.Option(
            "--expert-return",
            help="The mean return of an expert policy (normalised score 100); with "
            "--random-return.",
            show_default=False,
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
    The normalised score, 100 * (mean - random) / (expert - random), comes from --random-return
    and --expert-return, else from the reference returns of the stores a run trained on (not
    with --env).
    """
    setup_logging(quiet=quiet, debug=debug)
    with handle_errors(debug=debug, json_output=json_output):
        given = _given_references(random_return, expert_return)
        from emote_core.assembly.builders import load_trained_agent
        from emote_core.assembly.evaluation import (
            PolicyKind,
            policy_kind,
            run_reference_returns,
            with_normalised_score,
        )
        from emote_core.assembly.evaluation import evaluate as run_episodes
        from emote_core.assembly.export import recipe_from_policy
        from emote_core.onnx.agent import OnnxAgentProxy
        from emote_core.recipes import EvalConfig, load_recipe
        from emote_core.recipes.loading import with_env
        from emote_core.runs import RunDirectory
        from emote_core.utils.devices import resolve_device

        extra = {}
        kind = policy_kind(target)
        if kind is PolicyKind.ONNX:  # onnxruntime alone: no torch network
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
        references, origin = given, "--random-return/--expert-return"
        if given is None and kind is not PolicyKind.ONNX and env_id is None:  # for its env
            run_path = target if target.is_dir() else target.parent.parent
            references, why = run_reference_returns(run_path)
            origin = "the reference returns of the run's stores"
            if why is not None:
                log.warning("no normalised score: %s", printable(why))
        with_normalised_score(report, references, origin=origin if references else None)
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
                    f"{report['episodes']} episode{'s' if report['episodes'] != 1 else ''} of "
                    f"{report['env']}: mean "
                    f"{'team ' if 'groups' in report else ''}return "
                    f"{report['mean_return']:.2f} ± {report['std_return']:.2f}"
                    + _score_text(report["normalised_score"])
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


def _given_references(random_return: float | None, expert_return: float | None) -> Any:
    """The reference returns given on the command line (``None``: neither flag); exits 2 when
    only one is given or they cannot scale a score."""
    import math

    from emote_core.stores.provenance import ReferenceReturns

    if random_return is None and expert_return is None:
        return None
    if random_return is None or expert_return is None:
        missing = "--expert-return" if random_return is not None else "--random-return"
        given = "--random-return" if random_return is not None else "--expert-return"
        abort(
            f"{given} scales the normalised score with {missing}; pass both, or neither",
            ExitCode.USAGE,
        )
    for flag, value in (("--random-return", random_return), ("--expert-return", expert_return)):
        if not math.isfinite(value):
            abort(f"{flag} must be a finite return; got {value}", ExitCode.USAGE)
    if random_return == expert_return:
        abort(
            f"--random-return and --expert-return are both {random_return}; pass the returns of "
            "a random and of an expert policy, which differ",
            ExitCode.USAGE,
        )
    return ReferenceReturns(
        random=random_return, expert=expert_return, source="given on the command line"
    )


def _score_text(score: float | None) -> str:
    return "" if score is None else f", normalised score {score:.1f}"


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
