"""MemoryTableProxy: per-agent steps collated into whole episodes, as DESIGN.md specifies."""

from __future__ import annotations

import logging
import warnings

import gymnasium
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from emote_core.errors import ConfigurationError, EmoteError, EpisodeCollationError
from emote_core.memory.columns import Column, VirtualColumn
from emote_core.memory.mappers import NextElementMapper, SyntheticDones, SyntheticMasks
from emote_core.memory.proxy import Episode, MemoryTableProxy, MissingRewardWarning
from emote_core.memory.strategies import FifoEjectionStrategy, UniformSampleStrategy
from emote_core.memory.table import ArrayMemoryTable
from emote_core.typing import DictObservation, DictResponse, EpisodeState

INITIAL, RUNNING = EpisodeState.INITIAL, EpisodeState.RUNNING
TERMINAL, INTERRUPTED = EpisodeState.TERMINAL, EpisodeState.INTERRUPTED


def make_table(
    maxlen: int = 10_000, obs_shape: tuple[int, ...] = (3,), terminal: bool = False
) -> ArrayMemoryTable:
    columns = [
        Column("obs", obs_shape, np.float32),
        VirtualColumn("next_obs", obs_shape, np.float32, "obs", NextElementMapper()),
        Column("actions", (2,), np.float32),
        Column("rewards", (1,), np.float32),
        VirtualColumn("dones", (1,), np.float32, "rewards", SyntheticDones()),
        VirtualColumn("masks", (1,), np.float32, "rewards", SyntheticMasks()),
    ]
    if terminal:
        columns.append(Column("terminal", (1,), np.float32))
    return ArrayMemoryTable(
        columns=columns,
        maxlen=maxlen,
        sampler=UniformSampleStrategy(),
        ejector=FifoEjectionStrategy(),
        length_key="rewards",
        seed=0,
    )


def obs(state: EpisodeState, value: float, reward: float | None = None) -> DictObservation:
    rewards = {} if reward is None else {"reward": reward}
    return DictObservation(
        episode_state=state,
        array_data={"obs": np.full(3, value, dtype=np.float32)},
        rewards=rewards,
    )


def act(value: float) -> DictResponse:
    return DictResponse({"actions": np.array([value, -value], dtype=np.float32)})


def run_episode(proxy: MemoryTableProxy, agent: int, length: int, end: EpisodeState, base: float):
    """Feeds one agent's episode of ``length`` transitions; observation t has value base + t."""
    proxy.add({agent: obs(INITIAL, base)}, {agent: act(base)})
    for t in range(1, length):
        proxy.add({agent: obs(RUNNING, base + t, reward=10 * (base + t))}, {agent: act(base + t)})
    proxy.add({agent: obs(end, base + length, reward=10 * (base + length))}, {})


def test_episode_of_n_transitions_holds_n_plus_one_observations_and_shifted_rewards():
    table = make_table()
    proxy = MemoryTableProxy(table)
    run_episode(proxy, agent=7, length=4, end=TERMINAL, base=1.0)

    [(identity, data, end)] = list(table.episodes())
    assert end == TERMINAL
    np.testing.assert_array_equal(data["obs"][:, 0], [1, 2, 3, 4, 5])
    np.testing.assert_array_equal(data["actions"][:, 0], [1, 2, 3, 4])
    # The reward carried by observation t + 1 belongs to action t.
    np.testing.assert_array_equal(data["rewards"][:, 0], [20, 30, 40, 50])

    batch = table.sample_by_index([identity], [0], 4)
    torch.testing.assert_close(batch["obs"][:, 0], torch.tensor([1.0, 2, 3, 4]))
    torch.testing.assert_close(batch["next_obs"][:, 0], torch.tensor([2.0, 3, 4, 5]))
    torch.testing.assert_close(batch["rewards"][:, 0], torch.tensor([20.0, 30, 40, 50]))
    torch.testing.assert_close(batch["dones"][:, 0], torch.tensor([0.0, 0, 0, 1]))
    assert proxy.size() == 4 and proxy.is_initial(7)


