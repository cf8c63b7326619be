"""The sequence builder: collates per-agent steps into whole episodes for a memory table.

:class:`MemoryTableProxy` keeps one open :class:`Episode` per agent and adds each finished one
to its table in one ``add_sequence`` call, by DESIGN.md's "Episode semantics": the reward on
observation ``t + 1`` belongs to action ``t``; a second ``INITIAL`` for an open episode is an
error; a final observation for no open episode is skipped; a ``RUNNING`` one starts an episode
(its reward discarded, with a warning). :meth:`MemoryTableProxy.add_episode` takes a whole
episode at once and stores exactly what the same steps through ``add`` would.
"""

from __future__ import annotations

import functools
import itertools
import logging
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from emote_core.errors import ConfigurationError, DuplicateEpisodeError, EpisodeCollationError
from emote_core.typing import AgentId, DictObservation, DictResponse, EpisodeState
from emote_core.utils import BlockTimers

if TYPE_CHECKING:
    from emote_core.memory.table import ArrayMemoryTable

log = logging.getLogger(__name__)

REWARD_KEY = "reward"
"""The key of :attr:`DictObservation.rewards` that holds the previous action's reward."""
REWARDS_COLUMN = "rewards"
"""The table column that receives the rewards."""
TERMINAL_COLUMN = "terminal"
"""The table column that receives the per-step terminal flags (``use_terminal=True``)."""


class MissingRewardWarning(UserWarning):
    """An observation's ``rewards["reward"]`` was ``None``; its transition holds a NaN reward."""


_RUNNING = EpisodeState.RUNNING
_INITIAL = EpisodeState.INITIAL
_TERMINAL = EpisodeState.TERMINAL
_INTERRUPTED = EpisodeState.INTERRUPTED


@runtime_checkable
class MemoryProxy(Protocol):
    """What collectors feed: anything that takes per-agent steps (a proxy or a wrapper of one)."""

    def add(
        self,
        observations: Mapping[AgentId, DictObservation],
        responses: Mapping[AgentId, DictResponse],
    ) -> None:
        """Records one step of every agent in ``observations``."""
        ...

    def is_initial(self, identity: AgentId) -> bool:
        """Whether ``identity`` has no open episode."""
        ...


class Episode:
    """One agent's episode while it is being collected.

    Steps are kept as references to the arrays given (no copy per step) and stacked once, when the
    episode is turned into a sequence; arrays handed to an episode must therefore not be modified
    in place afterwards.

    Args:
        observation: The first observation's arrays by key; the episode keeps these keys.
    """

    __slots__ = ("_actions", "_observations", "_rewards")

    def __init__(self, observation: Mapping[str, Any]) -> None:
        self._observations: dict[str, list[Any]] = {k: [v] for k, v in observation.items()}
        self._actions: dict[str, list[Any]] | None = None
        self._rewards: list[Any] = []

    def __len__(self) -> int:
        """Transitions collected so far (rewards received)."""
        return len(self._rewards)

    @property
    def observations(self) -> dict[str, list[Any]]:
        """The observations so far by key, oldest first (new lists of the arrays given)."""
        return {key: list(values) for key, values in self._observations.items()}

    @property
    def actions(self) -> dict[str, list[Any]]:
        """The actions so far by key, oldest first (new lists of the arrays given)."""
        return {key: list(values) for key, values in (self._actions or {}).items()}

    @property
    def observation_count(self) -> int:
        """Observations collected so far (one more than the transitions once an action is due)."""
        return len(self._rewards) + 1

    @property
    def action_count(self) -> int:
        """Actions collected so far."""
        return 0 if self._actions is None else _fewest(self._actions)

    def add_action(self, actions: Mapping[str, Any]) -> None:
        """Records the action taken at the latest observation.

        Args:
            actions: The response's ``list_data``: arrays by key; the first action fixes the keys.

        Raises:
            EpisodeCollationError: If the keys differ from the episode's first action.
        """
        lists = self._actions
        if lists is None:
            self._actions = {k: [v] for k, v in actions.items()}
            return
        if len(actions) != len(lists):
            raise self._key_error("action", lists, actions)
        try:
            for key, values in lists.items():
                values.append(actions[key])
        except KeyError:
            _trim(lists, _fewest(lists))
            raise self._key_error("action", lists, actions) from None

    def add_transition(self, reward: Any, observation: Mapping[str, Any]) -> None:
        """Records the reward of the latest action and the observation it led to.

        Args:
            reward: The previous action's reward.
            observation: The next observation's arrays by key (the episode's keys).

        Raises:
            EpisodeCollationError: If the keys differ from the first observation's.
        """
        lists = self._observations
        if len(observation) != len(lists):
            raise self._key_error("observation", lists, observation)
        try:
            for key, values in lists.items():
                values.append(observation[key])
        except KeyError:
            _trim(lists, len(self._rewards) + 1)
            raise self._key_error("observation", lists, observation) from None
        self._rewards.append(reward)

    @staticmethod
    def _key_error(
        what: str, lists: Mapping[str, Any], given: Mapping[str, Any]
    ) -> EpisodeCollationError:
        return EpisodeCollationError(
            f"an episode keeps the {what} keys it started with, {sorted(lists)}; this step gives "
            f"{sorted(given)} — report the same keys at every step of an episode"
        )

    def to_sequence(self, *, terminal: bool | None = None) -> dict[str, np.ndarray]:
        """The episode as :meth:`ArrayMemoryTable.add_sequence` takes it.

        Args:
            terminal: ``None`` for no terminal column; else add ``"terminal"`` with ``N + 1``
                values, all 0 except a 1 at the final observation when ``terminal`` is true.

        Returns:
            One array per observation key (``N + 1`` rows), per action key (``N`` rows), and
            ``"rewards"`` (``N`` float32 values).

        Raises:
            EpisodeCollationError: If the episode has no transition, or not one action per
                transition.
        """
        length = len(self._rewards)
        if length == 0 or self.action_count != length:
            raise EpisodeCollationError(
                f"an episode needs at least one transition and one action per transition to be "
                f"stored; this one has {length} transitions and {self.action_count} actions"
            )
        sequence = {key: _stack(key, values) for key, values in self._observations.items()}
        for key, values in (self._actions or {}).items():
            if key in sequence:
                raise EpisodeCollationError(
                    f"action key '{key}' is also an observation key; rename one of them"
                )
            sequence[key] = _stack(key, values)
        sequence[REWARDS_COLUMN] = np.asarray(self._rewards, dtype=np.float32)
        if terminal is not None:
            sequence[TERMINAL_COLUMN] = _terminal_flags(length, terminal)
        return sequence


