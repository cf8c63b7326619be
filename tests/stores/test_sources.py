"""The format registry: detection, reading, inspecting, and atomic conversion between formats."""

from __future__ import annotations

import hashlib
import json
import pickle
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emote_core.errors import FormatError, SchemaError, StorageError, UnsafePickleError
from emote_core.integrations.convert import convert, source_sha256, write_target
from emote_core.integrations.formats import (
    FORMATS,
    detect_format,
    read_source,
    source_formats,
    target_formats,
)
from emote_core.integrations.inspect import inspect_source
from emote_core.stores import sources as sources_module
from emote_core.stores.sources import check_episodes
from emote_core.stores.stored import ColumnSchema, StoredTable
from emote_core.stores.zarr_store import MemoryStore
from emote_core.typing import EpisodeState

DATA = Path(__file__).parents[1] / "integrations" / "upstream" / "data"
LEGACY_ZIPS = sorted(DATA.glob("emote-rl-23-legacy-*.zip"))
ENDS = (EpisodeState.TERMINAL, EpisodeState.INTERRUPTED)


def _legacy_dump(path: Path) -> Path:
    """A legacy .pickle dump of 7 steps: episodes end at steps 2 and 4, then a 2-step tail."""
    steps = np.arange(7, dtype=np.float64)
    state = {
        "obs": np.repeat(10 * steps, 3).reshape(7, 1, 1, 3),
        "next_obs": np.repeat(10 * steps + 5, 3).reshape(7, 1, 1, 3),
        "actions": np.stack([steps, -steps], axis=1).reshape(7, 1, 2),
        "rewards": (steps + 0.5).reshape(7, 1, 1),
        "dones": np.isin(np.arange(7), (2, 4)).reshape(7, 1, 1),
    }
    path.write_bytes(pickle.dumps(state, protocol=4))
    return path


def _stored(episodes: list, tag: bool = False) -> StoredTable:
    columns = [
        ColumnSchema("obs", "Column", (3,), np.dtype(np.float32)),
        ColumnSchema("actions", "Column", (2,), np.dtype(np.int64)),
        ColumnSchema("rewards", "Column", (1,), np.dtype(np.float32)),
    ]
    if tag:
        columns.append(ColumnSchema("seed", "TagColumn", (), np.dtype(np.int32)))
    return StoredTable("generated", "test", columns, episodes, length_key="actions")


def _episode(identity: int, length: int, end: EpisodeState, seed: float = 0.0) -> tuple:
    rows = np.arange(length + 1, dtype=np.float32)
    data = {
        "obs": np.stack([rows + seed, rows * 2, np.full(length + 1, identity % 97)], 1).astype(
            np.float32
        ),
        "actions": np.stack([np.arange(length), -np.arange(length)], 1).astype(np.int64),
        "rewards": (rows[:length] * 0.5 + seed).reshape(-1, 1).astype(np.float32),
    }
    return identity, data, end


@st.composite
def _episodes(draw: st.DrawFn) -> tuple[list, bool]:
    ids = draw(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=12, unique=True))
    tag = draw(st.booleans())
    episodes = []
    for identity in ids:
        length = draw(st.integers(1, 9))
        end = draw(st.sampled_from(ENDS))
        seed = draw(st.floats(-1e6, 1e6, width=32, allow_nan=False))
        record = _episode(identity, length, end, seed)
        if tag:
            record[1]["seed"] = np.int32(draw(st.integers(-(2**31), 2**31 - 1)))
        episodes.append(record)
    return episodes, tag


def _assert_same_episodes(left: list, right: list, columns: list[str]) -> None:
    assert [(int(i), EpisodeState(e)) for i, _, e in left] == [
        (int(i), EpisodeState(e)) for i, _, e in right
    ]
    for (_, a, _), (_, b, _) in zip(left, right, strict=True):
        for name in columns:
            np.testing.assert_array_equal(np.asarray(a[name]), np.asarray(b[name]), strict=False)
            assert np.asarray(a[name]).dtype == np.asarray(b[name]).dtype


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(generated=_episodes())
def test_a_stored_table_round_trips_through_a_zarr_store_exactly(tmp_path_factory, generated):
    episodes, tag = generated
    store = tmp_path_factory.mktemp("roundtrip") / "memory.zarr"
    write_target(_stored(episodes, tag), store)

    name, back = read_source(store)
    assert name == "zarr"
    columns = ["obs", "actions", "rewards", *(["seed"] if tag else [])]
    _assert_same_episodes(episodes, back.episodes, columns)
    report = inspect_source(store)
    assert report["episodes"] == len(episodes)
    assert report["transitions"] == sum(len(d["actions"]) for _, d, _ in episodes)


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(generated=_episodes())
def test_a_zarr_store_round_trips_through_an_emote_v1_zip_exactly(tmp_path_factory, generated):
    episodes, tag = generated
    folder = tmp_path_factory.mktemp("v1")
    write_target(_stored(episodes, tag), folder / "a.zarr")

    convert(folder / "a.zarr", folder / "a.zip", target_format="emote-v1")
    summary = convert(folder / "a.zip", folder / "b.zarr")

    assert summary["source_format"] == "emote-v1" and summary["episodes"] == len(episodes)
    first = MemoryStore(folder / "a.zarr").read().episodes
    second = MemoryStore(folder / "b.zarr").read().episodes
    _assert_same_episodes(first, second, ["obs", "actions", "rewards", *(["seed"] * tag)])


