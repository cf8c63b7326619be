"""The tmrl-interface memory fed with samples made the way tmrl's RolloutWorker makes them.

tmrl itself does not install here (it requires pywin32 on every platform), so the samples are
tmrl's documented tuples ``(act, new_obs, rew, terminated, truncated, info)`` from real gymnasium
envs, with ``info["crc_sample"]`` filled as a worker run with ``crc_debug=True`` fills it.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from emote_core.errors import ConfigurationError, SamplingError, SchemaError
from emote_core.integrations.tmrl.episode_memory import TmrlEpisodeMemory
from emote_core.integrations.tmrl.samples import CrcMismatchError
from emote_core.typing import EpisodeState


class Buffer:
    """What tmrl's ``Buffer`` hands a memory: samples in ``memory`` and the worker's statistics."""

    def __init__(self, samples=(), train_return: float = 0.0) -> None:
        self.memory = list(samples)
        self.stat_train_return, self.stat_test_return = train_return, 0.0
        self.stat_train_steps, self.stat_test_steps = len(self.memory), 0

    def __len__(self) -> int:
        return len(self.memory)


def split_pendulum(obs):
    return (obs[:2].astype(np.float32), obs[2:].astype(np.float32))


def worker_samples(env_id, episodes, cap, *, observe=lambda o: o, seed=0, placeholder=None):
    """Samples as tmrl's RolloutWorker makes them with crc_debug on (reset, then steps)."""
    env = gym.make(env_id)
    env.action_space.seed(seed)
    samples, step_count = [], 0
    for episode in range(episodes):
        new_obs, info = env.reset(seed=seed + episode)
        new_obs, since_reset = observe(new_obs), 0
        step_count += 1
        info["crc_sample"] = (None, placeholder, new_obs, 0.0, False, False)
        info["crc_sample_ts"] = (step_count, since_reset)
        samples.append((placeholder, new_obs, 0.0, False, False, info))
        for step in range(cap):
            obs = new_obs
            act = env.action_space.sample()
            new_obs, rew, terminated, truncated, info = env.step(act)
            new_obs = observe(new_obs)
            if step == cap - 1 and not terminated:
                truncated = True  # the worker's step cap
            step_count, since_reset = step_count + 1, since_reset + 1
            info["crc_sample"] = (obs, act, new_obs, rew, terminated, truncated)
            info["crc_sample_ts"] = (step_count, since_reset)
            samples.append((act, new_obs, rew, terminated, truncated, info))
            if terminated or truncated:
                break
    env.close()
    return samples


def sent_transitions(samples):
    """The transitions the worker sent, oldest first: its crc_sample of every step."""
    return [s[5]["crc_sample"] for s in samples if s[5]["crc_sample"][0] is not None]


def assert_same_transition(got, sent):
    prev_obs, act, new_obs, rew, terminated, truncated = sent  # the worker's crc_sample order
    g_prev, g_act, g_rew, g_new, g_term, g_trunc, _ = got
    for want, have in ((prev_obs, g_prev), (new_obs, g_new)):
        for part_want, part_have in zip(want, have, strict=True):
            np.testing.assert_array_equal(part_have, part_want)
    np.testing.assert_array_equal(g_act, np.asarray(act))
    assert g_rew == np.float32(rew)
    assert (g_term, g_trunc) == (terminated, truncated)


def test_transitions_are_what_the_worker_sent_and_episodes_are_cut_where_it_said():
    samples = worker_samples("Pendulum-v1", episodes=3, cap=12, observe=split_pendulum)
    memory = TmrlEpisodeMemory(memory_size=1000, batch_size=8, seed=0)
    memory.append(Buffer(samples, train_return=-3.5))
    sent = sent_transitions(samples)
    assert len(memory) == len(sent) == 36
    for item, transition in enumerate(sent):
        assert_same_transition(memory.get_transition(item), transition)
    # Three whole episodes in the emote table, INTERRUPTED by the worker's cap.
    episodes = list(memory.table.episodes())
    assert [len(d["rewards"]) for _, d, _ in episodes] == [12, 12, 12]
    assert [end for _, _, end in episodes] == [EpisodeState.INTERRUPTED] * 3
    assert sorted(episodes[0][1]) == ["actions", "obs_0", "obs_1", "rewards"]
    assert len(episodes[0][1]["obs_0"]) == 13  # N + 1 observations
    assert memory.stat_train_return == -3.5 and memory.stat_train_steps == len(samples)


