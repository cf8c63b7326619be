"""Writing Minari datasets: round trips through plain minari, and refusals of bad input."""

from __future__ import annotations

import itertools
import json
import re
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emote_core.errors import ConfigurationError, FormatError, StorageError
from emote_core.integrations.minari.datasets import (
    INSTALL_HINT,
    RECORD_KEY,
    read_minari,
    write_minari,
)
from emote_core.memory.builders import DictObsMemoryTable
from emote_core.spaces import BoxSpace, DictSpace, DiscreteSpace, MDPSpace
from emote_core.stores.stored import ColumnSchema, StoredTable, restore_stored
from emote_core.typing import EpisodeState

minari = pytest.importorskip("minari", reason="Minari comes with the dev and minari extras")
pytest.importorskip(
    "h5py", reason="h5py (Minari's HDF5 backend) comes with the dev and minari extras"
)


DATA = Path(__file__).parent / "data"
_ids = itertools.count()


# Writing.


def _stored(
    episodes: list[tuple[int, dict[str, np.ndarray], EpisodeState]], **kwargs
) -> StoredTable:
    first = episodes[0][1]
    columns = [ColumnSchema(k, "Column", v.shape[1:], v.dtype) for k, v in first.items()]
    return StoredTable(
        source="generated table",
        format="zarr",
        columns=kwargs.pop("columns", columns),
        episodes=episodes,
        length_key="rewards",
        **kwargs,
    )


@st.composite
def box_tables(draw: st.DrawFn) -> StoredTable:
    obs_dtype = draw(st.sampled_from([np.float32, np.float64, np.int32]))
    obs_shape = draw(st.sampled_from([(), (1,), (3,), (2, 2)]))
    action_shape = draw(st.sampled_from([(1,), (2,)]))
    ids = draw(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=4, unique=True))
    floats = st.floats(-1e6, 1e6, width=32)
    episodes = []
    for identity in ids:
        steps = draw(st.integers(1, 6))

        def values(shape: tuple[int, ...], dtype: Any, strategy: Any = floats) -> np.ndarray:
            flat = draw(
                st.lists(strategy, min_size=int(np.prod(shape)), max_size=int(np.prod(shape)))
            )
            return np.asarray(flat, dtype=dtype).reshape(shape)

        obs_values = st.integers(-(2**31), 2**31 - 1) if obs_dtype is np.int32 else floats
        data = {
            "obs": values((steps + 1, *obs_shape), obs_dtype, obs_values),
            "actions": values((steps, *action_shape), np.float32),
            "rewards": values((steps, 1), np.float32),
        }
        end = draw(st.sampled_from([EpisodeState.TERMINAL, EpisodeState.INTERRUPTED]))
        episodes.append((identity, data, end))
    spaces = None
    if draw(st.booleans()):
        spaces = MDPSpace(
            rewards=BoxSpace(np.float32, (1,)),
            actions=BoxSpace(np.float32, action_shape, low=-1e6, high=1e6),
            state=DictSpace({"obs": BoxSpace(obs_dtype, obs_shape)}),
        ).to_json()
    return _stored(
        episodes,
        spaces=spaces,
        maxlen=draw(st.sampled_from([None, 10_000])),
        metadata={"source_format": "zarr", "note": "generated"},
    )


def _assert_same_table(back: StoredTable, stored: StoredTable) -> None:
    assert back.columns == stored.columns
    assert (back.length_key, back.maxlen, back.spaces) == (
        stored.length_key,
        stored.maxlen,
        stored.spaces,
    )
    for key in ("source_format", "note"):  # the source's own metadata survives
        assert back.metadata.get(key) == stored.metadata.get(key)
    assert len(back.episodes) == len(stored.episodes)
    for (identity, data, end), (want_id, want, want_end) in zip(
        back.episodes, stored.episodes, strict=True
    ):
        assert (identity, end) == (want_id, want_end)
        assert data.keys() == want.keys()
        for name, values in want.items():
            assert data[name].dtype == values.dtype, name
            np.testing.assert_array_equal(data[name], values)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(stored=box_tables())
def test_written_datasets_load_in_plain_minari_and_read_back_exactly(root: Path, stored):
    dataset_id = f"emote/generated-v{next(_ids)}"
    path = write_minari(stored, dataset_id)
    assert path == root / dataset_id
    dataset = minari.load_dataset(dataset_id)
    assert dataset.total_episodes == len(stored.episodes)
    assert dataset.total_steps == sum(len(data["rewards"]) for _, data, _ in stored.episodes)
    for episode, (_, data, end) in zip(dataset.iterate_episodes(), stored.episodes, strict=True):
        np.testing.assert_array_equal(episode.observations, data["obs"])
        np.testing.assert_array_equal(episode.actions, data["actions"])
        np.testing.assert_array_equal(episode.rewards, data["rewards"][:, 0])
        assert episode.observations.dtype == data["obs"].dtype
        flags = episode.terminations if end == EpisodeState.TERMINAL else episode.truncations
        assert flags[-1] and not flags[:-1].any()
        assert not (episode.terminations & episode.truncations).any()
    _assert_same_table(read_minari(dataset_id), stored)


