"""SB3 replay buffers written by SB3 itself read back as the episodes the envs made."""

from __future__ import annotations

import json

import numpy as np
import pytest

from emote_core.errors import FormatError
from emote_core.integrations.detect import read_peer_file
from emote_core.integrations.sb3.replay_buffer import read_sb3_replay_buffer
from emote_core.spaces import MDPSpace
from emote_core.typing import EpisodeState


def _unscale(actions: np.ndarray, metadata: dict) -> np.ndarray:
    low = np.asarray(metadata["env_action_low"])
    high = np.asarray(metadata["env_action_high"])
    return low + (actions + 1.0) * 0.5 * (high - low)


def _assert_matches(table, expected, *, scaled_actions: bool, final_obs: bool = True) -> None:
    assert [len(d["actions"]) for _, d, _ in table.episodes] == [e.length for e in expected]
    assert [s for _, _, s in table.episodes] == [e.state for e in expected]
    assert table.metadata["episode_envs"] == [e.env for e in expected]
    for (identity, data, _), want in zip(table.episodes, expected, strict=True):
        for key, obs in want.obs.items():
            rows = obs if final_obs else obs[:-1]
            np.testing.assert_array_equal(
                data[key][: len(rows)], rows, err_msg=f"episode {identity}"
            )
        np.testing.assert_array_equal(data["rewards"][:, 0], want.rewards)
        if scaled_actions:
            np.testing.assert_allclose(
                _unscale(data["actions"], table.metadata), want.actions, atol=1e-5
            )
        else:
            np.testing.assert_array_equal(data["actions"].reshape(want.actions.shape), want.actions)
    assert [d["rewards"].sum() for _, d, _ in table.episodes] == pytest.approx(
        [e.rewards.sum() for e in expected], rel=1e-5
    )


def test_wrapped_sac_buffer_keeps_the_last_300_steps_as_time_limited_episodes(data_file, recorded):
    table = read_sb3_replay_buffer(data_file("sb3_sac_pendulum_wrapped.pkl"))
    expected = recorded("sb3_sac_pendulum_wrapped", kept=300)
    _assert_matches(table, expected, scaled_actions=True)
    # 430 steps in 50-step episodes through a 300-row ring: a 20-step head whose start was
    # overwritten, five whole episodes, and the unfinished 30-step tail.
    assert [len(d["actions"]) for _, d, _ in table.episodes] == [20, 50, 50, 50, 50, 50, 30]
    assert all(s == EpisodeState.INTERRUPTED for _, _, s in table.episodes)
    assert table.metadata["first_episode_may_be_partial"] is True
    assert table.format == "sb3-replay-buffer"
    columns = {c.name: (c.shape, c.dtype) for c in table.columns}
    assert columns == {
        "obs": ((3,), np.float32),
        "actions": ((1,), np.float32),
        "rewards": ((1,), np.float32),
    }
    for _, data, _ in table.episodes:
        assert len(data["obs"]) == len(data["actions"]) + 1


def test_two_env_dqn_buffer_splits_each_env_at_dones_and_timeouts(data_file, recorded):
    table = read_sb3_replay_buffer(data_file("sb3_dqn_cartpole_2envs.pkl"))
    expected = recorded("sb3_dqn_cartpole_2envs", kept=152, envs=2)
    _assert_matches(table, expected, scaled_actions=False)
    states = [s for _, _, s in table.episodes]
    assert EpisodeState.TERMINAL in states and EpisodeState.INTERRUPTED in states
    assert set(table.metadata["episode_envs"]) == {0, 1}
    assert table.metadata["n_envs"] == 2 and table.metadata["full"] is False


def test_dict_replay_buffer_keeps_one_column_per_observation_key(data_file, recorded):
    table = read_sb3_replay_buffer(data_file("sb3_sac_dict_2envs.pkl"))
    _assert_matches(table, recorded("sb3_sac_dict_2envs", kept=80, envs=2), scaled_actions=True)
    assert [c.name for c in table.columns] == ["angle", "velocity", "actions", "rewards"]
    spaces = MDPSpace.from_json(table.spaces)
    assert spaces.state.keys() == ["angle", "velocity"]
    assert spaces.state["angle"].shape == (2,)


