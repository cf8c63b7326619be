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
have it (the policy proxies, ONNX agents); any other agent proxy is called with per-agent
observations built from the batch. Agents whose actions do not depend on the observations
(:class:`~emote_core.proxies.RandomAgentProxy`) draw a whole :meth:`BatchGymCollector.collect`
call's actions at once through ``act_steps(steps, num_envs)``, mapped to the environment's
action space in one go.

Per-episode work is kept small, since random episodes are short: steps are kept as the arrays
the environment returned, and at a cut each chunk is copied once into slot-major arrays, so an
episode that began in the chunk is handed out as views of those (its observations joined with
its final one).
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
_TERMINAL = EpisodeState.TERMINAL
_INTERRUPTED = EpisodeState.INTERRUPTED


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
        sequence[REWARDS_COLUMN] = np.concatenate(self.rewards)  # float32 chunks
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
        self._act_steps = getattr(agent, "act_steps", None)
        self._observations: dict[str, np.ndarray] | None = None
        self._slots = [_Slot() for _ in range(env.num_envs)]
        self._pending: list[tuple[dict[str, np.ndarray], np.ndarray, Any]] = []
        self._finals: dict[tuple[int, int], tuple[dict[str, np.ndarray], EpisodeState]] = {}

    def collect(self, steps: int) -> int:
        """Takes ``steps`` vector steps; episodes are handed out at each cut.

        Returns:
            The environment steps taken.
        """
        env, vector = self.env, self.env.env
        step_vector, observation_batch = vector.step, env.observation_batch
        final_observation = env.final_observation
        pending, finals = self._pending, self._finals
        observations = self._observations
        if observations is None:
            raw, _ = vector.reset(seed=self.seed)
            observations = observation_batch(raw)
        # Observation-independent agents (random ones) draw the whole call's actions at once.
        block = env_block = None
        if self._act_steps is not None and steps:
            block = np.asarray(self._act_steps(steps, env.num_envs))
            env_block = env.env_actions(block, steps=steps)
        for index in range(steps):
            if block is None:
                actions = self._act(observations)
                raw, rewards, terminated, truncated, infos = step_vector(env.env_actions(actions))
            else:
                actions = block[index]
                raw, rewards, terminated, truncated, infos = step_vector(env_block[index])
            ended = (terminated | truncated).nonzero()[0]
            if len(ended):
                at = len(pending)
                for slot in ended.tolist():
                    # terminated wins over truncated (EpisodeState.from_gymnasium)
                    state = _TERMINAL if terminated[slot] else _INTERRUPTED
                    finals[(at, slot)] = (final_observation(infos, slot), state)
                self.completed_episodes += len(ended)
            pending.append((observations, actions, rewards))
            observations = observation_batch(raw)
            if len(pending) >= self.chunk_steps:
                self.cut()
                pending, finals = self._pending, self._finals
        self._observations = observations
        self.env_steps += steps * env.num_envs
        return steps * env.num_envs

    def switch_agent(self, agent: Any) -> None:
        """Acts with ``agent`` from the next vector step on (call it between :meth:`collect`
        calls: a step is never taken half by one agent and half by another)."""
        self.agent = agent
        self._act_batch = getattr(agent, "act_batch", None)
        self._act_steps = getattr(agent, "act_steps", None)

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
        # Slot-major copies of the chunk, (num_envs, steps, ...): the rows an episode spent in
        # the chunk are one contiguous slice, handed out as a view (no copy per episode).
        observations = {
            key: _slot_major([step[0][key] for step in pending]) for key in pending[0][0]
        }
        actions = _slot_major([step[1] for step in pending])
        rewards = _slot_major([step[2] for step in pending], np.float32)
        starts = [0] * len(self._slots)
        slots, on_episode = self._slots, self.on_episode
        for step, slot in sorted(finals):  # by the step an episode ended in, then by slot
            final, state = finals[(step, slot)]
            start, stop = starts[slot], step + 1
            record = slots[slot]
            if record.actions:  # it began in an earlier chunk
                record.extend(
                    {key: rows[slot, start:stop] for key, rows in observations.items()},
                    actions[slot, start:stop],
                    rewards[slot, start:stop],
                )
                sequence = record.close(final)
            else:
                sequence = {
                    key: np.concatenate((rows[slot, start:stop], final[key][None]))
                    for key, rows in observations.items()
                }
                sequence[ACTIONS_KEY] = actions[slot, start:stop]
                sequence[REWARDS_COLUMN] = rewards[slot, start:stop]
            on_episode(self._next_identity, sequence, state)
            self._next_identity += 1
            starts[slot] = stop
        end = len(pending)
        for slot, record in enumerate(slots):
            if starts[slot] < end:
                record.extend(
                    {key: rows[slot, starts[slot] : end] for key, rows in observations.items()},
                    actions[slot, starts[slot] : end],
                    rewards[slot, starts[slot] : end],
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


def _slot_major(steps: list[Any], dtype: Any = None) -> np.ndarray:
    """``steps`` arrays of ``(num_envs, ...)`` as one contiguous ``(num_envs, steps, ...)``."""
    return np.ascontiguousarray(np.stack(steps).swapaxes(0, 1), dtype=dtype)


__all__ = ["BatchGymCollector", "EpisodeSink"]
