"""Following a store: how soon a committed episode can be sampled, and how fast episodes flow in.

Writers in other processes (one shard each, through ``ShardWriter``, as ``emote collect``
workers) commit batches of episodes while a follower in this process (the ``StoreFollower``
that ``emote train --follow`` uses) looks at the store every ``--poll`` seconds and appends
what is new to an ``ArrayMemoryTable``. Reported:

- follow latency: from an episode's commit to the moment it is in the table (sampleable),
  median and p95, measured from the commit time the store records for each episode (taken just
  before the writer writes its rows, so an upper bound by the write time);
- ingest throughput while following (transitions taken in per second of looking) and when
  catching up on a store written before the follower started (one look, transitions/s);
- the cost of a look that finds nothing new (commit records only).

Workload: 200-step episodes of float32 obs[32], actions[2], rewards[1], random values.

Run: ``python benchmarks/follow_bench.py [--writers 2] [--seconds 10] [--poll 1.0 0.1]``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from emote_core.memory.columns import Column, VirtualColumn
from emote_core.memory.mappers import NextElementMapper, SyntheticDones
from emote_core.memory.strategies import FifoEjectionStrategy, UniformSampleStrategy
from emote_core.memory.table import ArrayMemoryTable
from emote_core.stores.follow import StoreFollower
from emote_core.stores.stored import ColumnSchema
from emote_core.stores.zarr_store import ShardWriter, create_store, store_columns
from emote_core.typing import EpisodeState

LENGTH, OBS, ACT = 200, 32, 2
SCHEMAS = [
    ColumnSchema("obs", "Column", (OBS,), np.dtype(np.float32)),
    ColumnSchema("actions", "Column", (ACT,), np.dtype(np.float32)),
    ColumnSchema("rewards", "Column", (1,), np.dtype(np.float32)),
]


def episodes(count: int, seed: int) -> list[tuple]:
    rng = np.random.default_rng(seed)
    return [
        (
            k,
            {
                "obs": rng.standard_normal((LENGTH + 1, OBS), dtype=np.float32),
                "actions": rng.standard_normal((LENGTH, ACT), dtype=np.float32),
                "rewards": rng.standard_normal((LENGTH, 1), dtype=np.float32),
            },
            EpisodeState.INTERRUPTED,
        )
        for k in range(count)
    ]


def new_table(maxlen: int) -> ArrayMemoryTable:
    return ArrayMemoryTable(
        columns=[
            Column("obs", (OBS,), np.float32),
            Column("actions", (ACT,), np.float32),
            Column("rewards", (1,), np.float32),
            VirtualColumn("next_obs", (OBS,), np.float32, "obs", NextElementMapper()),
            VirtualColumn("dones", (1,), bool, "rewards", SyntheticDones()),
            VirtualColumn("masks", (1,), np.float32, "rewards", SyntheticDones.as_mask()),
        ],
        maxlen=maxlen, sampler=UniformSampleStrategy(), ejector=FifoEjectionStrategy(),
        length_key="rewards", seed=0,
    )  # fmt: skip


def new_store(url: str) -> None:
    create_store(url, columns=store_columns(SCHEMAS, episodes(1, 0)[0], "rewards"),
                 length_key="rewards")  # fmt: skip


def writer(url: str, shard: str, seconds: float, batch: int, period: float, start) -> None:
    """Commits ``batch`` episodes every ``period`` seconds for ``seconds`` (a collector)."""
    data = episodes(batch, seed=sum(map(ord, shard)))
    with ShardWriter(url, shard=shard) as shard_writer:
        start.wait()
        ends = time.monotonic() + seconds
        while time.monotonic() < ends:
            shard_writer.append(data)
            time.sleep(period)


def follow(url: str, args: argparse.Namespace, poll: float) -> dict[str, float]:
    """Writers commit while the follower looks every ``poll`` seconds."""
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    writers = [
        context.Process(
            target=writer, args=(url, f"w{poll}-{k}", args.seconds, args.batch, args.period, start)
        )
        for k in range(args.writers)
    ]
    for process in writers:
        process.start()
    follower = StoreFollower(new_table(4_000_000), [url])
    follower.fill()
    time.sleep(3.0)  # the writers import emote and open their shards
    start.set()
    ages, transitions, looking = [], 0, 0.0
    ends = time.monotonic() + args.seconds + 1.0
    while time.monotonic() < ends or any(p.is_alive() for p in writers):
        report = follower.poll()
        ages.append(report.ages)
        transitions += report.transitions
        looking += report.seconds
        time.sleep(poll)
    report = follower.poll()
    ages.append(report.ages)
    transitions += report.transitions
    looking += report.seconds
    for process in writers:
        process.join()
    latency = np.concatenate(ages)
    return {
        "episodes": float(len(latency)),
        "transitions": float(transitions),
        "median": float(np.median(latency)),
        "p95": float(np.percentile(latency, 95)),
        "max": float(latency.max()),
        "throughput": transitions / max(looking, 1e-9),
        "arrival": transitions / args.seconds,
    }


def catch_up(url: str, transitions: int) -> tuple[float, float, float]:
    """One look at a store written before the follower started: transitions/s, and the median
    seconds of a look that finds nothing new."""
    count = transitions // LENGTH
    with ShardWriter(url, shard="old") as shard_writer:
        for k in range(0, count, 50):
            shard_writer.append(episodes(min(50, count - k), seed=k))
    follower = StoreFollower(new_table(4_000_000), [url])
    started = time.perf_counter()
    follower.fill()
    seconds = time.perf_counter() - started
    idle = [follower.poll().seconds for _ in range(20)]
    return follower.ingested_transitions / seconds, float(np.median(idle)), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, default=2, help="writer processes (shards)")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds each run writes")
    parser.add_argument("--batch", type=int, default=4, help="episodes per commit")
    parser.add_argument("--period", type=float, default=0.2, help="seconds between commits")
    parser.add_argument(
        "--poll", type=float, nargs="+", default=[1.0, 0.1],
        help="follower's seconds between looks (1.0: the recipe's follow_min_seconds default)",
    )  # fmt: skip
    parser.add_argument("--catch-up", type=int, default=100_000, help="transitions pre-written")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="follow-bench-"))
    try:
        url = str(folder / "store.zarr")
        new_store(url)
        print(f"{args.writers} writers, {args.batch} x {LENGTH}-step episodes per commit every "
              f"{args.period} s each, {args.seconds} s; obs[{OBS}] float32")  # fmt: skip
        print(f"{'poll s':>7} {'episodes':>9} {'median s':>9} {'p95 s':>7} {'max s':>7} "
              f"{'arrival tr/s':>13} {'ingest tr/s':>12}")  # fmt: skip
        for poll in args.poll:
            r = follow(url, args, poll)
            print(f"{poll:>7.2f} {r['episodes']:>9.0f} {r['median']:>9.3f} {r['p95']:>7.3f} "
                  f"{r['max']:>7.3f} {r['arrival']:>13,.0f} {r['throughput']:>12,.0f}")  # fmt: skip
        other = str(folder / "old.zarr")
        new_store(other)
        rate, idle, seconds = catch_up(other, args.catch_up)
        print(f"catch-up: {args.catch_up:,} transitions in {seconds:.2f} s = {rate:,.0f} "
              f"transitions/s; a look with nothing new: {idle * 1e3:.2f} ms (1 shard)")  # fmt: skip
        shards = StoreFollower(new_table(1_000), [url])
        shards.fill()
        idle_many = np.median([shards.poll().seconds for _ in range(20)])
        count = sum(len(p) for p in shards.read)
        print(f"a look with nothing new on the followed store ({count} shards): "
              f"{idle_many * 1e3:.2f} ms")  # fmt: skip
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
