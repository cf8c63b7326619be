"""StoreFollower on real stores: it takes in what writers commit after it started (new shards
included), never a row past a commit record, nothing twice, and a checkpoint of it rebuilds the
exact table and follows on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from emote_core.errors import FormatError
from emote_core.memory.columns import Column, VirtualColumn
from emote_core.memory.mappers import NextElementMapper, SyntheticDones
from emote_core.memory.strategies import FifoEjectionStrategy, UniformSampleStrategy
from emote_core.memory.table import ArrayMemoryTable
from emote_core.stores import follow as follow_module
from emote_core.stores.follow import StoreFollower, follow_target, wait_for_stores
from emote_core.stores.stored import ColumnSchema
from emote_core.stores.zarr_store import ShardWriter, create_store, store_columns
from emote_core.typing import EpisodeState

SCHEMAS = [
    ColumnSchema("obs", "Column", (3,), np.dtype(np.float32)),
    ColumnSchema("actions", "Column", (2,), np.dtype(np.float32)),
    ColumnSchema("rewards", "Column", (1,), np.dtype(np.float32)),
]


def episode(identity: int, length: int | None = None) -> tuple:
    """Episode ``identity``: its observations carry the id, so a reader can tell which it is."""
    length = length or 3 + identity % 5
    steps = np.arange(length + 1, dtype=np.float32)
    obs = np.stack([np.full(length + 1, identity, np.float32), steps, -steps], axis=1)
    actions = np.stack([steps[:length], steps[:length] * 2], axis=1)
    rewards = (steps[:length] + identity).reshape(-1, 1)
    return identity, {"obs": obs, "actions": actions, "rewards": rewards}, EpisodeState.TERMINAL


def new_store(path: Path) -> str:
    create_store(path, columns=store_columns(SCHEMAS, episode(0), "rewards"),
                 length_key="rewards")  # fmt: skip
    return str(path)


def append(url: str, shard: str, identities: range) -> int:
    """Commits the episodes; returns their transitions."""
    with ShardWriter(url, shard=shard) as writer:
        episodes = [episode(k) for k in identities]
        writer.append(episodes)
    return sum(len(e[1]["rewards"]) for e in episodes)


def table(maxlen: int = 10_000) -> ArrayMemoryTable:
    return ArrayMemoryTable(
        columns=[
            Column("obs", (3,), np.float32),
            Column("actions", (2,), np.float32),
            Column("rewards", (1,), np.float32),
            VirtualColumn("next_obs", (3,), np.float32, "obs", NextElementMapper()),
            VirtualColumn("dones", (1,), bool, "rewards", SyntheticDones()),
            VirtualColumn("masks", (1,), np.float32, "rewards", SyntheticDones.as_mask()),
        ],
        maxlen=maxlen, sampler=UniformSampleStrategy(), ejector=FifoEjectionStrategy(),
        length_key="rewards", seed=0,
    )  # fmt: skip


def held(memory: ArrayMemoryTable) -> list[int]:
    """The writers' ids of the held episodes, in table order (their observations carry them)."""
    return [int(data["obs"][0, 0]) for _, data, _ in memory.episodes()]


def check_exact(memory: ArrayMemoryTable) -> None:
    for _, data, end in memory.episodes():
        _, expected, expected_end = episode(int(data["obs"][0, 0]), len(data["rewards"]))
        assert end == expected_end
        for key, values in expected.items():
            np.testing.assert_array_equal(data[key], values)


def test_a_follower_takes_in_what_is_committed_after_it_started_from_old_and_new_shards(
    tmp_path: Path,
) -> None:
    url = new_store(tmp_path / "s.zarr")
    committed = append(url, "a", range(0, 4))
    memory = table()
    follower = StoreFollower(memory, [url])
    follower.fill()
    assert sorted(held(memory)) == [0, 1, 2, 3]

    new = append(url, "a", range(4, 7))
    new += append(url, "b", range(100, 103))  # a shard made after the follower started
    committed += new
    report = follower.poll()
    assert report.episodes == 6 and report.transitions == new
    assert sorted(held(memory)) == [0, 1, 2, 3, 4, 5, 6, 100, 101, 102]
    assert memory.size() == committed  # nothing read twice
    assert follower.read == [{"a": 7, "b": 3}]
    assert (report.ages >= 0).all() and (report.ages < 60).all()
    check_exact(memory)

    again = follower.poll()
    assert again.episodes == 0 and memory.size() == committed
    committed += append(url, "b", range(103, 105))
    assert follower.poll().episodes == 2 and memory.size() == committed
    assert len(set(held(memory))) == memory.episode_count


