"""Writing tables as skrl exports: skrl's layout, exact round trips, atomic writes."""

from __future__ import annotations

import csv
import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from emote_core.errors import FormatError
from emote_core.integrations.detect import read_peer_file
from emote_core.integrations.skrl.reader import read_skrl_memory
from emote_core.integrations.skrl.writer import SkrlLayout, write_skrl_memory
from emote_core.stores.stored import ColumnSchema, StoredTable
from emote_core.typing import EpisodeState

FLOATS = st.floats(width=32, allow_nan=False, allow_infinity=True)


def _table(episodes, obs_shape=(3,), action_dtype=np.float32, action_shape=(2,)) -> StoredTable:
    return StoredTable(
        source="generated table",
        format="test",
        columns=[
            ColumnSchema("obs", "Column", obs_shape, np.dtype(np.float32)),
            ColumnSchema("actions", "Column", action_shape, np.dtype(action_dtype)),
            ColumnSchema("rewards", "Column", (1,), np.dtype(np.float32)),
        ],
        episodes=episodes,
        length_key="actions",
    )


@st.composite
def tables(draw, obs_shape=(3,), action_dtype=np.float32):
    action_shape = (1,) if action_dtype == np.int64 else (2,)
    elements = st.integers(-5, 5) if action_dtype == np.int64 else FLOATS
    episodes = []
    for identity in range(draw(st.integers(0, 5))):
        length = draw(st.integers(1, 8))
        data = {
            "obs": draw(hnp.arrays(np.float32, (length + 1, *obs_shape), elements=FLOATS)),
            "actions": draw(hnp.arrays(action_dtype, (length, *action_shape), elements=elements)),
            "rewards": draw(hnp.arrays(np.float32, (length, 1), elements=FLOATS)),
        }
        state = draw(st.sampled_from([EpisodeState.TERMINAL, EpisodeState.INTERRUPTED]))
        episodes.append((identity, data, state))
    return _table(episodes, obs_shape, action_dtype, action_shape)


def _assert_same_episodes(written: StoredTable, read: StoredTable, *, flat: bool = False) -> None:
    assert len(read.episodes) == len(written.episodes)
    for (_, want, state), (_, got, got_state) in zip(written.episodes, read.episodes, strict=True):
        assert got_state == state
        assert got.keys() == want.keys()
        for key, array in want.items():
            expected = array.reshape(len(array), -1) if flat else array
            assert got[key].dtype == array.dtype, key
            np.testing.assert_array_equal(got[key], expected, err_msg=key)
            # -0.0 and 0.0 compare equal; the bits must survive too.
            assert np.array_equal(np.signbit(got[key]), np.signbit(expected)), key


SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@SETTINGS
@given(table=tables())
def test_npz_round_trip_is_exact(tmp_path, table):
    path = write_skrl_memory(table, tmp_path / "memory.npz")
    _assert_same_episodes(table, read_skrl_memory(path))


@SETTINGS
@given(table=tables(action_dtype=np.int64))
def test_csv_round_trip_is_exact(tmp_path, table):
    path = write_skrl_memory(table, tmp_path / "memory.csv")
    _assert_same_episodes(table, read_skrl_memory(path, num_envs=1))


@SETTINGS
@given(table=tables(obs_shape=(2, 2)))
def test_pt_round_trip_keeps_shapes_and_csv_flattens_them(tmp_path, table):
    _assert_same_episodes(table, read_skrl_memory(write_skrl_memory(table, tmp_path / "m.pt")))
    path = write_skrl_memory(table, tmp_path / "m.csv")
    _assert_same_episodes(table, read_skrl_memory(path, num_envs=1), flat=True)


def test_written_files_have_skrls_layout(tmp_path):
    obs = np.arange(8, dtype=np.float32).reshape(4, 2)
    episode = {"obs": obs, "actions": np.ones((3, 1), np.float32), "rewards": np.ones((3, 1))}
    table = _table([(0, episode, EpisodeState.TERMINAL)], (2,), np.float32, (1,))
    npz = np.load(write_skrl_memory(table, tmp_path / "m.npz"))
    assert sorted(npz.files) == sorted(
        ["states", "next_states", "actions", "rewards", "terminated", "truncated"]
    )
    assert npz["states"].shape == (3, 1, 2) and npz["terminated"].dtype == bool
    np.testing.assert_array_equal(npz["next_states"][:, 0], obs[1:])
    assert npz["terminated"][:, 0, 0].tolist() == [False, False, True]
    pt = torch.load(
        write_skrl_memory(table, tmp_path / "m.pt", layout=SkrlLayout.V2), weights_only=True
    )
    assert {"observations", "next_observations"} <= set(pt)
    with (tmp_path / "m.csv").open("w") as file:
        file.write("stale")
    write_skrl_memory(table, tmp_path / "m.csv")
    with (tmp_path / "m.csv").open() as file:
        header, first = next(csv.reader(file)), None
    assert header[:3] == ["actions.0", "next_states.0", "next_states.1"]
    assert first is None and "truncated.0" in header