@pytest.mark.parametrize(("end", "last_mask"), [(TERMINAL, 0.0), (INTERRUPTED, 1.0)])
def test_end_state_reaches_the_table_as_masks(end: EpisodeState, last_mask: float):
    table = make_table()
    proxy = MemoryTableProxy(table)
    run_episode(proxy, agent=0, length=3, end=end, base=0.0)

    [(identity, _, stored_end)] = list(table.episodes())
    assert stored_end == end
    batch = table.sample_by_index([identity], [0], 3)
    torch.testing.assert_close(batch["masks"][:, 0], torch.tensor([1.0, 1.0, last_mask]))
    torch.testing.assert_close(batch["dones"][:, 0], torch.tensor([0.0, 0.0, 1.0]))


def test_interleaved_agents_reuse_ids_and_get_fresh_episode_identities():
    table = make_table()
    proxy = MemoryTableProxy(table)
    # Agent 0 runs two episodes while agent 1 runs one long episode beside them.
    proxy.add({0: obs(INITIAL, 0), 1: obs(INITIAL, 100)}, {0: act(0), 1: act(100)})
    proxy.add({0: obs(RUNNING, 1, 1.0), 1: obs(RUNNING, 101, 2.0)}, {0: act(1), 1: act(101)})
    proxy.add({0: obs(TERMINAL, 2, 3.0), 1: obs(RUNNING, 102, 4.0)}, {1: act(102)})
    assert proxy.is_initial(0) and not proxy.is_initial(1)
    proxy.add({0: obs(INITIAL, 50), 1: obs(RUNNING, 103, 5.0)}, {0: act(50), 1: act(103)})
    proxy.add({0: obs(INTERRUPTED, 51, 6.0), 1: obs(TERMINAL, 104, 7.0)}, {})

    episodes = list(table.episodes())
    assert len({identity for identity, _, _ in episodes}) == 3
    by_first_obs = {float(data["obs"][0, 0]): (data, end) for _, data, end in episodes}
    data, end = by_first_obs[0.0]
    assert end == TERMINAL
    np.testing.assert_array_equal(data["obs"][:, 0], [0, 1, 2])
    np.testing.assert_array_equal(data["rewards"][:, 0], [1, 3])
    data, end = by_first_obs[50.0]
    assert end == INTERRUPTED
    np.testing.assert_array_equal(data["rewards"][:, 0], [6])
    np.testing.assert_array_equal(data["actions"][:, 0], [50])
    data, end = by_first_obs[100.0]
    assert end == TERMINAL
    np.testing.assert_array_equal(data["obs"][:, 0], [100, 101, 102, 103, 104])
    np.testing.assert_array_equal(data["actions"][:, 0], [100, 101, 102, 103])
    np.testing.assert_array_equal(data["rewards"][:, 0], [2, 4, 5, 7])
    assert proxy.completed_episodes == 3 and proxy.open_episodes == 0


def test_second_initial_for_an_open_agent_is_an_error_naming_the_agent():
    table = make_table()
    proxy = MemoryTableProxy(table)
    proxy.add({"walker-3": obs(INITIAL, 0)}, {"walker-3": act(0)})
    proxy.add({"walker-3": obs(RUNNING, 1, 1.0)}, {"walker-3": act(1)})
    with pytest.raises(EpisodeCollationError, match="walker-3") as caught:
        proxy.add({"walker-3": obs(INITIAL, 9)}, {"walker-3": act(9)})
    assert isinstance(caught.value, EmoteError)
    # The open episode is untouched and can still finish.
    proxy.add({"walker-3": obs(TERMINAL, 2, 2.0)}, {})
    [(_, data, _)] = list(table.episodes())
    np.testing.assert_array_equal(data["obs"][:, 0], [0, 1, 2])


def test_final_observation_for_unknown_agent_is_skipped_with_a_warning(caplog):
    table = make_table()
    proxy = MemoryTableProxy(table, name="collector")
    with caplog.at_level(logging.WARNING, logger="emote_core.memory.proxy"):
        proxy.add({42: obs(TERMINAL, 1, 1.0)}, {})
    assert table.size() == 0 and table.episode_count == 0
    assert any("42" in r.getMessage() and "TERMINAL" in r.getMessage() for r in caplog.records)
    # The proxy keeps working afterwards.
    run_episode(proxy, agent=42, length=2, end=TERMINAL, base=0.0)
    assert table.episode_count == 1