class MemoryTableProxy:
    """Collects agents' steps into whole episodes and adds each finished one to a table.

    Each completed episode is added under a fresh int64 identity from a counter (agent ids are
    reused across episodes; episode identities never are).

    Args:
        table: The table finished episodes go to.
        minimum_length_threshold: Episodes with fewer transitions are dropped (logged at debug
            level); ``None`` or ``0`` keeps every episode.
        use_terminal: Also store a per-step ``"terminal"`` value (``N + 1`` values: 0, and 1 at
            the final observation of a TERMINAL episode), for tables built with a terminal column.
        name: A name for logs.

    A RUNNING or final observation whose ``rewards["reward"]`` is ``None`` is stored with a NaN
    reward, with a :class:`MissingRewardWarning` at the first one: the transition is kept, and
    training on it fails visibly (NaN losses) rather than on an invented reward.

    Raises:
        ConfigurationError: If ``minimum_length_threshold`` is not ``None`` or a non-negative
            integer.
    """

    accepts_episodes: bool = True
    """Takes whole finished episodes through :meth:`add_episode`."""

    def __init__(
        self,
        table: ArrayMemoryTable,
        minimum_length_threshold: int | None = None,
        use_terminal: bool = False,
        *,
        name: str = "default",
    ) -> None:
        if minimum_length_threshold is not None and (
            isinstance(minimum_length_threshold, bool)
            or not isinstance(minimum_length_threshold, int)
            or minimum_length_threshold < 0
        ):
            raise ConfigurationError(
                f"minimum_length_threshold must be None, 0 (both keep every episode) or a positive "
                f"number of transitions; got {minimum_length_threshold!r}"
            )
        self._table = table
        self._minimum_length = minimum_length_threshold or 0
        self._use_terminal = use_terminal
        self.name = name
        self._episodes: dict[AgentId, Episode] = {}
        self._identities = itertools.count()
        self.timers = BlockTimers()
        self._add_timer = self.timers.timer("add")
        self._completed_timer = self.timers.timer("completed")
        self._completed_episodes = 0
        self.episode_listeners: list[Callable[[int, dict[str, Any], EpisodeState], None]] = []
        """Called with ``(identity, sequence, end_state)`` after each episode enters the table
        (an incremental exporter listens here)."""
        self._dropped_episodes = 0
        self._warned_missing_reward = False

    @property
    def completed_episodes(self) -> int:
        """Episodes added to the table by this proxy."""
        return self._completed_episodes

    @property
    def dropped_episodes(self) -> int:
        """Episodes finished but dropped for being shorter than the threshold."""
        return self._dropped_episodes

    @property
    def table(self) -> ArrayMemoryTable:
        """The table finished episodes go to."""
        return self._table

    @property
    def open_episodes(self) -> int:
        """Agents with an episode in progress."""
        return len(self._episodes)

    def is_initial(self, identity: AgentId) -> bool:
        """Whether agent ``identity`` has no open episode (its next observation starts one)."""
        return identity not in self._episodes

    def open_episode(self, identity: AgentId) -> Episode | None:
        """Agent ``identity``'s episode in progress (``None`` when it has none), to read; the
        proxy keeps adding to it."""
        return self._episodes.get(identity)

    def add(
        self,
        observations: Mapping[AgentId, DictObservation],
        responses: Mapping[AgentId, DictResponse],
    ) -> None:
        """Records one step for every agent in ``observations``.

        Args:
            observations: Each agent's observation at this step.
            responses: The response each agent acted with at this step: required for agents
                whose observation is INITIAL or RUNNING, ignored for final observations.

        Raises:
            EpisodeCollationError: An INITIAL observation for an agent whose episode is open, an
                INITIAL or RUNNING observation without a response, a RUNNING or final observation
                without ``rewards["reward"]``, or keys that change within an episode.
            SchemaError: A finished episode does not match the table's columns (the episode is
                lost; the agent's next observation must be INITIAL).
        """
        with self._add_timer:
            episodes = self._episodes
            for agent, observation in observations.items():
                state = observation.episode_state
                episode = episodes.get(agent)
                if state == _RUNNING:
                    actions = _actions(agent, responses)
                    if episode is None:
                        log.warning(
                            "memory proxy '%s': agent %r sent a RUNNING observation without an "
                            "open episode; starting its episode here and discarding that reward",
                            self.name,
                            agent,
                        )
                        episode = episodes[agent] = Episode(observation.array_data)
                    else:
                        episode.add_transition(
                            self._reward(agent, observation), observation.array_data
                        )
                    episode.add_action(actions)
                elif state == _INITIAL:
                    if episode is not None:
                        raise EpisodeCollationError(
                            f"memory proxy '{self.name}': agent {agent!r} sent an INITIAL "
                            f"observation while its episode of {len(episode)} transitions is "
                            "still open; end an episode with a TERMINAL or INTERRUPTED "
                            "observation before starting the next"
                        )
                    episode = Episode(observation.array_data)
                    episode.add_action(_actions(agent, responses))
                    episodes[agent] = episode
                elif state in (_TERMINAL, _INTERRUPTED):
                    if episode is None:
                        log.warning(
                            "memory proxy '%s': agent %r sent a %s observation but has no open "
                            "episode; skipping it",
                            self.name,
                            agent,
                            EpisodeState(state).name,
                        )
                        continue
                    del episodes[agent]
                    episode.add_transition(self._reward(agent, observation), observation.array_data)
                    end_state = EpisodeState(state)
                    terminal = (end_state == _TERMINAL) if self._use_terminal else None
                    self._complete(
                        len(episode), functools.partial(episode.to_sequence, terminal=terminal),
                        end_state,
                    )  # fmt: skip
                else:
                    raise EpisodeCollationError(
                        f"memory proxy '{self.name}': agent {agent!r} sent episode_state "
                        f"{state!r}; use an emote_core.typing.EpisodeState"
                    )

    def _reward(self, agent: AgentId, observation: DictObservation) -> Any:
        """The reward an observation carries; ``None`` is NaN, with a warning the first time."""
        reward = _reward(agent, observation)
        if reward is None:
            if not self._warned_missing_reward:
                self._warned_missing_reward = True
                warnings.warn(
                    f"memory proxy '{self.name}': agent {agent!r} sent a "
                    f"{EpisodeState(observation.episode_state).name} observation with "
                    f"rewards['{REWARD_KEY}'] = None; its transition is stored with a NaN reward "
                    "(warned once) — send the previous action's reward",
                    MissingRewardWarning,
                    stacklevel=3,
                )
            return np.nan
        return reward

    def add_episode(self, sequence: Mapping[str, np.ndarray], end_state: EpisodeState) -> None:
        """Adds one finished episode at once, as its steps through :meth:`add` would have.

        Args:
            sequence: Each observation key's ``N + 1`` rows, each action key's ``N`` rows and
                ``"rewards"`` (``N`` float32 values), as :meth:`Episode.to_sequence` gives them
                (without the terminal column: the proxy adds it when it uses one).
            end_state: ``TERMINAL`` or ``INTERRUPTED``.

        Raises:
            EpisodeCollationError: If the episode has no transition or no rewards, or its end
                state is not final.
            SchemaError: If it does not match the table's columns.
        """
        rewards = sequence.get(REWARDS_COLUMN)
        if rewards is None or len(rewards) == 0 or end_state not in (_TERMINAL, _INTERRUPTED):
            raise EpisodeCollationError(
                f"memory proxy '{self.name}': a whole episode needs '{REWARDS_COLUMN}' for at "
                f"least one transition and a TERMINAL or INTERRUPTED end state; got "
                f"{None if rewards is None else len(rewards)} rewards, end state {end_state!r}"
            )
        with self._add_timer:
            length = len(rewards)
            if self._use_terminal:
                flags = _terminal_flags(length, end_state == _TERMINAL)
                sequence = {**sequence, TERMINAL_COLUMN: flags}
            self._complete(length, lambda: dict(sequence), EpisodeState(end_state))

    def _complete(
        self, length: int, sequence: Callable[[], dict[str, Any]], end_state: EpisodeState
    ) -> None:
        if length < self._minimum_length:
            self._dropped_episodes += 1
            log.debug(
                "memory proxy '%s': dropping an episode of %d transitions (threshold %d)",
                self.name,
                length,
                self._minimum_length,
            )
            return
        with self._completed_timer:
            # Listeners (store exports) get the episode as the table holds it.
            stored = self._table.stored_sequence(sequence())
            identity = next(self._identities)
            try:
                self._table.add_sequence(identity, stored, end_state=end_state)
            except DuplicateEpisodeError:
                # The table already holds this id (restored from a file): continue past its ids.
                identity = self._skip_held_identities()
                self._table.add_sequence(identity, stored, end_state=end_state)
            self._completed_episodes += 1
            for listener in self.episode_listeners:
                listener(identity, stored, end_state)

    def _skip_held_identities(self) -> int:
        index = self._table.index
        held = index.ids[index.live]
        start = int(held.max()) + 1 if len(held) else 0
        self._identities = itertools.count(start)
        return next(self._identities)

    def size(self) -> int:
        """Transitions held by the table."""
        return self._table.size()

    def resize(self, maxlen: int) -> None:
        """Changes the table's ``maxlen`` (see :meth:`ArrayMemoryTable.resize`)."""
        self._table.resize(maxlen)

    def __repr__(self) -> str:
        return (
            f"MemoryTableProxy(name={self.name!r}, open_episodes={len(self._episodes)}, "
            f"completed_episodes={self.completed_episodes}, table={self._table!r})"
        )


