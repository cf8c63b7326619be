"""BatchGymCollector: whole episodes from a vector environment, recorded a vector step at a time.

Steps are kept as the arrays the environment returned and cut into episodes every
``chunk_steps`` steps (or at :meth:`BatchGymCollector.cut_finished`), one gather per column. The
episodes equal, row for row and in order, what a ``MemoryTableProxy`` fed every agent's step
would store. Agents act through ``act_batch`` where they have it, else per agent; finished
episodes go out as one :class:`~emote_core.stores.episode_batch.EpisodeBatch` (``on_batch``) or
one by one (``on_episode``). ``emote collect`` and the training collectors record through it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium import spaces as gym_spaces

from emote_core.env.dict_gym import ACTIONS_KEY, REWARD_KEY, DictGymWrapper
from emote_core.errors import ConfigurationError
from emote_core.memory.proxy import REWARDS_COLUMN
from emote_core.stores.episode_batch import EpisodeBatch
from emote_core.typing import DictObservation, EpisodeState

EpisodeSink = Callable[[int, dict[str, np.ndarray], EpisodeState], None]
"""Receives ``(identity, sequence, end_state)`` for each finished episode, as
``MemoryTableProxy.episode_listeners`` do."""
BatchSink = Callable[[EpisodeBatch], None]
"""Receives the episodes that finished since the last cut, together, in the order they finished."""

CHUNK_ROWS = 8192
"""Rows (vector steps times environments) a chunk holds at most by default before it is cut..."""
CHUNK_BYTES = 32 << 20
"""...and bytes of observations (a chunk of 84x84 RGB frames, four stacked, is ~390 rows)."""

_NO_SLOTS = np.zeros(0, dtype=np.int64)
_INITIAL = EpisodeState.INITIAL
_RUNNING = EpisodeState.RUNNING
_TERMINAL = EpisodeState.TERMINAL
_INTERRUPTED = EpisodeState.INTERRUPTED


class _Slot:
    """The rows of one environment slot's unfinished episode that earlier chunks held: per
    column, views of those chunks' joined rows (strided: a chunk's rows are step after step)."""

    __slots__ = ("pieces", "rows")

    def __init__(self) -> None:
        self.pieces: dict[str, list[np.ndarray]] = {}
        self.rows = 0

    def extend(self, pieces: dict[str, np.ndarray], rows: int) -> None:
        for name, piece in pieces.items():
            self.pieces.setdefault(name, []).append(piece)
        self.rows += rows

    def clear(self) -> None:
        self.pieces, self.rows = {}, 0


class BatchGymCollector:
    """Plays a vector environment with an agent and hands out every finished episode.

    Args:
        env: The wrapped vector environment.
        agent: Acts for all slots: ``agent.act_batch(observations)`` if it has it, else any agent
            proxy (``agent({id: DictObservation})``).
        on_episode: Called with ``(identity, sequence, end_state)`` for each finished episode
            (identities count from ``first_identity``; arrays are views of the cut's rows).
        on_batch: Called at each cut with its finished episodes as one
            :class:`~emote_core.stores.episode_batch.EpisodeBatch`, before ``on_episode``.
        seed: Seeds the environments at the first reset; ``None`` leaves them unseeded.
        chunk_steps: Vector steps kept before they are cut into episodes (by default
            :data:`CHUNK_ROWS` rows or :data:`CHUNK_BYTES`, whichever is less); call
            :meth:`cut_finished` to have episodes sooner.
        first_identity: The identity of the first finished episode.
        track_returns: Keep every finished episode's ``(return, length)`` for
            :meth:`drain_completed_episodes`.

    Raises:
        ConfigurationError: If ``chunk_steps`` is not a positive integer, or neither sink is
            given.
    """

    def __init__(
        self,
        *,
        env: DictGymWrapper,
        agent: Any,
        on_episode: EpisodeSink | None = None,
        on_batch: BatchSink | None = None,
        seed: int | None = None,
        chunk_steps: int | None = None,
        first_identity: int = 0,
        track_returns: bool = False,
    ) -> None:
        if chunk_steps is None:
            rows = min(CHUNK_ROWS, CHUNK_BYTES // _row_bytes(env.env.single_observation_space))
            chunk_steps = max(1, rows // env.num_envs)
        if isinstance(chunk_steps, bool) or not isinstance(chunk_steps, int) or chunk_steps < 1:
            raise ConfigurationError(f"chunk_steps must be a positive integer; got {chunk_steps!r}")
        if on_episode is None and on_batch is None:
            raise ConfigurationError("BatchGymCollector needs on_episode or on_batch")
        self.env = env
        self.agent = agent
        self.on_episode = on_episode
        self.on_batch = on_batch
        self.seed = seed
        self.chunk_steps = chunk_steps
        self.env_steps = 0
        """Environment steps taken (each vector step counts ``num_envs``), counted as each vector
        step returns, also in a :meth:`collect` that is interrupted."""
        self.completed_episodes = 0
        """Episodes finished (handed out, or waiting for the next cut)."""
        self._next_identity = first_identity
        self._act_batch, self._act_steps = _batch_actions(agent)
        self._observations: dict[str, np.ndarray] | None = None
        self._slots = [_Slot() for _ in range(env.num_envs)]
        # The chunk's steps: observations (the plain array, or a dict), actions, rewards.
        self._pending: tuple[list[Any], list[Any], list[Any]] = ([], [], [])
        # (step in the chunk, slot, final observation, end state), in the order they finished.
        self._finals: list[tuple[int, int, dict[str, np.ndarray], EpisodeState]] = []
        # The last step's rewards and ended slots: what a per-agent proxy is told (see _act).
        self._last: tuple[Any, Any] | None = None
        self._agent_ids = list(range(env.num_envs))
        self._next_agent_id = env.num_envs
        # The return each slot's open episode had at the last cut (track_returns).
        self._returns: list[float] | None = [0.0] * env.num_envs if track_returns else None
        self._completed: list[tuple[float, int]] = []

    def collect(self, steps: int) -> int:
        """Takes ``steps`` vector steps; episodes are handed out at each cut.

        Returns:
            The environment steps taken.
        """
        env, vector = self.env, self.env.env
        step_vector, observation_batch = vector.step, env.observation_batch
        final_observation = env.final_observation
        (seen, acted, rewarded), finals = self._pending, self._finals
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
        width = env.num_envs
        quiet = bytes(width)  # the flags' bytes when no episode ends (bool arrays)
        plain = env.plain_observation_key  # a Box observation kept as it came, not in a dict
        current = observations if plain is None else observations[plain]
        chunk_steps = self.chunk_steps
        rewards, ended = self._last if self._last is not None else (None, None)
        for step in planned:
            if step is None:
                self._last = (rewards, ended) if rewards is not None else None
                actions = self._act(current if plain is None else {plain: current})
                step = actions, env.env_actions(actions)
            actions = step[0]
            raw, rewards, terminated, truncated, infos = step_vector(step[1])
            # Counted as soon as taken, before it is recorded: a Ctrl-C at any point leaves the
            # count at or above the steps a cut can hand out, never below.
            self.env_steps += width
            if terminated.tobytes() == quiet and truncated.tobytes() == quiet:
                ended = _NO_SLOTS
            else:
                ended = (terminated | truncated).nonzero()[0]
                if len(ended):
                    at = len(seen)
                    for slot in ended.tolist():
                        # terminated wins over truncated (EpisodeState.from_gymnasium)
                        state = _TERMINAL if terminated[slot] else _INTERRUPTED
                        finals.append((at, slot, final_observation(infos, slot), state))
                        self._agent_ids[slot] = self._next_agent_id  # the slot's next episode
                        self._next_agent_id += 1
                    self.completed_episodes += len(ended)
            seen.append(current)
            acted.append(actions)
            rewarded.append(rewards)
            current = raw if plain is not None else observation_batch(raw)
            if len(seen) >= chunk_steps:
                self.cut()
                (seen, acted, rewarded), finals = self._pending, self._finals
        self._last = (rewards, ended) if rewards is not None else None
        self._observations = current if plain is None else {plain: current}
        return steps * width

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
        self._act_batch, self._act_steps = _batch_actions(agent)

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
        """Hands out every episode that has finished so far (in the order they finished).

        Nothing changes until the episodes are built: a cut that fails or is interrupted
        (Ctrl-C) leaves every step to the next one. After a :meth:`collect` that was
        interrupted, a cut still hands out every episode that finished in a step it recorded
        whole.
        """
        (seen, acted, rewarded), finals = self._pending, self._finals
        steps, count = min(len(seen), len(acted), len(rewarded)), len(self._slots)
        if not steps:
            return
        if not len(seen) == len(acted) == len(rewarded):  # a step torn by Ctrl-C: left out
            seen, acted, rewarded = seen[:steps], acted[:steps], rewarded[:steps]
            finals = [final for final in finals if final[0] < steps]
        # Each column's rows: the chunk's, step after step (row t * count + slot), then those
        # the finished episodes carried from earlier chunks, then (observations) their finals.
        plain = self.env.plain_observation_key
        if plain is not None:
            parts = {plain: seen}
        else:
            parts = {key: [step[key] for step in seen] for key in seen[0]}
        extra_rows = dict.fromkeys(parts, 1)
        parts[ACTIONS_KEY] = acted
        parts[REWARDS_COLUMN] = rewarded
        extra_rows.update(dict.fromkeys((ACTIONS_KEY, REWARDS_COLUMN), 0))
        raw_rewards = None
        if self._returns is not None:  # the environment's values, summed as DictGymWrapper sums
            raw_rewards = np.concatenate(rewarded).reshape(steps, count)
        starts = [0] * count
        runs, carried, completed = self._runs(finals, starts, raw_rewards)
        rows = {}
        for name, chunk in parts.items():
            ends = [final[name][None] for _, _, final, _ in finals] if extra_rows[name] else []
            rows[name] = np.concatenate(
                [*chunk, *carried.get(name, ()), *ends],
                dtype=np.float32 if name == REWARDS_COLUMN else None,
            )  # rewards as float32, the form tables store
        batch = None
        if runs is not None:
            batch = self._gather(finals, runs, rows, extra_rows, steps * count)
        # Built: now the collector moves on.
        self._pending, self._finals = ([], [], []), []
        returns = self._returns
        for _, slot, _, _ in finals:
            self._slots[slot].clear()
            if returns is not None:
                returns[slot] = 0.0
        self._completed += completed
        # The rows of every slot's unfinished episode wait for a later cut, as views.
        for slot, start in enumerate(starts):
            if start < steps:
                first, end = start * count + slot, steps * count
                self._slots[slot].extend(
                    {name: joined[first:end:count] for name, joined in rows.items()}, steps - start
                )
                if returns is not None and raw_rewards is not None:
                    returns[slot] = sum(raw_rewards[start:, slot].tolist(), returns[slot])
        if batch is not None:
            self._next_identity += len(batch)
            self._hand_out(batch)

    def _runs(
        self,
        finals: list[tuple[int, int, dict[str, np.ndarray], EpisodeState]],
        starts: list[int],
        raw_rewards: np.ndarray | None,
    ) -> tuple[
        tuple[np.ndarray, np.ndarray, np.ndarray] | None,
        dict[str, list[np.ndarray]],
        list[tuple[float, int]],
    ]:
        """Where each finished episode's rows are, ``(carried rows, first chunk row, chunk
        rows)``; the pieces they carried from earlier chunks, per column; and (with
        ``track_returns``) their returns and lengths. ``starts`` is left at each slot's first
        unfinished step; nothing else changes."""
        if not finals:
            return None, {}, []
        count = len(self._slots)
        chunk_first, chunk_rows, carried = [], [], []
        pieces: dict[str, list[np.ndarray]] = {}
        completed = []
        returns = self._returns
        for step, slot, _, _ in finals:
            start = starts[slot]
            starts[slot] = step + 1
            chunk_first.append(start * count + slot)
            chunk_rows.append(step + 1 - start)
            record = self._slots[slot]
            first = start == 0  # the slot's first episode to finish here: it may have begun earlier
            carried.append(record.rows if first else 0)
            if first:
                for name, piece in record.pieces.items():
                    pieces.setdefault(name, []).extend(piece)
            if returns is not None and raw_rewards is not None:
                # summed one by one from 0.0, over the cuts, as DictGymWrapper sums them
                before = returns[slot] if first else 0.0
                total = sum(raw_rewards[start : step + 1, slot].tolist(), before)
                completed.append((float(total), carried[-1] + step + 1 - start))
        runs = (np.array(carried, dtype=np.int64), np.array(chunk_first, dtype=np.int64),
                np.array(chunk_rows, dtype=np.int64))  # fmt: skip
        return runs, pieces, completed

    def _gather(
        self,
        finals: list[tuple[int, int, dict[str, np.ndarray], EpisodeState]],
        runs: tuple[np.ndarray, np.ndarray, np.ndarray],
        rows: dict[str, np.ndarray],
        extra_rows: dict[str, int],
        chunk_rows: int,
    ) -> EpisodeBatch:
        """The finished episodes, each column's rows gathered into episode order."""
        carried, chunk_first, here = runs
        episodes, count = len(finals), len(self._slots)
        carried_first = chunk_rows + np.cumsum(carried) - carried
        ones = np.ones(episodes, dtype=np.int64)
        final_first = chunk_rows + int(carried.sum()) + np.arange(episodes)
        index = {  # each episode: its carried rows, its chunk rows (count apart), its final
            0: _gather_index(
                np.stack([carried_first, chunk_first], 1).ravel(),
                np.stack([ones, ones * count], 1).ravel(),
                np.stack([carried, here], 1).ravel(),
            ),
            1: _gather_index(
                np.stack([carried_first, chunk_first, final_first], 1).ravel(),
                np.stack([ones, ones * count, ones], 1).ravel(),
                np.stack([carried, here, ones], 1).ravel(),
            ),
        }
        identity = self._next_identity
        return EpisodeBatch(
            identities=np.arange(identity, identity + episodes, dtype=np.int64),
            lengths=carried + here,
            end_states=np.array([int(state) for *_, state in finals], dtype=np.int8),
            columns={name: joined[index[extra_rows[name]]] for name, joined in rows.items()},
            extra_rows=extra_rows,
        )

    def _hand_out(self, batch: EpisodeBatch) -> None:
        if self.on_batch is not None:
            self.on_batch(batch)
        if self.on_episode is not None:
            for episode in batch.episodes():
                self.on_episode(*episode)

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


