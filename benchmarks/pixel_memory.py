"""Pixel memory: bytes per transition of frame-stacked observations, stored once per frame
(emote's layout) beside a naive layout that stores every stack whole, in RAM and on disk.

Workload: real frames of ``emote/PixelCarRacing-v0`` (84x84 RGB ``uint8``, 3 frames stacked,
random actions), the same episodes added to both tables and saved to an emote-memory Zarr store
each; then each store is loaded back and sampled (batch 256, windows of 1), with the rate of each
stage in transitions/s.

Run: ``python benchmarks/pixel_memory.py [--transitions 5000]`` (CPU, one torch thread; CarRacing
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

from emote_core.assembly.builders import make_env
from emote_core.env import PIXEL_CAR_RACING_ID
from emote_core.memory import DictObsMemoryTable
from emote_core.recipes import load_recipe
from emote_core.spaces import DictSpace, MDPSpace
from emote_core.stores.zarr_store.tables import load_table, save_table

BATCH = 256


def naive(spaces: MDPSpace) -> MDPSpace:
    """The same spaces with every stack stored whole (no ``frames``)."""
    state = {key: replace(space, frames=1) for key, space in spaces.state.spaces.items()}
    return MDPSpace(rewards=spaces.rewards, actions=spaces.actions, state=DictSpace(state))


def collect(transitions: int, seed: int) -> tuple[MDPSpace, list[tuple[int, dict, object]]]:
    """Whole episodes of random CarRacing driving, about ``transitions`` in all, as
    ``emote collect --policy random`` plays them."""
    from emote_core.assembly.compatibility import collect_agent
    from emote_core.env import BatchGymCollector

    recipe = load_recipe("sac_hit_the_middle", [f'env.id="{PIXEL_CAR_RACING_ID}"', f"seed={seed}"])
    env = make_env(recipe)
    agent, _ = collect_agent("random", recipe, env, torch.device("cpu"))
    episodes: list[tuple[int, dict, object]] = []
    collector = BatchGymCollector(
        env=env, agent=agent, seed=seed, on_episode=lambda *episode: episodes.append(episode)
    )
    steps = 0
    while steps < transitions:
        steps += collector.collect(100)
    collector.cut()
    env.close()
    return env.spaces, episodes


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
    fresh.sample(BATCH, 1)
    rounds, started = 0, time.perf_counter()
    while time.perf_counter() - started < 2.0:
        fresh.sample(BATCH, 1)
        rounds += 1
    sample_seconds = (time.perf_counter() - started) / rounds
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
    parser.add_argument("--transitions", type=int, default=5_000, help="CarRacing steps to store")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = time.perf_counter()
    spaces, episodes = collect(args.transitions, args.seed)
    collect_seconds = time.perf_counter() - started
    entry = spaces.state[spaces.state.keys()[0]]
    frame_bytes = int(np.prod(entry.frame_shape)) * entry.dtype.itemsize
    print(
        f"{PIXEL_CAR_RACING_ID}: {sum(len(e[1]['rewards']) for e in episodes)} transitions in "
        f"{len(episodes)} episodes, {entry.shape} {entry.dtype} = {entry.frames} frames of "
        f"{entry.frame_shape} ({frame_bytes:,} bytes a frame); collected at "
        f"{sum(len(e[1]['rewards']) for e in episodes) / collect_seconds:,.0f} steps/s"
    )
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
