"""``emote train``: train an agent from a recipe, live, from stored memory, or both."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from emote_cli._common import (
    AllowNonfiniteOption,
    DebugOption,
    DeviceOption,
    EnvOption,
    ExitCode,
    JsonOption,
    QuietOption,
    SkipDamagedOption,
    abort,
    emit_json,
    handle_errors,
    setup_logging,
    stdout_console,
)
from emote_cli._text import printable, printable_lines
from emote_cli.progress import ProgressDisplay, training_sink

__all__ = ["train"]


def train(
    ctx: typer.Context,
    recipe: Annotated[
        str | None,
        typer.Argument(
            help="A recipe file, or the name of one in recipes/ (with --resume: optional; the "
            "run's own recipe.toml is used).",
            show_default=False,
        ),
    ] = None,
    memory: Annotated[
        list[str] | None,
        typer.Option(
            "--memory", metavar="STORE", help="An emote memory store to start from (repeatable)."
        ),
    ] = None,
    live: Annotated[
        bool | None,
        typer.Option(
            "--live/--no-live",
            help="Collect experience while training (default: live; with --resume, as the run "
            "did last).",
            show_default=False,
        ),
    ] = None,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            help="Keep taking in the episodes that collectors commit to the --memory stores "
            "while training (every memory.follow_interval updates); waits for a store that does "
            "not exist yet, and with --no-live for enough episodes to start. Publishes the "
            "policy as RUN_DIR/exports/latest.onnx (training.publish_interval).",
        ),
    ] = False,
    publish_interval: Annotated[
        int | None,
        typer.Option(
            "--publish-interval",
            min=0,
            help="Updates between publications of RUN_DIR/exports/latest.onnx (0: none; sets "
            "training.publish_interval; default 1000 with --follow, else none).",
        ),
    ] = None,
    skip_damaged: SkipDamagedOption = False,
    allow_nonfinite: AllowNonfiniteOption = False,
    steps: Annotated[
        int | None, typer.Option("--steps", min=1, help="Updates in all (recipe's bp_steps).")
    ] = None,
    run_dir: Annotated[
        Path | None,
        typer.Option(
            "--run-dir",
            help="Run directory (runs/<recipe>-<time>; runs/<recipe>-<env>-<time> when --env or "
            "--set changes the env).",
        ),
    ] = None,
    device: DeviceOption = "auto",
    threads: Annotated[
        int | None,
        typer.Option(
            "--threads",
            min=1,
            help="CPU threads for torch (default: torch's choice). 1 keeps training fast when "
            "other processes busy the cores.",
        ),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Continue the run from its latest checkpoint, with its own recipe; --set may "
            "change only bp_steps, log/checkpoint/export intervals, \\[eval] and \\[logging].",
        ),
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Start an existing run over: removes only what emote wrote there, as its run.json "
            "records (other files stay); refused when an input of this command lies inside it.",
        ),
    ] = False,
    seed: Annotated[int | None, typer.Option("--seed", help="Override the recipe's seed.")] = None,
    track: Annotated[
        bool,
        typer.Option(
            "--track",
            help="Also log to Weights & Biases, into the run directory (offline unless the "
            "recipe's logging.wandb_mode or WANDB_MODE says online); needs the wandb extra.",
        ),
    ] = False,
    overrides: Annotated[
        list[str] | None,
        typer.Option("--set", metavar="KEY=VALUE", help="Override a recipe value (repeatable)."),
    ] = None,
    env: EnvOption = None,
    show: Annotated[
        bool,
        typer.Option(
            "--show",
            help="Print the resolved recipe (every key, after --set) as TOML, or JSON with --json, "
            "and exit without training.",
        ),
    ] = False,
    nproc_per_node: Annotated[
        int,
        typer.Option(
            "--nproc-per-node",
            min=1,
            metavar="N",
            help="Train with N data-parallel processes on this machine, each this command "
            "without --nproc-per-node (1: one process). Ctrl-C stops them all after the same "
            "update, saves a checkpoint and exits 130.",
        ),
    ] = 1,
    json_output: JsonOption = False,
    quiet: QuietOption = False,
    debug: DebugOption = False,
) -> None:
    """Train an agent; checkpoints, TensorBoard logs and the recipe go to the run directory.

    Shows progress on stderr and ends by saying what to run next; with --quiet it prints only
    the run directory on stdout.

    Ctrl-C stops after the current update, writes a checkpoint, says how to resume and exits 130.

    The env's modules (\\[env] entry_point, module:EnvId, imports) are found on PYTHONPATH, in the
    recipe file's directory and in the current directory; the run records their files, so eval,
    export, collect --policy and --resume find them again from any directory.

    A PettingZoo env whose agents have different spaces trains one policy per agent group (agents
    of identical spaces share one); each --memory store (emote collect's OUT.<group>.zarr) goes to
    the group it recorded, and --no-live needs a store for every group (no --follow).

    Under torchrun --nproc-per-node K -m emote_cli train ... the K processes train one run
    data-parallel: each samples its own batches (and collects its own experience when live),
    gradients are averaged, and rank 0 alone writes the run directory and prints.
    With --nproc-per-node K, emote train starts those K processes itself (no torchrun needed).
    """
    if _launching_ranks(ctx, nproc_per_node, show=show, json_output=json_output):
        _launch_ranks(ctx, nproc_per_node, debug=debug, json_output=json_output)
    secondary = _secondary_rank()
    if secondary:  # rank 0 reports for the run; the others print only their errors
        quiet, json_output = True, False
    setup_logging(quiet=quiet, debug=debug)
    with (
        handle_errors(debug=debug, json_output=json_output, flags={"path": "--run-dir"}),
        ProgressDisplay("train", "update", quiet=quiet) as display,
        contextlib.ExitStack() as process_group,
    ):
        display.status(f"loading {recipe or run_dir or 'the run'}")  # before torch: alive at once
        import torch

        from emote_core.assembly.builders import check_env, env_source
        from emote_core.assembly.compatibility import check_training_mode, check_training_stores
        from emote_core.assembly.training import build_training
        from emote_core.env.making import env_record
        from emote_core.errors import ConfigurationError
        from emote_core.recipes import load_recipe
        from emote_core.recipes.loading import with_env
        from emote_core.runs import RunDirectory, default_run_path, prepare_run, run_steps
        from emote_core.utils import distributed
        from emote_core.utils.devices import resolve_device

        settings = list(overrides or [])
        if seed is not None:
            settings.append(f"seed={seed}")
        if track:
            settings.append("logging.wandb=true")
        if publish_interval is not None:
            settings.append(f"training.publish_interval={publish_interval}")
        if show:
            _show_recipe(recipe, settings, resume=resume, json_output=json_output, env=env)
            return
        if env is not None and resume:
            abort("--env with --resume: a resumed run keeps the env it began with; leave out "
                  "--env, or start a new run", ExitCode.USAGE)  # fmt: skip
        if follow and not memory and not resume:
            abort("--follow follows the stores given with --memory STORE; pass one", ExitCode.USAGE)
        chosen = resolve_device(device)
        context = distributed.from_environment()
        if context is not None:
            chosen = distributed.rank_device(context, chosen)
            process_group.enter_context(distributed.joined(context, chosen))
            if not context.is_main:  # the path and update count rank 0 settled on
                run_dir, steps = _wait_for_rank_zero()
        with _telling_other_ranks(context is not None and context.is_main) as told:
            if resume:
                path, loaded, changes, memory, live = _resume_plan(
                    recipe, run_dir, settings, memory, live
                )
                if steps is None and "training.bp_steps" not in changes:
                    steps = run_steps(RunDirectory(path))  # the total the run was started for
                follow = _resume_follow(RunDirectory(path), follow)
            else:
                if recipe is None:
                    abort(
                        "RECIPE is needed to start a run (only --resume can omit it)",
                        ExitCode.USAGE,
                    )
                loaded = load_recipe(recipe, settings)
                if env is not None:
                    loaded = with_env(loaded, env)
                path = run_dir or default_run_path(
                    loaded.name, _changed_env(recipe, settings, loaded, env)
                )
                changes = {}
                live = True if live is None else live
            check_env(loaded)
            if not live and not memory and not resume:  # a resumed run has its own memory
                raise ConfigurationError(
                    "--no-live trains from stored memory only: pass --memory STORE"
                )
            check_training_mode(loaded, live=live)  # before the run directory is written
            if follow:  # a learner may start before its collectors: wait for their store
                from emote_core.stores.follow import wait_for_stores

                display.status(f"waiting for {', '.join(memory or [])}")
                wait_for_stores(memory or [])
            check_training_stores(loaded, memory or [])
            created = not path.exists() and not secondary
            made_parents = _missing_parents(path) if created else []
            if secondary:
                run = RunDirectory(path)  # rank 0 prepared it
            else:
                run = prepare_run(
                    path, recipe=loaded, command=sys.argv, resume=resume, force=force,
                    changes=changes, memory=memory, live=live, steps=steps, follow=follow,
                    inputs=_command_inputs(recipe, loaded) if force else None,
                    env=None if resume else env_record(env_source(loaded)),
                )  # fmt: skip
            told.update(run_dir=str(path), steps=steps)
        torch.manual_seed(loaded.seed)
        if threads is not None:
            torch.set_num_threads(threads)
        try:
            setup = build_training(
                loaded, run=run, device=chosen, live=live, stores=memory or [], resume=resume,
                bp_steps=steps, skip_damaged=skip_damaged, distributed=context,
                allow_nonfinite=allow_nonfinite,
                # The progress line replaces TerminalLogger's; TensorBoard gets every metric.
                terminal_log=False, progress=None if quiet else training_sink(display),
                follow=follow,
            )  # fmt: skip
        except Exception:
            if created:  # a run that never started leaves nothing behind
                _remove_run(run.path, made_parents)
            raise
        console = display.console  # lines printed above the progress display
        console.print(  # the recipe's name (and the run's path) come from a file: escaped
            printable(f"training {loaded.name} on {chosen} into {run.path}"),
            markup=False, highlight=False, soft_wrap=True,
        )  # fmt: skip
        interrupted = _stop_on_ctrl_c(setup.stop, under_torchrun=context is not None)
        started = time.perf_counter()
        try:
            state = setup.trainer.train()
        except ConfigurationError:
            # Bad input met only when the env stepped (a wrong step result, NaN observations):
            # a run this command made that never wrote a checkpoint leaves nothing behind.
            if created and not run.has_checkpoints():
                _remove_run(run.path, made_parents)
            raise
        finally:
            if setup.env is not None:
                setup.env.close()
        display.close()
        if secondary:
            if interrupted():
                abort(f"interrupted at update {int(state['bp_step'])}", ExitCode.INTERRUPTED)
            return
        checkpoint = run.latest_checkpoint()
        total_steps = int(state["bp_step"])
        summary = {
            "run_dir": str(run.path),
            "ranks": context.world_size if context is not None else 1,
            "steps": total_steps,
            "updates": total_steps - setup.terminator.start_step,  # by this invocation
            "checkpoint": str(checkpoint) if checkpoint else None,
            "seconds": time.perf_counter() - started,
            "device": str(chosen),
            "threads": torch.get_num_threads(),
            "interrupted": interrupted(),
            "evaluation": _evaluation_summary(setup.evaluator),
            **_follow_summary(setup),
        }
        quoted = shlex.quote(str(run.path))
        if json_output:
            emit_json(summary)
        if interrupted():
            abort(
                f"interrupted at update {summary['steps']}; resume with: emote train --resume "
                f"--run-dir {quoted}",
                ExitCode.INTERRUPTED,
            )
        if json_output:
            return
        out = stdout_console()
        if quiet:  # the result alone, for `run=$(emote train RECIPE -q)`
            out.print(printable(run.path), markup=False, highlight=False, soft_wrap=True)
            return
        updates = f"{summary['updates']} updates"
        if summary["updates"] != summary["steps"]:  # a resume: where the run stands now
            updates += f" ({summary['steps']} in all)"
        out.print(
            printable_lines(
                f"done: {updates} in {summary['seconds']:.1f} s; checkpoint "
                f"{summary['checkpoint']}\nnext: emote eval {quoted}"
            ),
            markup=False, highlight=False, soft_wrap=True,
        )  # fmt: skip


def _missing_parents(path: Path) -> list[Path]:
    """The folders above ``path`` that do not exist yet (what preparing the run creates),
    nearest first."""
    missing = []
    for parent in path.absolute().parents:
        if parent.exists():
            break
        missing.append(parent)
    return missing


def _remove_run(path: Path, made_parents: list[Path]) -> None:
    """Removes a run directory this command created, and the folders it created above it
    (``runs/``) while they are empty."""
    shutil.rmtree(path, ignore_errors=True)
    for parent in made_parents:
        try:
            parent.rmdir()  # only an empty folder: anything else in it stays
        except OSError:
            break


def _show_recipe(
    recipe: str | None,
    settings: list[str],
    *,
    resume: bool,
    json_output: bool,
    env: str | None = None,
) -> None:
    """``--show``: the recipe with the overrides applied, on stdout; nothing is written."""
    from emote_core.recipes.loading import load_recipe, recipe_to_dict, recipe_to_toml, with_env

    if recipe is None or resume:
        abort("--show prints a recipe before a run exists: pass RECIPE, without --resume",
              ExitCode.USAGE)  # fmt: skip
    loaded = load_recipe(recipe, settings)
    if env is not None:
        loaded = with_env(loaded, env)
    if json_output:
        emit_json(recipe_to_dict(loaded))
    else:
        typer.echo(recipe_to_toml(loaded), nl=False)


def _launching_ranks(
    ctx: typer.Context, nproc_per_node: int, *, show: bool, json_output: bool
) -> bool:
    """Whether this process starts ``--nproc-per-node`` ranks rather than training itself."""
    given = ctx.get_parameter_source("nproc_per_node")
    if given is not None and given.name == "COMMANDLINE" and "LOCAL_RANK" in os.environ:
        with handle_errors(json_output=json_output):
            abort(
                f"--nproc-per-node {nproc_per_node} under torchrun (LOCAL_RANK="
                f"{os.environ['LOCAL_RANK']}): torchrun already started the ranks; leave out "
                "--nproc-per-node, or run emote train without torchrun",
                ExitCode.USAGE,
            )
    return nproc_per_node > 1 and not show


def _launch_ranks(
    ctx: typer.Context, nproc_per_node: int, *, debug: bool, json_output: bool
) -> NoReturn:
    """Runs this command as ``nproc_per_node`` data-parallel ranks and exits with their status.

    The ranks print for themselves (rank 0 the ``--json`` document); this process adds only its
    own failure to start them, as one line (and, with ``--json``, that error's document).
    """
    with handle_errors(debug=debug, json_output=json_output):
        from emote_core.utils.launcher import launch_local_ranks

        status = launch_local_ranks("emote_cli", _rank_arguments(ctx), ranks=nproc_per_node,
                                    launcher_logs=debug)  # fmt: skip
    raise typer.Exit(status)


def _rank_arguments(ctx: typer.Context) -> list[str]:
    """``train`` and the parameters given on this command line, less ``--nproc-per-node``: the
    command each rank runs."""
    arguments = ["train"]
    for parameter in ctx.command.params:
        name = parameter.name or ""
        source = ctx.get_parameter_source(name)
        if name == "nproc_per_node" or source is None or source.name != "COMMANDLINE":
            continue
        value = ctx.params[name]
        if parameter.param_type_name == "argument":
            arguments.append(str(value))
        elif getattr(parameter, "is_flag", False):
            flags = parameter.opts if value else parameter.secondary_opts
            arguments += flags[:1]
        else:
            for item in value if parameter.multiple else [value]:
                arguments += [parameter.opts[0], str(item)]
    return arguments


def _secondary_rank() -> bool:
    """Whether this process is a rank other than 0 of a ``torchrun`` launch (read before torch
    is imported, to keep those ranks quiet from the start)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1 and int(os.environ.get("RANK", "0")) > 0
    except ValueError:
        return False  # distributed.from_environment names the bad value


@contextlib.contextmanager
def _telling_other_ranks(tell: bool) -> Iterator[dict[str, Any]]:
    """Rank 0 checks its inputs and prepares the run directory inside this block, filling the
    dict it yields (``run_dir``, ``steps``); then the other ranks learn where the run is and how
    many updates it has, or that rank 0 failed, so they stop instead of waiting for it."""
    from emote_core.utils import distributed

    told: dict[str, Any] = {}
    if not tell:
        yield told
        return
    try:
        yield told
    except BaseException as error:
        # The others stop on hearing this, and the launcher then sends this rank SIGTERM: rank 0
        # is ending anyway, and must first say why (its error line and JSON document, its exit
        # status), so the launcher's SIGTERM is ignored from here on.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        distributed.broadcast_object({"error": str(error) or type(error).__name__})
        raise
    distributed.broadcast_object(told)


def _wait_for_rank_zero() -> tuple[Path, int | None]:
    """The run directory and update count rank 0 prepared (ranks other than 0).

    Raises:
        DistributedError: If rank 0 could not prepare the run.
    """
    from emote_core.utils import distributed

    outcome: Any = distributed.broadcast_object(None)
    if "error" in outcome:
        raise distributed.DistributedError(f"rank 0 could not start the run: {outcome['error']}")
    return Path(outcome["run_dir"]), outcome["steps"]


def _resume_plan(
    recipe: str | None,
    run_dir: Path | None,
    settings: list[str],
    memory: list[str] | None,
    live: bool | None,
) -> tuple[Path, Any, dict[str, list[Any]], list[str], bool]:
    """What a resumed run continues with: its directory, its own recipe with the allowed
    ``--set`` changes, those changes, its stores and whether it collects live (``live`` ``None``:
    as the run did last). Refuses before anything is written."""
    from emote_core.errors import ConfigurationError
    from emote_core.recipes import load_recipe
    from emote_core.recipes.loading import apply_override, recipe_from_dict, recipe_to_dict
    from emote_core.runs import (
        check_resumable_run,
        check_resume_inputs,
        latest_run_path,
        resume_changes,
        run_recipe,
    )

    named = load_recipe(recipe).name if recipe is not None else None
    path = run_dir
    if path is None:
        if named is None:
            abort("--resume needs the run: pass --run-dir RUN (or RECIPE for its newest)", 2)
        path = latest_run_path(named)
        if path is None:
            raise ConfigurationError(f"--resume: no runs/{named}-* run to continue; pass --run-dir")
    run = check_resumable_run(path)
    current = run_recipe(run)
    data = recipe_to_dict(current)
    if named is not None:
        data["name"] = named
    for setting in settings:
        apply_override(data, setting)
    requested = recipe_from_dict(data, source=f"{run.recipe_file} with --set")
    requested.env_search_paths = current.env_search_paths  # where the run's env record says
    changes = resume_changes(current, requested, run_path=run.path)
    stores, live = check_resume_inputs(run, memory=memory, live=live)
    return run.path, requested, changes, stores, live


def _command_inputs(recipe: str | None, loaded: Any) -> list[str]:
    """What the command reads besides its ``--memory`` stores: the recipe file and the stores
    its add-ons train on, which ``--force`` must never delete."""
    from emote_core.assembly.builders import data_sources
    from emote_core.recipes.loading import find_recipe

    inputs = [str(find_recipe(recipe))] if recipe is not None else []
    return inputs + [str(source.store) for source in data_sources(loaded)]


def _resume_follow(run: Any, follow: bool) -> bool:
    """A run that began following its stores follows on when resumed; one that did not cannot
    start (its checkpoints do not pin what a follower read)."""
    from emote_core.errors import ConfigurationError
    from emote_core.runs import run_follows

    if run_follows(run):
        return True
    if follow:
        raise ConfigurationError(
            f"--resume --follow: run '{run.path}' did not follow its stores, so its checkpoints "
            "do not pin what a follower read; start a new run with --follow"
        )
    return False


def _changed_env(
    recipe: str, settings: list[str], loaded: Any, env: str | None = None
) -> str | None:
    """The env of ``loaded`` (its id or entry point) when ``--env`` or ``--set`` made it another
    than the recipe file's (the run's default name then shows it), else ``None``."""
    from emote_core.recipes import load_recipe

    if env is None and not any(setting.strip().startswith("env") for setting in settings):
        return None
    return loaded.env.name if loaded.env.name != load_recipe(recipe).env.name else None


def _evaluation_summary(evaluator: Any) -> dict[str, Any] | None:
    """The final evaluation's figures, as training's last log line gave them; ``None`` when
    none ran (an interrupted or failed run)."""
    report = evaluator.report if evaluator is not None else None
    if report is None:
        return None
    keys = ("bp_step", "episodes", "mean_return", "std_return", "lowest_return",
            "highest_return", "deterministic", "threshold", "passed")  # fmt: skip
    return {key: report.get(key) for key in keys}


def _follow_summary(setup: Any) -> dict[str, Any]:
    """What a following run took in and published, for the summary."""
    summary: dict[str, Any] = {}
    follower = setup.follower
    if follower is not None:
        summary["follow"] = {
            "stores": follower.urls,
            "read": follower.read,
            "ingested_episodes": follower.ingested_episodes,
            "ingested_transitions": follower.ingested_transitions,
            "skipped_episodes": follower.skipped_episodes,
            "table_episodes": setup.table.episode_count,
            "table_transitions": setup.table.size(),
        }
    exporter = setup.exporter
    if exporter is not None and exporter.published_step is not None:
        from emote_core.onnx.exporter import LATEST_POLICY

        summary["published"] = {
            "path": str(setup.run.exports / LATEST_POLICY),
            "training_step": exporter.published_step,
        }
    return summary


def _stop_on_ctrl_c(stop: Any, *, under_torchrun: bool = False) -> Callable[[], bool]:
    """The first Ctrl-C asks training to stop after this update (a final checkpoint is written);
    a second one interrupts at once. Under torchrun, whose agent passes the terminal's Ctrl-C on
    to the ranks a second time, a repeat within a second counts as the same Ctrl-C."""
    seen: list[float] = []
    same_press = 1.0 if under_torchrun else 0.0

    def handler(signum: int, frame: object) -> None:
        now = time.monotonic()
        if seen and now - seen[0] > same_press:
            raise KeyboardInterrupt
        if not seen:
            seen.append(now)
        stop.set()

    signal.signal(signal.SIGINT, handler)
    return lambda: bool(seen)