def test_a_look_with_nothing_new_reads_only_commit_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = new_store(tmp_path / "s.zarr")
    append(url, "a", range(3))
    append(url, "b", range(10, 12))
    follower = StoreFollower(table(), [url])
    follower.fill()
    runs: list[tuple[str, int]] = []
    reader = follow_module.read_episode_run

    def counted(*args, **kwargs):
        runs.append((kwargs["shard"], kwargs["start"]))
        return reader(*args, **kwargs)

    monkeypatch.setattr(follow_module, "read_episode_run", counted)
    for _ in range(3):
        assert follower.poll().episodes == 0
    assert runs == []  # no episode table or column was opened
    append(url, "b", range(12, 13))
    assert follower.poll().episodes == 1
    assert runs == [("b", 2)]  # only the new episode of the shard that grew


def test_rows_written_before_their_commit_record_are_never_taken_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = new_store(tmp_path / "s.zarr")
    append(url, "main", range(2))
    memory = table()
    follower = StoreFollower(memory, [url])
    follower.fill()
    writer = ShardWriter(url, shard="main")
    attributes = type(writer.group.attrs)
    original = attributes.update
    seen_before_commit = []

    def follower_looks_before_the_commit(self, update):
        if "commit" in update:  # every row of the new episodes is written; the record is not
            seen_before_commit.append(follower.poll().episodes)
        return original(self, update)

    monkeypatch.setattr(attributes, "update", follower_looks_before_the_commit)
    writer.append([episode(k) for k in range(2, 6)])
    monkeypatch.undo()
    assert seen_before_commit == [0] and sorted(held(memory)) == [0, 1]
    assert follower.poll().episodes == 4 and sorted(held(memory)) == [0, 1, 2, 3, 4, 5]

    # A writer that dies after its rows, before its commit: a torn tail, never read.
    def killed(self, update):
        if "commit" in update:
            raise KeyboardInterrupt
        return original(self, update)

    monkeypatch.setattr(attributes, "update", killed)
    with pytest.raises(KeyboardInterrupt):
        writer.append([episode(k) for k in range(6, 9)])
    monkeypatch.undo()
    writer.lease.release()
    assert follower.poll().episodes == 0 and memory.episode_count == 6
    with ShardWriter(url, shard="main") as reopened:  # cuts the tail, appends anew
        reopened.append([episode(k) for k in range(20, 22)])
    assert follower.poll().episodes == 2
    assert sorted(held(memory)) == [0, 1, 2, 3, 4, 5, 20, 21]
    check_exact(memory)


def test_a_checkpoint_rebuilds_the_exact_table_with_ejections_and_follows_on(
    tmp_path: Path,
) -> None:
    first, second = new_store(tmp_path / "a.zarr"), new_store(tmp_path / "b.zarr")
    append(first, "main", range(10))
    memory = table(maxlen=60)  # a few episodes: the follower's intake ejects old ones
    follower = StoreFollower(memory, [first, second])
    follower.fill()
    for k in range(4):
        append(second, f"w{k % 2}", range(100 + 5 * k, 105 + 5 * k))
        append(first, "main", range(10 + 3 * k, 13 + 3 * k))
        follower.poll()
    segments = len(follower.segments)
    state = follower.state()
    before = [(i, int(d["obs"][0, 0])) for i, d, _ in memory.episodes()]
    assert memory.full() and 0 < len(state["segments"]) < segments  # ejected runs are dropped
    assert 0 not in held(memory)

    restored = table(maxlen=60)
    again = StoreFollower(restored, [first, second])
    again.restore(state)
    assert [(i, int(d["obs"][0, 0])) for i, d, _ in restored.episodes()] == before
    check_exact(restored)
    assert again.read == follower.read

    append(second, "w2", range(200, 202))
    append(first, "main", range(50, 51))
    assert again.poll().episodes == 3  # only what came after the checkpoint
    assert {200, 201, 50} <= set(held(restored))
    ids = [i for i, _, _ in restored.episodes()]
    assert len(set(ids)) == len(ids)


def test_the_first_fill_takes_the_newest_episodes_that_fit_and_never_reads_the_older(
    tmp_path: Path,
) -> None:
    url = new_store(tmp_path / "s.zarr")
    append(url, "main", range(0, 20))
    append(url, "main", range(20, 25))
    memory = table(maxlen=40)
    follower = StoreFollower(memory, [url])
    follower.fill()
    kept = held(memory)
    assert kept == sorted(kept) and kept[-1] == 24 and memory.size() <= 40
    assert follower.read == [{"main": 25}]
    assert follower.poll().episodes == 0  # the older ones count as read