def _table_content(table: DictObsMemoryTable, spaces: MDPSpace) -> StoredTable:
    columns = [ColumnSchema.of(column) for column in table.columns.values()]
    return StoredTable(
        source="a DictObsMemoryTable",
        format="table",
        columns=columns,
        episodes=list(table.episodes()),
        length_key=table.length_key,
        maxlen=table.maxlen,
        spaces=spaces.to_json(),
        metadata={"source_format": "table"},
    )


def test_dict_observations_and_discrete_actions_round_trip_through_a_table(root: Path) -> None:
    spaces = MDPSpace(
        rewards=BoxSpace(np.float32, (1,)),
        actions=DiscreteSpace(n=4),
        state=DictSpace(
            {"pos": BoxSpace(np.float32, (2,), -5.0, 5.0), "goal": BoxSpace(np.float64, (3,))}
        ),
    )
    table = DictObsMemoryTable(spaces=spaces, maxlen=100, seed=0)
    rng = np.random.default_rng(0)
    for identity, steps in [(7, 3), (2, 5), (11, 1)]:
        table.add_sequence(
            identity,
            {
                "pos": rng.uniform(-5, 5, (steps + 1, 2)).astype(np.float32),
                "goal": rng.normal(size=(steps + 1, 3)),
                "actions": rng.integers(0, 4, (steps, 1)),
                "rewards": rng.normal(size=(steps, 1)).astype(np.float32),
            },
            end_state=EpisodeState.TERMINAL if identity != 2 else EpisodeState.INTERRUPTED,
        )
    stored = _table_content(table, spaces)
    write_minari(stored, "tables/dict-discrete-v0", env_id=None, author=["a", "b"])
    dataset = minari.load_dataset("tables/dict-discrete-v0")
    assert dataset.action_space == gym.spaces.Discrete(4)
    assert set(dataset.observation_space.spaces) == {"pos", "goal"}
    assert dataset.storage.metadata["author"] == {"a", "b"}
    first = next(dataset.iterate_episodes())
    np.testing.assert_array_equal(first.actions, stored.episodes[0][1]["actions"][:, 0])
    back = read_minari("tables/dict-discrete-v0")
    _assert_same_table(back, stored)
    again = DictObsMemoryTable(spaces=MDPSpace.from_json(back.spaces), maxlen=100, seed=0)
    restore_stored(again, back)
    assert [(i, e) for i, _, e in again.episodes()] == [(i, e) for i, _, e in table.episodes()]


def test_env_id_and_authorship_are_recorded_for_minari(root: Path) -> None:
    stored = read_minari("cartpole/random-v0", root=DATA)
    write_minari(
        stored,
        "cartpole/copy-v0",
        env_id="CartPole-v1",
        author="someone",
        description="copied",
        code_permalink="https://example.com",
    )
    dataset = minari.load_dataset("cartpole/copy-v0")
    assert dataset.env_spec.id == "CartPole-v1"
    assert dataset.recover_environment().observation_space == dataset.observation_space
    back = read_minari("cartpole/copy-v0")
    assert (back.metadata["env_id"], back.metadata["description"]) == ("CartPole-v1", "copied")
    assert (root / "cartpole" / "namespace_metadata.json").is_file()
    _assert_same_table(back, stored)


# Refusals and errors.


def _small_table(value: float = 1.0) -> StoredTable:
    data = {
        "obs": np.full((3, 2), value, np.float32),
        "actions": np.zeros((2, 1), np.float32),
        "rewards": np.ones((2, 1), np.float32),
    }
    return _stored([(0, data, EpisodeState.TERMINAL)], metadata={"source_format": "zarr"})


def test_existing_dataset_is_refused_unless_forced(root: Path) -> None:
    write_minari(_small_table(1.0), "keep/me-v0")
    with pytest.raises(StorageError, match=r"already exists.*force=True"):
        write_minari(_small_table(2.0), "keep/me-v0")
    assert read_minari("keep/me-v0").episodes[0][1]["obs"][0, 0] == 1.0
    write_minari(_small_table(2.0), "keep/me-v0", force=True)
    assert read_minari("keep/me-v0").episodes[0][1]["obs"][0, 0] == 2.0
    assert sorted(p.name for p in (root / "keep").iterdir()) == ["me-v0", "namespace_metadata.json"]


def test_a_relative_datasets_path_is_taken_from_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MINARI_DATASETS_PATH", "datasets")
    path = write_minari(_small_table(3.0), "relative/me-v0")
    assert path == tmp_path / "datasets" / "relative" / "me-v0"
    assert minari.load_dataset("relative/me-v0").total_episodes == 1
    assert read_minari("relative/me-v0").episodes[0][1]["obs"][0, 0] == 3.0


