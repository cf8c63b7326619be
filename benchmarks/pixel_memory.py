"""Pixel memory: transitions/s at each stage of pixel observations' way through emote, and
bytes per transition of frame-stacked observations stored once per frame (emote's layout) beside
a naive layout that stores every stack whole, in RAM and on disk.

Workload: real frames of ``emote/PixelCarRacing-v0`` (84x84 RGB ``uint8``, 3 frames stacked,
random actions). Stages, each beside a reference measured in the same run:
- collect: ``emote collect``'s ``collect_to_store`` (env + collection + store appends), against
  stepping the bare environment with random actions;
- store: the loaded table written to a new store (``save_table``), against ``np.save`` of the
  same columns;
- load: the collected store into a table, against ``np.load`` of the same columns (first loads
  with both sides' files dropped from the page cache, and repeat loads);
- sample: batches of 256 windows of 1 from the table (stacks rebuilt from frames).
Then the same episodes go into a table of each layout, saved, loaded back and sampled.

Run: ``python benchmarks/pixel_memory.py [--transitions 2000]`` (CPU, one torch thread; CarRacing
needs ``gymnasium[box2d]``, which emote's default install has).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from store_bench import drop_cached

from emote_core.assembly.builders import make_env
from emote_core.env import PIXEL_CAR_RACING_ID
from emote_core.memory import DictObsMemoryTable
from emote_core.memory.frame_stacks import FRAME_PREFIX, stack_frames
from emote_core.recipes import load_recipe
from emote_core.spaces import DictSpace, MDPSpace
from emote_core.stores.zarr_store.acceleration import FAST_CRC32, zarrs_enabled
from emote_core.stores.zarr_store.reader import MemoryStore
from emote_core.stores.zarr_store.tables import load_table, save_table

BATCH = 256


def naive(spaces: MDPSpace) -> MDPSpace:
    """The same spaces with every stack stored whole (no ``frames``)."""
    state = {key: replace(space, frames=1) for key, space in spaces.state.spaces.items()}
    return MDPSpace(rewards=spaces.rewards, actions=spaces.actions, state=DictSpace(state))


def recipe_for(seed: int):
    return load_recipe("sac_hit_the_middle", [f'env.id="{PIXEL_CAR_RACING_ID}"', f"seed={seed}"])


def bare_steps_per_second(seed: int, steps: int = 300) -> float:
    """The vector environment emote steps, alone: cached random actions; it resets finished
    episodes itself."""
    from emote_core.env import make_vector_env

    vector = make_vector_env(PIXEL_CAR_RACING_ID, num_envs=1)
    vector.reset(seed=seed)
    vector.action_space.seed(seed)
    actions = [vector.action_space.sample() for _ in range(steps)]
    started = time.perf_counter()
    for action in actions:
        vector.step(action)
    seconds = time.perf_counter() - started
    vector.close()
    return steps / seconds


def collect(transitions: int, seed: int, store: Path) -> float:
    """Random CarRacing driving into ``store`` as ``emote collect --policy random --steps``
    runs it; returns the env steps per second it reports."""
    from emote_core.assembly.collection import collect_to_store

    result = collect_to_store(recipe_for(seed), str(store), steps=transitions, num_envs=1)
    return float(result.summary["env_steps_per_second"])


def stages(store: Path, root: Path, spaces: MDPSpace) -> tuple[dict, list]:
    """Load, store and sample rates of the collected store, each with its reference; and the
    episodes in the form agents see them (whole stacks)."""
    collected = MemoryStore(store)
    maxlen = 2 * collected.transition_count
    episodes = list(collected.episodes())
    transitions = sum(len(data["rewards"]) for _, data, _ in episodes)
    names = [c.name for c in collected.columns]
    for name in names:
        np.save(root / f"{name}.npy", np.concatenate([data[name] for _, data, _ in episodes]))
    npy_files = [root / f"{name}.npy" for name in names]
    store_files = [p for p in store.rglob("*") if p.is_file()]

    def numpy_load() -> float:
        started = time.perf_counter()
        loaded = [np.load(path) for path in npy_files]
        del loaded
        return time.perf_counter() - started

    def store_load() -> tuple[float, DictObsMemoryTable]:
        table = DictObsMemoryTable(spaces=spaces, maxlen=maxlen, seed=0)
        started = time.perf_counter()
        load_table(table, [store])
        return time.perf_counter() - started, table

    drop_cached(npy_files)
    first_numpy = numpy_load()
    drop_cached(store_files)
    first, table = store_load()
    repeat = float(np.median([store_load()[0] for _ in range(3)]))
    repeat_numpy = float(np.median([numpy_load() for _ in range(3)]))

    started = time.perf_counter()
    save_table(table, root / "copy.zarr", spaces=spaces.to_json())
    save_seconds = time.perf_counter() - started
    started = time.perf_counter()
    for name in names:
        np.save(root / f"copy-{name}.npy", np.load(root / f"{name}.npy", mmap_mode="r"))
    numpy_save = time.perf_counter() - started

    sample_seconds = seconds_per_sample(table)
    rates = {
        "store": (transitions / save_seconds, transitions / numpy_save),
        "load (first)": (transitions / first, transitions / first_numpy),
        "load (repeat)": (transitions / repeat, transitions / repeat_numpy),
        "sample": (BATCH / sample_seconds, None),
    }
    stacks = {key: space.frames for key, space in spaces.state.spaces.items() if space.frames > 1}
    agent_form = [
        (identity, _stacked(data, stacks), end) for identity, data, end in episodes
    ]  # as agents saw them: whole stacks
    return rates, agent_form


def seconds_per_sample(table: DictObsMemoryTable, seconds: float = 2.0) -> float:
    """Seconds per batch of ``BATCH`` windows of 1, sampled for about ``seconds``."""
    table.sample(BATCH, 1)
    rounds, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        table.sample(BATCH, 1)
        rounds += 1
    return (time.perf_counter() - started) / rounds


def _stacked(data: dict, stacks: dict[str, int]) -> dict:
    whole = {k: v for k, v in data.items() if not k.startswith(FRAME_PREFIX)}
    for key, count in stacks.items():
        whole[key] = stack_frames(data[FRAME_PREFIX + key], count)
    return whole


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def measure(name: str, spaces: MDPSpace, episodes: list, root: Path) -> dict[str, float]:
    maxlen = 2 * sum(len(data["rewards"]) for _, data, _ in episodes)
    table = DictObsMemoryTable(spaces=spaces, maxlen=maxlen, seed=0)
    started = time.perf_counter()
    for identity, sequence, end_state in episodes:
        table.add_sequence(identity, sequence, end_state=end_state)
    add_seconds = time.perf_counter() - started
    transitions = table.size()
    held = sum(
        value.nbytes for _, data, _ in table.episodes() for value in data.values()
    )  # the rows the table holds for these episodes, every stored column
    store = root / f"{name}.zarr"
    started = time.perf_counter()
    save_table(table, store, spaces=spaces.to_json())
    save_seconds = time.perf_counter() - started
    fresh = DictObsMemoryTable(spaces=spaces, maxlen=maxlen, seed=0)
    started = time.perf_counter()
    load_table(fresh, [store])
    load_seconds = time.perf_counter() - started
    sample_seconds = seconds_per_sample(fresh)
    return {
        "transitions": transitions,
        "ram": held / transitions,
        "disk": directory_bytes(store) / transitions,
        "add": transitions / add_seconds,
        "save": transitions / save_seconds,
        "load": transitions / load_seconds,
        "sample": BATCH / sample_seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transitions", type=int, default=2_000, help="CarRacing steps to collect")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    env = make_env(recipe_for(args.seed))
    spaces = env.spaces
    env.close()
    bare = bare_steps_per_second(args.seed)
    scratch_folder = tempfile.TemporaryDirectory()
    root = Path(scratch_folder.name)
    collected = collect(args.transitions, args.seed, root / "collected.zarr")
    if not MemoryStore(root / "collected.zarr").transition_count:
        parser.error(
            f"no {PIXEL_CAR_RACING_ID} episode ended in {args.transitions} steps (they run up to "
            "1,000 steps): collect more --transitions"
        )
    rates, episodes = stages(root / "collected.zarr", root, spaces)
    rates = {"collect": (collected, bare), **rates}
    entry = spaces.state[spaces.state.keys()[0]]
    frame_bytes = int(np.prod(entry.frame_shape)) * entry.dtype.itemsize
    print(
        f"{PIXEL_CAR_RACING_ID}: {sum(len(e[1]['rewards']) for e in episodes)} transitions in "
        f"{len(episodes)} episodes, {entry.shape} {entry.dtype} = {entry.frames} frames of "
        f"{entry.frame_shape} ({frame_bytes:,} bytes a frame); zarrs pipeline "
        f"{'on' if zarrs_enabled() else 'off (not installed)'}, zlib-ng crc32 "
        f"{'on' if FAST_CRC32 else 'off'}"
    )
    references = {
        "collect": "bare env stepping, random actions",
        "store": "np.save of the same columns",
        "load (first)": "np.load, files dropped from the page cache",
        "load (repeat)": "np.load, files cached",
        "sample": "batch 256, windows of 1",
    }
    print(f"  {'stage':<16}{'emote tr/s':>14}{'reference tr/s':>16}  reference")
    for stage, (ours, reference) in rates.items():
        shown = f"{reference:>16,.0f}" if reference else f"{'-':>16}"
        ratio = f" ({ours / reference:.2f}x)" if reference else ""
        print(f"  {stage:<16}{ours:>14,.0f}{shown}  {references[stage]}{ratio}")
    scratch_folder.cleanup()
    with tempfile.TemporaryDirectory() as scratch:
        rows = {
            "emote (one frame per step)": measure("frames", spaces, episodes, Path(scratch)),
            "naive (every stack whole)": measure("stacks", naive(spaces), episodes, Path(scratch)),
        }
    print(
        f"  {'layout':<28}{'RAM B/tr':>10}{'disk B/tr':>11}{'add tr/s':>11}{'save tr/s':>11}"
        f"{'load tr/s':>11}{'sample tr/s':>13}"
    )
    for name, row in rows.items():
        print(
            f"  {name:<28}{row['ram']:>10,.0f}{row['disk']:>11,.0f}{row['add']:>11,.0f}"
            f"{row['save']:>11,.0f}{row['load']:>11,.0f}{row['sample']:>13,.0f}"
        )
    ours, theirs = rows["emote (one frame per step)"], rows["naive (every stack whole)"]
    print(
        f"  emote / naive: RAM {ours['ram'] / theirs['ram']:.2f}x, disk "
        f"{ours['disk'] / theirs['disk']:.2f}x; emote's RAM per transition is "
        f"{ours['ram'] / frame_bytes:.2f} frames (the observations' N + 1 rows, actions and "
        f"rewards included)"
    )


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
