"""BatchGymCollector: whole episodes from a vector environment, recorded a step at a time in bulk.

:class:`~emote_core.env.collectors.GymCollector` feeds a memory proxy one agent at a time, which
is what training needs (episodes enter the table the moment they end). Filling a store with
experience needs less: this collector keeps each vector step as the arrays the environment
returned (one ``append`` per step, no per-agent objects) and cuts them into episodes every
``chunk_steps`` vector steps, with numpy slicing per environment slot. The episodes it hands out
are exactly those a ``GymCollector`` + ``MemoryTableProxy`` pair would store for the same
environment, seed and agent draws: the same rows, the same end states, in the same order (by the
step they ended in, then by slot), which tests/env/test_batch_collector.py checks.

Agents act on the whole batch at once through ``act_batch({key: (num_envs, ...)})`` when they
have it (:class:`~emote_core.proxies.RandomAgentProxy`); any other agent proxy is called with
per-agent observations built from the batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from emote_core.env.dict_gym import ACTIONS_KEY, DictGymWrapper
from emote_core.errors import ConfigurationError
from emote_core.memory.proxy import REWARDS_COLUMN
from emote_core.typing import DictObservation, EpisodeState

EpisodeSink = Callable[[int, dict[str, np.ndarray], EpisodeState], None]
"""Receives ``(identity, sequence, end_state)`` for each finished episode, as
``MemoryTableProxy.episode_listeners`` do."""

_RUNNING = EpisodeState.RUNNING


class _Slot:
    """The unfinished episode of one environment slot: chunks not yet joined."""

    __slots__ = ("actions", "observations", "rewards")

    def __init__(self) -> None:
        self.observations: dict[str, list[np.ndarray]] = {}
        self.actions: list[np.ndarray] = []
        self.rewards: list[np.ndarray] = []

    def extend(self, observations: dict[str, np.ndarray], actions: Any, rewards: Any) -> None:
        for key, rows in observations.items():
            self.observations.setdefault(key, []).append(rows)
        self.actions.append(actions)
        self.rewards.append(rewards)

    def close(self, final: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        sequence = {
            key: np.concatenate([*chunks, final[key][None]])
            for key, chunks in self.observations.items()
        }
        sequence[ACTIONS_KEY] = np.concatenate(self.actions)
        sequence[REWARDS_COLUMN] = np.concatenate(self.rewards).astype(np.float32, copy=False)
        self.observations, self.actions, self.rewards = {}, [], []
        return sequence


class BatchGymCollector:
    """Plays a vector environment with an agent and hands out every finished episode.

    Args:
        env: The wrapped vector environment.
        agent: Acts for all slots: ``agent.act_batch(observations)`` if it has it, else any agent
            proxy (``agent({id: DictObservation})``).
        on_episode: Called with ``(identity, sequence, end_state)`` for each finished episode;
            identities count from ``first_identity``.
        seed: Seeds the environments at the first reset; ``None`` leaves them unseeded.
        chunk_steps: Vector steps kept as they came before they are cut into episodes.
        first_identity: The identity of the first finished episode.

    Raises:
        ConfigurationError: If ``chunk_steps`` is not a positive integer.
    """

    def __init__(
        self,
        *,
        env: DictGymWrapper,
        agent: Any,
        on_episode: EpisodeSink,
        seed: int | None = None,
        chunk_steps: int = 256,
        first_identity: int = 0,
    ) -> None:
        if isinstance(chunk_steps, bool) or not isinstance(chunk_steps, int) or chunk_steps < 1:
            raise ConfigurationError(f"chunk_steps must be a positive integer; got {chunk_steps!r}")
        self.env = env
        self.agent = agent
        self.on_episode = on_episode
        self.seed = seed
        self.chunk_steps = chunk_steps
        self.env_steps = 0
        """Environment steps taken (each vector step counts ``num_envs``)."""
        self.completed_episodes = 0
        """Episodes finished (handed out, or waiting for the next cut)."""
        self._next_identity = first_identity
        self._act_batch = getattr(agent, "act_batch", None)
        self._observations: dict[str, np.ndarray] | None = None
        self._slots = [_Slot() for _ in range(env.num_envs)]
        self._pending: list[tuple[dict[str, np.ndarray], np.ndarray, Any, np.ndarray | None]] = []
        self._finals: dict[tuple[int, int], tuple[dict[str, np.ndarray], EpisodeState]] = {}

    def collect(self, steps: int) -> int:
        """Takes ``steps`` vector steps; episodes are handed out at each cut.

        Returns:
            The environment steps taken.
        """
        vector = self.env.env
        pending, finals = self._pending, self._finals
        observations = self._observations
        if observations is None:
            raw, _ = vector.reset(seed=self.seed)
            observations = self.env.observation_batch(raw)
        for _ in range(steps):
            actions = self._act(observations)
            raw, rewards, terminated, truncated, infos = vector.step(self.env.env_actions(actions))
            done = terminated | truncated
            if done.any():
                for slot in np.flatnonzero(done):
                    state = EpisodeState.from_gymnasium(
                        terminated=bool(terminated[slot]), truncated=bool(truncated[slot])
                    )
                    finals[(len(pending), int(slot))] = (
                        self.env.final_observation(infos, int(slot)),
                        state,
                    )
                self.completed_episodes += int(done.sum())
                pending.append((observations, actions, rewards, done))
            else:
                pending.append((observations, actions, rewards, None))
            observations = self.env.observation_batch(raw)
            if len(pending) >= self.chunk_steps:
                self.cut()
                pending, finals = self._pending, self._finals
        self._observations = observations
        self.env_steps += steps * self.env.num_envs
        return steps * self.env.num_envs

    def switch_agent(self, agent: Any) -> None:
        """Acts with ``agent`` from the next vector step on (call it between :meth:`collect`
        calls: a step is never taken half by one agent and half by another)."""
        self.agent = agent
        self._act_batch = getattr(agent, "act_batch", None)

    def collect_episodes(self, count: int) -> int:
        """Steps until ``count`` more episodes have finished (a few more may finish with them).

        Returns:
            The environment steps taken.
        """
        target = self.completed_episodes + count
        taken = 0
        while self.completed_episodes < target:
            taken += self.collect(1)
        return taken

    def cut(self) -> None:
        """Hands out every episode that has finished so far (in the order they finished)."""
        pending, finals = self._pending, self._finals
        if not pending:
            return
        self._pending, self._finals = [], {}
        keys = list(pending[0][0])
        observations = {key: np.stack([step[0][key] for step in pending]) for key in keys}
        actions = np.stack([step[1] for step in pending])
        rewards = np.stack([np.asarray(step[2]) for step in pending])
        starts = [0] * len(self._slots)
        for step, slot in sorted(finals):  # by the step an episode ended in, then by slot
            final, state = finals[(step, slot)]
            start, stop = starts[slot], step + 1
            record = self._slots[slot]
            record.extend(
                {key: rows[start:stop, slot] for key, rows in observations.items()},
                actions[start:stop, slot],
                rewards[start:stop, slot],
            )
            self.on_episode(self._next_identity, record.close(final), state)
            self._next_identity += 1
            starts[slot] = stop
        end = len(pending)
        for slot, record in enumerate(self._slots):
            if starts[slot] < end:
                record.extend(
                    {key: rows[starts[slot] : end, slot] for key, rows in observations.items()},
                    actions[starts[slot] : end, slot],
                    rewards[starts[slot] : end, slot],
                )

    def _act(self, observations: dict[str, np.ndarray]) -> np.ndarray:
        if self._act_batch is not None:
            return np.asarray(self._act_batch(observations))
        per_agent = {
            slot: DictObservation(
                episode_state=_RUNNING,
                array_data={k: v[slot] for k, v in observations.items()},
                rewards={},
            )
            for slot in range(self.env.num_envs)
        }
        responses = self.agent(per_agent)
        return np.stack([responses[slot].list_data[ACTIONS_KEY] for slot in per_agent])


__all__ = ["BatchGymCollector", "EpisodeSink"]
