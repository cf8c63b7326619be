"""Stores attacked on purpose: concurrent writers on one shard and on separate shards, a writer
killed while creating its shard, shard metadata deleted or garbled, remote leases taken over.
Each case asserts the exit code or error, its message, and that every committed episode
survives (values checked against the generator, byte counts of untouched files compared)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from emote_cli.app import app
from emote_core.errors import FormatError, StorageError
from emote_core.stores.zarr_store import MemoryStore, ShardWriter, create_store, store_columns
from emote_core.stores.zarr_store.verify import verify_store

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="flock and SIGKILL")

HOLDER = """
import runpy, sys, time
from emote_core.stores.zarr_store import ShardWriter
kit = runpy.run_path(sys.argv[1])
writer = ShardWriter(sys.argv[2], shard=sys.argv[3])
if sys.argv[4] == "append":
    writer.append([kit["make_episode"](k) for k in range(5)])
print("holding", flush=True)
time.sleep(600)
"""


def new_store(kit, url: str | Path) -> str:
    create_store(url, columns=store_columns(kit.schemas, kit.make(1), "rewards"),
                 length_key="rewards")  # fmt: skip
    return str(url)


def fill(kit, url: str, shard: str, identities: range) -> None:
    with ShardWriter(url, shard=shard) as writer:
        writer.append([kit.make(k) for k in identities])


def digest(folder: Path) -> dict[str, str]:
    """Every file below ``folder`` by its bytes' sha256 (to prove nothing was rewritten)."""
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file() and "leases" not in path.parts
    }


