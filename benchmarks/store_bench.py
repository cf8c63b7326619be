"""emote-memory Zarr stores on 1M transitions (1,000-step episodes of random float32 obs[32],
actions[2], rewards[1]), each figure beside its baseline: appends against ``np.save``; loads into
an ArrayMemoryTable against ``np.load`` of the same columns (first loads with both sides' files
dropped from the page cache, repeat loads, loads in a fresh process), with zarr's default codec
pipeline and with zarrs; size on disk; ``emote memory inspect --json``; ``verify`` throughput.

Run: ``python benchmarks/store_bench.py`` (or ``nox -s bench``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from emote_core.memory.columns import Column, VirtualColumn
from emote_core.memory.mappers import NextElementMapper, SyntheticDones, SyntheticMasks
from emote_core.memory.strategies import FifoEjectionStrategy, UniformSampleStrategy
from emote_core.memory.table import ArrayMemoryTable
from emote_core.stores.stored import ColumnSchema
from emote_core.stores.summary import bytes_on_disk
from emote_core.stores.zarr_store import ShardWriter, acceleration, create_store, store_columns
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


def table(
    obs_shape: tuple[int, ...] = (OBS,),
    obs_dtype: type = np.float32,
    action_shape: tuple[int, ...] = (ACT,),
    maxlen: int = TRANSITIONS,
) -> ArrayMemoryTable:
    """A transition table (next observations, dones and masks derived) of these columns."""
    return ArrayMemoryTable(
        columns=[
            Column("obs", obs_shape, obs_dtype),
            Column("actions", action_shape, np.float32),
            Column("rewards", (1,), np.float32),
            VirtualColumn("next_obs", obs_shape, obs_dtype, "obs", NextElementMapper()),
            VirtualColumn("dones", (1,), np.float32, "rewards", SyntheticDones()),
            VirtualColumn("masks", (1,), np.float32, "rewards", SyntheticMasks()),
        ],
        maxlen=maxlen,
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

        npy_files = [root / f"{name}.npy" for name in ("obs", "actions", "rewards")]
        store_files = [p for p in Path(url).rglob("*") if p.is_file()]
        loads = {}
        for pipeline in pipelines():
            with zarrs_switched(pipeline == "zarrs"):
                store_load()  # warm the imports and the allocator
                loads[pipeline] = load_figures(numpy_load, store_load, npy_files, store_files)
        fresh = fresh_process_figures(url, root)
        checksum_share = checksum_cost(store_load)
        checksum_wall = checksum_wall_share(store_load)

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
        raw_columns = ", ".join(stored_raw(url)) or "none"
        shutil.rmtree(url)

    print("store_bench: 1M transitions in 1000-step episodes, obs[32] actions[2] rewards[1]")
    print(f"{'measure':<40}{'emote store':>16}{'baseline':>16}  target")
    print(f"{'append, M transitions/s':<40}{TRANSITIONS / append_seconds / 1e6:>16.2f}"
          f"{TRANSITIONS / save_seconds / 1e6:>16.2f}  >= 1 M/s (baseline: np.save)")  # fmt: skip
    for pipeline, (first, first_numpy, repeat, repeat_numpy) in loads.items():
        for what, seconds, numpy_seconds in [
            ("first", first, first_numpy),
            ("repeat", repeat, repeat_numpy),
        ]:
            label = f"load ({what}, {pipeline}), s"
            print(f"{label:<40}{seconds:>16.3f}{numpy_seconds:>16.3f}  <= 2x np.load: "
                  f"{seconds / numpy_seconds:.2f}x")  # fmt: skip
    seconds, numpy_seconds = fresh
    print(f"{'load (fresh process, files cached), s':<40}{seconds:>16.3f}{numpy_seconds:>16.3f}"
          f"  <= 2x np.load: {seconds / numpy_seconds:.2f}x")  # fmt: skip
    print(f"{'checksums while loading, share of load':<40}{checksum_share:>16.1%}{'-':>16}"
          "  <= 10% of load time (time in the checks, all threads)")  # fmt: skip
    print(f"{'  wall time the checks add to a load':<40}{checksum_wall:>16.1%}{'-':>16}"
          "  (load against a load with the checks left out)")  # fmt: skip
    print(f"{'size on disk, MB':<40}{disk / 1e6:>16.1f}{raw / 1e6:>16.1f}"
          f"  raw bytes; ratio {disk / raw:.3f} (stored raw: {raw_columns})")  # fmt: skip
    print(f"{'emote memory inspect --json, s':<40}{min(inspect_runs):>16.3f}{python_start:>16.3f}"
          "  < 1 s (baseline: python -c pass)")  # fmt: skip
    print(f"{'verify, MB/s':<40}{report.bytes_checked / 1e6 / report.seconds:>16.0f}{'-':>16}"
          f"  ({report.bytes_checked / 1e6:.0f} MB in {report.seconds:.2f} s)")  # fmt: skip


def stored_raw(url: str) -> list[str]:
    """The columns the writer stored without a compressor (raw chunks)."""
    import zarr

    columns = zarr.open_group(url, mode="r")["shards/main/columns"]
    return [
        name for name in ("obs", "actions", "rewards") if len(columns[name].metadata.codecs) == 1
    ]


def pipelines() -> list[str]:
    """The codec pipelines to measure: zarr's default, and zarrs where it imports."""
    return ["zarr default", *(["zarrs"] if acceleration.zarrs_installed() else [])]


