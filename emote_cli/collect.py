"""``emote collect``: run a policy in a recipe's environment and append episodes to a store."""

from __future__ import annotations

import logging
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
from emote_cli._text import printable_lines
from emote_cli.progress import ProgressDisplay

__all__ = ["collect"]

log = logging.getLogger(__name__)


def collect(
    ctx: typer.Context,
    out: Annotated[
        str, typer.Option("--out", help="The emote memory store to create or append to.")
    ],
    recipe: Annotated[
        str | None,
        typer.Argument(
            help="A recipe file, or the name of one in recipes/ (optional with --policy RUN or an "
            ".onnx policy: the recipe it was trained with, its env rebuilt as the run recorded "
            "it).",
            show_default=False,
        ),
    ] = None,
    episodes: Annotated[
        int | None, typer.Option("--episodes", min=1, help="Collect this many episodes.")
    ] = None,
    steps: Annotated[
        int | None, typer.Option("--steps", min=1, help="Collect this many env steps.")
    ] = None,
    envs: Annotated[
        int | None,
        typer.Option(
            "--envs",
            min=1,
            help="Environments stepped together (default: the recipe's env.num_envs).",
        ),
    ] = None,
    policy: Annotated[
        str,
        typer.Option(
            "--policy", help="'random', a checkpoint file / run directory, or an .onnx policy."
        ),
    ] = "random",
    seed: Annotated[int | None, typer.Option("--seed", help="Override the recipe's seed.")] = None,
    env: EnvOption = None,
    shard: Annotated[
        str, typer.Option("--shard", help="Store shard to write (one per parallel collector).")
    ] = "main",
    device: DeviceOption = "auto",
    follow_policy: Annotated[
        bool,
        typer.Option(
            "--follow-policy",
            help="Act with the policy the run --policy RUN_DIR publishes (exports/latest.onnx), "
            "switching to each newer one between episodes.",
        ),
    ] = False,
    no_wait: Annotated[
        bool,
        typer.Option(
            "--no-wait", help="With --follow-policy: fail at once when no policy is published yet."
        ),
    ] = False,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            min=1,
            help="Collect with this many Ray workers, each writing its own shard (w0, w1, ...).",
        ),
    ] = None,
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray-address",
            help="The Ray cluster for --workers: auto, HOST:PORT or ray://HOST:PORT (default: "
            "a local Ray).",
        ),
    ] = None,
    max_restarts: Annotated[
        int,
        typer.Option("--max-restarts", min=0, help="With --workers: restarts allowed per worker."),
    ] = 3,
    json_output: JsonOption = False,
    quiet: QuietOption = False,
    debug: DebugOption = False,
) -> None:
    """Collect experience into an emote memory store (created, or appended to when it exists).

    Episodes are committed in batches as they finish, so a stopped run keeps what it committed.
    Only whole episodes are stored: the steps of episodes still running when collection stops
    are dropped (the summary says how many). The summary ends with the store's new totals.

    With --workers N, Ray workers collect together, each with its own shard and seed.

    The env's modules (\\[env] entry_point, module:EnvId, imports) are found on PYTHONPATH, in the
    recipe file's directory and in the current directory; a --policy RUN without RECIPE finds
    them where the run recorded them.

    A dead worker loses only what it had not committed and restarts on a new shard.
    """
    setup_logging(quiet=quiet, debug=debug)
    unit = "env step" if steps is not None else "episode"
    with (
        handle_errors(debug=debug, json_output=json_output),
        ProgressDisplay("collect", unit, quiet=quiet) as display,
    ):
        if (episodes is None) == (steps is None):
            abort("pass exactly one of --episodes N or --steps N", ExitCode.USAGE)
        if follow_policy and policy == "random":
            abort("--follow-policy needs --policy RUN_DIR, the run that publishes the policy",
                  ExitCode.USAGE)  # fmt: skip
        if no_wait and not follow_policy:
            abort("--no-wait goes with --follow-policy", ExitCode.USAGE)
        restarts_given = ctx.get_parameter_source("max_restarts").name != "DEFAULT"
        if workers is None and (ray_address is not None or restarts_given):
            option = "--ray-address" if ray_address is not None else "--max-restarts"
            abort(f"{option} goes with --workers N", ExitCode.USAGE)
        if workers is not None and shard != "main":
            abort("--shard names the shard of one collector; --workers N writes shards w0, w1, "
                  "...", ExitCode.USAGE)  # fmt: skip
        if recipe is None and policy == "random":
            abort("RECIPE is needed with --policy random (--policy RUN or an .onnx policy can "
                  "omit it: the recipe it was trained with is used)",
                  ExitCode.USAGE)  # fmt: skip
        display.status(f"loading {recipe or policy}")  # before the heavy imports: alive at once
        loaded = _load(recipe, policy, seed, env)
        _check_envs(envs, loaded.env.num_envs, steps=steps, workers=workers)
        options = {"episodes": episodes, "steps": steps, "policy": policy, "num_envs": envs,
                   "device": device, "follow_policy": follow_policy,
                   "wait_for_policy": not no_wait}  # fmt: skip
        if workers is not None:
            from emote_cli.collect_workers import collect_on_workers

            collect_on_workers(loaded, out, display, workers=workers, address=ray_address,
                               max_restarts=max_restarts, json_output=json_output,
                               **options)  # fmt: skip
            return
        from emote_core.assembly.collection import CollectionProgress, collect_to_store

        def show(progress: CollectionProgress) -> None:
            force = progress.phase != "running"
            if steps is not None:
                metrics = {"episodes": progress.episodes, "return": progress.recent_return}
                shown, total = progress.env_steps, steps
            else:
                metrics = {"env steps": progress.env_steps, "return": progress.recent_return}
                shown, total = progress.episodes, episodes
            metrics["policy step"] = progress.training_step
            display.update(shown, total, metrics=metrics, force=force)

        result = collect_to_store(loaded, out, shard=shard, on_progress=show, **options)
        display.close()
        summary = result.summary
        if json_output:
            emit_json(summary)
        else:
            stdout_console().print(describe(summary), markup=False, highlight=False, soft_wrap=True)
        if result.interrupted:
            abort(
                f"interrupted after {summary['env_steps']} env steps; the {summary['episodes']} "
                f"episodes committed to {out} are kept",
                ExitCode.INTERRUPTED,
            )