def test_csv_values_are_exact_float_reprs(tmp_path):
    value = np.float32(0.1)
    episode = {
        "obs": np.full((2, 1), value),
        "actions": np.zeros((1, 1)),
        "rewards": np.zeros((1, 1)),
    }
    table = _table([(0, episode, EpisodeState.INTERRUPTED)], (1,), np.float64, (1,))
    text = write_skrl_memory(table, tmp_path / "m.csv").read_text()
    assert repr(float(value)) in text  # 0.10000000149011612, not 0.1
    read = read_skrl_memory(tmp_path / "m.csv")
    assert read.episodes[0][1]["obs"][0, 0] == value


def test_float64_values_beyond_float32_read_back_as_float64(tmp_path):
    episode = {
        "obs": np.array([[0.1], [0.2]]),
        "actions": np.zeros((1, 1)),
        "rewards": np.zeros((1, 1)),
    }
    table = _table([(0, episode, EpisodeState.INTERRUPTED)], (1,), np.float64, (1,))
    table.columns[0] = ColumnSchema("obs", "Column", (1,), np.dtype(np.float64))
    read = read_skrl_memory(write_skrl_memory(table, tmp_path / "m.csv"))
    assert read.episodes[0][1]["obs"].dtype == np.float64
    assert read.episodes[0][1]["obs"][:, 0].tolist() == [0.1, 0.2]


@pytest.mark.parametrize("kind", ["npz", "pt", "csv"])
def test_real_peer_files_convert_and_read_back_the_same_episodes(data_file, tmp_path, kind):
    for name in ("sb3_dqn_cartpole_2envs.pkl", "tmrl_pendulum.data.pkl", "skrl1_memory_2envs.pt"):
        source = read_peer_file(data_file(name))
        back = read_peer_file(write_skrl_memory(source, tmp_path / f"{name}.{kind}"))
        assert back.format == "skrl-memory"
        _assert_same_episodes(source, back)


def test_dict_observations_are_joined_into_one_vector_as_skrl_does(data_file, tmp_path):
    source = read_peer_file(data_file("sb3_sac_dict_2envs.pkl"))
    back = read_skrl_memory(write_skrl_memory(source, tmp_path / "m.npz"))
    for (_, want, _), (_, got, _) in zip(source.episodes, back.episodes, strict=True):
        np.testing.assert_array_equal(
            got["obs"], np.concatenate([want["angle"], want["velocity"]], 1)
        )


def test_tables_without_actions_are_refused_and_nothing_is_left(tmp_path):
    table = StoredTable(
        source="a V1 table",
        format="emote-v1",
        columns=[ColumnSchema("observation", "Column", (), np.dtype(np.float32))],
        episodes=[(0, {"observation": np.zeros(3, np.float32)}, EpisodeState.TERMINAL)],
    )
    with pytest.raises(FormatError, match=r"no \['actions', 'rewards'\] column"):
        write_skrl_memory(table, tmp_path / "m.npz")
    with pytest.raises(FormatError, match="choose one of"):
        write_skrl_memory(_table([]), tmp_path / "m.parquet")
    assert list(tmp_path.iterdir()) == []


def test_an_empty_table_writes_an_export_with_no_episodes(tmp_path):
    path = write_skrl_memory(_table([]), tmp_path / "m.npz")
    assert read_skrl_memory(path).episodes == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.npz"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "m.pt"
    target.write_bytes(b"previous export")
    episode = {
        "obs": np.array(["a", "b"]),
        "actions": np.zeros((1, 1)),
        "rewards": np.zeros((1, 1)),
    }
    table = _table([(0, episode, EpisodeState.TERMINAL)], (), np.float64, (1,))
    table.columns[0] = ColumnSchema("obs", "Column", (), np.dtype("<U1"))
    with pytest.raises(FormatError, match="no torch equivalent"):
        write_skrl_memory(table, target)
    assert target.read_bytes() == b"previous export"
    assert [p.name for p in tmp_path.iterdir()] == ["m.pt"]


def test_written_files_get_the_usual_permissions(tmp_path):
    previous = os.umask(0o022)
    try:
        path = write_skrl_memory(_table([]), tmp_path / "m.csv")
    finally:
        os.umask(previous)
    assert path.stat().st_mode & 0o777 == 0o644  # readable by others, like any new file
