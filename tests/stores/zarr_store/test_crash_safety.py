"""Killing writers at random moments never yields a store that reads wrong data.

Each trial starts a real writer process that appends batches of deterministic episodes and
reports every commit on stdout, kills it with SIGKILL at a random moment, then checks that the
store opens, holds exactly the episodes committed before the kill (none torn, none invented),
verifies after a writer reopens it, and takes further appends.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from emote_core.stores.zarr_store import (
    MemoryStore,
    ShardWriter,
    create_store,
    store_columns,
)
from emote_core.stores.zarr_store.verify import verify_store

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs SIGKILL")

BATCH = 7
WRITER = f"""
import runpy, sys
from emote_core.stores.zarr_store import ShardWriter
kit = runpy.run_path(sys.argv[1])
writer = ShardWriter(sys.argv[2], shard=sys.argv[3])
start = writer.episodes
print("ready", start, flush=True)
for batch in range(int(sys.argv[4])):
    first = start + batch * {BATCH}
    writer.append([kit["make_episode"](first + k) for k in range({BATCH})])
    print("committed", writer.episodes, flush=True)
"""


def start_writer(kit, url: str, shard: str = "main", batches: int = 10_000) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(kit.conftest), url, shard, str(batches)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def new_store(kit, url: Path) -> str:
    columns = store_columns(kit.schemas, kit.make(1), "rewards")
    create_store(url, columns=columns, length_key="rewards")
    return str(url)


@pytest.mark.parametrize(
    "trials",
    [20, pytest.param(200, marks=pytest.mark.slow, id="200-slow")],
)
def test_sigkill_at_random_moments_never_tears_or_invents_episodes(
    tmp_path: Path, kit, trials: int
) -> None:
    url = new_store(kit, tmp_path / "crash.zarr")
    generator = random.Random(20261122 + trials)
    torn = 0
    for trial in range(trials):
        before = MemoryStore(url).episode_count
        process = start_writer(kit, url)
        assert process.stdout is not None
        assert process.stdout.readline().split() == ["ready", str(before)]
        time.sleep(generator.uniform(0.0, 0.4))
        os.kill(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        # Whole lines only: the kill may land inside a print, leaving a torn last line.
        lines = output.split("\n")[:-1]
        reported = [int(line.split()[1]) for line in lines if line.startswith("committed ")]
        last_reported = reported[-1] if reported else before

        store = MemoryStore(url)  # opens, whatever the moment of the kill
        held = store.episode_count
        # The kill may land between a commit and its report, never inside a commit.
        assert held in (last_reported, last_reported + BATCH), (trial, held, last_reported)
        records = list(store.episodes())
        assert [r[0] for r in records] == list(range(held))
        for record in records:
            kit.check(record)

        torn += bool(verify_store(url).notes)  # rows past the commit: killed mid-append
        ShardWriter(url)  # reopening for append cuts any torn tail
        report = verify_store(url)
        assert report.ok, report.problems
        assert not report.notes, report.notes
    assert torn >= max(3, trials // 7), f"only {torn} of {trials} kills landed mid-append; no teeth"
    writer = ShardWriter(url)
    held = writer.episodes
    writer.append([kit.make(held + k) for k in range(3)])
    assert MemoryStore(url).episode_count == held + 3


def test_two_writers_on_two_shards_in_parallel_lose_nothing(tmp_path: Path, kit) -> None:
    url = new_store(kit, tmp_path / "parallel.zarr")
    processes = [start_writer(kit, url, shard=f"collector-{k}", batches=25) for k in range(2)]
    for process in processes:
        _, errors = process.communicate(timeout=300)
        assert process.returncode == 0, errors
    store = MemoryStore(url)
    assert [s.episodes for s in store.shards] == [25 * BATCH, 25 * BATCH]
    for record in store.episodes():
        kit.check(record)
    assert verify_store(url).ok