def test_damaged_new_episodes_are_refused_or_skipped_when_asked(tmp_path: Path) -> None:
    import zarr

    url = new_store(tmp_path / "s.zarr")
    append(url, "main", range(3))
    strict, lenient = (
        StoreFollower(table(), [url]),
        StoreFollower(table(), [url], skip_damaged=True),
    )
    strict.fill()
    lenient.fill()
    append(url, "main", range(3, 6))
    obs = zarr.open_array(
        str(tmp_path / "s.zarr" / "shards" / "main" / "columns" / "obs"), mode="r+"
    )
    obs[-2] = 1e30  # a valid chunk holding other numbers than the checksum covers
    with pytest.raises(FormatError, match=r"shard 'main': 1 damaged episodes .*ids \[5\]"):
        strict.poll()
    report = lenient.poll()
    assert report.skipped == 1 and report.episodes == 2
    assert sorted(held(lenient.table)) == [0, 1, 2, 3, 4]
    assert lenient.read == [{"main": 6}] and lenient.poll().episodes == 0
    state = lenient.state()
    again = StoreFollower(table(), [url], skip_damaged=True)
    again.restore(state)  # the damaged episode is left out again, the others keep their ids
    assert [e[0] for e in again.table.episodes()] == [e[0] for e in lenient.table.episodes()]
    assert sorted(held(again.table)) == [0, 1, 2, 3, 4]
    with pytest.raises(FormatError, match="damaged episodes"):
        StoreFollower(table(), [url]).restore(state)


def test_a_shard_that_lost_episodes_is_refused(tmp_path: Path) -> None:
    import zarr

    url = new_store(tmp_path / "s.zarr")
    append(url, "main", range(4))
    follower = StoreFollower(table(), [url])
    follower.fill()
    group = zarr.open_group(str(tmp_path / "s.zarr" / "shards" / "main"), mode="r+")
    commit = dict(group.attrs["commit"])
    kept = 3 + 4  # episodes 0 and 1 (the rest lost), the record consistent with itself
    rows = {"obs": kept + 2, "actions": kept, "rewards": kept}
    group.attrs["commit"] = {**commit, "episodes": 2, "transitions": kept, "rows": rows}
    with pytest.raises(FormatError, match="fewer than the 4 read from it"):
        follower.poll()


def test_follow_targets_a_store_waits_for_a_missing_one_and_refuses_anything_else(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import threading

    assert follow_target(tmp_path / "later.zarr") is False
    (tmp_path / "empty").mkdir()
    assert follow_target(tmp_path / "empty") is False
    (tmp_path / "file.txt").write_text("hello")
    with pytest.raises(FormatError, match="is not an emote memory store"):
        follow_target(tmp_path / "file.txt")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "data.csv").write_text("1,2")
    with pytest.raises(FormatError, match="is not an emote memory store"):
        follow_target(tmp_path / "other")
    import zarr

    zarr.open_group(str(tmp_path / "plain.zarr"), mode="w", attributes={"format": "x"})
    with pytest.raises(FormatError, match="its format is 'x'"):
        follow_target(tmp_path / "plain.zarr")

    target = tmp_path / "later.zarr"
    stop = threading.Event()
    threading.Timer(0.4, lambda: new_store(target)).start()
    caplog.set_level("WARNING")
    assert wait_for_stores([target], stop=stop, poll_seconds=0.05) is True
    assert "waiting for" in caplog.text and "later.zarr" in caplog.text
    stop.set()
    assert wait_for_stores([tmp_path / "never.zarr"], stop=stop, poll_seconds=0.05) is False


def test_episode_listeners_hear_each_newly_followed_episode_once_and_not_a_restore(
    tmp_path: Path,
) -> None:
    url = new_store(tmp_path / "s.zarr")
    append(url, "a", range(0, 3))
    memory = table()
    follower = StoreFollower(memory, [url])
    heard: list[int] = []
    follower.episode_listeners.append(lambda data: heard.append(int(data["obs"][0, 0])))
    follower.fill()
    append(url, "a", range(3, 5))
    append(url, "b", range(100, 102))
    follower.poll()
    follower.poll()  # nothing new: nothing heard twice
    assert sorted(heard) == [0, 1, 2, 3, 4, 100, 101]

    rebuilt = StoreFollower(table(), [url])
    rebuilt.episode_listeners.append(lambda data: heard.append(-1))
    rebuilt.restore(follower.state())
    assert -1 not in heard