def acts_only(agent: Any) -> bool:
    """Whether ``agent``'s responses hold ``"actions"`` only (its ``output_names``, where it
    says): the only responses this collector records."""
    return tuple(getattr(agent, "output_names", (ACTIONS_KEY,))) == (ACTIONS_KEY,)


def _batch_actions(agent: Any) -> tuple[Any, Any]:
    """An agent's ``(act_batch, act_steps)``, each ``None`` where it lacks it; both ``None`` for
    an agent whose responses hold more than ``"actions"`` (its batched call would drop the rest).
    """
    if not acts_only(agent):
        return None, None
    return getattr(agent, "act_batch", None), getattr(agent, "act_steps", None)


def _row_bytes(space: Any) -> int:
    """The bytes of one observation of ``space`` (a Box, or a Dict of them)."""
    if isinstance(space, gym_spaces.Dict):
        return sum(_row_bytes(part) for part in space.spaces.values()) or 1
    dtype = np.dtype(getattr(space, "dtype", None) or np.float32)
    return max(1, int(np.prod(getattr(space, "shape", None) or ())) * dtype.itemsize)


def _gather_index(first: np.ndarray, stride: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The rows of runs one after another: run ``k`` is ``rows[k]`` rows from ``first[k]``,
    ``stride[k]`` apart."""
    total = int(rows.sum())
    offsets = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(rows) - rows, rows)
    return np.repeat(first, rows) + np.repeat(stride, rows) * offsets


__all__ = [
    "CHUNK_BYTES",
    "CHUNK_ROWS",
    "BatchGymCollector",
    "BatchSink",
    "EpisodeSink",
    "acts_only",
]
