"""``emote collect``: run a policy in a recipe's environment and append episodes to a store."""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Annotated, Any

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
from emote_cli.progress import ProgressDisplay

__all__ = ["collect"]

log = logging.getLogger(__name__)

_FLUSH_BYTES = 16 << 20  # commit pending episodes in batches of about this many bytes
_FLUSH_SECONDS = 10.0  # or at least this often, so a stopped run loses little
_STEPS_PER_CALL = 64  # vector steps per collector call with --steps
_RECENT_EPISODES = 20  # the shown return is the mean of this many recent episodes


class _Batches:
    """Completed episodes waiting to be committed to the store in one append."""

    def __init__(self, appender: Any) -> None:
        self.appender = appender
        self.pending: list[tuple[int, dict[str, Any], Any]] = []
        self.bytes = 0
        self.flushed_at = time.perf_counter()
        self.episodes = 0
        self.transitions = 0
        self.recent_returns: deque[float] = deque(maxlen=_RECENT_EPISODES)

    def add(self, identity: int, sequence: dict[str, Any], end_state: Any) -> None:
        self.pending.append((identity, sequence, end_state))
        self.bytes += sum(value.nbytes for value in sequence.values())
        self.recent_returns.append(float(sequence["rewards"].sum()))

    def recent_return(self) -> float | None:
        if not self.recent_returns:
            return None
        return sum(self.recent_returns) / len(self.recent_returns)

    def due(self) -> bool:
        waited = time.perf_counter() - self.flushed_at
        return bool(self.pending) and (self.bytes >= _FLUSH_BYTES or waited > _FLUSH_SECONDS)

    def flush(self) -> None:
        batch, self.pending, self.bytes = self.pending, [], 0
        self.appender.append(batch)
        self.episodes += len(batch)
        self.transitions += sum(len(episode[1]["rewards"]) for episode in batch)
        self.flushed_at = time.perf_counter()


