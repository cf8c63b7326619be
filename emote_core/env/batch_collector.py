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
have it and answer with ``"actions"`` only (the policy proxies, ONNX agents); any other agent
proxy is called with per-agent observations built from the batch, as a ``DictGymWrapper`` would
give them: an id per episode, ``INITIAL`` at an episode's first step and ``RUNNING`` with the
previous reward after it. Agents whose actions do not depend on the observations
(:class:`~emote_core.proxies.RandomAgentProxy`) draw a whole :meth:`BatchGymCollector.collect`
call's actions at once through ``act_steps(steps, num_envs)``, mapped to the environment's
action space in one go.

Per-episode work is kept small, since random episodes are short: steps are kept as the arrays
the environment returned, and at a cut each chunk is copied once into slot-major arrays, so an
episode that began in the chunk is handed out as views of those (its observations joined with
its final one).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

from emote_core.env.dict_gym import ACTIONS_KEY, REWARD_KEY, DictGymWrapper
from emote_core.errors import ConfigurationError
from emote_core.memory.proxy import REWARDS_COLUMN
from emote_core.typing import DictObservation, EpisodeState

EpisodeSink = Callable[[int, dict[str, np.ndarray], EpisodeState], None]
"""Receives ``(identity, sequence, end_state)`` for each finished episode, as
``MemoryTableProxy.episode_listeners`` do."""