def test_every_real_source_converts_to_a_store_with_the_same_episodes(tmp_path, upstream_v1):
    sources = [upstream_v1, *LEGACY_ZIPS, _legacy_dump(tmp_path / "dump.pickle")]
    for index, source in enumerate(sources):
        name, original = read_source(source)
        destination = tmp_path / f"{index}.zarr"
        summary = convert(source, destination)

        assert summary["source_format"] == name
        converted = MemoryStore(destination).read()
        stored = [c.name for c in original.columns if c.stored]
        _assert_same_episodes(original.episodes, converted.episodes, stored)
        assert converted.metadata["source"]["format"] == name


def test_detection_names_each_format_by_its_content(tmp_path, upstream_v1):
    dump = _legacy_dump(tmp_path / "dump.pickle")
    write_target(read_source(upstream_v1)[1], tmp_path / "store.zarr")
    # Misleading names do not matter: detection reads the content.
    disguised = tmp_path / "memory.pickle"
    shutil.copy(upstream_v1, disguised)

    assert detect_format(upstream_v1) == "emote-v1"
    assert [detect_format(p) for p in LEGACY_ZIPS] == ["emote-legacy"] * len(LEGACY_ZIPS)
    assert detect_format(dump) == "legacy-pickle"
    assert detect_format(tmp_path / "store.zarr") == "zarr"
    assert detect_format(disguised) == "emote-v1"


def test_the_upstream_fixture_reports_its_100_episodes_and_400_transitions(upstream_v1):
    report = inspect_source(upstream_v1)
    assert (report["format"], report["format_version"]) == ("emote-v1", 1)
    assert (report["episodes"], report["transitions"]) == (100, 400)
    assert report["columns"]["observation"] == {
        "dtype": "float32",
        "shape": [],
        "kind": "Column",
        "rows": "observations",
    }
    assert report["episode_length"] == {"min": 4.0, "mean": 4.0, "max": 4.0}
    assert report["end_states"] == {"TERMINAL": 100, "INTERRUPTED": 0}
    assert report["bytes_on_disk"] == upstream_v1.stat().st_size


def test_legacy_returns_sum_the_rewards_not_the_length_column():
    _, stored = read_source(LEGACY_ZIPS[0])
    expected = [float(np.sum(d["rewards"], dtype=np.float64)) for _, d, _ in stored.episodes]
    report = inspect_source(LEGACY_ZIPS[0])
    assert report["episode_return"]["max"] == pytest.approx(max(expected))
    assert report["episode_return"]["min"] == pytest.approx(min(expected))


def test_a_converted_store_records_its_source_and_sha256(tmp_path, upstream_v1):
    convert(upstream_v1, tmp_path / "a.zarr")
    source = MemoryStore(tmp_path / "a.zarr").attributes["source"]
    assert source["format"] == "emote-v1"
    assert source["sha256"] == hashlib.sha256(upstream_v1.read_bytes()).hexdigest()
    assert Path(source["path"]).resolve() == upstream_v1.resolve()


def test_a_directory_hash_depends_on_content_and_names_not_location(tmp_path, upstream_v1):
    convert(upstream_v1, tmp_path / "a.zarr")
    shutil.copytree(tmp_path / "a.zarr", tmp_path / "copy.zarr")
    digest, kind = source_sha256(str(tmp_path / "a.zarr"))

    assert kind == "directory" and digest == source_sha256(str(tmp_path / "copy.zarr"))[0]
    chunk = next(p for p in (tmp_path / "copy.zarr").rglob("c/*") if p.is_file())
    chunk.write_bytes(chunk.read_bytes() + b"\0")
    assert source_sha256(str(tmp_path / "copy.zarr"))[0] != digest
    assert source_sha256("memory://somewhere")[0] is None


