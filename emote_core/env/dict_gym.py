"""DictGymWrapper: gymnasium vector environments as per-agent dict observations.

Every episode of a slot is an agent with a fresh :data:`~emote_core.typing.AgentId`; the step
that ends one reports its final observation and the next episode's ``INITIAL`` one under a new
id. The wrapper needs gymnasium's ``AutoresetMode.SAME_STEP`` (so no action goes to a slot
between episodes); :func:`make_vector_env` creates environments in that mode.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces as gym_spaces
from gymnasium.vector import AutoresetMode

from emote_core.errors import ConfigurationError
from emote_core.spaces import MDPSpace
from emote_core.typing import AgentId, DictObservation, DictResponse, EpisodeState

ACTIONS_KEY = "actions"
"""The key of :attr:`DictResponse.list_data` holding the action sent to the environment."""
REWARD_KEY = "reward"
"""The key of :attr:`DictObservation.rewards` holding the previous action's reward."""

_INITIAL = EpisodeState.INITIAL
_RUNNING = EpisodeState.RUNNING


def make_vector_env(
    env: str | Callable[..., Any],
    *,
    num_envs: int = 1,
    vectorization_mode: str = "sync",
    wrappers: Sequence[Callable[[gymnasium.Env], gymnasium.Wrapper]] | None = None,
    **env_kwargs: Any,
) -> gymnasium.vector.VectorEnv:
    """Creates a vector environment in the autoreset mode :class:`DictGymWrapper` needs.

    Args:
        env: A registered gymnasium id, such as ``"Pendulum-v1"`` or ``"emote/HitTheMiddle-v0"``,
            or a factory called with ``env_kwargs`` (``render_mode``) that returns one env (see
            :func:`emote_core.env.making.env_factory`).
        num_envs: Environments stepped together.
        vectorization_mode: ``"sync"`` (one process) or ``"async"`` (one process per environment).
        wrappers: Wrappers applied to each single environment, innermost first.
        **env_kwargs: Passed to each environment's constructor (or the factory).

    Returns:
        A gymnasium vector environment with ``autoreset_mode`` ``SAME_STEP``.

    Raises:
        ConfigurationError: If ``num_envs`` is not a positive integer.
    """
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
        raise ConfigurationError(f"num_envs must be a positive integer; got {num_envs!r}")
    if isinstance(env, str):
        return gymnasium.make_vec(
            env,
            num_envs=num_envs,
            vectorization_mode=vectorization_mode,
            vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
            wrappers=wrappers,
            **env_kwargs,
        )
    if vectorization_mode not in ("sync", "async"):
        raise ConfigurationError(
            f"vectorization_mode must be 'sync' or 'async' for an env factory; got "
            f"{vectorization_mode!r}"
        )
    make = functools.partial(_wrapped, env, tuple(wrappers or ()), env_kwargs)
    vector_class = (
        gymnasium.vector.SyncVectorEnv
        if vectorization_mode == "sync"
        else gymnasium.vector.AsyncVectorEnv
    )
    return vector_class([make] * num_envs, autoreset_mode=AutoresetMode.SAME_STEP)


def _wrapped(
    factory: Callable[..., Any],
    wrappers: Sequence[Callable[[gymnasium.Env], gymnasium.Wrapper]],
    env_kwargs: dict[str, Any],
) -> gymnasium.Env:
    """One env of ``factory`` with ``wrappers`` applied, innermost first."""
    made = factory(**env_kwargs)
    for wrapper in wrappers:
        made = wrapper(made)
    return made


def _autoreset_mode(env: gymnasium.vector.VectorEnv) -> AutoresetMode:
    raw = (env.metadata or {}).get("autoreset_mode", AutoresetMode.NEXT_STEP)
    try:
        return AutoresetMode(raw)
    except ValueError as error:
        raise ConfigurationError(
            f"vector environment reports autoreset_mode {raw!r}, which gymnasium does not define"
        ) from error


def action_rescaling(action_space: gym_spaces.Box) -> tuple[np.ndarray, np.ndarray]:
    """``(half range, middle)`` that map actions in ``[-1, 1]`` onto ``action_space``'s bounds
    (``action * half_range + middle``).

    Raises:
        ConfigurationError: If the space is unbounded.
    """
    low = np.asarray(action_space.low, dtype=np.float64)
    high = np.asarray(action_space.high, dtype=np.float64)
    if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
        raise ConfigurationError(
            f"rescale_actions=True maps actions in [-1, 1] onto the action bounds, but the action "
            f"space {action_space} is unbounded — pass rescale_actions=False"
        )
    return (high - low) / 2.0, (high + low) / 2.0


