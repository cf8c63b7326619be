"""``emote collect``: run a policy in a recipe's environment and append episodes to a store."""

from __future__ import annotations

import time
from pathlib import Path
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
    stderr_console,
)

__all__ = ["collect"]

_FLUSH_BYTES = 16 << 20  # commit pending episodes in batches of about this many bytes
_FLUSH_SECONDS = 10.0  # or at least this often, so a stopped run loses little
_REPORT_SECONDS = 2.0
_STEPS_PER_CALL = 64  # vector steps per collector call with --steps


class _Batches:
    """Completed episodes waiting to be committed to the store in one append."""

    def __init__(self, appender: Any) -> None:
        self.appender = appender
        self.pending: list[tuple[int, dict[str, Any], Any]] = []
        self.bytes = 0
        self.flushed_at = time.perf_counter()
        self.episodes = 0
        self.transitions = 0

    def add(self, identity: int, sequence: dict[str, Any], end_state: Any) -> None:
        self.pending.append((identity, sequence, end_state))
        self.bytes += sum(value.nbytes for value in sequence.values())

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
    """
    setup_logging(quiet=quiet, debug=debug)
    with handle_errors(debug=debug):
        if (episodes is None) == (steps is None):
            abort("pass exactly one of --episodes N or --steps N", ExitCode.USAGE)
        from emote_core.assembly.builders import load_trained_agent, make_env
        from emote_core.env import BatchGymCollector
        from emote_core.memory import DictObsMemoryTable
        from emote_core.onnx.agent import OnnxAgentProxy, is_onnx_file
        from emote_core.proxies import RandomAgentProxy
        from emote_core.recipes import load_recipe
        from emote_core.stores.zarr_store.tables import StoreAppender
        from emote_core.utils.devices import resolve_device

        loaded = load_recipe(recipe, [f"seed={seed}"] if seed is not None else [])
        chosen = resolve_device(device)  # checked even when the policy runs without torch
        env = make_env(loaded, num_envs=envs)
        spaces = env.spaces
        if policy == "random":
            agent: Any = RandomAgentProxy(action_space=env.single_action_space, seed=loaded.seed)
        elif is_onnx_file(policy):  # onnxruntime alone, sampling actions
            agent = OnnxAgentProxy(policy, deterministic=False, seed=loaded.seed, spaces=spaces)
        else:
            _, _, agent, _, _ = load_trained_agent(Path(policy), device=chosen, deterministic=False)
        # The table only gives the store its columns: episodes go from the collector to the store.
        schema = DictObsMemoryTable(spaces=spaces, maxlen=1_000)
        appender = StoreAppender(out, schema, spaces=spaces.to_json(), shard=shard)
        batches = _Batches(appender)
        collector = BatchGymCollector(
            env=env, agent=agent, on_episode=batches.add, seed=loaded.seed
        )
        console = stderr_console(quiet)

        started = last_report = time.perf_counter()
        env_steps = 0
        interrupted = False
        try:
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
                if time.perf_counter() - last_report > _REPORT_SECONDS:
                    last_report = time.perf_counter()
                    console.print(f"{env_steps} env steps, {collector.completed_episodes} episodes")
        except KeyboardInterrupt:
            interrupted = True
        finally:
            collector.cut()  # the episodes finished since the last cut
            try:
                batches.flush()
            finally:
                appender.close()
                env.close()
        seconds = time.perf_counter() - started
        summary = {
            "store": out,
            "shard": shard,
            "episodes": batches.episodes,
            "transitions": batches.transitions,
            "env_steps": env_steps,
            "seconds": seconds,
            "env_steps_per_second": env_steps / seconds if seconds else None,
            "policy": policy,
        }
        if json_output:
            emit_json(summary)
        else:
            console.print(
                f"committed {summary['episodes']} episodes ({summary['transitions']} "
                f"transitions) to {out}"
            )
        if interrupted:
            raise typer.Exit(int(ExitCode.INTERRUPTED))