def test_an_existing_destination_is_refused_without_force_and_kept(tmp_path, upstream_v1):
    for target, destination in (("zarr", tmp_path / "a.zarr"), ("emote-v1", tmp_path / "a.zip")):
        convert(upstream_v1, destination, target_format=target)
        before = source_sha256(str(destination))[0]
        with pytest.raises(FormatError, match="exists; pass `force=True`"):
            convert(LEGACY_ZIPS[0], destination, target_format=target)
        assert source_sha256(str(destination))[0] == before

        convert(LEGACY_ZIPS[0], destination, target_format=target, force=True)
        assert read_source(destination)[1].episodes[0][1]["obs"].shape == (4, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.zarr", "a.zip"]


def test_a_failure_midway_leaves_no_destination_and_no_temporary_files(tmp_path, monkeypatch):
    episodes = [_episode(i, 50, EpisodeState.TERMINAL) for i in range(40)]
    monkeypatch.setattr(sources_module, "BATCH_BYTES", 4096)  # many appends
    calls = []

    def failing_append(self, batch):
        calls.append(len(batch))
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real_append(self, batch)

    from emote_core.stores.zarr_store import ShardWriter

    real_append = ShardWriter.append
    monkeypatch.setattr(ShardWriter, "append", failing_append)
    with pytest.raises(OSError, match="No space left"):
        write_target(_stored(episodes), tmp_path / "out.zarr")
    assert list(tmp_path.iterdir()) == []

    # A failure while replacing with --force leaves the old store as it was.
    monkeypatch.setattr(ShardWriter, "append", real_append)
    write_target(_stored(episodes[:2]), tmp_path / "out.zarr")
    before = source_sha256(str(tmp_path / "out.zarr"))[0]
    calls.clear()
    monkeypatch.setattr(ShardWriter, "append", failing_append)
    with pytest.raises(OSError):
        write_target(_stored(episodes), tmp_path / "out.zarr", force=True)
    assert source_sha256(str(tmp_path / "out.zarr"))[0] == before
    assert [p.name for p in tmp_path.iterdir()] == ["out.zarr"]


def test_mismatched_column_lengths_are_a_format_error_naming_the_episode(tmp_path):
    good = _episode(1, 3, EpisodeState.TERMINAL)
    bad = _episode(2, 3, EpisodeState.TERMINAL)
    bad[1]["obs"] = bad[1]["obs"][:2]
    with pytest.raises(FormatError, match=r"episode 2: 'obs' has 2 rows for 3 transitions"):
        check_episodes(_stored([good, bad]))
    with pytest.raises((FormatError, SchemaError)):
        write_target(_stored([good, bad]), tmp_path / "out.zarr")
    assert list(tmp_path.iterdir()) == []


def test_unsupported_versions_are_refused(tmp_path, upstream_v1):
    newer = tmp_path / "newer.zip"
    with zipfile.ZipFile(upstream_v1) as old, zipfile.ZipFile(newer, "w") as new:
        for name in old.namelist():
            new.writestr(name, b"7" if name == "version" else old.read(name))
    with pytest.raises(FormatError, match=r"version '7'; this emote reads versions \[0, 1\]"):
        read_source(newer)

    convert(upstream_v1, tmp_path / "a.zarr")
    metadata = tmp_path / "a.zarr" / "zarr.json"
    document = json.loads(metadata.read_text())
    document["attributes"]["format_version"] = 99
    metadata.write_text(json.dumps(document))
    with pytest.raises(FormatError, match="format_version 99; this emote reads up to 1"):
        inspect_source(tmp_path / "a.zarr")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "is empty"),
        (b"\x89PNG\r\n\x1a\n" + bytes(64), "not in a memory format emote knows"),
        (b"PK\x03\x04" + bytes(64), "not a readable zip archive"),
    ],
)
def test_files_that_are_no_memory_are_one_line_format_errors(tmp_path, content, message):
    path = tmp_path / "memory.zip"
    path.write_bytes(content)
    with pytest.raises(FormatError, match=message) as error:
        read_source(path)
    assert "\n" not in str(error.value)


