"""The upstream V1 memory zip: the real upstream export, exact round trips, upstream's layout."""

from __future__ import annotations

import io
import json
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emote_core.errors import DuplicateEpisodeError, FormatError, StorageError
from emote_core.integrations.convert import convert
from emote_core.integrations.upstream import read_table_file, restore_table, store_table
from emote_core.memory.columns import Column, TagColumn, VirtualColumn
from emote_core.memory.mappers import NextElementMapper, SyntheticDones
from emote_core.memory.strategies import FifoEjectionStrategy, UniformSampleStrategy
from emote_core.memory.table import ArrayMemoryTable
from emote_core.typing import EpisodeState


def _npy(archive: zipfile.ZipFile, name: str) -> np.ndarray:
    return np.load(io.BytesIO(archive.read(name)), allow_pickle=False)


def test_the_upstream_export_restores_its_100_episodes_with_the_files_values(
    upstream_v1, fixture_table
):
    table = fixture_table()
    restore_table(table, upstream_v1)

    episodes = list(table.episodes())
    assert len(episodes) == 100 and table.size() == 400
    with zipfile.ZipFile(upstream_v1) as archive:
        observations, rewards = _npy(archive, "observation.npy"), _npy(archive, "reward.npy")
        obs_ranges = {row[0]: row[1:] for row in _npy(archive, "observation.ranges.npy").tolist()}
        reward_ranges = {row[0]: row[1:] for row in _npy(archive, "reward.ranges.npy").tolist()}
    assert [identity for identity, _, _ in episodes] == list(range(100))
    for identity, data, end_state in episodes:
        assert len(data["reward"]) == 4 and len(data["observation"]) == 5
        start, count = obs_ranges[identity]
        np.testing.assert_array_equal(data["observation"], observations[start : start + count])
        start, count = reward_ranges[identity]
        np.testing.assert_array_equal(data["reward"], rewards[start : start + count])
        assert end_state == EpisodeState.TERMINAL  # the file records no end states


def test_the_upstream_export_samples_dones_and_masks_at_episode_ends(upstream_v1, fixture_table):
    table = fixture_table()
    restore_table(table, str(upstream_v1))

    batch = table.sample(64, 4)  # a window of 4 is a whole episode here
    dones = batch["dones"].numpy().reshape(64, 4)
    masks = batch["masks"].numpy().reshape(64, 4)
    assert dones[:, 3].all() and not dones[:, :3].any()
    assert (masks[:, 3] == 0).all() and (masks[:, :3] == 1).all()
    assert batch["reward"].numpy().reshape(64, 4).tolist() == [[1.0, 2.0, 3.0, 4.0]] * 64


def _rich_table(maxlen: int = 10_000) -> ArrayMemoryTable:
    return ArrayMemoryTable(
        columns=[
            Column("obs", (2,), np.float32),
            Column("actions", (1,), np.int64),
            Column("reward", (), np.float32),
            TagColumn("goal", (3,), np.float64),
            VirtualColumn("next_obs", (2,), np.float32, "obs", NextElementMapper()),
            VirtualColumn("dones", (1,), bool, "reward", SyntheticDones()),
            VirtualColumn("masks", (1,), np.float32, "reward", SyntheticDones.as_mask()),
        ],
        maxlen=maxlen,
        sampler=UniformSampleStrategy(),
        ejector=FifoEjectionStrategy(),
        length_key="reward",
    )


def _episode(length: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.normal(size=(length + 1, 2)).astype(np.float32),
        "actions": rng.integers(-5, 5, size=(length, 1)),
        "reward": rng.normal(size=length).astype(np.float32),
        "goal": rng.normal(size=3),
    }


def _plain(table: ArrayMemoryTable) -> list[tuple[int, dict[str, list], EpisodeState]]:
    return [
        (identity, {k: v.tolist() for k, v in data.items()}, end)
        for identity, data, end in table.episodes()
    ]


