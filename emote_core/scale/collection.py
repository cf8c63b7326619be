"""The driver of ``emote collect --workers N``: N Ray actors, one shard each, one store.

Each worker gets a share of the budget, its own seed and a new shard named after this command's
random session (``<session>-w0``). A worker that dies loses only what it had not committed and
is restarted, up to ``max_restarts`` times, on a new shard (``<session>-w0-r1``) with a new seed
and the rest of its budget. With ``follow_policy`` the driver alone reads the learner's run
directory and relays each newly published policy (:mod:`emote_core.scale.policy_relay`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import secrets
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from emote_core.assembly.collection import FLUSH_SECONDS, store_totals
from emote_core.recipes.schema import Recipe
from emote_core.scale.policy_relay import PolicyRelay
from emote_core.scale.ray_setup import RayOutput, connect, require_ray
from emote_core.scale.workers import (
    CollectorWorker,
    WorkerRun,
    WorkerTask,
    shard_name,
    split_budget,
    worker_seed,
)

__all__ = ["DEFAULT_MAX_RESTARTS", "RayCollection", "ScaleProgress"]

log = logging.getLogger(__name__)

DEFAULT_MAX_RESTARTS = 3
"""Restarts allowed per worker."""
RESTART_DELAY_S = 1.0
"""Seconds between a worker's death and its restart."""
_POLL_S = 0.25  # how often the driver looks at its workers
_STOP_GRACE_S = 60.0  # how long stopped workers get to commit before they are killed


@dataclass(frozen=True)
class ScaleProgress:
    """The workers together, for a progress display."""

    env_steps: int
    episodes: int
    committed_episodes: int
    recent_return: float | None
    running: int
    deaths: int
    restarts: int
    training_step: int | None = None
    """The newest training step of a followed policy that a running worker acts with."""