@contextmanager
def zarrs_switched(on: bool):
    """Stores read with the zarrs pipeline (where installed) or zarr's default one."""
    before = os.environ.get(acceleration.ZARRS_SWITCH)
    os.environ[acceleration.ZARRS_SWITCH] = "1" if on else "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ[acceleration.ZARRS_SWITCH]
        else:
            os.environ[acceleration.ZARRS_SWITCH] = before


def drop_cached(files: list[Path]) -> None:
    """Asks the kernel to drop ``files`` from the page cache (flushed first), so the next read
    comes from disk: a first load without root's ``drop_caches``."""
    for path in files:
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.fsync(descriptor)
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(descriptor)


def load_figures(numpy_load, store_load, npy_files, store_files) -> tuple[float, ...]:
    """Medians of first loads (page cache dropped before each, for np.load's files and the
    store's alike) and of repeat loads (files cached), np.load and the store taking turns."""
    first, first_numpy, repeat, repeat_numpy = [], [], [], []
    for _ in range(7):
        drop_cached(npy_files)
        first_numpy.append(numpy_load())
        drop_cached(store_files)
        first.append(store_load())
    for _ in range(9):
        repeat_numpy.append(numpy_load())
        repeat.append(store_load())
    return tuple(float(np.median(x)) for x in (first, first_numpy, repeat, repeat_numpy))


FRESH_LOAD = """
import sys, time
import numpy as np
sys.path.insert(0, {here!r})
from store_bench import table
from emote_core.stores.zarr_store.reader import MemoryStore
from emote_core.stores.zarr_store.tables import load_table
MemoryStore({url!r})  # imports and first calls before the clock
np.load({first!r})
if {numpy}:
    start = time.perf_counter()
    loaded = [np.load(name) for name in {names!r}]
else:
    target = table()
    start = time.perf_counter()
    load_table(target, [{url!r}])
print(time.perf_counter() - start)
"""


def fresh_process_figures(url: str, root: Path, pairs: int = 5) -> tuple[float, float]:
    """Medians of one load in each of ``pairs`` fresh processes, against ``np.load`` of the same
    columns in its own fresh process (files cached, imports warmed). Which of the two goes first
    alternates: a process's first touch of fresh memory depends on what the one before freed."""
    names = [str(root / f"{name}.npy") for name in ("obs", "actions", "rewards")]
    here = str(Path(__file__).resolve().parent)
    found: dict[bool, list[float]] = {True: [], False: []}
    for turn in range(pairs):
        for numpy in (True, False) if turn % 2 else (False, True):
            code = FRESH_LOAD.format(here=here, url=url, first=names[-1], names=names, numpy=numpy)
            result = subprocess.run(
                [sys.executable, "-c", code], check=True, capture_output=True, text=True
            )
            found[numpy].append(float(result.stdout.split()[-1]))
    return float(np.median(found[False])), float(np.median(found[True]))


def checksum_cost(store_load) -> float:
    """The share of a load spent checking episode checksums (best of 3 loads, each timed whole
    and inside ``EpisodeChecks.checksums``, summed over the threads that take them)."""
    from emote_core.stores.zarr_store.checks import EpisodeChecks

    check = EpisodeChecks.checksums
    spent: list[float] = []

    def timed(self, low, high):
        start = time.perf_counter()
        try:
            return check(self, low, high)
        finally:
            spent.append(time.perf_counter() - start)  # one call: safe from either thread

    EpisodeChecks.checksums = timed
    try:
        shares = []
        for _ in range(3):
            spent.clear()
            total = store_load()
            shares.append(sum(spent) / total)
    finally:
        EpisodeChecks.checksums = check
    return min(shares)


def checksum_wall_share(store_load) -> float:
    """The share of a load's wall time that checking checksums adds: best of 5 loads against
    best of 5 with the checksums taken as the episode table says, the rows unread (the checks
    may share the cores with the reads, so time inside them can overstate their cost)."""
    from emote_core.stores.zarr_store.checks import EpisodeChecks

    check = EpisodeChecks.checksums

    def unchecked(self, low, high):
        return self._table["checksum"][self._indices[low:high]]

    checked, skipped = [], []
    try:
        for _ in range(5):
            EpisodeChecks.checksums = check
            checked.append(store_load())
            EpisodeChecks.checksums = unchecked
            skipped.append(store_load())
    finally:
        EpisodeChecks.checksums = check
    return max(0.0, 1 - min(skipped) / min(checked))


def _timed(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