def _stack(key: str, values: list[Any]) -> np.ndarray:
    """One array of an episode's per-step values (``np.array``: faster than ``np.stack``)."""
    try:
        array = np.array(values)
    except ValueError:  # values of different shapes
        array = None
    if array is None or array.dtype == object or len(array) != len(values):
        try:
            return np.stack([np.asarray(v) for v in values])
        except ValueError as error:
            shapes = sorted({np.shape(v) for v in values})
            raise EpisodeCollationError(
                f"the '{key}' values of one episode must all have one shape; got shapes "
                f"{shapes[:5]} — report a fixed shape at every step"
            ) from error
    return array


def _terminal_flags(length: int, terminal: bool) -> np.ndarray:
    """An episode's ``N + 1`` terminal values: 0, and 1 at the final observation if it ended
    TERMINAL."""
    flags = np.zeros(length + 1, dtype=np.float32)
    flags[-1] = 1.0 if terminal else 0.0
    return flags


def _fewest(lists: Mapping[str, list[Any]]) -> int:
    """The fewest values any key holds (all keys hold as many between steps)."""
    return min((len(values) for values in lists.values()), default=0)


def _trim(lists: Mapping[str, list[Any]], count: int) -> None:
    """Undoes a partly recorded step: every key keeps at most ``count`` values."""
    for values in lists.values():
        del values[count:]


def _reward(agent: AgentId, observation: DictObservation) -> Any:
    """``rewards["reward"]`` (``None`` included: the proxy decides what that means).

    Raises:
        EpisodeCollationError: If the observation has no ``"reward"`` entry.
    """
    rewards = observation.rewards
    if rewards and REWARD_KEY in rewards:
        return rewards[REWARD_KEY]
    raise EpisodeCollationError(
        f"agent {agent!r} sent a {EpisodeState(observation.episode_state).name} observation "
        f"without rewards['{REWARD_KEY}'] (rewards: {rewards!r}); RUNNING and final "
        "observations carry the reward of the previous action"
    )


def _actions(agent: AgentId, responses: Mapping[AgentId, DictResponse]) -> Mapping[str, Any]:
    response = responses.get(agent)
    if response is None:
        raise EpisodeCollationError(
            f"agent {agent!r} has an INITIAL or RUNNING observation but no response; pass the "
            "response the agent acted with at every non-final step"
        )
    return response.list_data


__all__ = [
    "REWARDS_COLUMN",
    "REWARD_KEY",
    "TERMINAL_COLUMN",
    "Episode",
    "MemoryProxy",
    "MemoryTableProxy",
    "MissingRewardWarning",
]