def test_running_observation_for_unknown_agent_starts_an_episode_without_its_reward(caplog):
    table = make_table()
    proxy = MemoryTableProxy(table)
    with caplog.at_level(logging.WARNING, logger="emote_core.memory.proxy"):
        proxy.add({5: obs(RUNNING, 10, reward=999.0)}, {5: act(10)})
    assert any("RUNNING" in r.getMessage() and "5" in r.getMessage() for r in caplog.records)
    proxy.add({5: obs(RUNNING, 11, 1.0)}, {5: act(11)})
    proxy.add({5: obs(INTERRUPTED, 12, 2.0)}, {})
    [(_, data, end)] = list(table.episodes())
    assert end == INTERRUPTED
    np.testing.assert_array_equal(data["obs"][:, 0], [10, 11, 12])
    np.testing.assert_array_equal(data["rewards"][:, 0], [1, 2])


def test_episodes_shorter_than_the_threshold_are_dropped(caplog):
    table = make_table()
    proxy = MemoryTableProxy(table, minimum_length_threshold=3)
    with caplog.at_level(logging.DEBUG, logger="emote_core.memory.proxy"):
        run_episode(proxy, agent=0, length=2, end=TERMINAL, base=0.0)
    assert table.episode_count == 0 and proxy.dropped_episodes == 1
    assert any("dropping an episode of 2" in r.getMessage() for r in caplog.records)
    run_episode(proxy, agent=0, length=3, end=INTERRUPTED, base=0.0)
    assert table.episode_count == 1 and table.size() == 3


@pytest.mark.parametrize("threshold", [0, None])
def test_a_threshold_of_zero_or_none_keeps_every_episode(threshold):
    table = make_table()
    run_episode(MemoryTableProxy(table, threshold), agent=0, length=1, end=TERMINAL, base=0.0)
    assert table.episode_count == 1
    for refused in (-1, True, 1.5):
        with pytest.raises(ConfigurationError, match="minimum_length_threshold"):
            MemoryTableProxy(table, refused)