def held_by_another_process(
    kit, url: str, shard: str = "main", what: str = "append"
) -> subprocess.Popen:
    """A writer in another process that takes the shard (and appends 5 episodes) and waits."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(kit.conftest), url, shard, what],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    line = holder.stdout.readline()
    assert line.strip() == "holding", holder.stderr.read()
    return holder


# One writer per shard.


def test_a_second_writer_on_a_held_shard_is_refused_naming_the_holder(kit, tmp_path) -> None:
    url = new_store(kit, tmp_path / "s.zarr")
    holder = held_by_another_process(kit, url)
    try:
        with pytest.raises(StorageError) as refused:
            ShardWriter(url)
        message = str(refused.value)
        assert f"pid {holder.pid} on host" in message and "shard 'main'" in message
        assert "write to another shard (`shard`)" in message
        fill(kit, url, "other", range(100, 103))  # other shards are free
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # The holder died without a word: its lease is free, its 5 committed episodes are intact.
    with ShardWriter(url) as writer:
        assert writer.lease.previous["pid"] == holder.pid
        writer.append([kit.make(k) for k in range(5, 8)])
    store = MemoryStore(url)
    assert store.episode_count == 5 + 3 + 3
    for record in store.episodes():
        kit.check(record)
    assert verify_store(url).ok


def test_two_emote_collects_on_one_shard_the_second_exits_1_and_nothing_is_lost(
    kit, tmp_path, runner, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    collect = ["collect", "sac_hit_the_middle", "--out", "s.zarr", "--episodes", "3"]
    assert runner.invoke(app, collect).exit_code == 0
    before = MemoryStore("s.zarr").episode_count
    holder = held_by_another_process(kit, "s.zarr", what="hold")  # a collect still running
    try:
        second = runner.invoke(app, collect)
        assert second.exit_code == 1
        assert "is being written by pid" in second.stderr
        assert len(second.stderr.strip().splitlines()) == 1
        assert runner.invoke(app, [*collect, "--shard", "b"]).exit_code == 0
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert MemoryStore("s.zarr").episode_count == before + 3
    assert runner.invoke(app, collect).exit_code == 0  # the dead holder's lease is taken over
    assert MemoryStore("s.zarr").episode_count == before + 3 + 3
    assert runner.invoke(app, ["memory", "verify", "s.zarr"]).exit_code == 0


def test_writers_on_separate_shards_may_create_the_store_at_the_same_moment(kit, tmp_path) -> None:
    for trial in range(20):
        url = str(tmp_path / f"race{trial}.zarr")
        start = threading.Barrier(2)
        errors: list[BaseException] = []

        def write(shard: str, first: int, url: str = url, start=start, errors=errors) -> None:
            try:
                from emote_core.memory import DictObsMemoryTable  # noqa: F401 - loaded once

                start.wait()
                from emote_core.stores.zarr_store.tables import StoreAppender

                with StoreAppender(url, _table(kit), shard=shard) as appender:
                    appender.append([kit.make(k) for k in range(first, first + 4)])
            except BaseException as error:
                errors.append(error)

        threads = [threading.Thread(target=write, args=(s, f)) for s, f in (("a", 0), ("b", 50))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, f"trial {trial}: {errors}"
        store = MemoryStore(url)
        assert sorted(s.name for s in store.shards) == ["a", "b"] and store.episode_count == 8


def _table(kit):
    from emote_core.memory.columns import Column, VirtualColumn
    from emote_core.memory.mappers import NextElementMapper
    from emote_core.memory.strategies import FifoEjectionStrategy, UniformSampleStrategy
    from emote_core.memory.table import ArrayMemoryTable

    columns = [Column(s.name, s.shape, s.dtype) for s in kit.schemas]
    columns.append(VirtualColumn("next_obs", (3,), "float32", "obs", NextElementMapper()))
    return ArrayMemoryTable(
        columns=columns, maxlen=1000, sampler=UniformSampleStrategy(),
        ejector=FifoEjectionStrategy(), length_key="rewards",
    )  # fmt: skip


# A writer killed while creating its shard.


def test_a_shard_created_but_never_committed_is_empty_to_readers_and_taken_by_its_writer(
    kit, tmp_path, runner
) -> None:
    url = new_store(kit, tmp_path / "s.zarr")
    fill(kit, url, "main", range(4))
    import zarr

    # What a writer killed between creating its group and its first commit leaves behind.
    zarr.open_group(url, mode="r+").require_group("shards/w2").create_array(
        "columns/obs", shape=(0, 3), dtype="float32", chunks=(16, 3)
    )
    store = MemoryStore(url)
    assert [s.name for s in store.shards] == ["main"] and not store.damaged_shards
    assert store.episode_count == 4 and verify_store(url).ok
    assert runner.invoke(app, ["memory", "inspect", url, "--json"]).exit_code == 0
    fill(kit, url, "w2", range(10, 12))
    assert MemoryStore(url).episode_count == 6


def test_a_writer_killed_at_random_moments_while_creating_its_shard_never_wedges_the_store(
    kit, tmp_path
) -> None:
    url = new_store(kit, tmp_path / "s.zarr")
    fill(kit, url, "main", range(3))
    for trial, delay in enumerate((0.0, 0.02, 0.05, 0.1, 0.2)):
        shard = f"w{trial}"
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(kit.conftest), url, shard, "append"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        # Importing emote takes most of a second; these kills land in and around ShardWriter().
        _wait_for_creation(Path(url) / "shards" / shard, delay)
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        store = MemoryStore(url)
        assert not store.damaged_shards, store.damaged_shards
        # Earlier trials added one episode each; killed holders committed 5 or nothing.
        assert store.episode_count in {3 + trial + 5 * k for k in range(trial + 2)}
        assert verify_store(url).ok
        fill(kit, url, shard, range(100 + trial, 101 + trial))  # the shard is usable


@pytest.mark.slow
def test_many_writers_killed_at_random_moments_around_shard_creation(kit, tmp_path) -> None:
    """The slow set's longer loop of the case above: 60 kills, random delays, one store."""
    import random

    rng = random.Random(13)
    url = new_store(kit, tmp_path / "s.zarr")
    fill(kit, url, "main", range(3))
    for trial in range(60):
        shard = f"w{trial % 7}"
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(kit.conftest), url, shard, "append"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        _wait_for_creation(Path(url) / "shards" / shard, rng.uniform(0.0, 0.3))
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        store = MemoryStore(url)
        assert not store.damaged_shards, store.damaged_shards
        assert verify_store(url).ok, verify_store(url).problems
        for record in store.episodes():
            kit.check(record)
    fill(kit, url, "w0", range(500, 502))  # every shard is still writable


