"""Who made a store: provenance records, one per writing session, kept per shard; the store's
root keeps the environment id; stores without them read as before."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from emote_core.errors import FormatError
from emote_core.integrations.convert import convert, source_sha256
from emote_core.integrations.inspect import inspect_source
from emote_core.stores.inspect import store_provenance
from emote_core.stores.provenance import (
    PolicyKind,
    PolicyRecord,
    Provenance,
    file_sha256,
    shard_sessions,
)
from emote_core.stores.stored import ColumnSchema
from emote_core.stores.zarr_store import MemoryStore, ShardWriter, create_store, store_columns
from emote_core.stores.zarr_store.writer import open_group
from emote_core.typing import EpisodeState

SCHEMAS = [
    ColumnSchema("obs", "Column", (2,), np.dtype(np.float32)),
    ColumnSchema("actions", "Column", (1,), np.dtype(np.float32)),
    ColumnSchema("rewards", "Column", (1,), np.dtype(np.float32)),
]


def episode(identity: int, length: int = 3) -> tuple:
    obs = np.full((length + 1, 2), identity, np.float32)
    steps = np.ones((length, 1), np.float32)
    return identity, {"obs": obs, "actions": steps, "rewards": steps}, EpisodeState.TERMINAL


def new_store(path: Path, env_id: str | None = None) -> Path:
    columns = store_columns(SCHEMAS, episode(0), "rewards")
    create_store(path, columns=columns, length_key="rewards", env_id=env_id)
    return path


def record(command: str, env_id: str = "Pendulum-v1") -> Provenance:
    return Provenance(
        command=tuple(command.split()), env_id=env_id, recipe_name="sac_pendulum",
        recipe_toml='[env]\nid = "Pendulum-v1"\n', seed=3, env_seeds=(3, 4),
        policy=PolicyRecord(PolicyKind.ONNX, "/models/p.onnx", "ab" * 32),
    )  # fmt: skip


def test_a_record_round_trips_through_json_and_missing_keys_read_as_unknown() -> None:
    original = record("emote collect sac_pendulum --out p.zarr")
    assert Provenance.from_attrs(json.loads(json.dumps(original.to_attrs()))) == original
    sparse = Provenance.from_attrs({"command": ["emote", "collect"]})
    assert sparse.command == ("emote", "collect")
    assert (sparse.env_id, sparse.recipe_toml, sparse.seed, sparse.policy) == (None,) * 4
    assert sparse.env_seeds == ()


@pytest.mark.parametrize(
    "recorded",
    [{"provenance": "not a list"}, {"provenance": ["text"]}, {"provenance": [{"seed": "x"}]}],
)
def test_a_malformed_record_is_a_format_error_naming_where(recorded) -> None:
    with pytest.raises(FormatError, match=r"store 's\.zarr' shard 'main'"):
        shard_sessions(recorded, where="store 's.zarr' shard 'main'")


def test_file_sha256_hashes_the_whole_file_in_chunks(tmp_path: Path) -> None:
    data = bytes(range(256)) * 41
    (tmp_path / "policy.onnx").write_bytes(data)
    expected = hashlib.sha256(data).hexdigest()
    assert file_sha256(tmp_path / "policy.onnx", chunk_bytes=100) == expected
    assert PolicyRecord.of_file(PolicyKind.ONNX, tmp_path / "policy.onnx").sha256 == expected
    with pytest.raises(FormatError, match="cannot read"):
        file_sha256(tmp_path / "missing.onnx")


def test_each_writing_session_is_recorded_with_its_first_commit(tmp_path: Path) -> None:
    store = new_store(tmp_path / "s.zarr", env_id="Pendulum-v1")
    first, second, idle = record("emote collect a"), record("emote collect b"), record("idle")
    with ShardWriter(store, provenance=first) as writer:
        writer.append([episode(0)])
        writer.append([episode(1)])  # a second commit of the same session adds no record
    with ShardWriter(store, provenance=second) as writer:
        writer.append([episode(2), episode(3), episode(4)])
    with ShardWriter(store, provenance=idle):
        pass  # a session that commits nothing leaves no record
    with ShardWriter(store, shard="other") as writer:  # library code passing no record
        writer.append([episode(5)])

    opened = MemoryStore(store)
    sessions = shard_sessions(dict(open_group(store, "r")["shards/main"].attrs))
    assert [(start, r.command) for start, r in sessions] == [
        (0, ("emote", "collect", "a")),
        (2, ("emote", "collect", "b")),
    ]
    assert sessions[0][1] == first
    report = store_provenance(opened)
    assert report["env_id"] == "Pendulum-v1"
    assert [(s["first_episode"], s["episodes"]) for s in report["shards"]["main"]] == [
        (0, 2),
        (2, 3),
    ]
    assert report["shards"]["other"] == []
    assert report["shards"]["main"][1]["policy"]["sha256"] == "ab" * 32


def test_stores_without_provenance_read_as_before_and_need_no_new_version(tmp_path: Path) -> None:
    store = new_store(tmp_path / "old.zarr")
    with ShardWriter(store) as writer:
        writer.append([episode(0), episode(1)])
    report = inspect_source(store)
    assert report["provenance"] == {"env_id": None, "shards": {"main": []}}
    assert report["format_version"] == 1
    with ShardWriter(store, provenance=record("emote collect again")) as writer:
        writer.append([episode(2)])
    assert dict(open_group(store, "r").attrs)["format_version"] == 1
    assert len(list(MemoryStore(store).episodes())) == 3
    sessions = store_provenance(MemoryStore(store))["shards"]["main"]
    assert [(s["first_episode"], s["episodes"]) for s in sessions] == [(2, 1)]


def test_a_converted_store_records_its_source_file_sha256_and_the_command(tmp_path: Path) -> None:
    source = new_store(tmp_path / "source.zarr", env_id="Pendulum-v1")
    with ShardWriter(source) as writer:
        writer.append([episode(0), episode(1)])
    command = ["emote", "memory", "convert", str(source), str(tmp_path / "copy.zarr")]
    convert(source, tmp_path / "copy.zarr", command=command)

    (session,) = store_provenance(MemoryStore(tmp_path / "copy.zarr"))["shards"]["main"]
    assert session["command"] == command
    assert session["source"]["sha256"] == source_sha256(str(source))[0]
    assert session["source"]["path"] == str(source.absolute())
    assert session["source"]["format"] == "zarr"
    assert (session["first_episode"], session["episodes"]) == (0, 2)