episode_specs = st.lists(
    st.tuples(
        st.integers(-(2**63), 2**63 - 1),
        st.integers(1, 6),
        st.sampled_from([EpisodeState.TERMINAL, EpisodeState.INTERRUPTED]),
    ),
    min_size=0,
    max_size=12,
    unique_by=lambda spec: spec[0],
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=episode_specs)
def test_a_v1_round_trip_is_exact_for_any_int64_ids_lengths_and_end_states(specs):
    table = _rich_table()
    for seed, (identity, length, end_state) in enumerate(specs):
        table.add_sequence(identity, _episode(length, seed), end_state=end_state)
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "memory.zip"
        store_table(table, path)
        restored = _rich_table()
        restored.add_sequence(12345, _episode(3, 99))  # restoring replaces this
        restore_table(restored, path)

    assert _plain(restored) == _plain(table)
    assert restored.size() == table.size()
    if specs:
        batch = restored.sample_all()
        ends = np.cumsum([length for _, length, _ in specs]) - 1
        terminal = [end is EpisodeState.TERMINAL for _, _, end in specs]
        masks = batch["masks"].numpy().reshape(-1)
        assert masks[ends].tolist() == [0.0 if t else 1.0 for t in terminal]


def test_a_round_trip_after_ejections_keeps_the_survivors_and_their_eject_order(tmp_path):
    table = _rich_table(maxlen=20)
    for identity in range(10):
        table.add_sequence(-identity - 1, _episode(4, identity))  # 40 transitions: 5 ejected
    path = tmp_path / "memory.zip"
    store_table(table, path)

    restored = _rich_table(maxlen=20)
    restore_table(restored, path)
    assert _plain(restored) == _plain(table)
    assert [identity for identity, _, _ in restored.episodes()] == [-6, -7, -8, -9, -10]
    restored.add_sequence(77, _episode(4, 77))  # the oldest survivor goes first, as before
    assert [identity for identity, _, _ in restored.episodes()] == [-7, -8, -9, -10, 77]


def test_restoring_into_a_non_empty_table_replaces_its_content(upstream_v1, fixture_table):
    table = fixture_table()
    table.add_sequence(5000, {"observation": np.zeros(3), "reward": np.ones(2)})
    table.add_sequence(5, {"observation": np.zeros(3), "reward": np.ones(2)})
    restore_table(table, upstream_v1)

    identities = [identity for identity, _, _ in table.episodes()]
    assert identities == list(range(100)) and table.size() == 400
    table.add_sequence(5000, {"observation": np.zeros(3), "reward": np.ones(2)})
    with pytest.raises(DuplicateEpisodeError):
        table.add_sequence(5, {"observation": np.zeros(3), "reward": np.ones(2)})


def test_stored_files_have_upstreams_layout_and_dtypes(tmp_path, upstream_v1, fixture_table):
    table = fixture_table()
    restore_table(table, upstream_v1)
    table.add_sequence(-3, {"observation": np.arange(3.0), "reward": np.ones(2)})
    path = tmp_path / "export.zip"
    store_table(table, path)

    with zipfile.ZipFile(path) as ours, zipfile.ZipFile(upstream_v1) as theirs:
        assert set(ours.namelist()) == set(theirs.namelist())
        assert ours.read("version") == theirs.read("version") == b"1"
        config = json.loads(ours.read("configuration.json"))
        upstream = json.loads(theirs.read("configuration.json"))
        assert set(upstream) <= set(config)
        assert config["columns"][:2] == upstream["columns"][:2]
        for (name, _, spec), (_, _, theirs_spec) in zip(
            config["columns"], upstream["columns"], strict=True
        ):
            assert {k: spec[k] for k in theirs_spec} == theirs_spec, name
        assert config["ids"] == [*range(100), -3]
        assert config["ejector_state"]["identities"] == config["ids"]
        assert config["ejector_state"]["sequence_lengths"][-1] == [-3, 2]
        assert config["end_states"] == ["TERMINAL"] * 101
        for name in ("observation", "reward"):
            ranges, data = _npy(ours, f"{name}.ranges.npy"), _npy(ours, f"{name}.npy")
            assert ranges.dtype == np.int64 and ranges.shape == (101, 3)
            assert data.dtype == _npy(theirs, f"{name}.npy").dtype
        assert _npy(ours, "observation.ranges.npy")[-1].tolist() == [-3, 500, 3]


