"""Multi-agent envs through PettingZoo's Parallel API: agent lives as episodes, groups, stores."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces as gym_spaces
from mpe2 import simple_adversary_v3, simple_spread_v3
from pettingzoo import ParallelEnv
from pettingzoo.test import parallel_api_test

from emote_core.env import GymCollector
from emote_core.env.multi_agent import (
    GroupMemories,
    ParallelEnvCollector,
    ParallelEnvWrapper,
    agent_groups,
    group_store,
    random_group_agents,
    several_groups,
    wrap_parallel_env,
)
from emote_core.errors import ConfigurationError
from emote_core.memory import DictObsMemoryTable
from emote_core.memory.proxy import MemoryTableProxy
from emote_core.proxies import RandomAgentProxy
from emote_core.stores.episode_batch import EpisodeBatch
from emote_core.typing import DictResponse, EpisodeState

TERMINAL, INTERRUPTED = int(EpisodeState.TERMINAL), int(EpisodeState.INTERRUPTED)

# Agent -> (step it joins after, step it leaves at, how): runner_0 terminates after 2 steps,
# runner_1 is truncated after 3, late_0 joins after step 1 and terminates at step 4, runner_2
# terminates at step 5, which ends the env's episode.
SCHEDULE = {
    "runner_0": (0, 2, "terminated"),
    "runner_1": (0, 3, "truncated"),
    "runner_2": (0, 5, "terminated"),
    "late_0": (1, 4, "terminated"),
}
LIVES = {"runner_0": 2, "runner_1": 3, "runner_2": 5, "late_0": 3}
ENDS = {"runner_0": TERMINAL, "runner_1": INTERRUPTED, "runner_2": TERMINAL, "late_0": TERMINAL}


class StaggeredEnv(ParallelEnv):
    """Agents that join and leave at different steps; observation ``[agent index, step, 1]``,
    reward ``agent index + 1`` per step; actions recorded in ``received``."""

    metadata = {"name": "staggered_v0", "render_modes": []}

    def __init__(self, render_mode: str | None = None, action_space: Any = None) -> None:
        self.possible_agents = list(SCHEDULE)
        self.render_mode = render_mode
        self._action_space = action_space or gym_spaces.Discrete(3)
        self.agents: list[str] = []
        self.received: list[dict[str, Any]] = []
        self.step_count = 0

    @functools.cache  # noqa: B019 - PettingZoo's API test wants one object
    def observation_space(self, agent: str) -> gymnasium.Space:
        return gym_spaces.Box(0.0, 10.0, shape=(3,), dtype=np.float32)

    @functools.cache  # noqa: B019
    def action_space(self, agent: str) -> gymnasium.Space:
        return self._action_space

    def _observe(self, agent: str) -> np.ndarray:
        return np.array([self.possible_agents.index(agent), self.step_count, 1], np.float32)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.step_count = 0
        self.agents = [a for a, (join, _, _) in SCHEDULE.items() if join == 0]
        return {a: self._observe(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        self.received.append(dict(actions))
        self.step_count += 1
        acting = list(self.agents)
        leaving = {a: SCHEDULE[a][2] for a in acting if SCHEDULE[a][1] == self.step_count}
        joining = [a for a, (join, _, _) in SCHEDULE.items() if join == self.step_count]
        present = acting + joining
        observations = {a: self._observe(a) for a in present}
        rewards = {a: float(self.possible_agents.index(a) + 1) if a in acting else 0.0
                   for a in present}  # fmt: skip
        terminations = {a: leaving.get(a) == "terminated" for a in present}
        truncations = {a: leaving.get(a) == "truncated" for a in present}
        self.agents = [a for a in present if a not in leaving]
        return observations, rewards, terminations, truncations, {a: {} for a in present}


def staggered(**kwargs: Any) -> ParallelEnvWrapper:
    return ParallelEnvWrapper([StaggeredEnv(**kwargs)])


def collected(env: ParallelEnvWrapper, env_steps: int, seed: int = 0) -> EpisodeBatch:
    agent = RandomAgentProxy(action_space=env.single_action_space, seed=seed)
    batches: list[EpisodeBatch] = []
    collector = ParallelEnvCollector(env=env, agent=agent, on_batch=batches.append, seed=seed)
    collector.collect(env_steps)
    collector.cut()
    return EpisodeBatch.join(batches)


def test_the_staggered_env_passes_pettingzoo_parallel_api_test() -> None:
    parallel_api_test(StaggeredEnv(), num_cycles=20)


def test_every_agent_life_is_one_episode_with_its_own_length_and_end_state() -> None:
    env = staggered()
    batch = collected(env, 10)  # two env episodes of 5 steps
    names = [env.agent_name(i) for i in batch.identities.tolist()]
    assert sorted(names) == sorted(list(SCHEDULE) * 2)
    assert len(set(batch.identities.tolist())) == len(batch) == 8
    for name, length, end in zip(names, batch.lengths, batch.end_states, strict=True):
        assert (int(length), int(end)) == (LIVES[name], ENDS[name]), name
    # Observations: N + 1 rows per life; a late joiner's first row is the step it joined at.
    for identity, sequence, _ in batch.episodes():
        name = env.agent_name(identity)
        steps = sequence["obs"][:, 1].tolist()
        assert steps == list(range(SCHEDULE[name][0], SCHEDULE[name][1] + 1))
        assert sequence["rewards"].tolist() == [env.agent_names.index(name) + 1.0] * LIVES[name]
    team = env.drain_completed_env_episodes()
    assert [(e.length, e.team_return) for e in team] == [(5, 2 * 1 + 3 * 2 + 5 * 3 + 3 * 4)] * 2


def test_the_training_collector_stores_one_table_episode_per_agent_life() -> None:
    env = staggered()
    table = DictObsMemoryTable(spaces=env.spaces, maxlen=1_000)
    agent = RandomAgentProxy(action_space=env.single_action_space, seed=1)
    collector = GymCollector(env=env, agent=agent, memory=MemoryTableProxy(table), seed=0)
    assert not collector.records_episodes  # agents come and go: step by step
    collector.collect(15)  # three env episodes
    assert table.episode_count == 3 * len(SCHEDULE)
    assert table.size() == 3 * sum(LIVES.values())
    assert collector.completed_episodes == 12


def test_discrete_actions_go_to_each_agent_with_the_space_offset() -> None:
    env = staggered(action_space=gym_spaces.Discrete(3, start=5))
    assert env.single_action_space == gym_spaces.Discrete(3)
    collected(env, 5)
    sent = env.envs[0].received
    assert [sorted(step) for step in sent[:3]] == [
        ["runner_0", "runner_1", "runner_2"],
        ["late_0", "runner_0", "runner_1", "runner_2"],  # late_0 joined in step 1
        ["late_0", "runner_1", "runner_2"],  # runner_0 left in step 2
    ]
    assert {int(a) for step in sent for a in step.values()} <= {5, 6, 7}


def test_box_actions_are_rescaled_from_minus_one_one_onto_the_bounds() -> None:
    env = staggered(action_space=gym_spaces.Box(0.0, 10.0, shape=(2,), dtype=np.float32))
    assert env.single_action_space == gym_spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
    observations = env.reset(seed=0)

    given = [np.array([-1.0, 1.0]), np.array([0.0, 3.0]), np.array([0.5, -7.0])]
    env.step({a: DictResponse(list_data={"actions": x}, scalar_data={})
              for a, x in zip(observations, given, strict=True)})  # fmt: skip
    sent = env.envs[0].received[0]
    assert np.allclose(sent["runner_0"], [0.0, 10.0])
    assert np.allclose(sent["runner_1"], [5.0, 10.0])  # clipped to 1 first
    assert np.allclose(sent["runner_2"], [7.5, 0.0])


@pytest.mark.parametrize("continuous", [True, False])
def test_simple_spread_lives_are_truncated_episodes_of_max_cycles(continuous: bool) -> None:
    make = functools.partial(
        simple_spread_v3.parallel_env, N=3, max_cycles=10, continuous_actions=continuous
    )
    env = wrap_parallel_env(make, num_envs=2)
    assert [g.name for g in env.groups] == ["agent"]
    assert env.spaces.state.spaces["obs"].shape == (18,)
    batch = collected(env, 25)  # each of 2 envs: 2 whole episodes of 10 steps, 1 running
    assert len(batch) == 2 * 2 * 3
    assert batch.lengths.tolist() == [10] * 12
    assert set(batch.end_states.tolist()) == {INTERRUPTED}  # max_cycles truncates
    assert len(set(batch.identities.tolist())) == 12
    assert sorted(env.agent_name(i) for i in batch.identities) == sorted(
        ["agent_0", "agent_1", "agent_2"] * 4
    )
    actions = batch.columns["actions"]
    if continuous:
        assert actions.shape == (120, 5) and actions.min() >= -1 and actions.max() <= 1
    else:
        assert actions.shape == (120, 1) and set(actions.ravel().tolist()) <= set(range(5))
    # The team return of an env episode is its agents' returns summed.
    team = env.drain_completed_env_episodes()
    assert len(team) == 4
    assert sum(e.team_return for e in team) == pytest.approx(
        float(batch.returns("rewards").sum()), rel=1e-5
    )


def test_agents_of_other_spaces_form_groups_and_one_policy_is_refused() -> None:
    env = wrap_parallel_env(simple_adversary_v3.parallel_env, num_envs=1)
    assert [(g.name, g.agents) for g in env.groups] == [
        ("adversary", ("adversary_0",)),
        ("agent", ("agent_0", "agent_1")),
    ]
    with pytest.raises(ConfigurationError) as caught:
        env.spaces  # noqa: B018
    message = str(caught.value)
    assert "\n" not in message
    assert "2 agent groups" in message
    assert "adversary: adversary_0; agent: agent_0, agent_1" in message


def test_each_groups_agents_fill_their_groups_table_with_their_own_actions() -> None:
    env = wrap_parallel_env(functools.partial(simple_adversary_v3.parallel_env, N=2), num_envs=1)
    assert [g.name for g in several_groups(env)] == ["adversary", "agent"]
    tables = {
        g.name: DictObsMemoryTable(spaces=env.group_spaces(g.name), maxlen=1_000, seed=0)
        for g in env.groups
    }
    memories = GroupMemories(env, {name: MemoryTableProxy(t) for name, t in tables.items()})
    agents = random_group_agents(env, seed=3)
    assert set(agents.random_generators()) == {"adversary.actions", "agent.actions"}
    collector = GymCollector(env=env, agent=agents, memory=memories, seed=0)
    collector.collect(25)  # one env episode: every agent's life ends
    assert {name: t.episode_count for name, t in tables.items()} == {"adversary": 1, "agent": 2}
    for name, table in tables.items():
        (_, sequence, _), *_ = table.episodes()
        assert sequence["obs"].shape[1:] == env.group_spaces(name).state["obs"].shape
        assert sequence["actions"].shape == (25, 1)  # one discrete action per step
    env.close()


class MaskedPair(ParallelEnv):
    """A scout with a Box observation and a picker whose observation masks its actions: only
    action 2 of 4 is legal. Each episode is 5 steps."""

    metadata = {"name": "masked_pair_v0", "render_modes": []}
    possible_agents = ["scout_0", "picker_0"]

    def __init__(self, render_mode: str | None = None) -> None:
        self.agents: list[str] = []
        self.received: list[dict[str, Any]] = []
        self.count = 0

    @functools.cache  # noqa: B019 - PettingZoo's API wants one object
    def observation_space(self, agent: str) -> gymnasium.Space:
        box = gym_spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        if agent == "scout_0":
            return box
        mask = gym_spaces.Box(0, 1, shape=(4,), dtype=np.int8)
        return gym_spaces.Dict({"obs": box, "action_mask": mask})

    @functools.cache  # noqa: B019
    def action_space(self, agent: str) -> gymnasium.Space:
        return gym_spaces.Discrete(4)

    def _observe(self) -> dict[str, Any]:
        mask = np.array([0, 0, 1, 0], np.int8)
        obs = np.zeros(2, np.float32)
        return {"scout_0": obs, "picker_0": {"obs": obs, "action_mask": mask}}

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.agents, self.count = list(self.possible_agents), 0
        return self._observe(), {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        self.received.append(dict(actions))
        self.count += 1
        done = {a: self.count == 5 for a in self.agents}
        zero = {a: 0.0 for a in self.agents}
        infos = {a: {} for a in self.agents}
        if self.count == 5:
            self.agents = []
        return self._observe(), zero, done, dict.fromkeys(done, False), infos


def test_random_group_agents_take_only_the_actions_a_groups_mask_allows() -> None:
    env = ParallelEnvWrapper([MaskedPair()])
    assert [g.name for g in several_groups(env)] == ["scout", "picker"]
    agents = random_group_agents(env, seed=0)
    observations = env.reset(seed=0)
    for _ in range(20):
        observations = env.step(agents(observations))
    picked = {actions["picker_0"] for actions in env.envs[0].received}
    assert picked == {2}  # 20 random draws of 4 actions: only the legal one
    assert len({actions["scout_0"] for actions in env.envs[0].received}) > 1


def test_several_groups_is_empty_for_one_group_and_group_files_sit_beside_out() -> None:
    env = wrap_parallel_env(simple_spread_v3.parallel_env, num_envs=1)
    assert several_groups(env) == []
    env.close()
    assert group_store("out/policy.onnx", "agent", "onnx") == "out/policy.agent.onnx"
    assert group_store("policy", "agent", "onnx") == "policy.agent"
    assert group_store("s.zarr", "agent") == "s.agent.zarr"


def test_agents_with_one_prefix_and_different_spaces_are_separate_groups() -> None:
    class Mixed(StaggeredEnv):
        def observation_space(self, agent: str) -> gymnasium.Space:
            size = 3 if agent != "runner_2" else 4
            return gym_spaces.Box(0.0, 10.0, shape=(size,), dtype=np.float32)

    groups = agent_groups(Mixed())
    assert [(g.name, g.agents) for g in groups] == [
        ("group_0", ("runner_0", "runner_1", "late_0")),
        ("group_1", ("runner_2",)),
    ]


def test_a_factory_that_returns_no_parallel_env_is_one_line() -> None:
    with pytest.raises(ConfigurationError) as caught:
        wrap_parallel_env(simple_spread_v3.env, num_envs=1)
    assert "must be a pettingzoo.ParallelEnv; got OrderEnforcingWrapper" in str(caught.value)


def test_store_round_trip_keeps_each_episodes_agent_and_group(tmp_path: Path) -> None:
    from emote_core.assembly.collection import collect_to_store
    from emote_core.recipes import load_recipe
    from emote_core.stores.agents import episode_agent, shard_agents
    from emote_core.stores.zarr_store import MemoryStore

    recipe = load_recipe("sac_simple_spread")
    out = str(tmp_path / "spread.zarr")
    result = collect_to_store(recipe, out, episodes=9, command=["test"])
    assert result.summary["episodes"] == 9
    assert result.summary["transitions"] == 9 * 25
    store = MemoryStore(out)
    (shard,) = store.shards
    record = shard_agents(dict(shard.group.attrs))
    assert record == {
        "agents": ["agent_0", "agent_1", "agent_2"],
        "groups": [{"name": "agent", "agents": ["agent_0", "agent_1", "agent_2"]}],
    }
    agents = [episode_agent(i, record) for i in shard.table["id"].tolist()]
    assert sorted(agents) == sorted(
        [("agent_0", "agent"), ("agent_1", "agent"), ("agent_2", "agent")] * 3
    )


class Forgetful(StaggeredEnv):
    """Leaves runner_1's observation out of the step that truncates it."""

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        observations, *rest = super().step(actions)
        if self.step_count == 3:
            observations.pop("runner_1")
        return observations, *rest  # type: ignore[return-value]


