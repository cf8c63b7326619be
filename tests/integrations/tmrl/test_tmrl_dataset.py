"""tmrl ``data.pkl`` datasets made by tmrl's own memory read back as the recorded episodes."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from emote_core.errors import FormatError
from emote_core.integrations.detect import read_peer_file
from emote_core.integrations.tmrl.dataset import read_tmrl_dataset
from emote_core.typing import EpisodeState


def _kept(expected, entries: int):
    """The recorded episodes tmrl still holds when it kept the last ``entries`` entries.

    Each episode took ``length + 1`` entries (a reset, then one per step); tmrl trims whole
    entries from the front, so the first kept episode may have lost its reset and first steps.
    """
    dropped = sum(e.length + 1 for e in expected) - entries
    kept = []
    for episode in expected:
        if dropped >= episode.length + 1:
            dropped -= episode.length + 1
            continue
        if dropped:  # entry `dropped` of this episode is the first kept one
            episode.obs = {k: v[dropped:] for k, v in episode.obs.items()}
            episode.actions, episode.rewards = episode.actions[dropped:], episode.rewards[dropped:]
            dropped = 0
        kept.append(episode)
    return kept


def _assert_matches(table, expected, parts) -> None:
    assert [len(d["actions"]) for _, d, _ in table.episodes] == [e.length for e in expected]
    assert [s for _, _, s in table.episodes] == [e.state for e in expected]
    for (_, data, _), want in zip(table.episodes, expected, strict=True):
        for column, make in parts.items():
            np.testing.assert_array_equal(data[column], make(want.obs["obs"]))
        np.testing.assert_array_equal(data["rewards"][:, 0], want.rewards)
        np.testing.assert_array_equal(data["actions"].reshape(want.actions.shape), want.actions)


def test_trimmed_tuple_observation_dataset(data_file, recorded):
    table = read_tmrl_dataset(data_file("tmrl_pendulum.data.pkl"))
    expected = _kept(recorded("tmrl_pendulum"), table.metadata["entries"])
    # Tuples of two float32 arrays are joined into one obs vector: Pendulum's own observation.
    _assert_matches(table, expected, {"obs": lambda obs: obs})
    # tmrl kept 91 of 112 entries: the first episode lost its reset and first 5 steps.
    assert [len(d["actions"]) for _, d, _ in table.episodes] == [10, 15, 15, 15, 15, 15]
    assert all(s == EpisodeState.INTERRUPTED for _, _, s in table.episodes)  # the worker's cap
    assert table.metadata["observation_flattened"] is True
    assert table.metadata["observation_parts"] == [
        {"shape": [2], "dtype": "<f4"},
        {"shape": [1], "dtype": "<f4"},
    ]
    assert table.format == "tmrl-dataset" and table.spaces is None


def test_mixed_dtype_observation_parts_become_separate_columns(data_file, recorded):
    table = read_tmrl_dataset(data_file("tmrl_cartpole_mixed.data.pkl"))
    expected = recorded("tmrl_cartpole_mixed")

    def image(obs):
        return (np.clip(np.abs(obs), 0, 1) * 255).astype(np.uint8).reshape(len(obs), 2, 2)

    _assert_matches(table, expected, {"obs_0": lambda obs: obs, "obs_1": image})
    states = [s for _, _, s in table.episodes]
    assert EpisodeState.TERMINAL in states and EpisodeState.INTERRUPTED in states
    columns = {c.name: (c.shape, c.dtype) for c in table.columns}
    assert columns == {
        "obs_0": ((4,), np.float32),
        "obs_1": ((2, 2), np.uint8),
        "actions": ((1,), np.int64),
        "rewards": ((1,), np.float32),
    }


def _dataset(entries):
    """The seven lists from ``(action, obs, reward, terminated, truncated)`` entries."""
    lists = [[e[i] for e in entries] for i in range(5)]
    lists.append([{} for _ in entries])
    lists.append([bool(e[3] or e[4]) for e in entries])
    return lists


def test_unfinished_tail_and_a_lone_final_reset(tmp_path):
    obs = [np.full(2, float(i), np.float32) for i in range(7)]
    entries = [
        (None, obs[0], 0.0, False, False),  # reset
        (np.ones(1), obs[1], 1.0, False, False),
        (np.ones(1), obs[2], 2.0, True, False),  # terminated
        (None, obs[3], 0.0, False, False),  # reset
        (np.ones(1), obs[4], 4.0, False, False),  # unfinished: no done after it
    ]
    path = tmp_path / "data.pkl"
    path.write_bytes(pickle.dumps(_dataset(entries)))
    table = read_tmrl_dataset(path)
    assert [(len(d["actions"]), s) for _, d, s in table.episodes] == [
        (2, EpisodeState.TERMINAL),
        (1, EpisodeState.INTERRUPTED),
    ]
    assert table.episodes[0][1]["obs"][:, 0].tolist() == [0.0, 1.0, 2.0]
    assert table.episodes[0][1]["rewards"][:, 0].tolist() == [1.0, 2.0]
    entries.append((np.ones(1), obs[5], 5.0, False, True))  # truncated ...
    entries.append((None, obs[6], 0.0, False, False))  # ... then a reset with no step
    path.write_bytes(pickle.dumps(_dataset(entries)))
    table = read_tmrl_dataset(path)
    assert [(len(d["actions"]), s) for _, d, s in table.episodes][1] == (
        2,
        EpisodeState.INTERRUPTED,
    )
    assert len(table.episodes) == 2 and table.metadata["empty_resets_skipped"] == 1


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ({"a": 1}, "holds dict"),
        ([[1], [2]], "holds 2 items"),
        ([[], [], [], [], [], [], []], "no entries"),
        ([[None, None], [np.zeros(2)], [0.0], [False], [False], [{}], [False]], "differ in length"),
    ],
)
def test_other_pickles_are_refused_with_the_rule(tmp_path, value, match):
    path = tmp_path / "data.pkl"
    path.write_bytes(pickle.dumps(value))
    with pytest.raises(FormatError, match=match):
        read_tmrl_dataset(path)


def test_truncated_and_empty_datasets_are_format_errors(data_file, tmp_path):
    data = data_file("tmrl_pendulum.data.pkl").read_bytes()
    path = tmp_path / "data.pkl"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(FormatError, match="not a readable pickle"):
        read_tmrl_dataset(path)
    path.write_bytes(b"")
    with pytest.raises(FormatError, match="empty"):
        read_tmrl_dataset(path)


def test_read_peer_file_detects_a_dataset(data_file):
    assert read_peer_file(data_file("tmrl_pendulum.data.pkl")).format == "tmrl-dataset"