def _wait_for_creation(folder: Path, delay: float) -> None:
    import time

    deadline = time.monotonic() + 30
    while not folder.exists() and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(delay)


# Shard metadata missing or garbled.


@pytest.mark.parametrize("damage", ["deleted", "garbled"])
def test_a_shard_without_readable_metadata_is_damage_never_an_empty_shard(
    kit, tmp_path, runner, damage
) -> None:
    url = new_store(kit, tmp_path / "s.zarr")
    fill(kit, url, "main", range(200))
    fill(kit, url, "other", range(300, 310))
    metadata = Path(url) / "shards" / "main" / "zarr.json"
    if damage == "deleted":
        metadata.unlink()
    else:
        metadata.write_text("{not json")
    untouched = digest(Path(url) / "shards" / "main")
    said = "is missing" if damage == "deleted" else "is unreadable"

    verified = runner.invoke(app, ["memory", "verify", url, "--json"])
    assert verified.exit_code == 1
    report = json.loads(verified.stdout)
    assert not report["ok"] and any("shards/main/zarr.json" in p for p in report["problems"])
    assert report["episodes"] == 10  # the readable shard was still checked

    inspected = runner.invoke(app, ["memory", "inspect", url])
    assert inspected.exit_code == 0 and "damaged shard 'main'" in inspected.stderr

    with pytest.raises(FormatError, match=f"shards/main/zarr.json {said}"):
        ShardWriter(url, shard="main")
    with pytest.raises(FormatError, match=r"shard 'main'.*emote memory verify"):
        list(MemoryStore(url).episodes())
    assert [r[0] for r in MemoryStore(url).episodes(skip_damaged=True)] == list(range(300, 310))

    converted = runner.invoke(app, ["memory", "convert", url, str(tmp_path / "out.npz")])
    assert converted.exit_code == 1 and "shards/main/zarr.json" in converted.stderr
    assert not (tmp_path / "out.npz").exists()
    assert digest(Path(url) / "shards" / "main") == untouched  # nothing rewritten or cut


