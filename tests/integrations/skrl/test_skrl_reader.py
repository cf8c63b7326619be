"""skrl ``Memory.save`` exports written by skrl itself read back as the episodes the envs made."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
import torch

from emote_core.errors import FormatError
from emote_core.integrations.detect import read_peer_file
from emote_core.integrations.skrl.reader import read_skrl_memory
from emote_core.typing import EpisodeState

KINDS = ["pt", "npz", "csv"]


def _assert_matches(table, expected) -> None:
    assert [len(d["actions"]) for _, d, _ in table.episodes] == [e.length for e in expected]
    assert [s for _, _, s in table.episodes] == [e.state for e in expected]
    assert table.metadata["episode_envs"] == [e.env for e in expected]
    for (_, data, _), want in zip(table.episodes, expected, strict=True):
        np.testing.assert_array_equal(data["obs"], want.obs["obs"])
        np.testing.assert_array_equal(data["rewards"][:, 0], want.rewards)
        np.testing.assert_allclose(
            data["actions"].reshape(want.actions.shape), want.actions, rtol=1e-6
        )


@pytest.mark.parametrize("kind", KINDS)
def test_skrl2_sac_export_cuts_the_unflagged_time_limits(data_file, recorded, kind):
    table = read_skrl_memory(data_file(f"skrl2_sac_pendulum.{kind}"))
    _assert_matches(table, recorded("skrl2_sac_pendulum"))
    # skrl 2.x stores no `truncated`: both 50-step time limits are found from the reset between
    # rows, and the 30-step tail is unfinished.
    assert [len(d["actions"]) for _, d, _ in table.episodes] == [50, 50, 30]
    assert all(s == EpisodeState.INTERRUPTED for _, _, s in table.episodes)
    assert table.metadata["inferred_cuts"] == 2
    assert table.metadata["layout"] == "observations"
    assert table.format == "skrl-memory"


@pytest.mark.parametrize("kind", KINDS)
def test_two_env_skrl1_memory_splits_each_env_and_skips_unwritten_rows(data_file, recorded, kind):
    table = read_skrl_memory(data_file(f"skrl1_memory_2envs.{kind}"))
    _assert_matches(table, recorded("skrl1_memory_2envs", envs=2))
    states = {s for _, _, s in table.episodes}
    assert states == {EpisodeState.TERMINAL, EpisodeState.INTERRUPTED}
    assert table.metadata["num_envs"] == 2
    assert table.metadata["valid_rows"] == [57, 57]  # 80 rows, 57 written, the rest NaN
    assert table.metadata["inferred_cuts"] == 0  # every end is flagged in skrl 1.x
    columns = {c.name: (c.shape, c.dtype) for c in table.columns}
    assert columns == {
        "obs": ((4,), np.float32),
        "actions": ((1,), np.int64),
        "rewards": ((1,), np.float32),
    }


def test_csv_env_count_is_inferred_and_can_be_given(data_file):
    path = data_file("skrl1_memory_2envs.csv")
    assert read_skrl_memory(path).metadata["num_envs_inferred"] is True
    given = read_skrl_memory(path, num_envs=2)
    assert given.metadata["num_envs_inferred"] is False
    wrong = read_skrl_memory(path, num_envs=1, infer_cuts=False)
    assert len(wrong.episodes) != len(given.episodes)  # the env count matters, so it is recorded


def test_without_cut_inference_unflagged_time_limits_stay_inside_episodes(data_file):
    table = read_skrl_memory(data_file("skrl2_sac_pendulum.npz"), infer_cuts=False)
    assert [len(d["actions"]) for _, d, _ in table.episodes] == [130]


def _autoreset_memory(path) -> None:
    """A memory as skrl records a next-step-autoreset vector env: an extra row after the end."""
    obs = np.arange(1, 8, dtype=np.float32)[:, None]  # one episode 1..4, then 5..7
    rows = [(1, 2, False), (2, 3, False), (3, 4, True), (4, 5, False), (5, 6, False), (6, 7, False)]
    np.savez(
        path,
        states=np.array([[[obs[a - 1, 0]]] for a, _, _ in rows], np.float32),
        next_states=np.array([[[obs[b - 1, 0]]] for _, b, _ in rows], np.float32),
        actions=np.zeros((6, 1, 1), np.float32),
        rewards=np.ones((6, 1, 1), np.float32),
        terminated=np.array([[[t]] for _, _, t in rows]),
    )


def test_autoreset_rows_are_counted_and_dropped_on_request(tmp_path):
    path = tmp_path / "autoreset.npz"
    _autoreset_memory(path)
    kept = read_skrl_memory(path)
    assert kept.metadata["suspected_autoreset_steps"] == 1
    assert [len(d["actions"]) for _, d, _ in kept.episodes] == [3, 3]
    dropped = read_skrl_memory(path, drop_autoreset_steps=True)
    assert [len(d["actions"]) for _, d, _ in dropped.episodes] == [3, 2]
    assert dropped.episodes[1][1]["obs"][:, 0].tolist() == [5.0, 6.0, 7.0]


def test_on_policy_memory_without_next_observations_is_refused(tmp_path):
    path = tmp_path / "ppo.npz"
    np.savez(
        path,
        states=np.zeros((4, 1, 3)),
        actions=np.zeros((4, 1, 1)),
        rewards=np.zeros((4, 1, 1)),
        terminated=np.zeros((4, 1, 1), bool),
    )
    with pytest.raises(FormatError, match=r"on-policy agent .* has 'states' but no 'next_states'"):
        read_skrl_memory(path)


def test_pt_with_more_than_tensors_is_refused_naming_trust_pickle(tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    path = tmp_path / "memory.pt"
    torch.save(
        {"states": torch.zeros(2, 1, 3), "rewards": torch.zeros(2, 1, 1), "payload": Payload()},
        path,
    )
    with pytest.raises(FormatError, match="`trust_pickle=True`"):
        read_skrl_memory(path)
    assert not marker.exists()


@pytest.mark.parametrize("kind", KINDS)
def test_truncated_exports_are_format_errors(data_file, tmp_path, kind):
    data = data_file(f"skrl1_memory_2envs.{kind}").read_bytes()
    cut = len(data) // 2
    if kind == "csv":  # cut inside a line, as a crashed writer would leave it
        cut = data.index(b"\n", cut) - 3
    path = tmp_path / f"memory.{kind}"
    path.write_bytes(data[:cut])
    with pytest.raises(FormatError):
        read_skrl_memory(path)


@pytest.mark.parametrize("kind", KINDS)
def test_empty_exports_are_format_errors(tmp_path, kind):
    path = tmp_path / f"memory.{kind}"
    path.write_bytes(b"")
    with pytest.raises(FormatError, match="empty"):
        read_skrl_memory(path)


def test_csv_with_a_foreign_header_is_refused(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("time,value\n1,2\n")
    with pytest.raises(FormatError, match=r"not of the form 'name\.index'"):
        read_skrl_memory(path)


def test_tensors_of_different_lengths_are_refused(tmp_path):
    buffer = io.BytesIO()
    np.savez(
        buffer,
        states=np.zeros((4, 1, 3)),
        next_states=np.zeros((4, 1, 3)),
        actions=np.zeros((3, 1, 1)),
        rewards=np.zeros((4, 1, 1)),
    )
    path = tmp_path / "ragged.npz"
    path.write_bytes(buffer.getvalue())
    with pytest.raises(FormatError, match="share"):
        read_skrl_memory(path)


def test_read_peer_file_detects_all_three_kinds(data_file):
    counts = {len(read_peer_file(data_file(f"skrl2_sac_pendulum.{k}")).episodes) for k in KINDS}
    assert counts == {3}


def test_a_memory_the_installed_skrl_saves_reads_back_as_the_steps_it_was_given(tmp_path):
    """Not only the files in data/: whatever skrl is installed (the dev extra brings it) writes
    a fresh memory here, in every format its ``Memory.save`` knows."""
    memories = pytest.importorskip(
        "skrl.memories.torch", reason='skrl comes with the dev extra: pip install -e ".[dev]"'
    )
    import gymnasium as gym

    memory = memories.RandomMemory(memory_size=30, num_envs=1, device="cpu")
    names = ("observations", "next_observations", "actions", "rewards", "terminated", "truncated")
    for name, size in zip(names, (3, 3, 1, 1, 1, 1), strict=True):
        dtype = torch.bool if name in ("terminated", "truncated") else torch.float32
        memory.create_tensor(name=name, size=size, dtype=dtype)
    env = gym.make("Pendulum-v1", max_episode_steps=10)
    env.action_space.seed(1)
    observation, _ = env.reset(seed=1)
    episodes: list[dict[str, list]] = [{"obs": [observation], "rewards": []}]
    for _ in range(25):
        action = env.action_space.sample()
        after, reward, terminated, truncated, _ = env.step(action)
        row = (observation, after, action, [reward], [terminated], [truncated])
        tensors = {n: torch.tensor(np.asarray(v)[None]) for n, v in zip(names, row, strict=True)}
        memory.add_samples(**tensors)
        episodes[-1]["obs"].append(after)
        episodes[-1]["rewards"].append(reward)
        observation = after
        if terminated or truncated:
            observation, _ = env.reset()
            episodes.append({"obs": [observation], "rewards": []})
    for kind in KINDS:
        memory.save(str(tmp_path), format=kind)
    saved = sorted((tmp_path / "memories").iterdir(), key=lambda p: p.suffix)
    assert [p.suffix for p in saved] == [".csv", ".npz", ".pt"]
    for path in saved:
        table = read_skrl_memory(path)
        assert [len(d["rewards"]) for _, d, _ in table.episodes] == [10, 10, 5], path.suffix
        assert all(s == EpisodeState.INTERRUPTED for _, _, s in table.episodes)
        for (_, data, _), want in zip(table.episodes, episodes, strict=True):
            np.testing.assert_allclose(data["obs"], np.asarray(want["obs"]), rtol=1e-6)
            np.testing.assert_allclose(data["rewards"][:, 0], want["rewards"], rtol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_a_real_ppo_export_is_refused_as_on_policy_with_the_reason(data_file, kind):
    # Written by skrl's PPO filling RandomMemory(export=True): observations, actions, rewards,
    # terminated, truncated, log_prob, values, returns, advantages, and no next observations.
    with pytest.raises(FormatError) as refused:
        read_peer_file(data_file(f"skrl2_ppo_pendulum.{kind}"))
    message = str(refused.value)
    assert "on-policy" in message
    assert "final observations are not in the file" in message
    assert "'next_observations'" in message and "off-policy agent" in message
    assert "\n" not in message


def test_a_memory_without_any_observations_is_refused_naming_its_tensors(tmp_path):
    path = tmp_path / "memory.npz"
    arrays = {n: np.zeros((4, 1, 1), np.float32) for n in ("actions", "rewards", "values")}
    np.savez(path, **arrays)
    with pytest.raises(FormatError, match=r"'values'\].*no observations/next_observations"):
        read_skrl_memory(path)