def _load(recipe: str | None, policy: str, seed: int | None, env: str | None) -> Any:
    """The collect's recipe: RECIPE, else the one ``--policy RUN`` or ``--policy FILE.onnx`` was
    trained with; ``--seed`` and ``--env`` applied."""
    from dataclasses import replace
    from pathlib import Path

    from emote_core.recipes import load_recipe
    from emote_core.recipes.loading import with_env

    if recipe is not None:
        loaded = load_recipe(recipe, [f"seed={seed}"] if seed is not None else [])
    elif policy.lower().endswith(".onnx"):
        from emote_core.assembly.export import recipe_from_policy
        from emote_core.onnx.agent import OnnxAgentProxy

        loaded = recipe_from_policy(OnnxAgentProxy(Path(policy)).metadata, source=policy)
    else:
        from emote_core.assembly.builders import trained_recipe

        loaded = trained_recipe(Path(policy))
    if recipe is None and seed is not None:
        loaded = replace(loaded, seed=seed)
    return with_env(loaded, env) if env is not None else loaded


def _check_envs(
    envs: int | None, recipe_envs: int, *, steps: int | None, workers: int | None
) -> None:
    """Refuses (exit 2) more environments than one process steps, or than a --steps budget (each
    worker's share of it) takes."""
    from emote_core.errors import ConfigurationError
    from emote_core.recipes.schema import check_num_envs

    share = steps // workers if steps is not None and workers else steps
    budget = "--steps" if share == steps else f"each worker's share of --steps {steps:,}"
    try:
        check_num_envs(envs or recipe_envs, name="--envs" if envs else "env.num_envs",
                       env_steps=share, budget=budget)  # fmt: skip
    except ConfigurationError as error:
        abort(str(error), ExitCode.USAGE)


def describe(summary: dict[str, Any]) -> str:
    """The human-readable summary: what was committed, what was dropped and why, the totals
    (store names escaped: they may come from a recipe or a store)."""
    stores = summary.get("stores")  # a multi-agent env's groups, one store each
    lines = [
        f"committed {summary['episodes']} episodes ({summary['transitions']} transitions) of "
        f"{summary['env_steps']} env steps to "
        + (
            ", ".join(f"{path} (group {g})" for g, path in stores.items())
            if stores
            else summary["store"]
        )
    ]
    if summary["dropped_steps"]:
        lines.append(
            f"dropped {summary['dropped_steps']} env steps: their episodes were still running "
            "when collection stopped, and a store keeps only whole episodes"
        )
    totals = summary["store_totals"]
    for store, held in (
        [(stores[g], totals[g]) for g in stores]
        if stores and totals
        else [(summary["store"], totals)]
    ):
        if held is not None:
            lines.append(
                f"{store} now holds {held['episodes']} episodes ({held['transitions']} transitions)"
            )
    return printable_lines("\n".join(lines))