def test_tag_columns_are_stored_as_one_row_per_episode(tmp_path):
    table = _rich_table()
    table.add_sequence(1, _episode(2, 1))
    table.add_sequence(2, _episode(3, 2))
    store_table(table, tmp_path / "tags.zip")
    with zipfile.ZipFile(tmp_path / "tags.zip") as archive:
        assert _npy(archive, "goal.npy").shape == (2, 3)
        assert _npy(archive, "goal.ranges.npy").tolist() == [[1, 0, 1], [2, 1, 1]]
        assert _npy(archive, "obs.ranges.npy").tolist() == [[1, 0, 3], [2, 3, 4]]


def test_an_empty_table_round_trips(tmp_path):
    table = _rich_table()
    store_table(table, tmp_path / "empty.zip")
    restored = _rich_table()
    restored.add_sequence(1, _episode(2, 1))
    restore_table(restored, tmp_path / "empty.zip")
    assert list(restored.episodes()) == [] and restored.size() == 0


def test_a_failed_store_leaves_the_previous_file_and_no_temporary_files(tmp_path, monkeypatch):
    table = _rich_table()
    table.add_sequence(1, _episode(2, 1))
    path = tmp_path / "memory.zip"
    store_table(table, path)
    before = path.read_bytes()

    table.add_sequence(2, _episode(5, 2))
    calls = []

    def failing_write(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return original(*args, **kwargs)

    original = np.lib.format.write_array
    monkeypatch.setattr(np.lib.format, "write_array", failing_write)
    with pytest.raises(StorageError, match=r"No space left"):
        store_table(table, path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["memory.zip"]


def test_upstream_names_without_the_zip_suffix_are_accepted(tmp_path):
    table = _rich_table()
    table.add_sequence(3, _episode(2, 3))
    store_table(table, tmp_path / "memory.zip")
    restored = _rich_table()
    restore_table(restored, tmp_path / "memory")  # upstream emote appends ".zip" itself
    assert _plain(restored) == _plain(table)


def test_read_table_file_describes_a_v1_file_without_a_table(upstream_v1):
    stored = read_table_file(upstream_v1)
    assert stored.format == "emote-v1" and stored.length_key == "reward"
    assert [(c.name, c.kind) for c in stored.columns] == [
        ("observation", "Column"),
        ("reward", "Column"),
        ("dones", "VirtualColumn"),
        ("masks", "VirtualColumn"),
    ]
    assert len(stored.episodes) == 100 and stored.ejector_type == "FifoEjectionStrategy"


@pytest.mark.parametrize("noise_every", [None, 16], ids=["zeros-1000x", "sparse-noise-under-64x"])
def test_a_zip_is_read_only_within_64_times_its_size(tmp_path, monkeypatch, noise_every):
    from emote_core.integrations.upstream import read_table_file
    from emote_core.integrations.upstream.v1 import write_v1_stored
    from emote_core.stores.stored import ColumnSchema, StoredTable

    monkeypatch.setattr("emote_core.stores.budget.SIZE_FLOOR", 0)  # the ratio alone decides
    rows = np.zeros((1 << 18, 4), dtype=np.float32)  # 4 MiB
    if noise_every is not None:
        noisy = rows[::noise_every]
        noisy[:] = np.random.default_rng(0).standard_normal(noisy.shape)
    data = {"obs": np.concatenate([rows, rows[:1]]), "actions": rows[:, :1]}
    columns = [ColumnSchema(n, "Column", v.shape[1:], v.dtype) for n, v in data.items()]
    stored = StoredTable("t", "emote-v1", columns, [(0, data, EpisodeState.TERMINAL)], "actions")
    plain, path = tmp_path / "plain.zip", tmp_path / "deflated.zip"
    write_v1_stored(stored, plain)
    with zipfile.ZipFile(plain) as old, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as new:
        for name in old.namelist():
            new.writestr(name, old.read(name))
    ratio = sum(i.file_size for i in zipfile.ZipFile(path).infolist()) / path.stat().st_size
    if noise_every is None:
        assert ratio > 200
        with pytest.raises(FormatError, match=r"member 'obs.npy' declares 4,194,4\d\d bytes"):
            read_table_file(path)
    else:
        assert ratio < 64
        assert np.array_equal(read_table_file(path).episodes[0][1]["obs"], data["obs"])


def test_a_zip_is_refused_before_any_member_is_read(tmp_path, monkeypatch):
    import tracemalloc

    from emote_core.integrations.upstream import read_table_file
    from emote_core.integrations.upstream.v1 import write_v1_stored
    from emote_core.stores.stored import ColumnSchema, StoredTable

    monkeypatch.setattr("emote_core.stores.budget.SIZE_FLOOR", 0)  # the ratio alone decides
    rows = np.random.default_rng(0).standard_normal((4, 1 << 20)).astype(np.float32)  # 16 MiB
    data = {"obs": np.zeros((5, 1), np.float32), "actions": np.zeros((4, 1), np.float32),
            "early": rows, "late": rows[::-1].copy()}  # fmt: skip
    columns = [ColumnSchema(n, "Column", v.shape[1:], v.dtype) for n, v in data.items()]
    stored = StoredTable("t", "emote-v1", columns, [(0, data, EpisodeState.TERMINAL)], "actions")
    written, path = tmp_path / "written.zip", tmp_path / "late.zip"
    write_v1_stored(stored, written)
    with zipfile.ZipFile(written) as old, zipfile.ZipFile(path, "w") as new:
        for name in old.namelist():  # stored as they are, without zip64 extras
            content = old.read(name)
            new.writestr(name, content[: 12 << 20] if name == "late.npy" else content)
    declared = 190 * (12 << 20)  # what a 190x compressed member would expand to
    blob = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        offset = archive.start_dir
    while blob[offset : offset + 4] == b"PK\x01\x02":  # the central directory's entries
        lengths = [
            int.from_bytes(blob[offset + k : offset + k + 2], "little") for k in (28, 30, 32)
        ]
        if blob[offset + 46 : offset + 46 + lengths[0]] == b"late.npy":
            blob[offset + 24 : offset + 28] = declared.to_bytes(4, "little")
        offset += 46 + sum(lengths)
    path.write_bytes(bytes(blob))
    assert declared > 64 * path.stat().st_size
    tracemalloc.start()
    try:
        with pytest.raises(FormatError, match=f"member 'late.npy' declares {declared:,} bytes"):
            read_table_file(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, f"{peak:,} bytes read before the refusal"  # 'early.npy' is 16 MiB


def test_a_converted_v1_zip_restores_into_an_emote_table(tmp_path, upstream_v1, fixture_table):
    convert(upstream_v1, tmp_path / "a.zarr")
    convert(tmp_path / "a.zarr", tmp_path / "back.zip", target_format="emote-v1")
    table = fixture_table()
    restore_table(table, tmp_path / "back.zip")

    assert table.episode_count == 100 and table.size() == 400
    configuration = json.loads(zipfile.ZipFile(tmp_path / "back.zip").read("configuration.json"))
    assert configuration["source"]["format"] == "zarr"
    assert configuration["ejector_type"] == "FifoEjectionStrategy"
