"""One collector: a recipe's vector environment played by a policy, its episodes committed to
one shard of a store.

:func:`collect_to_store` is what ``emote collect`` and each of its Ray workers run. Finished
episodes are committed in batches (:data:`FLUSH_BYTES`, :data:`FLUSH_SECONDS`); episodes still
running at the end are never committed. With ``follow_policy`` it switches to a newly published
policy at a vector step boundary, once an episode has finished since the last switch.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from emote_core.errors import StorageError
from emote_core.memory.proxy import REWARDS_COLUMN
from emote_core.recipes.schema import Recipe
from emote_core.stores.episode_batch import EpisodeBatch

__all__ = [
    "FLUSH_BYTES",
    "FLUSH_SECONDS",
    "CollectionProgress",
    "CollectionResult",
    "collect_to_store",
    "store_totals",
]

log = logging.getLogger(__name__)

FLUSH_BYTES = 16 << 20
"""Pending episodes are committed in batches of about this many bytes..."""
FLUSH_SECONDS = 10.0
"""...or at least this often, so that a stopped or killed collector loses little."""
_ROWS_PER_CALL = 512  # env steps per collector call with a step budget (64 vector steps of 8)
_CUT_SECONDS = 1.0  # finished episodes are handed out at least this often (shown, committed)
_RECENT_EPISODES = 20  # the shown return is the mean of this many recent episodes


@dataclass(frozen=True)
class CollectionProgress:
    """Where a collector stands.

    Attributes:
        env_steps: Environment steps taken.
        episodes: Episodes finished (committed or pending).
        committed_episodes: Episodes committed to the store.
        committed_transitions: Their transitions.
        recent_return: The mean return of the last few finished episodes.
        training_step: The training step of the followed policy in use (``None`` otherwise).
        phase: ``"start"``, ``"running"`` or ``"end"``.
    """

    env_steps: int
    episodes: int
    committed_episodes: int
    committed_transitions: int
    recent_return: float | None
    training_step: int | None
    phase: str


@dataclass
class CollectionResult:
    """What a collector did: the summary ``emote collect --json`` prints, and how it ended.

    Attributes:
        summary: ``store``, ``shard``, ``episodes``, ``transitions``, ``env_steps``,
            ``dropped_steps``, ``store_totals``, ``seconds``, ``env_steps_per_second``,
            ``policy``; with a followed policy also ``policy_training_steps``. However
            collection ended (a Ctrl-C at any step included), ``transitions + dropped_steps ==
            env_steps`` and ``dropped_steps >= 0``.
        interrupted: Stopped by Ctrl-C or the stop flag before the budget was spent.
    """

    summary: dict[str, Any]
    interrupted: bool


class _Batches:
    """Finished episodes waiting to be committed to the store in one append: the collector's
    batches, one per cut."""

    def __init__(self, appender: Any, out: str, flush_seconds: float) -> None:
        self.appender = appender
        self.out = out
        self.failed = False  # an append failed: nothing more is tried
        self.flush_seconds = flush_seconds
        self.pending: list[EpisodeBatch] = []
        self.bytes = 0
        self.flushed_at = time.perf_counter()
        self.episodes = 0
        self.transitions = 0
        self.recent_returns: deque[float] = deque(maxlen=_RECENT_EPISODES)
        self._unsummed: deque[EpisodeBatch] = deque(maxlen=_RECENT_EPISODES)  # not yet summed

    def add(self, batch: EpisodeBatch) -> None:
        self.pending.append(batch)
        self.bytes += batch.nbytes
        # Summed when shown, and only the last few: many short episodes end between reports.
        self._unsummed.append(batch)

    def recent_return(self) -> float | None:
        for batch in self._unsummed:
            self.recent_returns.extend(batch.returns(REWARDS_COLUMN).tolist())
        self._unsummed.clear()
        if not self.recent_returns:
            return None
        return sum(self.recent_returns) / len(self.recent_returns)

    def due(self) -> bool:
        waited = time.perf_counter() - self.flushed_at
        return bool(self.pending) and (self.bytes >= FLUSH_BYTES or waited > self.flush_seconds)

    def flush(self) -> None:
        if not self.pending or self.failed:
            return
        batch = EpisodeBatch.join(self.pending)
        self.pending, self.bytes = [], 0
        try:
            self.appender.append_batch(batch)
        except OSError as error:  # a full disk, a lost mount: say where, and what is kept
            self.failed = True
            raise _write_failed(self.out, error, self.episodes) from error
        self.episodes += len(batch)
        self.transitions += batch.transitions
        self.flushed_at = time.perf_counter()


def collect_to_store(
    recipe: Recipe,
    out: str,
    *,
    episodes: int | None = None,
    steps: int | None = None,
    policy: str = "random",
    shard: str = "main",
    num_envs: int | None = None,
    device: str = "cpu",
    follow_policy: bool = False,
    wait_for_policy: bool = True,
    on_progress: Callable[[CollectionProgress], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    command: Sequence[str] | None = None,
    count_store: bool = True,
    flush_seconds: float = FLUSH_SECONDS,
) -> CollectionResult:
    """Collects ``episodes`` episodes or ``steps`` env steps into shard ``shard`` of ``out``.

    The store and the policy are checked against the environment before it steps or anything
    is written. Ctrl-C (``KeyboardInterrupt``) or ``should_stop()`` ends collection early; what
    finished is committed either way.

    Args:
        recipe: The resolved recipe (its ``seed`` seeds the environments and the policy).
        out: The store, created or appended to.
        episodes: Collect this many episodes (exactly one of ``episodes`` and ``steps``).
        steps: Collect this many env steps.
        policy: ``"random"``, a checkpoint file or run directory, or an ``.onnx`` file; with
            ``follow_policy``, the run directory that publishes the policy.
        shard: The store shard this collector writes (one writer per shard).
        num_envs: Environments stepped together (the recipe's by default).
        device: ``auto``, ``cpu`` or ``cuda[:n]``: where a checkpoint's networks act.
        follow_policy: Act with the policy the run ``policy`` publishes, reloading newer ones.
        wait_for_policy: With ``follow_policy``, wait for a first policy (else refuse at once).
        on_progress: Called after every collector call and at the start and end.
        should_stop: Asked after every collector call; ``True`` ends collection.
        command: The command line for the store's provenance (``sys.argv`` by default).
        count_store: Read the store's totals over all shards for the summary at the end.
        flush_seconds: Commit finished episodes at least this often.

    Returns:
        The summary and whether collection was cut short.

    Raises:
        ConfigurationError: If neither or both budgets are given, or the store or policy does
            not fit the environment.
        StorageError: If the store cannot be written (a full disk): naming it and what it keeps.
        EmoteError: If the store cannot be opened for appending.
    """
    from emote_core.assembly.builders import make_env
    from emote_core.assembly.compatibility import check_collect_store, collect_agent
    from emote_core.assembly.provenance import session_provenance
    from emote_core.assembly.published_policy import PublishedPolicy
    from emote_core.env import BatchGymCollector
    from emote_core.env.multi_agent import (
        ParallelEnvCollector,
        ParallelEnvWrapper,
        group_store,
        parallel_env_record,
    )
    from emote_core.errors import ConfigurationError
    from emote_core.memory import DictObsMemoryTable
    from emote_core.stores.agents import record_agents
    from emote_core.stores.zarr_store.tables import StoreAppender
    from emote_core.utils.devices import resolve_device

    if (episodes is None) == (steps is None):
        raise ConfigurationError("collect needs exactly one budget: episodes or env steps")
    stop = should_stop or (lambda: False)
    chosen = resolve_device(device)  # checked even when the policy runs without torch
    env = make_env(recipe, num_envs=num_envs)
    follower: PublishedPolicy | None = None
    groups = list(getattr(env, "groups", ()))  # a multi-agent env's groups of agents
    several = len(groups) > 1  # one store per group, each group's own policy
    try:  # the stores and the policy must fit the env before it steps or anything is written
        if several:
            agent, acting = _group_agents(env, policy, follow_policy, recipe, chosen)
            stores = {g.name: (group_store(out, g.name), env.group_spaces(g.name)) for g in groups}
        else:
            stores = {"": (out, env.spaces)}
        for path, spaces in stores.values():
            check_collect_store(path, recipe, spaces)
        if follow_policy and not several:
            follower = PublishedPolicy(policy, recipe, spaces, seed=recipe.seed)
            agent = follower.first(wait=wait_for_policy, should_stop=stop)
            acting = follower.record
        elif not several:
            agent, acting = collect_agent(policy, recipe, env, chosen)
    except BaseException:
        env.close()
        raise
    if agent is None:  # stopped while waiting for a first policy: nothing to write
        env.close()
        summary = _summary(out, shard, policy, 0, 0, 0, 0.0, count_store=False)
        summary["policy_training_steps"] = []
        return CollectionResult(summary, interrupted=True)
    record = session_provenance(recipe, policy=acting, num_envs=env.num_envs, command=command)
    created = [  # the stores this call makes
        path for path, _ in stores.values() if "://" not in path and not os.path.lexists(path)
    ]
    appenders: list[Any] = []
    parts: dict[str, _Batches] = {}
    try:
        for group, (path, spaces) in stores.items():
            # The table only gives the store its columns: episodes go from the collector there.
            schema = DictObsMemoryTable(spaces=spaces, maxlen=1_000)
            appenders.append(
                StoreAppender(path, schema, spaces=spaces.to_json(), shard=shard, provenance=record)
            )
            parts[group] = _Batches(appenders[-1], path, flush_seconds)
    except OSError as error:
        for opened in appenders:
            opened.close()
        env.close()
        raise _write_failed(path, error, 0) from error
    except BaseException:
        for opened in appenders:
            opened.close()
        env.close()
        raise
    batches: Any = _GroupBatches(parts, env.group_of) if several else parts[""]
    collector: Any
    if isinstance(env, ParallelEnvWrapper):  # agents come and go: played agent by agent
        for opened in appenders:
            record_agents(opened.writer.group, parallel_env_record(env))
        collector = ParallelEnvCollector(
            env=env, agent=agent, on_batch=batches.add, seed=recipe.seed
        )
    else:
        collector = BatchGymCollector(env=env, agent=agent, on_batch=batches.add, seed=recipe.seed)

    def report(phase: str) -> None:
        if on_progress is not None:
            on_progress(
                CollectionProgress(
                    env_steps=collector.env_steps,
                    episodes=collector.completed_episodes,
                    committed_episodes=batches.episodes,
                    committed_transitions=batches.transitions,
                    recent_return=batches.recent_return(),
                    training_step=follower.training_step if follower is not None else None,
                    phase=phase,
                )
            )

    started = time.perf_counter()
    interrupted = refused = False
    switched_at = 0  # completed episodes at the last policy switch
    cut_at, cut_seconds = started, min(_CUT_SECONDS, flush_seconds)
    # Rows (transitions) a vector step takes at most: a multi-agent env's, one per agent.
    width = env.num_envs * len(getattr(env, "agent_names", None) or (None,))
    per_call = max(1, _ROWS_PER_CALL // width)  # vector steps per call with a step budget
    try:
        report("start")
        while (
            (episodes is not None and collector.completed_episodes < episodes)
            or (steps is not None and collector.env_steps < steps)
        ):  # fmt: skip
            if stop():
                interrupted = True
                break
            # Steps: whole chunks of vector steps; episodes: one at a time, to stop on time.
            vector_steps = 1
            if steps is not None:
                vector_steps = min(per_call, -(-(steps - collector.env_steps) // width))
            collector.collect(vector_steps)
            if follower is not None and collector.completed_episodes > switched_at:
                newer = follower.poll()
                if newer is not None:
                    collector.switch_agent(newer)
                    switched_at = collector.completed_episodes
            if time.perf_counter() - cut_at > cut_seconds:  # the collector's chunks are long
                collector.cut_finished()
                cut_at = time.perf_counter()
            if batches.due():
                batches.flush()
            report("running")
    except KeyboardInterrupt:
        interrupted = True
    except ConfigurationError:  # the env's bad input (a wrong step result, NaN observations)
        refused = True
        raise
    finally:
        try:
            collector.cut()  # the episodes finished since the last cut
        finally:
            try:
                batches.flush()  # what was handed out is committed, whatever the cut did
            finally:
                for opened in appenders:
                    opened.close()
                env.close()
                if refused and batches.episodes == 0:
                    for path in created:  # the stores this call made, while still empty
                        _remove_empty_store(path)
    report("end")  # with the returns of the episodes the last cut handed out
    seconds = time.perf_counter() - started
    # The collector counts a step as it returns, before it is recorded, and only recorded steps
    # are ever committed: a Ctrl-C at any point leaves dropped_steps >= 0.
    summary = _summary(out, shard, policy, batches.episodes, batches.transitions,
                       collector.env_steps, seconds, count_store and not several)  # fmt: skip
    if several:  # the groups' stores, and their totals in place of one store's
        summary["stores"] = {group: path for group, (path, _) in stores.items()}
        summary["store_totals"] = (
            {group: store_totals(path) for group, (path, _) in stores.items()}
            if count_store
            else None
        )
    if follower is not None:
        summary["policy_training_steps"] = list(follower.training_steps)
    return CollectionResult(summary, interrupted=interrupted)


class _GroupBatches:
    """The finished episodes of a multi-agent env with several agent groups, each batch to its
    group's store (the collector hands out one batch per group, see ``ParallelEnvCollector``)."""

    def __init__(self, parts: dict[str, _Batches], group_of: Callable[[int], str]) -> None:
        self.parts = parts
        self.group_of = group_of

    def add(self, batch: EpisodeBatch) -> None:
        self.parts[self.group_of(int(batch.identities[0]))].add(batch)

    @property
    def episodes(self) -> int:
        return sum(part.episodes for part in self.parts.values())

    @property
    def transitions(self) -> int:
        return sum(part.transitions for part in self.parts.values())

    def recent_return(self) -> float | None:
        returns = [r for part in self.parts.values() if (r := part.recent_return()) is not None]
        return sum(returns) / len(returns) if returns else None

    def due(self) -> bool:
        return any(part.due() for part in self.parts.values())

    def flush(self) -> None:
        for part in self.parts.values():
            part.flush()


def _group_agents(
    env: Any, policy: str, follow_policy: bool, recipe: Any, device: Any
) -> tuple[Any, Any]:
    """The agents of a multi-agent env's several groups (random, or each group's policy of a
    run), and their provenance record.

    Raises:
        ConfigurationError: For a followed policy (``--follow-policy``) or an ONNX file: each
            holds one group's policy.
    """
    from emote_core.assembly.compatibility import collect_agent
    from emote_core.env.multi_agent import describe_groups
    from emote_core.errors import ConfigurationError

    if follow_policy:
        raise ConfigurationError(
            f"this multi-agent env has {len(env.groups)} agent groups with different spaces "
            f"({describe_groups(env.groups)}); a published policy is one group's, so such an "
            "env is collected with `policy='random'` or a run's policies (a run directory or a "
            "checkpoint)"
        )
    return collect_agent(policy, recipe, env, device)


def _remove_empty_store(path: str) -> None:
    """Removes the store at ``path`` when no shard of it has committed an episode and it holds
    nothing but metadata and lease files: another collector's episodes or rows, and a user's
    file put there meanwhile, keep the whole store."""
    from emote_core.errors import EmoteError
    from emote_core.stores.zarr_store import MemoryStore
    from emote_core.stores.zarr_store.lease import LEASES

    try:
        if any(MemoryStore(path).committed().values()):
            return
    except (EmoteError, OSError):
        return  # not a store this can read: left as it is
    root = Path(path)
    for folder, _, names in os.walk(root):
        in_leases = Path(folder).relative_to(root).parts[:1] == (LEASES,)
        if any(name != "zarr.json" and not in_leases for name in names):
            return
    shutil.rmtree(root, ignore_errors=True)


def _summary(
    out: str,
    shard: str,
    policy: str,
    episodes: int,
    transitions: int,
    env_steps: int,
    seconds: float,
    count_store: bool,
) -> dict[str, Any]:
    return {
        "store": out,
        "shard": shard,
        "episodes": episodes,
        "transitions": transitions,
        "env_steps": env_steps,
        # Stores hold whole episodes: the steps of episodes still running at the end are not
        # committed.
        "dropped_steps": env_steps - transitions,
        "store_totals": store_totals(out) if count_store else None,
        "seconds": seconds,
        "env_steps_per_second": env_steps / seconds if seconds else None,
        "policy": policy,
    }


def _write_failed(out: str, error: OSError, committed: int) -> StorageError:
    """The error of a store that cannot be written: where, why, and what it keeps."""
    reason = f"{error.strerror} (errno {error.errno})" if error.strerror else str(error)
    totals = store_totals(out)
    kept = (
        f"it keeps the {totals['episodes']} episodes ({totals['transitions']} transitions) "
        f"committed before, {committed} of them from this collection"
        if totals is not None
        else f"the {committed} episodes this collection committed before are kept"
    )
    return StorageError(
        f"cannot write to store '{out}': {reason}; {kept} — free space there (or write another "
        "store) and collect again"
    )


def store_totals(out: str) -> dict[str, int] | None:
    """The store's episodes and transitions over all its shards (``None`` if unreadable)."""
    from emote_core.errors import EmoteError
    from emote_core.stores.zarr_store import MemoryStore

    try:
        store = MemoryStore(out)
        return {"episodes": store.episode_count, "transitions": store.transition_count}
    except (EmoteError, OSError) as error:  # what was committed stays committed
        log.warning("could not count what %s holds now: %s", out, error)
        return None