class DictGymWrapper:
    """Steps a gymnasium vector environment with per-agent dict observations and responses.

    Args:
        env: A vector environment created in ``AutoresetMode.SAME_STEP`` (see
            :func:`make_vector_env`). Its observations are a ``Box`` or a ``Dict`` of ``Box``
            (and an ``action_mask`` for ``Discrete`` actions: see
            :meth:`~emote_core.spaces.MDPSpace.from_gymnasium`); its actions a ``Box`` or
            ``Discrete``.
        observation_key: The key a ``Box`` observation gets in :attr:`DictObservation.array_data`.
        rescale_actions: For ``Box`` actions, the agents act in ``[-1, 1]`` and the wrapper maps
            that range linearly onto the environment's bounds (values outside are clipped first);
            :attr:`spaces` then describes actions as ``[-1, 1]``.

    Raises:
        ConfigurationError: If the environment is not in ``SAME_STEP`` autoreset mode, its spaces
            are not supported, or ``rescale_actions`` meets an unbounded action space.
    """

    def __init__(
        self,
        env: gymnasium.vector.VectorEnv,
        *,
        observation_key: str = "obs",
        rescale_actions: bool = True,
    ) -> None:
        mode = _autoreset_mode(env)
        if mode is not AutoresetMode.SAME_STEP:
            raise ConfigurationError(
                f"DictGymWrapper needs a vector environment in AutoresetMode.SAME_STEP (the final "
                f"observation of each episode arrives in the same step); this one uses "
                f"{mode.name} — create it with emote_core.env.make_vector_env, or pass "
                "vector_kwargs={'autoreset_mode': gymnasium.vector.AutoresetMode.SAME_STEP} to "
                "gymnasium.make_vec"
            )
        self.env = env
        self.observation_key = observation_key
        single_action = env.single_action_space
        self._discrete = isinstance(single_action, gym_spaces.Discrete)
        self._rescale: tuple[np.ndarray, np.ndarray] | None = None
        if self._discrete:
            self._action_offset = int(single_action.start)
        elif isinstance(single_action, gym_spaces.Box):
            if rescale_actions:
                self._rescale = action_rescaling(single_action)
        else:
            raise ConfigurationError(
                f"DictGymWrapper supports Box and Discrete actions; the environment's action "
                f"space is {single_action}"
            )
        self._spaces = MDPSpace.from_gymnasium(
            env.single_observation_space, self.single_action_space, observation_key=observation_key
        )
        self._dict_observations = isinstance(env.single_observation_space, gym_spaces.Dict)
        # SyncVectorEnv(copy=False) hands out the same buffer every step; the episodes collected
        # downstream keep references to each step's rows, so such buffers are copied here.
        self._copy_observations = not getattr(env.unwrapped, "copy", True)
        self.plain_observation_key: str | None = (
            None if self._dict_observations or self._copy_observations else observation_key
        )
        """The key of a ``Box`` observation that :meth:`observation_batch` keeps as it came (a
        collector may build ``{key: observations}`` itself); ``None`` for others."""
        self._ids = itertools.count()
        self._agents: list[AgentId] = []
        self._returns = np.zeros(self.num_envs, dtype=np.float64)
        self._lengths = np.zeros(self.num_envs, dtype=np.int64)
        self.completed_episodes: list[tuple[float, int]] = []
        """``(return, length)`` of every episode finished since a collector last drained it."""

    @property
    def spaces(self) -> MDPSpace:
        """The MDP space of one agent, with actions in ``[-1, 1]`` when rescaling."""
        return self._spaces

    @property
    def num_envs(self) -> int:
        """Environments stepped together (one open episode each)."""
        return int(self.env.num_envs)

    @property
    def single_action_space(self) -> gymnasium.Space:
        """One agent's action space as agents see it.

        ``Box(-1, 1)`` when rescaling; ``Discrete(n)`` starting at 0 (an offset ``start`` of the
        environment's space is added back when stepping).
        """
        space = self.env.single_action_space
        if self._discrete:
            return gym_spaces.Discrete(int(space.n))
        if self._rescale is not None:
            return gym_spaces.Box(-1.0, 1.0, shape=space.shape, dtype=space.dtype)
        return space

    @property
    def env_action_space(self) -> gymnasium.Space:
        """One agent's action space as the environment takes it (its own bounds)."""
        return self.env.single_action_space

    @property
    def agents(self) -> list[AgentId]:
        """The ids of the open episodes, one per environment slot."""
        return list(self._agents)

    def reset(self, seed: int | None = None) -> dict[AgentId, DictObservation]:
        """Starts a new episode in every slot.

        Episodes still open are abandoned: their ids get no final observation.

        Args:
            seed: Seeds slot ``i`` with ``seed + i`` (gymnasium's rule); ``None`` leaves the
                environments' generators as they are.

        Returns:
            An ``INITIAL`` observation for every slot, under fresh agent ids.
        """
        observations, _ = self.env.reset(seed=seed)
        self._agents = [next(self._ids) for _ in range(self.num_envs)]
        self._returns[:] = 0.0
        self._lengths[:] = 0
        rows = self._split(observations)
        return {
            agent: DictObservation(episode_state=_INITIAL, array_data=row, rewards={})
            for agent, row in zip(self._agents, rows, strict=True)
        }

    def step(self, responses: Mapping[AgentId, DictResponse]) -> dict[AgentId, DictObservation]:
        """Sends every open episode's action and returns what followed.

        Args:
            responses: One response per open episode (``list_data["actions"]``): for ``Discrete``
                actions an integer array of shape ``(1,)``, for ``Box`` actions an array of the
                action shape. Responses for other agents are ignored.

        Returns:
            For each slot: a ``RUNNING`` observation under the slot's agent id, or, when its
            episode ended, the final observation (``TERMINAL`` for ``terminated``, else
            ``INTERRUPTED``) under that id and an ``INITIAL`` one under a new id.

        Raises:
            ConfigurationError: If :meth:`reset` was not called, or a response is missing or has
                no ``"actions"``.
        """
        if not self._agents:
            raise ConfigurationError("DictGymWrapper.step was called before reset(); reset first")
        actions = self._actions(responses)
        observations, rewards, terminated, truncated, infos = self.env.step(actions)
        rows = self._split(observations)
        rewards = np.asarray(rewards, dtype=np.float64)
        self._returns += rewards
        self._lengths += 1
        done = np.logical_or(terminated, truncated)
        reward_values = rewards.tolist()
        agents = self._agents
        result: dict[AgentId, DictObservation] = {}
        if not done.any():
            for agent, row, reward in zip(agents, rows, reward_values, strict=True):
                result[agent] = DictObservation(
                    episode_state=_RUNNING, array_data=row, rewards={REWARD_KEY: reward}
                )
            return result
        for slot, (agent, row, reward) in enumerate(zip(agents, rows, reward_values, strict=True)):
            if not done[slot]:
                result[agent] = DictObservation(
                    episode_state=_RUNNING, array_data=row, rewards={REWARD_KEY: reward}
                )
                continue
            state = EpisodeState.from_gymnasium(
                terminated=bool(terminated[slot]), truncated=bool(truncated[slot])
            )
            final = self.final_observation(infos, slot)
            result[agent] = DictObservation(
                episode_state=state, array_data=final, rewards={REWARD_KEY: reward}
            )
            self.completed_episodes.append((float(self._returns[slot]), int(self._lengths[slot])))
            self._returns[slot] = 0.0
            self._lengths[slot] = 0
            new_agent = next(self._ids)
            agents[slot] = new_agent
            result[new_agent] = DictObservation(episode_state=_INITIAL, array_data=row, rewards={})
        return result

    def drain_completed_episodes(self) -> list[tuple[float, int]]:
        """Returns and forgets the ``(return, length)`` of the episodes finished so far."""
        completed, self.completed_episodes = self.completed_episodes, []
        return completed

    def close(self) -> None:
        """Closes the vector environment."""
        self.env.close()

    def _actions(self, responses: Mapping[AgentId, DictResponse]) -> np.ndarray:
        try:
            per_slot = [responses[agent].list_data[ACTIONS_KEY] for agent in self._agents]
        except KeyError:
            raise self._response_error(responses) from None
        if self._discrete:
            try:
                stacked = np.asarray(per_slot, dtype=np.int64).reshape(self.num_envs, -1)
            except ValueError:
                stacked = None
            if stacked is None or stacked.shape[1] != 1:
                raise ConfigurationError(
                    f"discrete actions must be one integer per agent (shape (1,)); got shapes "
                    f"{sorted({np.shape(a) for a in per_slot})}"
                )
            return self.env_actions(stacked)
        space = self.env.single_action_space
        try:
            stacked = np.asarray(per_slot).reshape((self.num_envs, *space.shape))
        except ValueError as error:
            raise ConfigurationError(
                f"actions must have the action space's shape {space.shape}; got shapes "
                f"{sorted({np.shape(a) for a in per_slot})}"
            ) from error
        return self.env_actions(stacked)

    def env_actions(self, actions: np.ndarray, *, steps: int | None = None) -> np.ndarray:
        """Every slot's action as the vector environment takes it.

        Args:
            actions: ``(num_envs, *action shape)`` in the agents' action space
                (:attr:`single_action_space`): ``[-1, 1]`` boxes are clipped and mapped onto the
                environment's bounds; discrete indices (``(num_envs, 1)`` or ``(num_envs,)``) get
                the space's ``start`` added.
            steps: The actions of this many vector steps at once: ``(steps, num_envs, ...)`` in,
                ``(steps, num_envs, ...)`` out.
        """
        if self._discrete:
            shape = (self.num_envs,) if steps is None else (steps, self.num_envs)
            return actions.reshape(shape) + self._action_offset
        if self._rescale is not None:
            half_range, middle = self._rescale
            # ufuncs rather than np.clip: this runs every step and np.clip's dispatch is slow.
            clipped = np.minimum(np.maximum(actions, -1.0), 1.0)
            actions = clipped * half_range + middle
        return actions.astype(self.env.single_action_space.dtype, copy=False)

    def _response_error(self, responses: Mapping[AgentId, DictResponse]) -> ConfigurationError:
        for agent in self._agents:
            response = responses.get(agent)
            if response is None:
                return ConfigurationError(
                    f"DictGymWrapper.step got no response for agent {agent}, whose episode is "
                    f"open; every INITIAL or RUNNING observation needs a response (open agents: "
                    f"{self._agents}, responses for: {sorted(responses)})"
                )
            if ACTIONS_KEY not in response.list_data:
                return ConfigurationError(
                    f"the response for agent {agent} has no '{ACTIONS_KEY}' in list_data (it has "
                    f"{sorted(response.list_data)})"
                )
        return ConfigurationError("DictGymWrapper.step could not read the responses' actions")

    def observation_batch(self, observations: Any) -> dict[str, np.ndarray]:
        """The vector environment's observations as ``{key: (num_envs, ...)}`` arrays.

        The arrays are the step's own (copied when the environment reuses its buffers), so they
        may be kept.
        """
        if self._dict_observations:
            return {
                k: np.array(v, copy=True) if self._copy_observations else np.asarray(v)
                for k, v in observations.items()
            }
        array = np.array(observations, copy=True) if self._copy_observations else observations
        return {self.observation_key: array}

    def _split(self, observations: Any) -> list[dict[str, np.ndarray]]:
        """Per-slot observation dicts (views into the step's arrays)."""
        batch = self.observation_batch(observations)
        return [{k: v[slot] for k, v in batch.items()} for slot in range(self.num_envs)]

    def final_observation(self, infos: Mapping[str, Any], slot: int) -> dict[str, np.ndarray]:
        """A copy of the true final observation of ``slot``'s episode, which ended in this step.

        Raises:
            ConfigurationError: If the environment did not report it.
        """
        final = infos.get("final_obs")
        mask = infos.get("_final_obs")
        if final is None or mask is None or not mask[slot]:
            raise ConfigurationError(
                "the vector environment ended an episode without reporting infos['final_obs']; "
                "DictGymWrapper needs AutoresetMode.SAME_STEP environments that report it"
            )
        observation = final[slot]
        if self._dict_observations:
            return {k: np.array(v, copy=True) for k, v in observation.items()}
        return {self.observation_key: np.array(observation, copy=True)}

    def __repr__(self) -> str:
        return f"DictGymWrapper(num_envs={self.num_envs}, spaces={self._spaces!r})"


__all__ = ["ACTIONS_KEY", "REWARD_KEY", "DictGymWrapper", "action_rescaling", "make_vector_env"]