def test_force_never_replaces_a_directory_that_is_not_a_dataset(root: Path) -> None:
    (root / "notes-v0").mkdir()
    (root / "notes-v0" / "precious.txt").write_text("mine")
    with pytest.raises(StorageError, match="not a Minari dataset"):
        write_minari(_small_table(), "notes-v0", force=True)
    assert (root / "notes-v0" / "precious.txt").read_text() == "mine"


@pytest.mark.parametrize(
    "dataset_id",
    [
        "cartpole",
        "cartpole-v",
        "bad name-v0",
        "../escape-v0",
        "a//b-v0",
        "/abs-v0",
        "x/one-char-namespace-v0",
        "dots.in.name-v0",
        "",
    ],
)
def test_bad_dataset_ids_are_refused_before_anything_is_written(root: Path, dataset_id: str):
    with pytest.raises(ConfigurationError, match=r"\(namespace/\)name-v<version>"):
        write_minari(_small_table(), dataset_id)
    assert list(root.iterdir()) == []
    with pytest.raises(FormatError, match="neither a Minari dataset directory nor an id"):
        read_minari(dataset_id or "/nothing-here")


def test_missing_datasets_name_the_id_and_where_emote_looked(root: Path, tmp_path: Path) -> None:
    with pytest.raises(FormatError, match=f"'nowhere/none-v0' is not under {root}"):
        read_minari("nowhere/none-v0")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FormatError, match=r"no data/metadata\.json"):
        read_minari(tmp_path / "empty")


def test_without_minari_both_functions_say_how_to_install_it(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "minari", None)  # `import minari` now raises ImportError
    with pytest.raises(FormatError, match=re.escape(f"install it with {INSTALL_HINT}")):
        read_minari("cartpole/random-v0", root=DATA)
    with pytest.raises(FormatError, match=re.escape(f"install it with {INSTALL_HINT}")):
        write_minari(_small_table(), "any/thing-v0")


def test_tables_that_do_not_fit_minari_are_refused_with_the_fix(root: Path) -> None:
    table = _small_table()
    table.episodes[0][1]["terminal"] = np.zeros((2, 1), np.float32)  # one per transition
    table.columns.append(ColumnSchema("terminal", "Column", (1,), np.dtype(np.float32)))
    with pytest.raises(FormatError, match=r"columns \['terminal'\].*drop_columns=\['terminal'\]"):
        write_minari(table, "fit/extra-v0")
    write_minari(table, "fit/extra-v0", drop_columns=["terminal"])
    assert [c.name for c in read_minari("fit/extra-v0").columns] == ["obs", "actions", "rewards"]
    with pytest.raises(FormatError, match=r"no per-step column 'action'.*actions_key="):
        write_minari(_small_table(), "fit/named-v0", actions_key="action")
    wide = _small_table()
    wide.episodes[0][1]["rewards"] = np.ones((2, 2), np.float32)
    wide.columns[2] = ColumnSchema("rewards", "Column", (2,), np.dtype(np.float32))
    with pytest.raises(FormatError, match="one reward per step"):
        write_minari(wide, "fit/wide-v0")
    assert not (root / "fit" / "named-v0").exists() and not (root / "fit" / "wide-v0").exists()


def test_damaged_datasets_give_one_line_errors(root: Path) -> None:
    write_minari(_small_table(), "broken/file-v0")
    main = root / "broken" / "file-v0" / "data" / "main_data.hdf5"
    main.write_bytes(main.read_bytes()[:200])
    with pytest.raises(FormatError, match="cannot be read"):
        read_minari("broken/file-v0")
    write_minari(_small_table(), "broken/record-v0")
    metadata_file = root / "broken" / "record-v0" / "data" / "metadata.json"
    metadata = json.loads(metadata_file.read_text())
    metadata[RECORD_KEY]["columns"] = "nonsense"
    metadata_file.write_text(json.dumps(metadata))
    with pytest.raises(FormatError, match=f"damaged '{RECORD_KEY}' record"):
        read_minari("broken/record-v0")
    del metadata[RECORD_KEY]
    metadata_file.write_text(json.dumps(metadata))
    assert read_minari("broken/record-v0").episodes[0][0] == 0  # plain Minari again


def test_image_observations_are_stored_losslessly(root: Path) -> None:
    # Minari JPEG-encodes uint8 Box(0, 255) images of 32x32 or more unless told not to.
    images = np.random.default_rng(1).integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
    data = {
        "obs": images,
        "actions": np.zeros((3, 1), np.float32),
        "rewards": np.ones((3, 1), np.float32),
    }
    stored = _stored([(5, data, EpisodeState.INTERRUPTED)], metadata={"source_format": "zarr"})
    write_minari(stored, "pixels/noise-v0")
    np.testing.assert_array_equal(minari.load_dataset("pixels/noise-v0")[0].observations, images)
    _assert_same_table(read_minari("pixels/noise-v0"), stored)
