"""Which columns to store raw: Blosc's ratio, size on disk and load time, raw against Blosc.

For several kinds of data (random floats, a random walk, gymnasium Pendulum-v1 and CartPole-v1
episodes with a random policy, uint8 pixel frames), each column's Blosc ratio on its first
chunk (what the writer decides from, :mod:`emote_core.stores.zarr_store.raw_chunks`), then the
whole store written with every column raw and with every column Blosc: bytes on disk, append
speed, and the repeat load into a table (best of 5) with zarr's default codec pipeline and with
zarrs, beside ``np.load`` of the same columns (best of 5). Where raw loads
faster for little more disk, the writer's threshold (``RAW_RATIO``) should store it raw.

Run: ``python benchmarks/codec_bench.py``.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np
from store_bench import table as transition_table

from emote_core.memory.table import ArrayMemoryTable
from emote_core.stores.stored import ColumnSchema
from emote_core.stores.summary import bytes_on_disk
from emote_core.stores.zarr_store import (
    ShardWriter,
    acceleration,
    create_store,
    raw_chunks,
    store_columns,
)
from emote_core.stores.zarr_store import writer as writer_module
from emote_core.stores.zarr_store.tables import BATCH_BYTES, load_table
from emote_core.typing import EpisodeState

TRANSITIONS = 500_000


def synthetic(kind: str, obs: int = 32, length: int = 1000) -> list[tuple]:
    rng = np.random.default_rng(0)
    result = []
    for identity in range(TRANSITIONS // length):
        if kind == "random floats":
            values = rng.standard_normal((length + 1, obs), dtype=np.float32)
        else:  # a random walk
            steps = rng.standard_normal((length + 1, obs), dtype=np.float32) * 0.05
            values = np.cumsum(steps, axis=0, dtype=np.float32)
        data = {
            "obs": values,
            "actions": rng.uniform(-1, 1, (length, 2)).astype(np.float32),
            "rewards": rng.standard_normal((length, 1), dtype=np.float32),
        }
        result.append((identity, data, EpisodeState.INTERRUPTED))
    return result


def gymnasium_episodes(env_id: str) -> list[tuple]:
    """Random-policy episodes of ``env_id``, repeated to :data:`TRANSITIONS` transitions."""
    import gymnasium

    env = gymnasium.make(env_id)
    env.action_space.seed(0)
    episodes, total = [], 0
    while total < 50_000:
        observation, _ = env.reset(seed=len(episodes))
        observations, actions, rewards = [observation], [], []
        while True:
            action = env.action_space.sample()
            observation, reward, terminated, truncated, _ = env.step(action)
            observations.append(observation)
            actions.append(np.asarray(action, dtype=np.float32).reshape(-1))
            rewards.append([reward])
            if terminated or truncated:
                break
        data = {
            "obs": np.asarray(observations, np.float32),
            "actions": np.asarray(actions, np.float32),
            "rewards": np.asarray(rewards, np.float32),
        }
        end = EpisodeState.TERMINAL if terminated else EpisodeState.INTERRUPTED
        episodes.append((len(episodes), data, end))
        total += len(actions)
    repeated = [episodes[k % len(episodes)] for k in range(len(episodes) * TRANSITIONS // total)]
    return [(k, data, end) for k, (_, data, end) in enumerate(repeated)]


def pixel_frames(count: int = 6_000, length: int = 200) -> list[tuple]:
    """84x84x3 uint8 frames: a flat background with a few moving blocks and sensor noise."""
    rng = np.random.default_rng(0)
    result = []
    for identity in range(count // length):
        frames = np.full((length + 1, 84, 84, 3), 40, np.uint8)
        frames[:, 60:, :] = 90  # the floor
        for t in range(length + 1):
            x, y = (identity * 7 + t) % 70, (identity * 3 + 2 * t) % 50
            frames[t, y : y + 12, x : x + 12] = (200, 60, 30)
        frames += rng.integers(0, 3, frames.shape, dtype=np.uint8)
        data = {
            "obs": frames,
            "actions": rng.uniform(-1, 1, (length, 2)).astype(np.float32),
            "rewards": rng.standard_normal((length, 1), dtype=np.float32),
        }
        result.append((identity, data, EpisodeState.INTERRUPTED))
    return result


def table(data: dict[str, np.ndarray], maxlen: int) -> ArrayMemoryTable:
    obs, actions = data["obs"], data["actions"]
    return transition_table(obs.shape[1:], obs.dtype, actions.shape[1:], maxlen)


def write(url: str, episodes: list[tuple], raw: bool) -> float:
    data = episodes[0][1]
    schemas = [ColumnSchema(k, "Column", v.shape[1:], v.dtype) for k, v in data.items()]
    create_store(url, columns=store_columns(schemas, episodes[0], "rewards"), length_key="rewards")
    size = sum(v.nbytes for v in data.values())
    per_batch = max(1, BATCH_BYTES // size)
    with mock.patch.object(writer_module, "stores_raw", lambda *a: raw), ShardWriter(url) as w:
        start = time.perf_counter()
        for first in range(0, len(episodes), per_batch):
            w.append(episodes[first : first + per_batch])
        return time.perf_counter() - start


def best_seconds(action, times: int = 5) -> float:
    """The fastest of ``times`` runs: the least disturbed by other work on a shared machine."""
    seconds = []
    for _ in range(times):
        start = time.perf_counter()
        action()
        seconds.append(time.perf_counter() - start)
    return min(seconds)


def measure(kind: str, episodes: list[tuple], root: Path) -> None:
    first = {k: np.concatenate([d[k] for _, d, _ in episodes[:64]]) for k in episodes[0][1]}
    chunk_rows = {
        k: max(1, (1 << 20) // max(1, v[0].nbytes)) for k, v in first.items()
    }  # about one 1 MB chunk, as the writer trials
    ratios = {k: raw_chunks.compressed_ratio(v[: chunk_rows[k]]) for k, v in first.items()}
    transitions = sum(len(d["rewards"]) for _, d, _ in episodes)
    raw_bytes = sum(v.nbytes for _, d, _ in episodes for v in d.values())
    columns = {k: np.concatenate([d[k] for _, d, _ in episodes]) for k in episodes[0][1]}
    for name, values in columns.items():
        np.save(root / f"{kind}-{name}.npy", values)
    del columns
    numpy_seconds = best_seconds(
        lambda: [np.load(root / f"{kind}-{name}.npy") for name in episodes[0][1]]
    )
    figures = {}
    for raw in (False, True):
        url = str(root / f"{kind}-{raw}.zarr")
        append = write(url, episodes, raw)
        os.sync()  # no write-back during the loads
        loads = []
        for switch in ("0", "1"):  # zarr's default pipeline, then zarrs where installed
            os.environ[acceleration.ZARRS_SWITCH] = switch

            def load(url: str = url) -> None:
                load_table(table(episodes[0][1], transitions), [url])

            load()  # warm
            loads.append(best_seconds(load))
        os.environ.pop(acceleration.ZARRS_SWITCH)
        figures[raw] = ((bytes_on_disk(url) or 0) / raw_bytes, append, loads)
    ratio_text = " ".join(f"{k}={v:.2f}" for k, v in ratios.items())
    blosc, raw_figures = figures[False], figures[True]
    print(
        f"{kind:<15}{ratio_text:<38}{blosc[0]:>6.3f}{raw_figures[0]:>6.3f}"
        + "".join(
            f"{blosc[2][p] / numpy_seconds:>7.2f}x{raw_figures[2][p] / numpy_seconds:>6.2f}x"
            for p in (0, 1)
        )
        + f"{transitions / blosc[1] / 1e6:>7.2f}{transitions / raw_figures[1] / 1e6:>6.2f}"
        f"{numpy_seconds * 1000:>8.1f}"
    )


def main() -> None:
    print(f"codec_bench: {TRANSITIONS} transitions per kind (pixels: 6000 frames); threshold "
          f"RAW_RATIO={raw_chunks.RAW_RATIO}")  # fmt: skip
    print(
        f"{'':<15}{'Blosc ratio of the first chunk':<38}{'disk/raw':>12}"
        f"{'load/np.load (zarr)':>20}{'(zarrs)':>14}{'append M/s':>13}{'np.load':>8}"
    )
    print(f"{'data':<15}{'':<38}{'blosc':>6}{'raw':>6}{'blosc':>8}{'raw':>7}{'blosc':>8}"
          f"{'raw':>7}{'blosc':>7}{'raw':>6}{'ms':>8}")  # fmt: skip
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        for kind, make in [
            ("random floats", lambda: synthetic("random floats")),
            ("random walk", lambda: synthetic("random walk")),
            ("Pendulum-v1", lambda: gymnasium_episodes("Pendulum-v1")),
            ("CartPole-v1", lambda: gymnasium_episodes("CartPole-v1")),
            ("pixels uint8", pixel_frames),
        ]:
            measure(kind, make(), root)


if __name__ == "__main__":
    main()