def test_terminated_episodes_end_terminal_and_scalar_actions_come_back_as_scalars():
    samples = worker_samples("CartPole-v1", episodes=4, cap=200, seed=3)
    memory = TmrlEpisodeMemory(memory_size=10_000, crc_debug=True)
    memory.append(Buffer(samples))
    ends = [end for _, _, end in memory.table.episodes()]
    assert ends == [EpisodeState.TERMINAL] * 4  # random CartPole falls well before 200 steps
    last = memory.get_transition(len(memory) - 1)
    assert last[4] is True and last[5] is False
    assert isinstance(last[1], np.integer) and last[1] == sent_transitions(samples)[-1][1]
    for item in range(len(memory)):
        memory[item]  # crc_debug: every transition checked against what the worker sent


def test_an_episode_split_over_buffers_is_sampled_before_it_ends():
    samples = worker_samples("Pendulum-v1", episodes=2, cap=10, observe=split_pendulum)
    memory = TmrlEpisodeMemory(memory_size=100, batch_size=4, crc_debug=True, seed=1)
    memory.append(Buffer(samples[:6]))  # a reset and five steps of the first episode
    assert len(memory) == 5 and memory.table is None
    assert memory.open_episode is not None and len(memory.open_episode) == 5
    for item in range(5):
        memory[item]
    memory.append(Buffer(samples[6:]))
    assert memory.open_episode is None and memory.table.episode_count == 2
    for item, transition in enumerate(sent_transitions(samples)):
        assert_same_transition(memory.get_transition(item), transition)


def test_crc_debug_fails_loudly_when_the_pipeline_changes_a_sample():
    samples = worker_samples("Pendulum-v1", episodes=1, cap=5, observe=split_pendulum)
    act, obs, rew, terminated, truncated, info = samples[3]
    # A local buffer compressor that drops part of the observation before sending.
    samples[3] = (act, (obs[0] * 0, obs[1]), rew, terminated, truncated, info)
    memory = TmrlEpisodeMemory(memory_size=100, crc_debug=True)
    memory.append(Buffer(samples))
    memory[0]
    memory[1]
    with pytest.raises(CrcMismatchError, match=r"the observation read back differs .* step 4"):
        memory[2]
    with pytest.raises(CrcMismatchError, match="previous observation"):
        memory[3]
    without = TmrlEpisodeMemory(memory_size=100)  # crc_debug off: no check
    without.append(Buffer(samples))
    without[2]


def test_crc_debug_needs_the_worker_to_send_crc_samples():
    samples = [(a, o, r, d, t, {}) for a, o, r, d, t, _ in worker_samples("Pendulum-v1", 1, 3)]
    memory = TmrlEpisodeMemory(memory_size=100, crc_debug=True)
    memory.append(Buffer(samples))
    with pytest.raises(CrcMismatchError, match="run the rollout worker with crc_debug=True"):
        memory[0]


def test_sample_collates_the_transitions_at_the_sampled_indices():
    samples = worker_samples("Pendulum-v1", episodes=3, cap=10, observe=split_pendulum, seed=5)
    memory = TmrlEpisodeMemory(memory_size=1000, batch_size=16, nb_steps=3, seed=2)
    memory.append(Buffer(samples))
    memory.rng = np.random.default_rng(7)
    indices = memory.sample_indices()
    memory.rng = np.random.default_rng(7)
    prev_obs, act, rew, new_obs, terminated, truncated = memory.sample()
    assert isinstance(prev_obs, tuple) and [p.shape for p in prev_obs] == [(16, 2), (16, 1)]
    assert act.shape == (16, 1) and rew.shape == (16,) and rew.dtype == torch.float32
    assert terminated.dtype == torch.float32 and truncated.shape == (16,)
    for row, item in enumerate(indices):
        want = memory.get_transition(int(item))
        np.testing.assert_array_equal(prev_obs[1][row].numpy(), want[0][1])
        np.testing.assert_array_equal(new_obs[0][row].numpy(), want[3][0])
        assert rew[row].item() == want[2] and truncated[row].item() == float(want[5])
    assert truncated.sum() >= 0 and len(list(memory)) == 3