class RayCollection:
    """Collects into one store with ``workers`` Ray actors.

    Args:
        recipe: The resolved recipe (``--seed`` applied: the workers' seeds derive from it).
        out: The store (a local path is made absolute: workers may run elsewhere).
        workers: How many actors.
        episodes: The episode budget of all workers together (or ``steps``).
        steps: The env-step budget of all workers together.
        policy: As for :func:`~emote_core.assembly.collection.collect_to_store`.
        num_envs: Environments each worker steps together.
        device: Where a checkpoint's networks act.
        follow_policy: Follow the policy the run ``policy`` publishes (read here, relayed to
            the workers).
        wait_for_policy: With ``follow_policy``, wait for a first policy when none is published
            yet (else refuse at once).
        address: The Ray cluster (``None``: a local Ray with one CPU per worker).
        max_restarts: Restarts allowed per worker.
        restart_delay: Seconds between a death and the restart.
        on_progress: Called with the totals about four times a second.
        should_stop: Asked as often; ``True`` stops every worker (each commits what finished).
        command: The command line for the store's provenance (``sys.argv`` by default).
        flush_seconds: Each worker commits finished episodes at least this often.
    """

    def __init__(
        self,
        recipe: Recipe,
        out: str,
        *,
        workers: int,
        episodes: int | None = None,
        steps: int | None = None,
        policy: str = "random",
        num_envs: int | None = None,
        device: str = "cpu",
        follow_policy: bool = False,
        wait_for_policy: bool = True,
        address: str | None = None,
        max_restarts: int = DEFAULT_MAX_RESTARTS,
        restart_delay: float = RESTART_DELAY_S,
        on_progress: Callable[[ScaleProgress], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
        command: Sequence[str] | None = None,
        flush_seconds: float = FLUSH_SECONDS,
    ) -> None:
        from emote_core.errors import ConfigurationError

        if workers < 1:
            raise ConfigurationError(f"collecting needs at least one worker; got {workers}")
        if (episodes is None) == (steps is None):
            raise ConfigurationError("collect needs exactly one budget: episodes or env steps")
        # Workers may start in another directory: the driver's is where env modules are found.
        paths = (*recipe.env_search_paths, os.getcwd())
        self.recipe = dataclasses.replace(recipe, env_search_paths=paths)
        self.out = _absolute(out)
        self.workers = workers
        self.episodes, self.steps = episodes, steps
        self.shares = split_budget(episodes if episodes is not None else steps or 0, workers)
        self.policy = policy if policy == "random" else _absolute(policy)
        self.options = {
            "num_envs": num_envs,
            "device": device,
            "follow_policy": follow_policy,
            "flush_seconds": flush_seconds,
        }
        self.relay = PolicyRelay(self.policy, recipe, _spaces(recipe)) if follow_policy else None
        self.wait_for_policy = wait_for_policy
        self.address = address
        self.max_restarts = max_restarts
        self.restart_delay = restart_delay
        self.on_progress = on_progress
        self.should_stop = should_stop or (lambda: False)
        self.command = list(sys.argv if command is None else command)
        self.session = secrets.token_hex(3)
        """Prefixes this command's shard names: a store that earlier or concurrent commands
        write too never gives a worker a shard that holds others' episodes."""
        self.runs: list[WorkerRun] = []
        """Every run started, restarts included, in the order they started."""
        self.deaths: list[dict[str, Any]] = []
        self.lost: list[int] = []
        """Workers lost for good."""
        self.stopping = False
        self._pending: list[tuple[float, WorkerTask]] = []  # restarts waiting for their delay
        self._shards: set[str] = set()
        self._remote: Any = None  # the worker class as a Ray actor class

    def start_run(self, task: WorkerTask) -> WorkerRun:
        """Starts one actor on ``task`` (its shard must be new to this collection)."""
        from emote_core.errors import ConfigurationError

        if task.shard in self._shards:
            raise ConfigurationError(f"shard '{task.shard}' was already given to a worker")
        self._shards.add(task.shard)
        if self._remote is None:
            ray = require_ray()
            # run() on one thread; progress(), stop() and offer_policy() answered meanwhile
            self._remote = ray.remote(num_cpus=1, max_restarts=0, max_concurrency=4)(
                CollectorWorker
            )
        newest = self.relay.newest() if self.relay is not None else {}  # acted with at once
        actor = self._remote.remote(self.recipe, self.out, task, policy=self.policy,
                                    command=self.command, **self.options, **newest)  # fmt: skip
        run = WorkerRun(task, actor=actor, result=actor.run.remote())
        self.runs.append(run)
        return run

    def run(self) -> dict[str, Any]:
        """Collects; returns the summary (totals, ``workers``, ``deaths``, ``restarts``,
        ``lost_workers``, ``interrupted``). A Ctrl-C stops every worker, which commit what
        finished, and ends with the summary (``interrupted``: true)."""
        ray = require_ray()
        first = None
        if self.relay is not None:  # no worker starts before there is a policy to act with
            first = self.relay.first(wait=self.wait_for_policy, should_stop=self.should_stop)
            if first is None:
                self.stopping = True
                return self._summary(0.0)
        # Ray prints what it hears of dead workers on stdout, which belongs to the command (a
        # --json document): while Ray runs here, its messages are logged.
        output = RayOutput()
        with contextlib.redirect_stdout(output), contextlib.closing(output):
            cpus = max(self.workers, os.cpu_count() or 1)
            started_here = connect(self.address, num_cpus=cpus)
            begun = time.perf_counter()
            try:
                if self.relay is not None and first is not None:
                    self.relay.share(ray, first, [])
                for index, share in enumerate(self.shares):
                    if share > 0:
                        self.start_run(self._task(index, 0, share))
                self._supervise(ray)
                return self._summary(time.perf_counter() - begun)
            finally:
                for run in self.runs:
                    ray.kill(run.actor, no_restart=True)  # every run has ended: frees its CPU
                if started_here:
                    ray.shutdown()

    def _task(self, worker: int, restart: int, budget: int) -> WorkerTask:
        return WorkerTask(
            worker=worker,
            restart=restart,
            shard=shard_name(worker, restart, self.session),
            seed=worker_seed(self.recipe.seed, worker, restart),
            episodes=budget if self.episodes is not None else None,
            steps=budget if self.steps is not None else None,
        )

    def _supervise(self, ray: Any) -> None:
        stop_deadline: float | None = None
        while True:
            try:
                live = [run for run in self.runs if run.status == "running"]
                if not live and not self._pending:
                    return
                if live:
                    asked = {run.actor.progress.remote(): run for run in live}
                    ready, _ = ray.wait([run.result for run in live], num_returns=len(live),
                                        timeout=_POLL_S)  # fmt: skip
                    for run in live:
                        if run.result in ready:
                            self._finish(ray, run)
                    self._gather_progress(ray, asked)
                else:  # only restarts waiting for their delay
                    time.sleep(_POLL_S)
                self._restart_due(ray)
                self._relay_newer(ray)
                if self.on_progress is not None:
                    self.on_progress(self.totals())
                if not self.stopping and self.should_stop():
                    self.stop()
                    stop_deadline = time.monotonic() + _STOP_GRACE_S
                if stop_deadline is not None and time.monotonic() > stop_deadline:
                    for run in live:
                        ray.kill(run.actor, no_restart=True)
            except KeyboardInterrupt:
                if self.stopping:  # a second Ctrl-C: stop waiting for the workers
                    for run in self.runs:
                        ray.kill(run.actor, no_restart=True)
                    raise
                self.stop()
                stop_deadline = time.monotonic() + _STOP_GRACE_S

    def stop(self) -> None:
        """Asks every running worker to commit what finished and end; cancels restarts."""
        self.stopping = True
        self._pending.clear()
        for run in self.runs:
            if run.status == "running":
                run.actor.stop.remote()

    def _finish(self, ray: Any, run: WorkerRun) -> None:
        try:
            run.summary = ray.get(run.result)
            run.status = "stopped" if run.summary.get("interrupted") else "finished"
            return
        except ray.exceptions.RayActorError as error:  # the actor, its process or node died
            run.status = "died"
            run.error = _first_line(error)
        except ray.exceptions.RayError as error:  # the run raised: a restart would too
            run.status = "failed"
            run.error = _first_line(getattr(error, "cause", None) or error)
        committed = self._committed(run.task.shard)
        # Its last report may predate its last commits: it took at least the steps it committed.
        reported = run.progress.env_steps if run.progress is not None else 0
        run.summary = {"episodes": committed[0], "transitions": committed[1],
                       "env_steps": max(reported, committed[1])}  # fmt: skip
        self._after_loss(run)

    def _after_loss(self, run: WorkerRun) -> None:
        task = run.task
        death: dict[str, Any] = {
            "worker": task.worker,
            "shard": task.shard,
            "status": run.status,
            "after_seconds": time.monotonic() - run.started,
            "reason": run.error,
            "restarted_as": None,
        }
        self.deaths.append(death)
        left = self.shares[task.worker] - self._done(task.worker)
        if self.stopping or left <= 0:
            return
        if run.status == "died" and task.restart < self.max_restarts:
            retry = self._task(task.worker, task.restart + 1, left)
            death["restarted_as"] = retry.shard
            self._pending.append((time.monotonic() + self.restart_delay, retry))
            log.warning("worker %d (shard %s) died: %s; restarting it on shard %s",
                        task.worker, task.shard, run.error, retry.shard)  # fmt: skip
            return
        self.lost.append(task.worker)
        log.warning("worker %d (shard %s) is lost for good: %s", task.worker, task.shard, run.error)

    def _done(self, worker: int) -> int:
        """What the runs of ``worker`` have committed, in the budget's unit."""
        key = "episodes" if self.episodes is not None else "transitions"
        return sum(
            int((run.summary or {}).get(key, 0)) for run in self.runs if run.task.worker == worker
        )

    def _committed(self, shard: str) -> tuple[int, int]:
        """Episodes and transitions a shard has committed, read from the store."""
        from emote_core.errors import EmoteError
        from emote_core.stores.zarr_store import MemoryStore

        try:
            for view in MemoryStore(self.out).shards:
                if view.name == shard:
                    return view.episodes, int(view.commit["transitions"])
        except (EmoteError, OSError) as error:
            log.warning("could not read what shard %s committed: %s", shard, error)
        return 0, 0

    def _gather_progress(self, ray: Any, asked: dict[Any, WorkerRun]) -> None:
        ready, _ = ray.wait(list(asked), num_returns=len(asked), timeout=_POLL_S)
        for ref in ready:
            try:
                found = ray.get(ref)
            except ray.exceptions.RayError:
                continue  # its death shows in its run's result
            if found is not None:
                asked[ref].progress = found

    def _restart_due(self, ray: Any) -> None:
        now = time.monotonic()
        due = [task for at, task in self._pending if at <= now]
        self._pending = [(at, task) for at, task in self._pending if at > now]
        if due:  # a restart acts with what is published now
            self._relay_newer(ray, force=True)
        for task in due:
            self.start_run(task)

    def _relay_newer(self, ray: Any, *, force: bool = False) -> None:
        """Relays a newly published policy to the running workers (and those started later)."""
        if self.relay is None or self.stopping:
            return
        newer = self.relay.poll(force=force)
        if newer is not None:
            self.relay.share(
                ray, newer, [run.actor for run in self.runs if run.status == "running"]
            )

    def totals(self) -> ScaleProgress:
        """The workers' progress together (dead runs as they last reported)."""
        progress = [run.progress for run in self.runs if run.progress is not None]
        returns = [p.recent_return for p in progress if p.recent_return is not None]
        entries = [run.entry() for run in self.runs]
        steps = [p.training_step for p in progress if p.training_step is not None]
        ended = [run.summary for run in self.runs if run.summary is not None]
        return ScaleProgress(
            env_steps=sum(entry["env_steps"] for entry in entries),
            # a run that ended counts what it committed; a running one what finished so far
            episodes=sum(int(found.get("episodes", 0)) for found in ended)
            + sum(
                run.progress.episodes for run in self.runs if run.summary is None and run.progress
            ),
            committed_episodes=sum(entry["episodes"] for entry in entries),
            recent_return=sum(returns) / len(returns) if returns else None,
            running=sum(run.status == "running" for run in self.runs),
            deaths=len(self.deaths),
            restarts=sum(run.task.restart > 0 for run in self.runs),
            training_step=max(steps, default=None),
        )

    def _summary(self, seconds: float) -> dict[str, Any]:
        entries = [run.entry() for run in self.runs]
        episodes = sum(entry["episodes"] for entry in entries)
        transitions = sum(entry["transitions"] for entry in entries)
        env_steps = sum(entry["env_steps"] for entry in entries)
        spans = [(f["started_at"], f["ended_at"]) for f in (r.summary or {} for r in self.runs)
                 if "started_at" in f]  # fmt: skip
        collecting = max(e for _, e in spans) - min(s for s, _ in spans) if spans else None
        summary: dict[str, Any] = {
            "store": self.out,
            "episodes": episodes,
            "transitions": transitions,
            "env_steps": env_steps,
            "dropped_steps": env_steps - transitions,
            "store_totals": store_totals(self.out),
            "seconds": seconds,
            "env_steps_per_second": env_steps / seconds if seconds else None,
            # from the first worker's start to the last one's end (Ray's start-up left out)
            "collecting_seconds": collecting,
            "collecting_env_steps_per_second": env_steps / collecting if collecting else None,
            "policy": self.policy,
            "session": self.session,
            "worker_count": self.workers,
            "max_restarts": self.max_restarts,
            "workers": entries,
            "deaths": self.deaths,
            "restarts": sum(run.task.restart > 0 for run in self.runs),
            "lost_workers": sorted(set(self.lost)),
            "interrupted": self.stopping,
        }
        if self.options["follow_policy"]:
            steps = {s for e in entries for s in e.get("policy_training_steps", [])}
            summary["policy_training_steps"] = sorted(steps)
        return summary


def _absolute(path: str) -> str:
    return path if "://" in path else os.path.abspath(path)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _spaces(recipe: Recipe) -> Any:
    """The spaces of the recipe's environment (made once here, then closed)."""
    from emote_core.assembly.builders import make_env

    env = make_env(recipe, num_envs=1)
    try:
        return env.spaces
    finally:
        env.close()