def test_a_truncated_zip_and_a_plain_directory_are_refused(tmp_path, upstream_v1):
    truncated = tmp_path / "cut.zip"
    truncated.write_bytes(upstream_v1.read_bytes()[: upstream_v1.stat().st_size // 2])
    with pytest.raises(FormatError, match="truncated or damaged"):
        read_source(truncated)
    (tmp_path / "folder").mkdir()
    with pytest.raises(FormatError, match="directory but not an emote memory store"):
        read_source(tmp_path / "folder")
    with pytest.raises(FormatError, match="does not exist"):
        read_source(tmp_path / "missing.zip")


def test_a_malicious_pickle_is_refused_before_it_runs(tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            import os

            return (os.system, (f"touch {marker}",))

    path = tmp_path / "memory.pickle"
    path.write_bytes(pickle.dumps({"obs": Payload()}))
    with pytest.raises(UnsafePickleError, match="system"):
        convert(path, tmp_path / "out.zarr")
    assert not marker.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["memory.pickle"]


def test_the_registry_lists_sources_and_targets_with_readers_and_writers():
    assert {"zarr", "emote-v1", "emote-legacy", "legacy-pickle"} <= set(source_formats())
    assert {"zarr", "emote-v1"} <= set(target_formats())
    assert all(FORMATS[name].read is not None for name in source_formats())
    assert all(FORMATS[name].write is not None for name in target_formats())
    with pytest.raises(FormatError, match="not a target format"):
        write_target(_stored([]), "x", "emote-legacy")


PEER_DATA = Path(__file__).parents[1] / "integrations" / "data"
PEER_FILES = sorted(
    p
    for p in PEER_DATA.glob("*")
    if p.suffix in (".pkl", ".pt", ".npz", ".csv")
    and not p.name.endswith(".record.npz")
    # skrl's PPO exports hold no final observations: refused (tests/integrations/skrl/).
    and not p.name.startswith("skrl2_ppo_")
)
PEER_FAMILIES = {"sb3": "sb3-replay-buffer", "skrl1": "skrl-memory", "skrl2": "skrl-memory"}
MINARI_DATA = Path(__file__).parents[1] / "integrations" / "minari" / "data"


@pytest.mark.parametrize("path", PEER_FILES, ids=lambda p: p.name)
def test_every_real_peer_file_converts_to_a_store_with_the_same_episodes(tmp_path, path):
    family = PEER_FAMILIES.get(path.name.split("_")[0], "tmrl-dataset")
    assert detect_format(path) == family
    _, original = read_source(path)
    summary = convert(path, tmp_path / "peer.zarr")

    assert summary["source_format"] == family
    assert summary["source_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    back = MemoryStore(tmp_path / "peer.zarr").read()
    _assert_same_episodes(original.episodes, back.episodes, [c.name for c in original.columns])
    assert back.spaces == original.spaces


@pytest.mark.parametrize("kind", ["npz", "pt", "csv"])
def test_skrl_targets_read_back_as_the_same_episodes(tmp_path, kind):
    episodes = [
        _episode(identity, length, end)
        for identity, length, end in ((5, 3, ENDS[0]), (6, 1, ENDS[1]), (9, 6, ENDS[1]))
    ]
    write_target(_stored(episodes), tmp_path / "a.zarr")
    summary = convert(tmp_path / "a.zarr", tmp_path / f"memory.{kind}", target_format=kind)

    assert summary["target_format"] == kind and summary["transitions"] == 10
    name, back = read_source(tmp_path / f"memory.{kind}")
    assert name == "skrl-memory"
    # skrl's files have no episode ids: episodes come back numbered in order.
    assert [e for _, _, e in back.episodes] == [e for _, _, e in episodes]
    for (_, left, _), (_, right, _) in zip(episodes, back.episodes, strict=True):
        for column in ("obs", "actions", "rewards"):
            np.testing.assert_array_equal(left[column], right[column])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.zarr", f"memory.{kind}"]


def test_minari_datasets_convert_both_ways(tmp_path, monkeypatch):
    pytest.importorskip("minari", reason="Minari comes with the dev and minari extras")
    pytest.importorskip(
        "h5py", reason="h5py (Minari's HDF5 backend) comes with the dev and minari extras"
    )
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    collected = MINARI_DATA / "cartpole" / "random-v0"
    assert detect_format(collected) == "minari"
    _, original = read_source(collected)
    convert(collected, tmp_path / "cartpole.zarr")
    stored = MemoryStore(tmp_path / "cartpole.zarr").read()
    _assert_same_episodes(original.episodes, stored.episodes, ["obs", "actions", "rewards"])

    summary = convert(tmp_path / "cartpole.zarr", "emote/cartpole-v0", target_format="minari")
    assert (summary["episodes"], summary["target_format"]) == (len(original.episodes), "minari")
    assert detect_format("emote/cartpole-v0") == "minari"
    assert inspect_source("emote/cartpole-v0")["transitions"] == summary["transitions"]
    with pytest.raises(StorageError, match="exists"):
        convert(tmp_path / "cartpole.zarr", "emote/cartpole-v0", target_format="minari")
    convert("emote/cartpole-v0", tmp_path / "again.zarr")
    again = MemoryStore(tmp_path / "again.zarr").read()
    _assert_same_episodes(stored.episodes, again.episodes, ["obs", "actions", "rewards"])


def test_a_converted_store_reports_the_same_returns_as_its_source(tmp_path):
    convert(LEGACY_ZIPS[0], tmp_path / "a.zarr")
    assert inspect_source(tmp_path / "a.zarr")["episode_return"] == pytest.approx(
        inspect_source(LEGACY_ZIPS[0])["episode_return"]
    )
