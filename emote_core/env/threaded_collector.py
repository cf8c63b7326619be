"""ThreadedGymCollector: collection in a background thread while training runs.

The collector thread never acts with weights the trainer is halfway through updating: it acts
with a private copy of the policy. Every ``sync_every`` batches the training thread copies the
trained weights (in ``end_batch``) into a spare module that the collector is not using, then
hands it over under a lock; the collector thread swaps it in between two inference steps. Three
copies of the policy circulate (the one acting, one waiting to be picked up, one spare), so a
copy is never written while it is read.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable

from torch import nn

from emote_core.env.collectors import GymCollector
from emote_core.env.dict_gym import DictGymWrapper
from emote_core.env.multi_agent import ParallelEnvWrapper
from emote_core.errors import ConfigurationError
from emote_core.memory.callbacks import PendingExportProcessor, ReadinessSource
from emote_core.memory.proxy import MemoryProxy
from emote_core.proxies.base import AgentProxy
from emote_core.trainer import TrainingShutdownException

log = logging.getLogger(__name__)

_POLL_SECONDS = 0.05


class ThreadedGymCollector(GymCollector):
    """A :class:`GymCollector` whose collection runs in its own thread.

    The thread starts in ``begin_training``, which returns after the warm-up, and stops in
    ``end_training`` or at the trainer's shutdown signal. Episodes are logged, and an error in
    the thread is raised, on the training thread at its next hook. The memory is filled while
    the trainer samples it (emote's tables lock ``add_sequence`` against sampling).

    Args:
        env: The wrapped vector environment (used only by the collector thread once started).
        agent: Acts in the collector thread, with a copy of its ``policy_attribute`` module
            synced every ``sync_every`` batches (restored in ``end_training``).
        memory: Receives every step.
        warmup_steps: Environment steps collected before ``begin_training`` returns.
        inference_steps_per_batch: With ``free_running=False``, vector steps the thread may
            collect per training batch that collects.
        bp_steps_per_inference: With ``free_running=False``, updates per grant of
            ``inference_steps_per_batch`` vector steps (see ``GymCollector``).
        seed: Seeds the environments at their first reset.
        warmup_agent: Acts during warm-up instead of ``agent``.
        ready_check: Warm-up goes on past ``warmup_steps`` until ``ready_check.is_ready()``
            (pass the trainer's ``MemoryLoader``).
        default_window_length: How many recent episodes the episode logs average over.
        exporter: Served while ``begin_training`` waits for the warm-up (see
            :class:`~emote_core.env.collectors.GymCollector`).
        sync_every: Batches between policy syncs.
        free_running: Collect as fast as the thread runs; ``False`` keeps GymCollector's ratio of
            ``inference_steps_per_batch`` vector steps per batch, collected concurrently.
        policy_attribute: The agent attribute holding the policy to copy.
        join_timeout: Seconds ``end_training`` waits for the thread to finish its step.
        name: The callback's name.

    Raises:
        ConfigurationError: If ``sync_every`` is not a positive integer.
    """

    def __init__(
        self,
        *,
        env: DictGymWrapper | ParallelEnvWrapper,
        agent: AgentProxy,
        memory: MemoryProxy,
        warmup_steps: int = 0,
        inference_steps_per_batch: int = 1,
        seed: int | None = None,
        warmup_agent: AgentProxy | None = None,
        ready_check: ReadinessSource | None = None,
        default_window_length: int = 250,
        exporter: PendingExportProcessor | None = None,
        sync_every: int = 1,
        free_running: bool = True,
        policy_attribute: str = "policy",
        join_timeout: float = 30.0,
        name: str = "threaded_gym_collector",
        bp_steps_per_inference: int = 1,
    ) -> None:
        super().__init__(
            env=env,
            agent=agent,
            memory=memory,
            warmup_steps=warmup_steps,
            inference_steps_per_batch=inference_steps_per_batch,
            seed=seed,
            warmup_agent=warmup_agent,
            ready_check=ready_check,
            default_window_length=default_window_length,
            exporter=exporter,
            name=name,
            bp_steps_per_inference=bp_steps_per_inference,
        )
        if isinstance(sync_every, bool) or not isinstance(sync_every, int) or sync_every < 1:
            raise ConfigurationError(
                f"ThreadedGymCollector's sync_every must be a positive integer; got {sync_every!r}"
            )
        self.sync_every = sync_every
        self.free_running = bool(free_running)
        self.policy_attribute = policy_attribute
        self.join_timeout = float(join_timeout)
        self._lock = threading.Lock()
        self._credits = threading.Condition(self._lock)
        self._credit_count = 0
        self._stop = threading.Event()
        self._warmed_up = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._finished: list[tuple[float, int]] = []
        self._training_policy: nn.Module | None = None
        self._acting: nn.Module | None = None
        self._fresh: nn.Module | None = None
        self._spares: list[nn.Module] = []
        self.syncs = 0
        """Policy copies handed to the collector thread so far."""

    # Training-thread hooks.

    def begin_training(self, shutdown_signal: threading.Event | None = None) -> None:
        """Starts the collector thread and waits for its warm-up.

        Raises:
            TrainingShutdownException: If a shutdown is requested during warm-up.
        """
        if self._thread is not None:
            raise ConfigurationError(f"'{self.name}' is already collecting; it runs one training")
        self._prepare_policies()
        self._stop.clear()
        self._warmed_up.clear()
        self._error = None
        warmup_target = max(self.warmup_steps, self.env_steps)
        self._thread = threading.Thread(
            target=self._run,
            args=(warmup_target, shutdown_signal),
            name=f"emote-collector-{self.name}",
            daemon=True,
        )
        self._thread.start()
        while not self._warmed_up.wait(_POLL_SECONDS):
            if shutdown_signal is not None and shutdown_signal.is_set():
                raise TrainingShutdownException(f"shutdown requested during '{self.name}' warm-up")
            self._serve_exports()
        self._raise_thread_error()
        self._log_finished()

    def begin_batch(self) -> None:
        """Raises the collector thread's error, if it had one."""
        self._raise_thread_error()

    def end_batch(self, bp_step: int) -> None:
        """Syncs the policy when due, grants collection credits and logs finished episodes."""
        self._raise_thread_error()
        if self._training_policy is not None and bp_step % self.sync_every == 0:
            self._publish_policy(self._training_policy)
        if not self.free_running and self.collects_at(bp_step):
            with self._credits:
                self._credit_count += self.inference_steps_per_batch
                self._credits.notify()
        self._log_finished()

    def end_training(self) -> None:
        """Stops the collector thread and points the agent back at the training policy."""
        self._stop.set()
        with self._credits:
            self._credits.notify_all()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(self.join_timeout)
            if thread.is_alive():
                log.warning(
                    "collector thread of '%s' did not stop within %.0f s; leaving it (daemon)",
                    self.name,
                    self.join_timeout,
                )
        if self._training_policy is not None:
            setattr(self.agent, self.policy_attribute, self._training_policy)
        self._log_finished()
        self._raise_thread_error()

    # Policy copies.

    def _prepare_policies(self) -> None:
        policy = getattr(self.agent, self.policy_attribute, None)
        if not isinstance(policy, nn.Module):
            self._training_policy = None
            return
        self._training_policy = policy
        self._acting = copy.deepcopy(policy)
        self._spares = [copy.deepcopy(policy), copy.deepcopy(policy)]
        self._fresh = None
        setattr(self.agent, self.policy_attribute, self._acting)

    def _publish_policy(self, training_policy: nn.Module) -> None:
        """Training thread: copy the trained weights into a spare, then offer it.

        Three copies circulate and only this thread takes spares, so one is always free here.
        """
        with self._lock:
            spare = self._spares.pop()
        spare.load_state_dict(training_policy.state_dict())
        with self._lock:
            if self._fresh is not None:  # never picked up: it becomes a spare again
                self._spares.append(self._fresh)
            self._fresh = spare
            self.syncs += 1

    def _pick_up_policy(self) -> None:
        """Collector thread: swap in the newest copy, if one is waiting."""
        with self._lock:
            fresh = self._fresh
            if fresh is None:
                return
            if self._acting is not None:
                self._spares.append(self._acting)
            self._acting, self._fresh = fresh, None
        setattr(self.agent, self.policy_attribute, fresh)

    # The collector thread.

    def _run(self, warmup_target: int, shutdown_signal: threading.Event | None) -> None:
        stopping: Callable[[], bool] = (
            (lambda: self._stop.is_set() or shutdown_signal.is_set())
            if shutdown_signal is not None
            else self._stop.is_set
        )
        try:
            while (self.env_steps < warmup_target or not self._ready()) and not stopping():
                self._take_steps(
                    1, self.warmup_agent if self.warmup_agent is not None else self.agent
                )
                self._collect_finished()
            self._warmed_up.set()
            while not stopping():
                if not self.free_running and not self._take_credit():
                    continue
                if self._training_policy is not None:
                    self._pick_up_policy()
                self._take_steps(1, self.agent)
                self._collect_finished()
        except BaseException as error:  # handed to the training thread
            error.add_note(f"raised in the collector thread of '{self.name}'")
            self._error = error
            log.error("collector thread of '%s' failed: %r", self.name, error)
        finally:
            self._warmed_up.set()

    def _take_credit(self) -> bool:
        with self._credits:
            if self._credit_count == 0:
                self._credits.wait(_POLL_SECONDS)
            if self._credit_count == 0:
                return False
            self._credit_count -= 1
            return True

    def _collect_finished(self) -> None:
        finished = self._drain_env_episodes()
        if finished:
            with self._lock:
                self._finished.extend(finished)

    def _finished_episodes(self) -> list[tuple[float, int]]:
        with self._lock:
            finished, self._finished = self._finished, []
        return finished

    def _raise_thread_error(self) -> None:
        error = self._error
        if error is not None:
            self._error = None
            raise error

    def __repr__(self) -> str:
        return (
            f"ThreadedGymCollector(name={self.name!r}, num_envs={self.env.num_envs}, "
            f"env_steps={self.env_steps}, running={self._thread is not None})"
        )


__all__ = ["ThreadedGymCollector"]
