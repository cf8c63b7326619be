"""emote-memory Zarr stores on the issue's workload, each figure beside its baseline.

Workload: 1,000,000 transitions in 1,000-step episodes; float32 obs[32], actions[2], rewards[1]
(random values: the worst case for compression).
- append: batched ShardWriter appends, against writing the same columns with ``np.save``;
- load: the whole store into an ArrayMemoryTable, against ``np.load`` of the same columns;
- size on disk against the raw bytes of the columns;
- ``emote memory inspect --json`` wall time (a fresh process, as a user runs it);
- ``verify`` throughput in MB/s of column data checked.

Run: ``python benchmarks/store_bench.py`` (or ``nox -s bench``).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from emote_core.memory.columns import Column, VirtualColumn
from emote_core.memory.mappers import NextElementMapper, SyntheticDones, SyntheticMasks
from emote_core.memory.strategies import FifoEjectionStrategy, UniformSampleStrategy
from emote_core.memory.table import ArrayMemoryTable
from emote_core.stores.stored import ColumnSchema
from emote_core.stores.summary import bytes_on_disk
from emote_core.stores.zarr_store import ShardWriter, create_store, store_columns
from emote_core.stores.zarr_store.tables import BATCH_BYTES, load_table
from emote_core.stores.zarr_store.verify import verify_store
from emote_core.typing import EpisodeState

TRANSITIONS, LENGTH, OBS, ACT = 1_000_000, 1_000, 32, 2
EPISODES = TRANSITIONS // LENGTH
SCHEMAS = [
    ColumnSchema("obs", "Column", (OBS,), np.dtype(np.float32)),
    ColumnSchema("actions", "Column", (ACT,), np.dtype(np.float32)),
    ColumnSchema("rewards", "Column", (1,), np.dtype(np.float32)),
]


def episodes() -> list[tuple]:
    rng = np.random.default_rng(0)
    return [
        (
            identity,
            {
                "obs": rng.standard_normal((LENGTH + 1, OBS), dtype=np.float32),
                "actions": rng.standard_normal((LENGTH, ACT), dtype=np.float32),
                "rewards": rng.standard_normal((LENGTH, 1), dtype=np.float32),
            },
            EpisodeState.INTERRUPTED,
        )
        for identity in range(EPISODES)
    ]


def table() -> ArrayMemoryTable:
    return ArrayMemoryTable(
        columns=[
            Column("obs", (OBS,), np.float32),
            Column("actions", (ACT,), np.float32),
            Column("rewards", (1,), np.float32),
            VirtualColumn("next_obs", (OBS,), np.float32, "obs", NextElementMapper()),
            VirtualColumn("dones", (1,), np.float32, "rewards", SyntheticDones()),
            VirtualColumn("masks", (1,), np.float32, "rewards", SyntheticMasks()),
        ],
        maxlen=TRANSITIONS,
        sampler=UniformSampleStrategy(),
        ejector=FifoEjectionStrategy(),
        length_key="rewards",
    )


def main() -> None:
    data = episodes()
    raw = sum(v.nbytes for _, d, _ in data for v in d.values())
    per_batch = max(1, BATCH_BYTES // (raw // EPISODES))
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        url = str(root / "store.zarr")
        create_store(url, columns=store_columns(SCHEMAS, data[0], "rewards"), length_key="rewards")
        with ShardWriter(url) as writer:
            start = time.perf_counter()
            for first in range(0, EPISODES, per_batch):
                writer.append(data[first : first + per_batch])
            append_seconds = time.perf_counter() - start

        columns = {
            k: np.concatenate([d[k] for _, d, _ in data]) for k in ("obs", "actions", "rewards")
        }
        start = time.perf_counter()
        for name, values in columns.items():
            np.save(root / f"{name}.npy", values)
        save_seconds = time.perf_counter() - start
        del columns

        def numpy_load() -> float:
            start = time.perf_counter()
            loaded = [np.load(root / f"{name}.npy") for name in ("obs", "actions", "rewards")]
            del loaded
            return time.perf_counter() - start

        def store_load() -> float:
            target = table()
            start = time.perf_counter()
            load_table(target, [url])
            seconds = time.perf_counter() - start
            assert target.size() == TRANSITIONS
            return seconds

        first_numpy, first_load = numpy_load(), store_load()  # fresh memory, warm file cache
        numpy_seconds = min(numpy_load() for _ in range(3))
        load_seconds = min(store_load() for _ in range(3))
        checksum_share = checksum_cost(store_load)

        inspect_runs = []
        for _ in range(3):
            start = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "emote_cli", "memory", "inspect", url, "--json"],
                check=True, capture_output=True,
            )  # fmt: skip
            inspect_runs.append(time.perf_counter() - start)
        python_start = min(
            _timed([sys.executable, "-c", "pass"]) for _ in range(3)
        )  # the interpreter alone, for reference

        report = verify_store(url)
        assert report.ok, report.problems
        disk = bytes_on_disk(url) or 0
        shutil.rmtree(url)

    print("store_bench: 1M transitions in 1000-step episodes, obs[32] actions[2] rewards[1]")
    print(f"{'measure':<40}{'emote store':>16}{'baseline':>16}  target")
    print(f"{'append, M transitions/s':<40}{TRANSITIONS / append_seconds / 1e6:>16.2f}"
          f"{TRANSITIONS / save_seconds / 1e6:>16.2f}  >= 1 M/s (baseline: np.save)")  # fmt: skip
    print(f"{'load into a table (first), s':<40}{first_load:>16.3f}{first_numpy:>16.3f}"
          f"  <= 2x np.load: {first_load / first_numpy:.2f}x")  # fmt: skip
    ratio = load_seconds / numpy_seconds
    print(f"{'load into a table (repeat, best of 3), s':<40}{load_seconds:>16.3f}"
          f"{numpy_seconds:>16.3f}  <= 2x np.load: {ratio:.2f}x")  # fmt: skip
    print(f"{'checksums while loading, share of load':<40}{checksum_share:>16.1%}{'-':>16}"
          "  <= 10% of load time")  # fmt: skip
    print(f"{'size on disk, MB':<40}{disk / 1e6:>16.1f}{raw / 1e6:>16.1f}"
          f"  raw bytes; ratio {disk / raw:.3f} (random data does not compress)")  # fmt: skip
    print(f"{'emote memory inspect --json, s':<40}{min(inspect_runs):>16.3f}{python_start:>16.3f}"
          "  < 1 s (baseline: python -c pass)")  # fmt: skip
    print(f"{'verify, MB/s':<40}{report.bytes_checked / 1e6 / report.seconds:>16.0f}{'-':>16}"
          f"  ({report.bytes_checked / 1e6:.0f} MB in {report.seconds:.2f} s)")  # fmt: skip


def checksum_cost(store_load) -> float:
    """The share of a load spent checking episode checksums (best of 3 loads, each timed whole
    and in ``damaged_episodes``, which the reader calls once per shard)."""
    from emote_core.stores.zarr_store import reader

    check = reader.damaged_episodes
    spent = [0.0]

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return check(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - start

    reader.damaged_episodes = timed
    try:
        shares = []
        for _ in range(3):
            spent[0] = 0.0
            total = store_load()
            shares.append(spent[0] / total)
    finally:
        reader.damaged_episodes = check
    return min(shares)


def _timed(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