def test_the_sample_preprocessor_gets_and_replaces_the_whole_sample():
    seen = []

    def preprocessor(prev_obs, new_act, rew, new_obs, terminated, truncated):
        seen.append((terminated, truncated))
        return new_obs, -new_act, rew * 2, prev_obs, truncated, terminated

    samples = worker_samples("Pendulum-v1", episodes=1, cap=4, observe=split_pendulum)
    memory = TmrlEpisodeMemory(memory_size=100, sample_preprocessor=preprocessor)
    memory.append(Buffer(samples))
    prev_obs, act, rew, new_obs, terminated, truncated = memory[3]
    original = memory.get_transition(3)
    np.testing.assert_array_equal(prev_obs[0], original[3][0])
    np.testing.assert_array_equal(new_obs[1], original[0][1])
    np.testing.assert_array_equal(act, -original[1])
    assert rew == original[2] * 2 and (terminated, truncated) == (np.float32(1), np.float32(0))
    assert seen == [(False, True)]


def test_old_episodes_and_their_infos_leave_when_memory_size_is_reached():
    samples = worker_samples("Pendulum-v1", episodes=5, cap=10, observe=split_pendulum)
    memory = TmrlEpisodeMemory(memory_size=25, crc_debug=True)
    memory.append(Buffer(samples))
    assert len(memory) == 20 and memory.table.episode_count == 2
    assert sorted(memory.infos) == [3, 4]
    kept = sent_transitions(samples)[-20:]
    for item, transition in enumerate(kept):
        assert_same_transition(memory.get_transition(item), transition)
        memory[item]


def test_an_empty_buffer_changes_nothing_and_an_empty_memory_cannot_be_sampled():
    memory = TmrlEpisodeMemory(memory_size=10)
    memory.append(Buffer(train_return=9.0))
    assert len(memory) == 0 and memory.stat_train_return == 0.0
    with pytest.raises(SamplingError, match="append buffers first"):
        memory.sample()
    with pytest.raises(IndexError, match="transition 0 is out of range"):
        memory.get_transition(0)


def test_bad_samples_are_refused_with_what_to_send():
    memory = TmrlEpisodeMemory(memory_size=100)
    with pytest.raises(ConfigurationError, match=r"\(act, new_obs, rew, terminated, truncated"):
        memory.append_buffer([(None, np.zeros(3), 0.0, False, False)])
    samples = worker_samples("Pendulum-v1", episodes=1, cap=3)
    memory.append_buffer(samples)
    with pytest.raises(SchemaError, match=r"laid out for \(3,\)"):
        memory.append_buffer([(np.zeros(1), np.zeros(4), 0.0, True, False, {})])  # a reset
    with pytest.raises(SchemaError, match=r"laid out for tuples of 2 parts"):
        tuples = TmrlEpisodeMemory(memory_size=100)
        tuples.append_buffer(worker_samples("Pendulum-v1", 1, 3, observe=split_pendulum))
        tuples.append_buffer([(np.zeros(1), np.zeros(3), 0.0, False, False, {})])
    with pytest.raises(ConfigurationError, match="memory_size=5"):
        small = TmrlEpisodeMemory(memory_size=5)
        small.append_buffer(worker_samples("Pendulum-v1", episodes=1, cap=8))
    with pytest.raises(ConfigurationError, match="batch_size must be a positive"):
        TmrlEpisodeMemory(batch_size=0)