def test_a_none_reward_is_stored_as_nan_with_one_warning_and_the_episode_can_be_read():
    table = make_table()
    proxy = MemoryTableProxy(table)
    proxy.add({0: obs(INITIAL, 0.0)}, {0: act(0.0)})
    none_reward = DictObservation(
        episode_state=RUNNING, array_data={"obs": np.ones(3, np.float32)}, rewards={"reward": None}
    )
    with pytest.warns(MissingRewardWarning, match=r"agent 0 .*NaN reward"):
        proxy.add({0: none_reward}, {0: act(1.0)})
    episode = proxy.open_episode(0)
    assert proxy.open_episode(1) is None and len(episode) == 1
    np.testing.assert_array_equal(episode.observations["obs"][1], np.ones(3))
    np.testing.assert_array_equal(episode.actions["actions"][0], [0.0, -0.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once per proxy
        proxy.add({0: DictObservation(**{**vars(none_reward), "episode_state": TERMINAL})}, {})
    ((_, data, _),) = list(table.episodes())
    assert np.isnan(data["rewards"]).all() and len(data["rewards"]) == 2


def test_terminal_column_marks_only_the_final_observation_of_terminal_episodes():
    table = make_table(terminal=True)
    proxy = MemoryTableProxy(table, use_terminal=True)
    run_episode(proxy, agent=0, length=3, end=TERMINAL, base=0.0)
    run_episode(proxy, agent=0, length=2, end=INTERRUPTED, base=0.0)
    (_, terminal_data, _), (_, interrupted_data, _) = list(table.episodes())
    np.testing.assert_array_equal(terminal_data["terminal"][:, 0], [0, 0, 0, 1])
    np.testing.assert_array_equal(interrupted_data["terminal"][:, 0], [0, 0, 0])


def test_missing_response_or_reward_is_an_error_naming_the_agent():
    proxy = MemoryTableProxy(make_table())
    with pytest.raises(EpisodeCollationError, match=r"agent 3 .*no response"):
        proxy.add({3: obs(INITIAL, 0)}, {})
    assert proxy.is_initial(3)
    proxy.add({3: obs(INITIAL, 0)}, {3: act(0)})
    with pytest.raises(EpisodeCollationError, match=r"agent 3 .*rewards\['reward'\]"):
        proxy.add({3: obs(RUNNING, 1)}, {3: act(1)})


def test_observation_keys_must_not_change_within_an_episode():
    proxy = MemoryTableProxy(make_table())
    proxy.add({0: obs(INITIAL, 0)}, {0: act(0)})
    other = DictObservation(
        episode_state=RUNNING, array_data={"pixels": np.zeros(3)}, rewards={"reward": 1.0}
    )
    with pytest.raises(EpisodeCollationError, match=r"\['obs'\].*\['pixels'\]"):
        proxy.add({0: other}, {0: act(1)})


def test_observation_shapes_must_not_change_within_an_episode():
    table = make_table()
    proxy = MemoryTableProxy(table)
    proxy.add({0: obs(INITIAL, 0)}, {0: act(0)})
    wider = DictObservation(
        episode_state=TERMINAL, array_data={"obs": np.zeros(4, np.float32)}, rewards={"reward": 1.0}
    )
    with pytest.raises(EpisodeCollationError, match=r"'obs'.*\(3,\), \(4,\)"):
        proxy.add({0: wider}, {})
    assert table.episode_count == 0 and proxy.is_initial(0)


def test_identities_skip_past_episodes_already_in_the_table():
    table = make_table()
    for identity in range(3):  # as if restored from an earlier run's export
        table.add_sequence(
            identity,
            {"obs": np.zeros((2, 3)), "actions": np.zeros((1, 2)), "rewards": np.zeros(1)},
        )
    proxy = MemoryTableProxy(table)
    run_episode(proxy, agent=0, length=2, end=TERMINAL, base=0.0)
    run_episode(proxy, agent=0, length=2, end=TERMINAL, base=0.0)
    assert [identity for identity, _, _ in table.episodes()] == [0, 1, 2, 3, 4]


def test_size_resize_and_timers_reach_the_table():
    table = make_table(maxlen=100)
    proxy = MemoryTableProxy(table)
    for _ in range(5):
        run_episode(proxy, agent=1, length=10, end=TERMINAL, base=0.0)
    assert proxy.size() == 50
    proxy.resize(20)
    assert table.maxlen == 20 and proxy.size() == 20 and table.episode_count == 2
    stats = proxy.timers.stats()
    assert stats["add"]["count"] == 5 * 11 and stats["completed"]["count"] == 5


def test_episode_to_sequence_needs_one_action_per_transition():
    episode = Episode({"obs": np.zeros(3)})
    with pytest.raises(EpisodeCollationError, match="0 transitions"):
        episode.to_sequence()
    episode.add_action({"actions": np.ones(2)})
    episode.add_transition(1.0, {"obs": np.ones(3)})
    sequence = episode.to_sequence(terminal=False)
    assert sequence["obs"].shape == (2, 3) and sequence["actions"].shape == (1, 2)
    assert sequence["rewards"].dtype == np.float32
    np.testing.assert_array_equal(sequence["terminal"], [0, 0])


@settings(max_examples=40, deadline=None)
@given(
    episodes=st.lists(
        st.tuples(
            st.integers(0, 3),  # agent
            st.integers(1, 6),  # transitions
            st.sampled_from([TERMINAL, INTERRUPTED]),
        ),
        min_size=1,
        max_size=12,
    ),
    seed=st.integers(0, 2**16),
)
def test_random_interleavings_store_every_episode_intact(episodes, seed):
    """Whatever the interleaving of agents, each episode reaches the table exactly as it ran."""
    rng = np.random.default_rng(seed)
    queues: dict[int, list[tuple[int, int, EpisodeState]]] = {}
    for number, (agent, length, end) in enumerate(episodes):
        queues.setdefault(agent, []).append((number, length, end))
    table = make_table()
    proxy = MemoryTableProxy(table)
    position = {agent: -1 for agent in queues}  # -1: the next step is INITIAL
    while queues:
        agents = [a for a in queues if rng.random() < 0.7] or [next(iter(queues))]
        observations, responses = {}, {}
        for agent in agents:
            number, length, end = queues[agent][0]
            t = position[agent] + 1
            value = 1000 * number + t
            if t == 0:
                observations[agent] = obs(INITIAL, value)
            elif t < length:
                observations[agent] = obs(RUNNING, value, reward=value + 0.5)
            else:
                observations[agent] = obs(end, value, reward=value + 0.5)
            if t < length:
                responses[agent] = act(value)
            position[agent] = t
            if t == length:
                queues[agent].pop(0)
                position[agent] = -1
                if not queues[agent]:
                    del queues[agent]
        proxy.add(observations, responses)

    stored = {int(data["obs"][0, 0]) // 1000: (data, end) for _, data, end in table.episodes()}
    assert len(stored) == len(episodes)
    for number, (_, length, end) in enumerate(episodes):
        data, stored_end = stored[number]
        steps = 1000 * number + np.arange(length + 1)
        assert stored_end == end
        np.testing.assert_array_equal(data["obs"][:, 0], steps)
        np.testing.assert_array_equal(data["actions"][:, 0], steps[:-1])
        np.testing.assert_array_equal(data["rewards"][:, 0], steps[1:] + 0.5)


def test_gymnasium_vector_env_episodes_match_the_env_exactly():
    """CartPole in a sync vector env, NEXT_STEP autoreset: the table holds the env's episodes."""
    num_envs = 4
    env = gymnasium.make_vec(
        "CartPole-v1", num_envs=num_envs, vectorization_mode="sync", max_episode_steps=30
    )
    env = gymnasium.wrappers.vector.RecordEpisodeStatistics(env)
    assert env.metadata["autoreset_mode"] == gymnasium.vector.AutoresetMode.NEXT_STEP
    env.action_space.seed(0)
    table = ArrayMemoryTable(
        columns=[
            Column("obs", (4,), np.float32),
            Column("actions", (1,), np.int64),
            Column("rewards", (1,), np.float32),
            VirtualColumn("masks", (1,), np.float32, "rewards", SyntheticMasks()),
        ],
        maxlen=100_000,
        sampler=UniformSampleStrategy(),
        ejector=FifoEjectionStrategy(),
        length_key="rewards",
    )
    proxy = MemoryTableProxy(table)

    expected = []  # (observations, actions, rewards, end state) per finished episode, in order
    running = {i: {"obs": [], "actions": [], "rewards": []} for i in range(num_envs)}
    env_reported = []  # (return, length) from RecordEpisodeStatistics
    observation, _ = env.reset(seed=0)
    states = [INITIAL] * num_envs
    rewards = np.zeros(num_envs)
    for _ in range(400):
        actions = env.action_space.sample()
        observations, responses = {}, {}
        for i in range(num_envs):
            state = states[i]
            reward = None if state == INITIAL else {"reward": float(rewards[i])}
            observations[i] = DictObservation(
                episode_state=state, array_data={"obs": observation[i]}, rewards=reward or {}
            )
            record = running[i]
            record["obs"].append(observation[i].copy())
            if state != INITIAL:
                record["rewards"].append(float(rewards[i]))
            if state.is_final:
                expected.append((record["obs"], record["actions"], record["rewards"], state))
                running[i] = {"obs": [], "actions": [], "rewards": []}
            else:
                responses[i] = DictResponse({"actions": np.array([actions[i]])})
                record["actions"].append(int(actions[i]))
        proxy.add(observations, responses)
        # Envs whose observation was final ignore this action and return a reset observation.
        autoreset = np.array([s.is_final for s in states])
        observation, rewards, terminated, truncated, info = env.step(actions)
        if "episode" in info:
            for i in np.flatnonzero(info["_episode"]):
                env_reported.append((float(info["episode"]["r"][i]), int(info["episode"]["l"][i])))
        states = [
            INITIAL
            if autoreset[i]
            else EpisodeState.from_gymnasium(
                terminated=bool(terminated[i]), truncated=bool(truncated[i])
            )
            for i in range(num_envs)
        ]
        np.testing.assert_array_equal(rewards[autoreset], 0.0)

    stored = list(table.episodes())
    assert len(stored) == len(expected) > 20
    assert {end for _, _, end in stored} == {TERMINAL, INTERRUPTED}
    for (_, data, end), (observations_, actions_, rewards_, state) in zip(
        stored, expected, strict=True
    ):
        assert end == state
        np.testing.assert_array_equal(data["obs"], np.stack(observations_))
        np.testing.assert_array_equal(data["actions"][:, 0], actions_)
        np.testing.assert_array_equal(data["rewards"][:, 0], rewards_)
    # The env reports an episode's statistics at the step that ends it; the proxy gets that final
    # observation one loop later, so the episodes ending at the last step are still open.
    still_open = sum(state.is_final for state in states)
    assert len(env_reported) == len(stored) + still_open
    assert env_reported[: len(stored)] == [
        (float(data["rewards"].sum()), len(data["rewards"])) for _, data, _ in stored
    ]
    env.close()
