"""One Ray collector worker, and how workers get their shards, seeds and budgets.

A worker is a Ray actor running :func:`~emote_core.assembly.collection.collect_to_store` on its
own vector environment and its own shard. It answers :meth:`CollectorWorker.progress` and
:meth:`CollectorWorker.stop` while it collects (a threaded actor), so the driver can show
progress and stop it, after which it commits what finished and returns its summary.

A worker following a published policy never reads the learner's run directory, which may be on
another machine: the driver relays each policy through Ray (:mod:`emote_core.scale.policy_relay`)
and the worker's collector follows the worker's own mirror of that run.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from emote_core.assembly.collection import FLUSH_SECONDS, CollectionProgress, collect_to_store
from emote_core.recipes.schema import Recipe
from emote_core.scale.policy_relay import PolicyMirror

__all__ = [
    "CollectorWorker",
    "WorkerRun",
    "WorkerTask",
    "shard_name",
    "split_budget",
    "worker_seed",
]

_SEED_BITS = 31  # environment seeds stay small non-negative integers


def shard_name(worker: int, restart: int, session: str = "") -> str:
    """``<session>-w3`` for worker 3 of one ``emote collect``; ``<session>-w3-r1`` for its first
    restart (a restart never reuses a shard, and no two commands share one)."""
    name = f"w{worker}" if restart == 0 else f"w{worker}-r{restart}"
    return f"{session}-{name}" if session else name


def worker_seed(seed: int, worker: int, restart: int) -> int:
    """The recipe seed of ``worker``'s ``restart``-th run: distinct per worker and restart,
    reproducible from ``seed`` (numpy's ``SeedSequence`` spawn keys)."""
    sequence = np.random.SeedSequence(seed, spawn_key=(worker, restart))
    return int(sequence.generate_state(1, dtype=np.uint64)[0] >> np.uint64(64 - _SEED_BITS))


def split_budget(total: int, workers: int) -> list[int]:
    """``total`` split into ``workers`` shares that differ by at most one, largest first."""
    share, rest = divmod(total, workers)
    return [share + (1 if index < rest else 0) for index in range(workers)]


@dataclasses.dataclass(frozen=True)
class WorkerTask:
    """What one worker run collects.

    Attributes:
        worker: The worker's index.
        restart: How many times this worker was restarted before this run.
        shard: The shard it writes.
        seed: The recipe seed it runs with.
        episodes: Its episode budget (or ``None``).
        steps: Its env-step budget (or ``None``).
    """

    worker: int
    restart: int
    shard: str
    seed: int
    episodes: int | None
    steps: int | None


@dataclasses.dataclass
class WorkerRun:
    """One run of one worker: its task, actor and outcome."""

    task: WorkerTask
    actor: Any = None
    result: Any = None  # the ObjectRef of the run's summary
    progress: CollectionProgress | None = None
    started: float = dataclasses.field(default_factory=time.monotonic)
    status: str = "running"  # running, finished, stopped, died, failed
    summary: dict[str, Any] | None = None
    error: str | None = None

    def entry(self) -> dict[str, Any]:
        """This run in the ``workers`` list of the summary."""
        progress = self.progress
        found = self.summary or {}
        env_steps = found.get("env_steps", progress.env_steps if progress else 0)
        seconds = found.get("seconds", time.monotonic() - self.started)
        entry = {
            "worker": self.task.worker,
            "restart": self.task.restart,
            "shard": self.task.shard,
            "seed": self.task.seed,
            "status": self.status,
            "episodes": found.get("episodes", 0),
            "transitions": found.get("transitions", 0),
            "env_steps": env_steps,
            "seconds": seconds,
            "env_steps_per_second": env_steps / seconds if seconds else None,
        }
        if "policy_training_steps" in found:
            entry["policy_training_steps"] = found["policy_training_steps"]
        if self.error is not None:
            entry["error"] = self.error
        return entry


class CollectorWorker:
    """The body of a collector actor (wrapped with ``ray.remote`` by the driver).

    Args:
        recipe: The resolved recipe; its seed is replaced by the task's.
        out: The store.
        task: The shard, seed and budget.
        policy: As for :func:`~emote_core.assembly.collection.collect_to_store`; with
            ``follow_policy``, the learner's run directory as the driver names it (never read
            here).
        num_envs: Environments stepped together.
        device: Where a checkpoint's networks act.
        follow_policy: Follow the policy the driver relays (:meth:`offer_policy`).
        command: The driver's command line, for the store's provenance.
        flush_seconds: Commit finished episodes at least this often.
        policy_data: With ``follow_policy``, the newest published policy's bytes, acted with
            from the first step.
        policy_version: Their version (offers of this version or older are ignored).
    """

    def __init__(
        self,
        recipe: Recipe,
        out: str,
        task: WorkerTask,
        *,
        policy: str,
        num_envs: int | None,
        device: str,
        follow_policy: bool,
        command: Sequence[str],
        flush_seconds: float = FLUSH_SECONDS,
        policy_data: bytes | None = None,
        policy_version: int = 1,
    ) -> None:
        self.recipe = dataclasses.replace(recipe, seed=task.seed)
        self.out = out
        self.task = task
        self.options: dict[str, Any] = {
            "policy": policy,
            "num_envs": num_envs,
            "device": device,
            "follow_policy": follow_policy,
            "command": list(command),
            "flush_seconds": flush_seconds,
        }
        self._stop = threading.Event()
        self._progress: CollectionProgress | None = None
        self.mirror: PolicyMirror | None = None
        if follow_policy:  # the collector follows the mirror, which the driver keeps current
            self.mirror = PolicyMirror()
            self.options["policy"] = str(self.mirror.run_dir)
            if policy_data is not None:
                self.mirror.publish(policy_data, policy_version)

    def pid(self) -> int:
        """The worker's process id."""
        return os.getpid()

    def run(self) -> dict[str, Any]:
        """Collects the task's budget (or until stopped) and returns the summary, with
        ``interrupted`` and the wall-clock ``started_at`` and ``ended_at`` added (its
        ``policy``: the worker's mirror of a followed run)."""
        try:
            result = collect_to_store(
                self.recipe,
                self.out,
                episodes=self.task.episodes,
                steps=self.task.steps,
                shard=self.task.shard,
                wait_for_policy=True,
                on_progress=self._report,
                should_stop=self._stop.is_set,
                count_store=False,
                **self.options,
            )
        finally:
            if self.mirror is not None:
                self.mirror.close()
        ended = time.time()  # the stepping began `seconds` before (set-up left out)
        return {
            **result.summary,
            "interrupted": result.interrupted,
            "started_at": ended - float(result.summary["seconds"]),
            "ended_at": ended,
        }

    def _report(self, progress: CollectionProgress) -> None:
        self._progress = progress

    def progress(self) -> CollectionProgress | None:
        """Where the run stands (``None`` before it started)."""
        return self._progress

    def offer_policy(self, data: bytes, version: int) -> bool:
        """Publishes a newer policy in the worker's mirror; the collector switches to it after
        an episode has ended, or refuses it (logged) if it does not fit the environment.

        Args:
            data: The ONNX file's bytes.
            version: Their version, increasing with each policy the driver relays.

        Returns:
            Whether it was taken (not when this version or a newer one is here, or the run
            has ended).
        """
        return self.mirror is not None and self.mirror.publish(data, version)

    def stop(self) -> None:
        """Asks the run to end after the current collector call, committing what finished."""
        self._stop.set()