_NO_SLOTS = np.zeros(0, dtype=np.int64)
_INITIAL = EpisodeState.INITIAL
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
        track_returns: Also keep every finished episode's ``(return, length)``, summed in
            float64 as :class:`~emote_core.env.dict_gym.DictGymWrapper` sums them, for
            :meth:`drain_completed_episodes` (a collector that logs returns asks for it).

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
        track_returns: bool = False,
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
        self._act_batch, self._act_steps = batch_actions(agent)
        self._observations: dict[str, np.ndarray] | None = None
        self._slots = [_Slot() for _ in range(env.num_envs)]
        self._pending: list[tuple[dict[str, np.ndarray], np.ndarray, Any]] = []
        self._finals: dict[tuple[int, int], tuple[dict[str, np.ndarray], EpisodeState]] = {}
        # The last step's rewards and ended slots: what a per-agent proxy is told (see _act).
        self._last: tuple[Any, Any] | None = None
        self._agent_ids = list(range(env.num_envs))
        self._next_agent_id = env.num_envs
        # The return and length each slot's open episode had at the last cut (track_returns).
        self._returns: list[float] | None = [0.0] * env.num_envs if track_returns else None
        self._lengths = [0] * env.num_envs
        self._completed: list[tuple[float, int]] = []

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
            self._last = None
        # Observation-independent agents (random ones) draw the whole call's actions at once.
        planned: Any = itertools.repeat(None, steps)
        if self._act_steps is not None and steps:
            block = np.asarray(self._act_steps(steps, env.num_envs))
            planned = zip(block, env.env_actions(block, steps=steps), strict=True)
        quiet = bytes(env.num_envs)  # the flags' bytes when no episode ends (bool arrays)
        plain = env.plain_observation_key  # a Box observation kept as it came
        chunk_steps, last = self.chunk_steps, self._last
        for step in planned:
            if step is None:
                self._last = last
                actions = self._act(observations)
                step = actions, env.env_actions(actions)
            actions = step[0]
            raw, rewards, terminated, truncated, infos = step_vector(step[1])
            if terminated.tobytes() == quiet and truncated.tobytes() == quiet:
                ended = _NO_SLOTS
            else:
                ended = (terminated | truncated).nonzero()[0]
                if len(ended):
                    at = len(pending)
                    for slot in ended.tolist():
                        # terminated wins over truncated (EpisodeState.from_gymnasium)
                        state = _TERMINAL if terminated[slot] else _INTERRUPTED
                        finals[(at, slot)] = (final_observation(infos, slot), state)
                        self._agent_ids[slot] = self._next_agent_id  # the slot's next episode
                        self._next_agent_id += 1
                    self.completed_episodes += len(ended)
            last = (rewards, ended)
            pending.append((observations, actions, rewards))
            observations = {plain: raw} if plain is not None else observation_batch(raw)
            if len(pending) >= chunk_steps:
                self.cut()
                pending, finals = self._pending, self._finals
        self._last = last
        self._observations = observations
        self.env_steps += steps * env.num_envs
        return steps * env.num_envs

    @property
    def started(self) -> bool:
        """Whether the environments have been reset (by the first :meth:`collect`)."""
        return self._observations is not None

    def drain_completed_episodes(self) -> list[tuple[float, int]]:
        """Returns and forgets the ``(return, length)`` of the episodes handed out so far (kept
        with ``track_returns=True`` only), in the order they finished."""
        completed, self._completed = self._completed, []
        return completed

    def cut_finished(self) -> None:
        """Hands out the episodes that have finished so far, if any (:meth:`cut` when one has):
        a collector that must store every finished episode before it returns calls it."""
        if self._finals:
            self.cut()

    def switch_agent(self, agent: Any) -> None:
        """Acts with ``agent`` from the next vector step on (call it between :meth:`collect`
        calls: a step is never taken half by one agent and half by another)."""
        self.agent = agent
        self._act_batch, self._act_steps = batch_actions(agent)

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
        returns, lengths = self._returns, self._lengths
        if returns is None:  # one copy, straight to float32
            raw_rewards = rewards = _slot_major([step[2] for step in pending], np.float32)
        else:  # the environment's values too, to sum the returns as DictGymWrapper does
            raw_rewards = _slot_major([step[2] for step in pending])
            rewards = raw_rewards.astype(np.float32)
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
            if returns is not None:  # summed one by one from 0.0, as DictGymWrapper sums them
                total = sum(raw_rewards[slot, start:stop].tolist(), returns[slot])
                self._completed.append((float(total), lengths[slot] + stop - start))
                returns[slot], lengths[slot] = 0.0, 0
            on_episode(self._next_identity, sequence, state)
            self._next_identity += 1
            starts[slot] = stop
        end = len(pending)
        for slot, record in enumerate(slots):
            if starts[slot] < end:
                if returns is not None:
                    returns[slot] = sum(
                        raw_rewards[slot, starts[slot] : end].tolist(), returns[slot]
                    )
                    lengths[slot] += end - starts[slot]
                record.extend(
                    {key: rows[slot, starts[slot] : end] for key, rows in observations.items()},
                    actions[slot, starts[slot] : end],
                    rewards[slot, starts[slot] : end],
                )

    def _act(self, observations: dict[str, np.ndarray]) -> np.ndarray:
        if self._act_batch is not None:
            return np.asarray(self._act_batch(observations))
        ids, count = self._agent_ids, self.env.num_envs
        rewards, ended = self._last if self._last is not None else (None, None)
        # A slot whose episode ended in the last step starts a new one, under a new id.
        initial = set(range(count)) if rewards is None else set(ended.tolist())
        per_agent = {
            ids[slot]: DictObservation(
                episode_state=_INITIAL if slot in initial else _RUNNING,
                array_data={k: v[slot] for k, v in observations.items()},
                rewards={} if slot in initial else {REWARD_KEY: float(rewards[slot])},
            )
            for slot in range(count)
        }
        responses = self.agent(per_agent)
        return np.stack([responses[agent].list_data[ACTIONS_KEY] for agent in per_agent])


def batch_actions(agent: Any) -> tuple[Any, Any]:
    """An agent's ``(act_batch, act_steps)``, each ``None`` where it lacks it; both ``None`` for
    an agent whose responses hold more than ``"actions"`` (its batched call would drop the rest).
    """
    if tuple(getattr(agent, "output_names", (ACTIONS_KEY,))) != (ACTIONS_KEY,):
        return None, None
    return getattr(agent, "act_batch", None), getattr(agent, "act_steps", None)


def _slot_major(steps: list[Any], dtype: Any = None) -> np.ndarray:
    """``steps`` arrays of ``(num_envs, ...)`` as one contiguous ``(num_envs, steps, ...)``."""
    return np.ascontiguousarray(np.stack(steps).swapaxes(0, 1), dtype=dtype)


__all__ = ["BatchGymCollector", "EpisodeSink", "batch_actions"]
