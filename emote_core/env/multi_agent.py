"""Multi-agent environments: PettingZoo's Parallel API as per-agent dict observations.

Every life of a PettingZoo agent in an environment episode is one emote episode under a fresh
:data:`~emote_core.typing.AgentId`: an agent that appears in ``env.agents`` mid-episode starts
with an ``INITIAL`` observation, one that leaves ends ``TERMINAL`` (terminated) or
``INTERRUPTED`` (truncated, or gone without either flag). When no agent is left the environment
is reset.

Agents with identical observation and action spaces form an :class:`AgentGroup` and share one
policy. An agent id encodes the agent: ``id % len(agent_names)`` is its index in the
environment's ``possible_agents`` (:meth:`ParallelEnvWrapper.agent_name`), so stores that keep
episode ids keep each episode's agent and group with no column of their own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces as gym_spaces

from emote_core.env.dict_gym import ACTIONS_KEY, REWARD_KEY, action_rescaling
from emote_core.env.making import is_parallel_env
from emote_core.errors import ConfigurationError
from emote_core.memory.proxy import REWARDS_COLUMN, Episode
from emote_core.spaces import MDPSpace
from emote_core.stores.episode_batch import EpisodeBatch
from emote_core.typing import AgentId, DictObservation, DictResponse, EpisodeState

_INITIAL = EpisodeState.INITIAL
_RUNNING = EpisodeState.RUNNING
_FINAL = (EpisodeState.TERMINAL, EpisodeState.INTERRUPTED)


@dataclass(frozen=True)
class AgentGroup:
    """Agents with identical spaces, acting with one shared policy.

    Attributes:
        name: The agents' common name prefix (``"agent"`` for ``agent_0``, ``agent_1``), else
            ``group_<k>``.
        agents: The PettingZoo agent names, in ``possible_agents`` order.
        observation_space: Their observation space.
        action_space: Their action space (the environment's own).
    """

    name: str
    agents: tuple[str, ...]
    observation_space: gymnasium.Space = field(repr=False)
    action_space: gymnasium.Space = field(repr=False)

    def to_json(self) -> dict[str, Any]:
        """``{"name", "agents"}``: what a store records of the group."""
        return {"name": self.name, "agents": list(self.agents)}


def _prefix(name: str) -> str:
    head, _, tail = name.rpartition("_")
    return head if head and tail.isdigit() else name


def agent_groups(env: Any) -> list[AgentGroup]:
    """Groups ``env``'s ``possible_agents`` by identical (observation, action) spaces.

    Groups are ordered by their first agent. A group is named by its agents' common name prefix
    when they share one that no other group has, else ``group_<k>``.

    Raises:
        ConfigurationError: If the env lists no ``possible_agents``.
    """
    names = list(getattr(env, "possible_agents", None) or ())
    if not names:
        raise ConfigurationError(
            f"the PettingZoo env {type(env).__name__} lists no possible_agents; a Parallel env "
            "must name every agent that can appear in possible_agents"
        )
    members: list[tuple[gymnasium.Space, gymnasium.Space, list[str]]] = []
    for name in names:
        observation, action = env.observation_space(name), env.action_space(name)
        for group_observation, group_action, agents in members:
            if observation == group_observation and action == group_action:
                agents.append(name)
                break
        else:
            members.append((observation, action, [name]))
    prefixes = [{_prefix(a) for a in agents} for *_, agents in members]
    groups = []
    for k, (observation, action, agents) in enumerate(members):
        prefix = prefixes[k]
        shared = next(iter(prefix)) if len(prefix) == 1 else None
        unique = shared is not None and sum(shared in other for other in prefixes) == 1
        groups.append(
            AgentGroup(shared if unique else f"group_{k}", tuple(agents), observation, action)
        )
    return groups


class _Actions:
    """Converts an agent's action from the agents' space to the environment's."""

    def __init__(self, space: gymnasium.Space, rescale: bool) -> None:
        self.discrete = isinstance(space, gym_spaces.Discrete)
        self.rescale: tuple[np.ndarray, np.ndarray] | None = None
        if self.discrete:
            self.offset = int(space.start)
            self.agent_space: gymnasium.Space = gym_spaces.Discrete(int(space.n))
        elif isinstance(space, gym_spaces.Box):
            self.dtype = space.dtype
            self.shape = space.shape
            self.agent_space = space
            if rescale:
                self.rescale = action_rescaling(space)
                self.agent_space = gym_spaces.Box(-1.0, 1.0, shape=space.shape, dtype=space.dtype)
        else:
            raise ConfigurationError(
                f"multi-agent envs may have Box and Discrete actions; an agent's action space is "
                f"{space}"
            )

    def __call__(self, action: Any) -> Any:
        array = np.asarray(action)
        if self.discrete:
            if array.size != 1:
                raise ConfigurationError(
                    f"discrete actions must be one integer per agent (shape (1,)); got shape "
                    f"{array.shape}"
                )
            return int(array.reshape(())) + self.offset
        try:
            array = array.reshape(self.shape)
        except ValueError:
            raise ConfigurationError(
                f"actions must have the action space's shape {self.shape}; got shape {array.shape}"
            ) from None
        if self.rescale is not None:
            half_range, middle = self.rescale
            array = np.minimum(np.maximum(array, -1.0), 1.0) * half_range + middle
        return array.astype(self.dtype, copy=False)


@dataclass
class EnvEpisode:
    """One finished episode of a multi-agent environment.

    Attributes:
        team_return: The sum of every agent's rewards.
        length: Environment steps.
        group_returns: Group name -> the return of each agent life in the group.
    """

    team_return: float
    length: int
    group_returns: dict[str, list[float]]


class ParallelEnvWrapper:
    """Steps PettingZoo Parallel environments with per-agent dict observations and responses.

    Offers what collectors and the assembly use of
    :class:`~emote_core.env.dict_gym.DictGymWrapper`: :attr:`spaces`, :attr:`num_envs`,
    :attr:`single_action_space`, :meth:`reset`, :meth:`step`, :meth:`drain_completed_episodes`.

    Args:
        envs: Copies of one PettingZoo ``ParallelEnv`` (same agents and spaces), stepped together.
        observation_key: The key a ``Box`` observation gets in :attr:`DictObservation.array_data`.
        rescale_actions: For ``Box`` actions, agents act in ``[-1, 1]``, mapped linearly onto the
            environment's bounds (see ``DictGymWrapper``).

    Raises:
        ConfigurationError: If no env is given, the copies differ, or an agent's spaces are not
            supported.
    """

    def __init__(
        self,
        envs: Sequence[Any],
        *,
        observation_key: str = "obs",
        rescale_actions: bool = True,
    ) -> None:
        if not envs:
            raise ConfigurationError("ParallelEnvWrapper needs at least one env; got none")
        self.envs = list(envs)
        self.observation_key = observation_key
        self.groups = agent_groups(self.envs[0])
        """The agent groups, one policy each."""
        self.agent_names: tuple[str, ...] = tuple(self.envs[0].possible_agents)
        """``possible_agents``: an agent id's ``id % len(agent_names)`` indexes it."""
        for env in self.envs[1:]:
            if tuple(env.possible_agents) != self.agent_names:
                raise ConfigurationError(
                    f"the envs of one ParallelEnvWrapper must have the same agents; got "
                    f"{list(self.agent_names)} and {list(env.possible_agents)}"
                )
        self._index = {name: k for k, name in enumerate(self.agent_names)}
        self._group_of = {name: g for g in self.groups for name in g.agents}
        group_actions = {g.name: _Actions(g.action_space, rescale_actions) for g in self.groups}
        self._actions = {name: group_actions[g.name] for name, g in self._group_of.items()}
        self._group_spaces = {
            g.name: MDPSpace.from_gymnasium(
                g.observation_space,
                group_actions[g.name].agent_space,
                observation_key=observation_key,
            )
            for g in self.groups
        }
        self._dict_observations = {
            g.name: isinstance(g.observation_space, gym_spaces.Dict) for g in self.groups
        }
        self._lives = [0] * len(self.agent_names)
        self._open: list[dict[str, AgentId]] = [{} for _ in self.envs]
        self._returns: dict[AgentId, float] = {}
        self._lengths: dict[AgentId, int] = {}
        self._env_lengths = [0] * len(self.envs)
        self._env_returns: list[dict[str, list[float]]] = [{} for _ in self.envs]
        self._started = False
        self.completed_episodes: list[tuple[float, int]] = []
        """``(return, length)`` of every agent life finished since a collector drained them."""
        self.completed_env_episodes: list[EnvEpisode] = []
        """Every environment episode finished since :meth:`drain_completed_env_episodes`."""

    # What collectors and the assembly read.

    @property
    def spaces(self) -> MDPSpace:
        """The MDP space of every agent, which must form one group.

        Raises:
            ConfigurationError: If the env has agents of more than one group (each group's
                policy takes :meth:`group_spaces` instead).
        """
        if len(self.groups) > 1:
            raise ConfigurationError(
                f"this multi-agent env has {len(self.groups)} agent groups with different spaces "
                f"({describe_groups(self.groups)}); this needs one policy for every agent — "
                "train, evaluate, export and collect with one policy per group instead, or give "
                "every agent the same observation and action spaces (pad them, as SuperSuit's "
                "pad_observations_v0 and pad_action_space_v0 do)"
            )
        return self._group_spaces[self.groups[0].name]

    def group_spaces(self, group: str) -> MDPSpace:
        """The MDP space of the agents of ``group``."""
        return self._group_spaces[group]

    def group_action_space(self, group: str) -> gymnasium.Space:
        """The action space of ``group``'s agents as they see it (see
        :attr:`single_action_space`)."""
        agents = next(g.agents for g in self.groups if g.name == group)
        return self._actions[agents[0]].agent_space

    @property
    def num_envs(self) -> int:
        """Environments stepped together."""
        return len(self.envs)

    @property
    def single_action_space(self) -> gymnasium.Space:
        """The one group's action space as agents see it (``[-1, 1]`` boxes when rescaling)."""
        self.spaces  # noqa: B018 - refuses several groups
        return self._actions[self.groups[0].agents[0]].agent_space

    @property
    def env_action_space(self) -> gymnasium.Space:
        """The one group's action space as the environment takes it."""
        self.spaces  # noqa: B018 - refuses several groups
        return self.groups[0].action_space

    @property
    def agents(self) -> list[AgentId]:
        """The ids of the open agent lives."""
        return [agent for open_ in self._open for agent in open_.values()]

    def agent_name(self, agent: AgentId) -> str:
        """The PettingZoo name of the agent whose life ``agent`` is."""
        return self.agent_names[int(agent) % len(self.agent_names)]

    def group_of(self, agent: AgentId) -> str:
        """The group name of the agent whose life ``agent`` is."""
        return self._group_of[self.agent_name(agent)].name

    # Stepping.

    def reset(self, seed: int | None = None) -> dict[AgentId, DictObservation]:
        """Starts a new episode in every env; lives still open are abandoned.

        Args:
            seed: Seeds env ``i`` with ``seed + i``; ``None`` leaves their generators as they are.

        Returns:
            An ``INITIAL`` observation for every agent present, under fresh ids.
        """
        result: dict[AgentId, DictObservation] = {}
        self._returns.clear()
        self._lengths.clear()
        for slot in range(self.num_envs):
            self._open[slot] = {}
            self._start(slot, None if seed is None else seed + slot, result)
        self._started = True
        return result

    def step(self, responses: Mapping[AgentId, DictResponse]) -> dict[AgentId, DictObservation]:
        """Sends every open agent's action and returns what followed.

        Args:
            responses: One response per open agent (``list_data["actions"]``).

        Returns:
            Per agent life: ``RUNNING``, or its final observation (``TERMINAL`` or
            ``INTERRUPTED``); ``INITIAL`` for agents that joined and, where an env's episode
            ended, for the agents of its next one.

        Raises:
            ConfigurationError: If :meth:`reset` was not called, a response is missing, or the env
                drops an agent without its final observation.
        """
        if not self._started:
            raise ConfigurationError(
                "ParallelEnvWrapper.step was called before reset(); reset first"
            )
        result: dict[AgentId, DictObservation] = {}
        for slot, env in enumerate(self.envs):
            open_ = self._open[slot]
            actions = {}
            for name, agent in open_.items():
                response = responses.get(agent)
                if response is None or ACTIONS_KEY not in response.list_data:
                    raise ConfigurationError(
                        f"ParallelEnvWrapper.step got no '{ACTIONS_KEY}' for agent {agent} "
                        f"('{name}'), whose episode is open; every INITIAL or RUNNING observation "
                        "needs a response"
                    )
                actions[name] = self._actions[name](response.list_data[ACTIONS_KEY])
            observations, rewards, terminations, truncations, _ = env.step(actions)
            self._env_lengths[slot] += 1
            present = list(env.agents)  # read once: PettingZoo's wrappers make it slow to read
            alive = set(present)
            for name, agent in list(open_.items()):
                reward = float(rewards.get(name, 0.0))
                self._returns[agent] += reward
                self._lengths[agent] += 1
                terminated = bool(terminations.get(name, False))
                truncated = bool(truncations.get(name, False))
                done = terminated or truncated or name not in alive
                if name not in observations:
                    raise ConfigurationError(
                        f"the env's step returned no observation for agent '{name}', which acted; "
                        "a Parallel env must observe every agent that acted, also in the step "
                        "that ends it"
                    )
                row = self._row(name, observations[name])
                if not done:
                    result[agent] = DictObservation(
                        episode_state=_RUNNING, array_data=row, rewards={REWARD_KEY: reward}
                    )
                    continue
                state = EpisodeState.TERMINAL if terminated else EpisodeState.INTERRUPTED
                result[agent] = DictObservation(
                    episode_state=state, array_data=row, rewards={REWARD_KEY: reward}
                )
                del open_[name]
                self._finish(slot, name, agent)
            for name in present:  # agents that joined in this step
                if name not in open_:
                    if name not in observations:
                        raise ConfigurationError(
                            f"agent '{name}' joined the env without an observation; a Parallel "
                            "env must observe every agent in env.agents after each step"
                        )
                    self._open_life(slot, name, observations[name], result)
            if not present:
                self._end_env_episode(slot, result)
        return result

    def drain_completed_episodes(self) -> list[tuple[float, int]]:
        """Returns and forgets the ``(return, length)`` of the agent lives finished so far."""
        completed, self.completed_episodes = self.completed_episodes, []
        return completed

    def drain_completed_env_episodes(self) -> list[EnvEpisode]:
        """Returns and forgets the environment episodes finished so far."""
        completed, self.completed_env_episodes = self.completed_env_episodes, []
        return completed

    def close(self) -> None:
        """Closes every env."""
        for env in self.envs:
            env.close()

    # Parts.

    def _start(self, slot: int, seed: int | None, result: dict[AgentId, DictObservation]) -> None:
        observations, _ = self.envs[slot].reset(seed=seed)
        self._env_lengths[slot] = 0
        self._env_returns[slot] = {}
        for name in self.envs[slot].agents:
            if name not in observations:
                raise ConfigurationError(
                    f"the env's reset returned no observation for agent '{name}', which is in "
                    "env.agents; reset must observe every agent present"
                )
            self._open_life(slot, name, observations[name], result)

    def _open_life(
        self, slot: int, name: str, observation: Any, result: dict[AgentId, DictObservation]
    ) -> None:
        index = self._index.get(name)
        if index is None:
            raise ConfigurationError(
                f"agent '{name}' is not in the env's possible_agents {list(self.agent_names)}; "
                "a Parallel env must list every agent that can appear"
            )
        agent = self._lives[index] * len(self.agent_names) + index
        self._lives[index] += 1
        self._open[slot][name] = agent
        self._returns[agent] = 0.0
        self._lengths[agent] = 0
        result[agent] = DictObservation(
            episode_state=_INITIAL, array_data=self._row(name, observation), rewards={}
        )

    def _finish(self, slot: int, name: str, agent: AgentId) -> None:
        episode_return = self._returns.pop(agent)
        self.completed_episodes.append((episode_return, self._lengths.pop(agent)))
        group = self._group_of[name].name
        self._env_returns[slot].setdefault(group, []).append(episode_return)

    def _end_env_episode(self, slot: int, result: dict[AgentId, DictObservation]) -> None:
        for name, agent in list(self._open[slot].items()):  # gone without a word: cut short
            previous = result.get(agent)
            if previous is not None:
                result[agent] = DictObservation(
                    episode_state=EpisodeState.INTERRUPTED,
                    array_data=previous.array_data,
                    rewards=previous.rewards,
                )
                self._finish(slot, name, agent)
            else:
                self._returns.pop(agent, None)
                self._lengths.pop(agent, None)
        self._open[slot] = {}
        groups = self._env_returns[slot]
        self.completed_env_episodes.append(
            EnvEpisode(
                team_return=float(sum(sum(returns) for returns in groups.values())),
                length=self._env_lengths[slot],
                group_returns=groups,
            )
        )
        self._start(slot, None, result)

    def _row(self, name: str, observation: Any) -> dict[str, np.ndarray]:
        if self._dict_observations[self._group_of[name].name]:
            return {k: np.array(v, copy=True) for k, v in observation.items()}
        return {self.observation_key: np.array(observation, copy=True)}

    def __repr__(self) -> str:
        return (
            f"ParallelEnvWrapper(num_envs={self.num_envs}, groups=[{describe_groups(self.groups)}])"
        )


def describe_groups(groups: Sequence[AgentGroup]) -> str:
    """``"adversary: adversary_0; agent: agent_0, agent_1"``."""
    return "; ".join(f"{g.name}: {', '.join(g.agents)}" for g in groups)


def wrap_parallel_env(
    make: Callable[..., Any], *, num_envs: int, render_mode: str | None = None
) -> ParallelEnvWrapper:
    """``num_envs`` envs from ``make(render_mode=...)``, as one :class:`ParallelEnvWrapper`.

    Raises:
        ConfigurationError: If ``num_envs`` is not positive or ``make`` returns something that is
            not a PettingZoo ``ParallelEnv``.
    """
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
        raise ConfigurationError(f"num_envs must be a positive integer; got {num_envs!r}")
    envs = []
    try:
        for _ in range(num_envs):
            env = make(render_mode=render_mode) if render_mode is not None else make()
            if not is_parallel_env(env):
                raise ConfigurationError(
                    f"a multi-agent env must be a pettingzoo.ParallelEnv; got "
                    f"{type(env).__name__} — return env.parallel_env(...), or wrap an AEC env "
                    "with pettingzoo.utils.conversions.aec_to_parallel"
                )
            envs.append(env)
        return ParallelEnvWrapper(envs)
    except BaseException:
        for env in envs:
            env.close()
        raise


class ParallelEnvCollector:
    """Plays a :class:`ParallelEnvWrapper` with an agent and hands out finished agent lives.

    What ``emote collect`` runs for a multi-agent env, in the place of
    :class:`~emote_core.env.batch_collector.BatchGymCollector` (same calls). Each agent life
    becomes one episode whose identity is its agent id.

    Args:
        env: The wrapped envs.
        agent: Answers all agents' observations of a step in one call.
        on_batch: Receives the finished episodes at each :meth:`cut`, one batch per agent group
            (:meth:`ParallelEnvWrapper.group_of` its first identity tells which).
        seed: Seeds the envs' first reset.
    """

    def __init__(
        self,
        *,
        env: ParallelEnvWrapper,
        agent: Any,
        on_batch: Callable[[EpisodeBatch], None] | None = None,
        seed: int | None = None,
    ) -> None:
        self.env = env
        self.agent = agent
        self.on_batch = on_batch
        self.seed = seed
        self.env_steps = 0
        """Agent steps taken (each acting agent's step counts one: a transition)."""
        self.completed_episodes = 0
        """Agent lives finished."""
        self._observations: dict[AgentId, DictObservation] | None = None
        self._episodes: dict[AgentId, Episode] = {}
        self._finished: list[tuple[int, dict[str, np.ndarray], EpisodeState]] = []

    @property
    def started(self) -> bool:
        """Whether the envs have been reset (by the first :meth:`collect`)."""
        return self._observations is not None

    def collect(self, steps: int) -> int:
        """Takes ``steps`` steps of every env.

        Returns:
            The agent steps taken (transitions, finished or not).
        """
        episodes = self._episodes
        observations = self._observations
        if observations is None:
            observations = self._received(self.env.reset(seed=self.seed))
        taken = 0
        for _ in range(steps):
            responses = self.agent(observations)
            for agent in observations:
                episodes[agent].add_action(responses[agent].list_data)
            stepped = self.env.step(responses)
            taken += len(observations)
            self.env_steps += len(observations)
            observations = self._received(stepped)
            self._observations = observations
        self._observations = observations
        return taken

    def _received(self, observations: dict[AgentId, DictObservation]) -> dict[AgentId, Any]:
        """Records what the env returned; returns the observations that need an action."""
        episodes, acting = self._episodes, {}
        for agent, observation in observations.items():
            state = observation.episode_state
            if state is _INITIAL:
                episodes[agent] = Episode(observation.array_data)
                acting[agent] = observation
                continue
            episode = episodes[agent]
            episode.add_transition(observation.rewards[REWARD_KEY], observation.array_data)
            if state in _FINAL:
                del episodes[agent]
                self._finished.append((int(agent), episode.to_sequence(), state))
                self.completed_episodes += 1
            else:
                acting[agent] = observation
        return acting

    def switch_agent(self, agent: Any) -> None:
        """Acts with ``agent`` from the next step on."""
        self.agent = agent

    def cut(self) -> None:
        """Hands out every agent life finished so far: one batch per agent group."""
        finished, self._finished = self._finished, []
        if not finished or self.on_batch is None:
            return
        by_group: dict[str, list[tuple[int, dict[str, np.ndarray], EpisodeState]]] = {}
        for episode in finished:
            by_group.setdefault(self.env.group_of(episode[0]), []).append(episode)
        for episodes in by_group.values():
            first = episodes[0][1]
            steps = len(first[REWARDS_COLUMN])  # observations have one row more
            extra_rows = {name: int(len(rows) == steps + 1) for name, rows in first.items()}
            self.on_batch(EpisodeBatch.of(episodes, extra_rows))

    cut_finished = cut

    def drain_completed_episodes(self) -> list[tuple[float, int]]:
        """The ``(return, length)`` of the agent lives finished since the last call."""
        return self.env.drain_completed_episodes()


class GroupAgents:
    """Acts for the agents of several groups, each group's with an agent of its own.

    Args:
        env: Tells each agent id's group (any copy of the env: ids encode the agent).
        agents: Group name -> the agent that answers for its agents.
    """

    def __init__(self, env: ParallelEnvWrapper, agents: Mapping[str, Any]) -> None:
        self.env = env
        self.agents = dict(agents)

    def random_generators(self) -> dict[str, Any]:
        """Every group's agent's generators, named ``<group>.<name>``, for checkpoints."""
        generators: dict[str, Any] = {}
        for group, agent in self.agents.items():
            owned = getattr(agent, "random_generators", None)
            if callable(owned):
                generators.update({f"{group}.{k}": g for k, g in owned().items()})
        return generators

    def __call__(
        self, observations: Mapping[AgentId, DictObservation]
    ) -> dict[AgentId, DictResponse]:
        """Every group's agent answers its agents' observations."""
        by_group: dict[str, dict[AgentId, DictObservation]] = {}
        for agent, observation in observations.items():
            by_group.setdefault(self.env.group_of(agent), {})[agent] = observation
        responses: dict[AgentId, DictResponse] = {}
        for group, part in by_group.items():
            responses.update(self.agents[group](part))
        return responses


class GroupMemories:
    """Routes every agent's steps to the memory proxy of its group (one table per group).

    Args:
        env: Tells each agent id's group (any copy of the env: ids encode the agent).
        memories: Group name -> the memory proxy its agents' episodes go to.
    """

    accepts_episodes = False
    """Takes steps (``add``), not whole episodes: a multi-agent env is collected step by step."""

    def __init__(self, env: ParallelEnvWrapper, memories: Mapping[str, Any]) -> None:
        self.env = env
        self.memories = dict(memories)

    def add(
        self,
        observations: Mapping[AgentId, DictObservation],
        responses: Mapping[AgentId, DictResponse],
    ) -> None:
        """Hands each group's memory its agents' observations and responses of this step."""
        by_group: dict[str, dict[AgentId, DictObservation]] = {}
        for agent, observation in observations.items():
            by_group.setdefault(self.env.group_of(agent), {})[agent] = observation
        for group, part in by_group.items():
            self.memories[group].add(part, {a: responses[a] for a in part if a in responses})


def several_groups(env: Any) -> list[AgentGroup]:
    """The agent groups of a multi-agent env whose agents form more than one group, which takes
    one policy per group; ``[]`` for any other env (one policy for every agent)."""
    groups = list(getattr(env, "groups", ()) or ())
    return groups if isinstance(env, ParallelEnvWrapper) and len(groups) > 1 else []


def random_group_agents(env: ParallelEnvWrapper, seed: int) -> GroupAgents:
    """Uniformly random actions for every group's agents (group ``k`` seeded ``seed + k``),
    among the legal ones where a group's observations carry an ``action_mask``."""
    from emote_core.proxies import RandomAgentProxy

    return GroupAgents(
        env,
        {
            g.name: RandomAgentProxy(
                action_space=env.group_action_space(g.name),
                seed=seed + k,
                action_mask_key=env.group_spaces(g.name).action_mask_key,
            )
            for k, g in enumerate(env.groups)
        },
    )


def group_store(out: str, group: str, suffix: str = "zarr") -> str:
    """Where ``emote collect --out OUT`` writes the store of agent group ``group`` of an env with
    several: ``spread.zarr`` -> ``spread.<group>.zarr`` (``OUT.<group>`` without the suffix);
    with ``suffix="onnx"``, where ``emote export onnx`` writes each group's policy."""
    stem, dot, found = out.rstrip("/").rpartition(".")
    if dot and found == suffix and stem and not stem.endswith("/"):
        return f"{stem}.{group}.{suffix}"
    return f"{out.rstrip('/')}.{group}"


def parallel_env_record(env: ParallelEnvWrapper) -> dict[str, Any]:
    """What a store records of a multi-agent env: its agents (by id index) and groups."""
    return {"agents": list(env.agent_names), "groups": [g.to_json() for g in env.groups]}


__all__ = [
    "AgentGroup",
    "EnvEpisode",
    "GroupAgents",
    "GroupMemories",
    "ParallelEnvCollector",
    "ParallelEnvWrapper",
    "agent_groups",
    "describe_groups",
    "group_store",
    "parallel_env_record",
    "random_group_agents",
    "several_groups",
    "wrap_parallel_env",
]