def collect(
    recipe: Annotated[str, typer.Argument(help="A recipe file, or the name of one in recipes/.")],
    out: Annotated[
        str, typer.Option("--out", help="The emote memory store to create or append to.")
    ],
    episodes: Annotated[
        int | None, typer.Option("--episodes", min=1, help="Collect this many episodes.")
    ] = None,
    steps: Annotated[
        int | None, typer.Option("--steps", min=1, help="Collect this many env steps.")
    ] = None,
    envs: Annotated[
        int | None, typer.Option("--envs", min=1, help="Environments stepped together.")
    ] = None,
    policy: Annotated[
        str,
        typer.Option(
            "--policy", help="'random', a checkpoint file / run directory, or an .onnx policy."
        ),
    ] = "random",
    seed: Annotated[int | None, typer.Option("--seed", help="Override the recipe's seed.")] = None,
    shard: Annotated[
        str, typer.Option("--shard", help="Store shard to write (one per parallel collector).")
    ] = "main",
    device: Annotated[str, typer.Option("--device", help="auto, cpu or cuda[:n].")] = "cpu",
    json_output: JsonOption = False,
    quiet: QuietOption = False,
    debug: DebugOption = False,
) -> None:
    """Collect experience into an emote memory store (created, or appended to when it exists).

    Episodes are committed in batches as they finish, so a stopped run keeps what it committed.
    Only whole episodes are stored: the steps of episodes still running when collection stops
    are dropped (the summary says how many). The summary ends with the store's new totals.
    """
    setup_logging(quiet=quiet, debug=debug)
    unit = "env step" if steps is not None else "episode"
    with (
        handle_errors(debug=debug, json_output=json_output),
        ProgressDisplay("collect", unit, quiet=quiet) as display,
    ):
        if (episodes is None) == (steps is None):
            abort("pass exactly one of --episodes N or --steps N", ExitCode.USAGE)
        display.status(f"loading {recipe}")  # before the heavy imports: alive at once
        from emote_core.assembly.builders import make_env
        from emote_core.assembly.compatibility import check_collect_store, collect_agent
        from emote_core.assembly.provenance import session_provenance
        from emote_core.env import BatchGymCollector
        from emote_core.memory import DictObsMemoryTable
        from emote_core.recipes import load_recipe
        from emote_core.stores.zarr_store.tables import StoreAppender
        from emote_core.utils.devices import resolve_device

        loaded = load_recipe(recipe, [f"seed={seed}"] if seed is not None else [])
        chosen = resolve_device(device)  # checked even when the policy runs without torch
        env = make_env(loaded, num_envs=envs)
        spaces = env.spaces
        try:  # the store and the policy must fit the env before it steps or anything is written
            check_collect_store(out, loaded, spaces)
            agent, acting = collect_agent(policy, loaded, env, chosen)
        except BaseException:
            env.close()
            raise
        record = session_provenance(loaded, policy=acting, num_envs=env.num_envs)
        # The table only gives the store its columns: episodes go from the collector to the store.
        schema = DictObsMemoryTable(spaces=spaces, maxlen=1_000)
        appender = StoreAppender(
            out, schema, spaces=spaces.to_json(), shard=shard, provenance=record
        )
        batches = _Batches(appender)

        def finished(identity: int, sequence: dict[str, Any], end_state: Any) -> None:
            # Pending episodes held as the store keeps them: frame stacks as single frames.
            batches.add(identity, dict(schema.stored_sequence(sequence)), end_state)

        collector = BatchGymCollector(env=env, agent=agent, on_episode=finished, seed=loaded.seed)

        def show(env_steps: int, *, force: bool = False) -> None:
            completed, recent = collector.completed_episodes, batches.recent_return()
            if steps is not None:
                metrics = {"episodes": completed, "return": recent}
                display.update(env_steps, steps, metrics=metrics, force=force)
            else:
                metrics = {"env steps": env_steps, "return": recent}
                display.update(completed, episodes, metrics=metrics, force=force)

        started = time.perf_counter()
        env_steps = 0
        interrupted = False
        try:
            show(env_steps, force=True)
            while (
                (episodes is not None and collector.completed_episodes < episodes)
                or (steps is not None and env_steps < steps)
            ):  # fmt: skip
                # --steps: whole chunks of vector steps; --episodes: one at a time, to stop on time.
                vector_steps = 1
                if steps is not None:
                    vector_steps = min(_STEPS_PER_CALL, -(-(steps - env_steps) // env.num_envs))
                env_steps += collector.collect(vector_steps)
                if batches.due():
                    batches.flush()
                show(env_steps)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            collector.cut()  # the episodes finished since the last cut
            try:
                batches.flush()
            finally:
                appender.close()
                env.close()
        show(env_steps, force=True)  # with the returns of the episodes the last cut handed out
        display.close()
        seconds = time.perf_counter() - started
        summary = {
            "store": out,
            "shard": shard,
            "episodes": batches.episodes,
            "transitions": batches.transitions,
            "env_steps": env_steps,
            # Stores hold whole episodes: the steps of episodes still running at the end are
            # not committed.
            "dropped_steps": env_steps - batches.transitions,
            "store_totals": _store_totals(out),
            "seconds": seconds,
            "env_steps_per_second": env_steps / seconds if seconds else None,
            "policy": policy,
        }
        if json_output:
            emit_json(summary)
        else:
            stdout_console().print(
                _describe(summary), markup=False, highlight=False, soft_wrap=True
            )
        if interrupted:
            abort(
                f"interrupted after {env_steps} env steps; the {batches.episodes} episodes "
                f"committed to {out} are kept",
                ExitCode.INTERRUPTED,
            )


def _store_totals(out: str) -> dict[str, int] | None:
    """The store's episodes and transitions over all its shards, after this collect's commits."""
    from emote_core.errors import EmoteError
    from emote_core.stores.zarr_store import MemoryStore

    try:
        store = MemoryStore(out)
        return {"episodes": store.episode_count, "transitions": store.transition_count}
    except (EmoteError, OSError) as error:  # what was committed stays committed
        log.warning("could not count what %s holds now: %s", out, error)
        return None


def _describe(summary: dict[str, Any]) -> str:
    """The human-readable summary: what was committed, what was dropped and why, the totals."""
    lines = [
        f"committed {summary['episodes']} episodes ({summary['transitions']} transitions) of "
        f"{summary['env_steps']} env steps to {summary['store']}"
    ]
    if summary["dropped_steps"]:
        lines.append(
            f"dropped {summary['dropped_steps']} env steps: their episodes were still running "
            "when collection stopped, and a store keeps only whole episodes"
        )
    totals = summary["store_totals"]
    if totals is not None:
        lines.append(
            f"{summary['store']} now holds {totals['episodes']} episodes "
            f"({totals['transitions']} transitions)"
        )
    return "\n".join(lines)
