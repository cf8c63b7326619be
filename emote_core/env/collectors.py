"""Collectors: play a DictGymWrapper with an agent proxy and feed a memory proxy.

:class:`GymCollector` collects on the training thread (``warmup_steps`` first, then
``inference_steps_per_batch`` vector steps per batch); ``ThreadedGymCollector`` in a thread of
its own. Both record through :class:`~emote_core.env.batch_collector.BatchGymCollector` and hand
each finished episode to the memory whole, falling back to every agent's step (``memory.add``)
for multi-agent envs, step-only memories and agents that answer more than ``"actions"``. They log
``episode/reward``, ``episode/length``, ``training/scaled_reward``, ``training/env_steps`` and
``training/completed_episodes``.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Any, ClassVar

import numpy as np

from emote_core.callback import Callback, Order
from emote_core.callbacks.logging_mixin import LoggingMixin
from emote_core.env.batch_collector import BatchGymCollector, acts_only
from emote_core.env.dict_gym import DictGymWrapper
from emote_core.env.multi_agent import ParallelEnvWrapper
from emote_core.errors import ConfigurationError
from emote_core.memory.callbacks import PendingExportProcessor, ReadinessSource
from emote_core.memory.proxy import MemoryProxy
from emote_core.proxies.base import AgentProxy
from emote_core.trainer import TrainingShutdownException
from emote_core.typing import AgentId, DictObservation, EpisodeState
from emote_core.utils.checks import non_negative_int
from emote_core.utils.random_state import capture, generators_of, restore

log = logging.getLogger(__name__)

EPISODE_REWARD_KEY = "episode/reward"
EPISODE_LENGTH_KEY = "episode/length"
SCALED_REWARD_KEY = "training/scaled_reward"
ENV_STEPS_KEY = "training/env_steps"
COMPLETED_EPISODES_KEY = "training/completed_episodes"

_FINAL = (EpisodeState.TERMINAL, EpisodeState.INTERRUPTED)


class GymCollector(LoggingMixin, Callback):
    """Plays the environment with the agent and records every step in the memory.

    Args:
        env: The wrapped vector environment, or a multi-agent ``ParallelEnvWrapper`` (whose
            agents come and go: its steps always go to ``memory.add``).
        agent: Answers observations with actions (a policy proxy, or a random one).
        memory: Receives every finished episode whole (``memory.add_episode``), or every step
            (``memory.add(observations, responses)``) where it must (see the module's
            docstring and :attr:`records_episodes`).
        warmup_steps: Environment steps, summed over the vector's environments, collected in
            ``begin_training`` (skipped as far as a restored state already collected them).
        inference_steps_per_batch: Vector steps collected in ``begin_batch`` before each batch
            that collects.
        bp_steps_per_inference: Updates per collection: it collects before every N-th batch
            (updates 1, 1 + N, 1 + 2N, ...).
        seed: Seeds the environments at their first reset; ``None`` leaves them unseeded.
        warmup_agent: Acts during warm-up instead of ``agent`` (a ``RandomAgentProxy``, say).
        ready_check: Warm-up goes on past ``warmup_steps`` until ``ready_check.is_ready()``
            (pass the trainer's ``MemoryLoader``: episodes enter the table only once they end).
        default_window_length: How many recent episodes the episode logs average over.
        exporter: Served with ``process_pending_exports()`` while warm-up holds the training
            thread, so other threads' export requests are answered before the first batch.
        name: The callback's name (keys its checkpoint entry).

    Raises:
        ConfigurationError: If a step count is negative or not an integer.
    """

    order: ClassVar[int] = Order.DATA

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
        name: str = "gym_collector",
        bp_steps_per_inference: int = 1,
    ) -> None:
        owner = type(self).__name__
        super().__init__(name=name, default_window_length=default_window_length)
        self.env = env
        self.agent = agent
        self.memory = memory
        self.warmup_steps = non_negative_int(owner, "warmup_steps", warmup_steps)
        self.inference_steps_per_batch = non_negative_int(
            owner, "inference_steps_per_batch", inference_steps_per_batch
        )
        self.bp_steps_per_inference = non_negative_int(
            owner, "bp_steps_per_inference", bp_steps_per_inference
        )
        if self.bp_steps_per_inference == 0:
            raise ConfigurationError(
                f"{owner}'s bp_steps_per_inference must be a positive integer; got 0"
            )
        self.seed = seed
        self.warmup_agent = warmup_agent
        self.exporter = exporter
        self.ready_check = ready_check
        self.env_steps = 0
        """Environment steps collected (each vector step counts ``num_envs``)."""
        self.completed_episodes = 0
        """Episodes finished."""
        self._observations: dict[AgentId, DictObservation] | None = None
        self._resets = 0
        self._recorder: BatchGymCollector | None = None
        if (
            isinstance(env, DictGymWrapper)  # a multi-agent env's agents come and go
            and _takes_episodes(memory)
            and all(acts_only(a) for a in (agent, warmup_agent) if a is not None)
        ):
            self._recorder = BatchGymCollector(
                env=env, agent=agent, on_episode=self._add_episode, track_returns=True
            )

    @property
    def records_episodes(self) -> bool:
        """Whether whole episodes go to the memory (see the module's docstring), rather than
        every agent's step to ``memory.add``."""
        return self._recorder is not None

    # Collecting.

    def collect(self, steps: int, *, agent: AgentProxy | None = None) -> int:
        """Collects ``steps`` vector steps and logs the episodes that finished.

        Args:
            steps: Vector steps (each is one step of every environment).
            agent: Acts instead of :attr:`agent` for these steps.

        Raises:
            ConfigurationError: If ``agent`` answers more than ``"actions"`` while whole episodes
                go to the memory (:attr:`records_episodes`).

        Returns:
            The environment steps taken (``steps * num_envs``).
        """
        acting = agent if agent is not None else self.agent
        self._take_steps(steps, acting)
        self._log_finished()
        return steps * self.env.num_envs

    def collect_episodes(self, count: int, *, agent: AgentProxy | None = None) -> int:
        """Collects until at least ``count`` more episodes have finished.

        Episodes of several environments can end in the same step, so a few more may finish.

        Returns:
            The environment steps taken.
        """
        target = self.completed_episodes + count
        taken = 0
        while self.completed_episodes < target:
            taken += self.collect(1, agent=agent)
        return taken

    def _take_steps(self, steps: int, agent: AgentProxy) -> None:
        """Takes ``steps`` vector steps; every episode they finish is in the memory after."""
        recorder = self._recorder
        if recorder is None:
            for _ in range(steps):
                self._step(agent)
            return
        if agent is not recorder.agent:
            if not acts_only(agent):  # whole episodes would drop its other outputs
                raise ConfigurationError(
                    f"'{self.name}' hands whole episodes to its memory, which hold actions only; "
                    f"got an agent answering {tuple(agent.output_names)}; give it as agent= or "
                    "warmup_agent= when making the collector, which then records every step"
                )
            recorder.switch_agent(agent)
        if not recorder.started:
            recorder.seed = self._next_seed()
        recorder.collect(steps)
        recorder.cut_finished()
        self.env_steps += steps * self.env.num_envs

    def _add_episode(self, identity: int, sequence: dict[str, Any], state: EpisodeState) -> None:
        self.memory.add_episode(sequence, state)  # type: ignore[attr-defined]

    def _step(self, agent: AgentProxy) -> None:
        observations = self._observations
        if observations is None:
            observations = self._reset()
        responses = agent(observations)
        self.memory.add(observations, responses)
        observations = self.env.step(responses)
        self.env_steps += self.env.num_envs
        finals = [a for a, o in observations.items() if o.episode_state in _FINAL]
        if finals:
            # Finished episodes go to the memory now, so that what has been collected is stored
            # when a call returns; only the observations that need an action wait for the next.
            self.memory.add({a: observations.pop(a) for a in finals}, {})
        self._observations = observations

    def _reset(self) -> dict[AgentId, DictObservation]:
        self._observations = self.env.reset(seed=self._next_seed())
        return self._observations

    def _next_seed(self) -> int | None:
        # A resumed run must not replay the first run's episodes: offset the seed by the resets.
        seed = None if self.seed is None else self.seed + self._resets * self.env.num_envs
        self._resets += 1
        return seed

    def _drain_env_episodes(self) -> list[tuple[float, int]]:
        """``(return, length)`` of the episodes finished since the last call."""
        if self._recorder is not None:
            return self._recorder.drain_completed_episodes()
        return self.env.drain_completed_episodes()

    def _finished_episodes(self) -> list[tuple[float, int]]:
        return self._drain_env_episodes()

    def _log_finished(self) -> None:
        finished = self._finished_episodes()
        if finished:
            returns = np.array([r for r, _ in finished], dtype=np.float64)
            lengths = np.array([n for _, n in finished], dtype=np.float64)
            self.completed_episodes += len(finished)
            self.log_windowed_scalar(EPISODE_REWARD_KEY, returns)
            self.log_windowed_scalar(EPISODE_LENGTH_KEY, lengths)
            self.log_scalar(
                SCALED_REWARD_KEY, float(np.mean(self.windowed_scalar[EPISODE_REWARD_KEY]))
            )
        self.log_scalar(ENV_STEPS_KEY, self.env_steps)
        self.log_scalar(COMPLETED_EPISODES_KEY, self.completed_episodes)

    # Hooks.

    def begin_training(self, shutdown_signal: threading.Event | None = None) -> None:
        """Collects what remains of the warm-up.

        Raises:
            TrainingShutdownException: If the shutdown signal is set during warm-up.
        """
        remaining = math.ceil(max(self.warmup_steps - self.env_steps, 0) / self.env.num_envs)
        if remaining:
            log.info("'%s' collects %d warm-up vector steps", self.name, remaining)
        warmup_agent = self.warmup_agent if self.warmup_agent is not None else self.agent
        while remaining or not self._ready():
            if shutdown_signal is not None and shutdown_signal.is_set():
                raise TrainingShutdownException(f"shutdown requested during '{self.name}' warm-up")
            chunk = min(remaining, 100) if remaining else 1
            self.collect(chunk, agent=warmup_agent)
            remaining -= min(remaining, chunk)
            self._serve_exports()

    def _serve_exports(self) -> None:
        if self.exporter is not None:
            self.exporter.process_pending_exports()

    def _ready(self) -> bool:
        return self.ready_check is None or self.ready_check.is_ready()

    def collects_at(self, bp_step: int) -> bool:
        """Whether the batch of update ``bp_step`` (counted from 1) is preceded by collection."""
        return (bp_step - 1) % self.bp_steps_per_inference == 0

    def begin_batch(self, bp_step: int = 1) -> None:
        """Collects ``inference_steps_per_batch`` vector steps when this update collects."""
        if self.inference_steps_per_batch and self.collects_at(bp_step):
            self.collect(self.inference_steps_per_batch)

    # Checkpoints.

    def random_generators(self) -> dict[str, Any]:
        """The acting and warm-up agents' generators, for checkpoints."""
        generators = generators_of(self.agent, "agent.")
        if self.warmup_agent is not None:
            generators.update(generators_of(self.warmup_agent, "warmup_agent."))
        return generators

    def state_dict(self) -> dict[str, Any]:
        """The step and episode counters, the agents' random generators and the logs."""
        state = super().state_dict()
        state.update(
            env_steps=self.env_steps,
            completed_episodes=self.completed_episodes,
            resets=self._resets,
            random_state=capture(self.random_generators()),
        )
        return state

    def load_state_dict(
        self,
        state_dict: dict[str, Any],
        load_network: bool = True,
        load_optimizer: bool = True,
        load_hparams: bool = True,
    ) -> None:
        """Restores the counters (so warm-up is not repeated) and the logs."""
        super().load_state_dict(state_dict, load_network, load_optimizer, load_hparams)
        self.env_steps = int(state_dict.get("env_steps", 0))
        self.completed_episodes = int(state_dict.get("completed_episodes", 0))
        self._resets = int(state_dict.get("resets", 0))
        saved = state_dict.get("random_state", {})  # checkpoints before it have none
        fresh = restore(self.random_generators(), saved, owner=self.name, strict=False)
        if fresh and saved:
            log.warning(
                "'%s': the checkpoint holds no random state for %s (another agent?); they start "
                "afresh, so the resumed run is not an exact continuation",
                self.name,
                fresh,
            )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(name={self.name!r}, num_envs={self.env.num_envs}, "
            f"env_steps={self.env_steps})"
        )


def _takes_episodes(memory: Any) -> bool:
    """Whether ``memory`` takes whole episodes (``accepts_episodes`` and ``add_episode``)."""
    return bool(getattr(memory, "accepts_episodes", False)) and callable(
        getattr(memory, "add_episode", None)
    )


__all__ = [
    "COMPLETED_EPISODES_KEY",
    "ENV_STEPS_KEY",
    "EPISODE_LENGTH_KEY",
    "EPISODE_REWARD_KEY",
    "SCALED_REWARD_KEY",
    "GymCollector",
]