def test_optimized_buffer_drops_the_overwritten_row_and_says_finals_are_lost(data_file, recorded):
    table = read_sb3_replay_buffer(data_file("sb3_dqn_cartpole_optimized.pkl"))
    expected = recorded("sb3_dqn_cartpole_optimized", kept=119)
    for want in expected:  # SB3 recorded no timeouts here: it treats every done as terminal
        if want is not expected[-1]:
            want.state = EpisodeState.TERMINAL
    _assert_matches(table, expected, scaled_actions=False, final_obs=False)
    # The unfinished tail still has its real final observation (the newest row SB3 wrote).
    np.testing.assert_array_equal(table.episodes[-1][1]["obs"][-1], expected[-1].obs["obs"][-1])
    assert table.metadata["final_observations_recorded"] is False
    assert table.metadata["optimize_memory_usage"] is True


def test_spaces_describe_the_stored_data(data_file):
    sac = MDPSpace.from_json(
        read_sb3_replay_buffer(data_file("sb3_sac_pendulum_wrapped.pkl")).spaces
    )
    assert sac.state["obs"].shape == (3,)
    assert sac.actions.low.tolist() == [-1.0] and sac.actions.high.tolist() == [1.0]
    dqn = read_sb3_replay_buffer(data_file("sb3_dqn_cartpole_2envs.pkl"))
    assert dqn.spaces["actions"] == {"type": "discrete", "n": 2, "dtype": "<i8", "shape": [1]}
    json.dumps(dqn.metadata)  # metadata is JSON-compatible for stores and `inspect --json`


def test_read_peer_file_detects_the_format(data_file):
    table = read_peer_file(data_file("sb3_dqn_cartpole_2envs.pkl"))
    assert table.format == "sb3-replay-buffer" and len(table.episodes) == 13


def test_trusted_load_with_sb3_installed_reads_the_same_episodes(data_file):
    pytest.importorskip(
        "stable_baselines3",
        reason="Stable-Baselines3 writes these inputs; it comes with the dev extra",
    )
    path = data_file("sb3_dqn_cartpole_2envs.pkl")
    safe, trusted = read_sb3_replay_buffer(path), read_sb3_replay_buffer(path, trust_pickle=True)
    assert len(safe.episodes) == len(trusted.episodes)
    for (_, a, s), (_, b, t) in zip(safe.episodes, trusted.episodes, strict=True):
        assert s == t and all(np.array_equal(a[k], b[k]) for k in a)
    assert safe.spaces == trusted.spaces


@pytest.mark.parametrize("keep", [0.5, 0.1])
def test_truncated_buffer_is_a_format_error(data_file, tmp_path, keep):
    data = data_file("sb3_sac_pendulum_wrapped.pkl").read_bytes()
    path = tmp_path / "buffer.pkl"
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(FormatError, match="not a readable pickle"):
        read_sb3_replay_buffer(path)


def test_empty_and_missing_files_are_format_errors(tmp_path):
    (tmp_path / "empty.pkl").write_bytes(b"")
    with pytest.raises(FormatError, match="empty"):
        read_sb3_replay_buffer(tmp_path / "empty.pkl")
    with pytest.raises(FormatError, match="does not exist"):
        read_sb3_replay_buffer(tmp_path / "missing.pkl")


def test_a_pickle_of_something_else_is_refused_with_what_it_holds(tmp_path):
    import pickle

    path = tmp_path / "dict.pkl"
    path.write_bytes(pickle.dumps({"observations": np.zeros((2, 1, 3))}))
    with pytest.raises(FormatError, match=r"holds a builtins\.dict"):
        read_sb3_replay_buffer(path)


def test_n_step_buffer_stores_single_steps_like_a_replay_buffer(data_file, recorded):
    table = read_sb3_replay_buffer(data_file("sb3_dqn_cartpole_nstep.pkl"))
    _assert_matches(table, recorded("sb3_dqn_cartpole_nstep", kept=72), scaled_actions=False)