def test_training_refuses_a_store_with_a_damaged_shard(tmp_path, runner, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    collect = ["collect", "sac_pendulum", "--out", "p.zarr", "--episodes", "3"]
    assert runner.invoke(app, collect).exit_code == 0
    (tmp_path / "p.zarr" / "shards" / "main" / "zarr.json").unlink()
    trained = runner.invoke(
        app, ["train", "sac_pendulum", "--memory", "p.zarr", "--no-live", "--steps", "2"]
    )
    assert trained.exit_code == 1
    assert "shards/main/zarr.json is missing" in trained.stderr


# Leases on object stores (fsspec URLs).


def test_a_remote_lease_refuses_a_second_writer_and_a_stale_one_is_taken_over(kit) -> None:
    url = new_store(kit, f"memory://lease-test-{os.getpid()}/s.zarr")
    first = ShardWriter(url, lease_timeout=600)
    first.append([kit.make(k) for k in range(3)])
    with pytest.raises(StorageError, match=r"pid \d+ on host .*\(heartbeat \d+ s ago"):
        ShardWriter(url, lease_timeout=600)
    second = ShardWriter(url, lease_timeout=0.0)  # the first looks stalled: taken over
    assert second.lease.previous["token"] == first.lease.token
    with pytest.raises(StorageError, match="lost the lease of shard 'main'"):
        first.append([kit.make(k) for k in range(3, 6)])
    second.append([kit.make(k) for k in range(3, 6)])
    second.close()
    third = ShardWriter(url)  # a released lease is free at once
    third.close()
    store = MemoryStore(url)
    assert [r[0] for r in store.episodes()] == list(range(6))
    for record in store.episodes():
        kit.check(record)


# Damaged data: nothing is trained on or converted from it unless the user asks.


def damage_chunk(url: str, shard: str, how: str) -> None:
    import zarr

    column = Path(url) / "shards" / shard / "columns" / "obs"
    chunk = next(p for p in sorted(column.rglob("*")) if p.is_file() and p.name != "zarr.json")
    if how == "chunk deleted":  # zarr reads a missing chunk as zeros, without a word
        chunk.unlink()
    elif how == "chunk garbled":
        data = bytearray(chunk.read_bytes())
        for k in range(len(data) // 2, len(data) // 2 + 64):
            data[k] ^= 0xFF
        chunk.write_bytes(bytes(data))
    else:  # values rewritten through zarr itself: a valid chunk with wrong numbers
        array = zarr.open_array(str(column), mode="r+")
        array[3] = 2.3e38


@pytest.mark.parametrize("how", ["chunk deleted", "chunk garbled", "values rewritten"])
def test_damaged_episodes_are_refused_by_readers_and_skipped_only_when_asked(
    kit, tmp_path, runner, how
) -> None:
    url = new_store(kit, tmp_path / "s.zarr")
    fill(kit, url, "main", range(40))
    fill(kit, url, "clean", range(100, 110))
    damage_chunk(url, "main", how)

    with pytest.raises(FormatError, match=r"shard 'main': \d+ damaged episodes .*ids \[") as no:
        list(MemoryStore(url).episodes())
    assert "`skip_damaged=True`" in str(no.value)
    kept = list(MemoryStore(url).episodes(skip_damaged=True))
    for record in kept:
        kit.check(record)  # every episode handed out is exactly what was written
    assert {r[0] for r in kept} >= set(range(100, 110)) and len(kept) < 50

    verified = json.loads(runner.invoke(app, ["memory", "verify", url, "--json"]).stdout)
    assert not verified["ok"] and verified["damaged_episodes"]
    assert len(kept) == 50 - len(verified["damaged_episodes"])

    out = tmp_path / "out.npz"
    refused = runner.invoke(app, ["memory", "convert", url, str(out)])
    assert refused.exit_code == 1 and "damaged episodes" in refused.stderr and not out.exists()
    skipped = runner.invoke(app, ["memory", "convert", url, str(out), "--skip-damaged", "--json"])
    assert skipped.exit_code == 0, skipped.stderr
    assert json.loads(skipped.stdout)["episodes"] == len(kept)


def test_training_refuses_damaged_episodes_unless_told_to_skip_them(
    tmp_path, runner, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for shard in ("a", "b"):
        collect = ["collect", "sac_pendulum", "--out", "p.zarr", "--episodes", "3"]
        assert runner.invoke(app, [*collect, "--shard", shard, "--seed", "1"]).exit_code == 0
    damage_chunk("p.zarr", "b", "values rewritten")
    train = ["train", "sac_pendulum", "--memory", "p.zarr", "--no-live", "--steps", "2"]
    train += ["--set", "memory.batch_size=16"]
    refused = runner.invoke(app, [*train, "--run-dir", "r1"])
    assert refused.exit_code == 1
    assert "shard 'b': 1 damaged episodes" in refused.stderr and not Path("r1").exists()
    trained = runner.invoke(app, [*train, "--run-dir", "r2", "--skip-damaged", "--json"])
    assert trained.exit_code == 0, trained.stderr
    # Shard b's first episode is id 3 in the store: shard a already counted 0, 1 and 2.
    assert "damaged episodes (checksum mismatch or unreadable chunks), ids [3]: skipped" in (
        trained.stderr
    )


# The episode table is checksummed too.


@pytest.mark.parametrize(
    ("field", "value"),
    [("end_state", 2), ("return", 1e9), ("id", 12345), ("length", 3), ("offset", 7)],
)
def test_a_rewritten_episode_table_row_is_damage(kit, tmp_path, runner, field, value) -> None:
    import zarr

    url = new_store(kit, tmp_path / "s.zarr")
    fill(kit, url, "main", range(1, 7))
    array = zarr.open_array(str(Path(url) / "shards" / "main" / "episodes" / field), mode="r+")
    row = 2  # id 3 ends INTERRUPTED; end_state 2 (TERMINAL) would zero its last mask
    array[row] = value
    verified = json.loads(runner.invoke(app, ["memory", "verify", url, "--json"]).stdout)
    assert not verified["ok"]
    assert [d["index"] for d in verified["damaged_episodes"]][:1] == [row]
    with pytest.raises(FormatError, match="damaged episodes"):
        list(MemoryStore(url).episodes())
    kept = list(MemoryStore(url).episodes(skip_damaged=True))
    assert [r[0] for r in kept] == [1, 2, 4, 5, 6]
    for record in kept:
        kit.check(record)


def test_shards_written_before_the_table_checksum_read_and_get_one_on_the_next_append(
    kit, tmp_path
) -> None:
    import shutil

    url = new_store(kit, tmp_path / "s.zarr")
    fill(kit, url, "main", range(5))
    # What an earlier emote wrote: no episodes/table_checksum.
    shutil.rmtree(Path(url) / "shards" / "main" / "episodes" / "table_checksum")
    report = verify_store(url)
    assert report.ok and any("no checksums" in note for note in report.notes)
    assert [r[0] for r in MemoryStore(url).episodes()] == list(range(5))
    fill(kit, url, "main", range(5, 8))  # the writer checksums the old rows, then appends
    report = verify_store(url)
    assert report.ok and not report.notes
    for record in MemoryStore(url).episodes():
        kit.check(record)


# Episode ids are unique across a store, whoever wrote it.


@pytest.mark.parametrize("target", ["emote-v1", "zarr", "npz", "pt", "csv", "minari"])
def test_a_store_of_several_collects_and_shards_round_trips_through_every_format(
    tmp_path, runner, monkeypatch, target
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    collect = ["collect", "sac_hit_the_middle", "--out", "s.zarr", "--episodes", "3"]
    for shard in ("main", "main", "b"):  # two collects counting from 0 on one shard, one more
        assert runner.invoke(app, [*collect, "--shard", shard]).exit_code == 0
    store = MemoryStore("s.zarr")
    ids = [record[0] for record in store.episodes()]
    assert len(ids) == 9 and len(set(ids)) == 9
    out = {"emote-v1": "s.zip", "zarr": "copy.zarr", "npz": "s.npz", "pt": "s.pt",
           "csv": "s.csv", "minari": "emote/s-v0"}[target]  # fmt: skip
    written = runner.invoke(app, ["memory", "convert", "s.zarr", out, "--to", target])
    assert written.exit_code == 0, written.stderr
    back = runner.invoke(app, ["memory", "convert", out, "back.zarr", "--json"])
    assert back.exit_code == 0, back.stderr
    assert json.loads(back.stdout)["episodes"] == 9
    before = sorted(r[1]["obs"].tobytes() for r in store.episodes())
    after = sorted(r[1]["obs"].tobytes() for r in MemoryStore("back.zarr").episodes())
    assert before == after


@pytest.mark.parametrize(
    ("garbled", "named"),
    [
        ("zarr.json", "its zarr.json is unreadable"),
        ("shards/main/columns/obs/zarr.json", "shards/main/columns/obs/zarr.json is unreadable"),
        ("shards/main/episodes/length/c/0", "shards/main/episodes/length is unreadable"),
        ("shards/main/episodes/end_state/zarr.json", "shards/main/episodes/end_state"),
    ],
)
def test_damaged_metadata_or_tables_are_one_line_naming_the_file(
    tmp_path, runner, monkeypatch, garbled, named
) -> None:
    monkeypatch.chdir(tmp_path)
    collect = ["collect", "sac_pendulum", "--out", "p.zarr", "--episodes", "3"]
    assert runner.invoke(app, collect).exit_code == 0
    (tmp_path / "p.zarr" / garbled).write_bytes(b"{garbage")
    train = ["train", "sac_pendulum", "--memory", "p.zarr", "--no-live", "--steps", "2"]
    for command in (["memory", "verify", "p.zarr"], train):
        result = runner.invoke(app, command)
        assert result.exit_code == 1, result.output
        assert named in result.stderr and "internal error" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