class Unseen(StaggeredEnv):
    """Lets late_0 join without observing it."""

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        observations, *rest = super().step(actions)
        observations.pop("late_0", None)
        return observations, *rest  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("env_class", "words"),
    [
        (Forgetful, "returned no observation for agent 'runner_1'"),
        (Unseen, "agent 'late_0' joined the env without an observation"),
    ],
)
def test_an_agent_without_an_observation_is_one_line(env_class: type, words: str) -> None:
    env = ParallelEnvWrapper([env_class()])
    with pytest.raises(ConfigurationError) as caught:
        collected(env, 5)
    message = str(caught.value)
    assert "\n" not in message
    assert words in message


class Masked(StaggeredEnv):
    """PettingZoo's convention for masks: a Dict of the observation and the action mask."""

    @functools.cache  # noqa: B019
    def observation_space(self, agent: str) -> gymnasium.Space:
        return gym_spaces.Dict(
            {
                "observation": gym_spaces.Box(0.0, 10.0, shape=(3,), dtype=np.float32),
                "action_mask": gym_spaces.MultiBinary(3),
            }
        )

    def _observe(self, agent: str) -> dict[str, np.ndarray]:
        return {"observation": super()._observe(agent), "action_mask": np.array([1, 0, 1], np.int8)}


def test_dict_observations_keep_every_key_in_each_episode() -> None:
    parallel_api_test(Masked(), num_cycles=10)
    env = ParallelEnvWrapper([Masked()])
    assert set(env.spaces.state.spaces) == {"observation", "action_mask"}
    batch = collected(env, 5)
    assert batch.extra_rows["observation"] == batch.extra_rows["action_mask"] == 1
    assert batch.columns["action_mask"].shape == (sum(LIVES.values()) + 4, 3)
    assert batch.columns["action_mask"].tolist()[0] == [1, 0, 1]
