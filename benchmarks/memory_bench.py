"""Episode memory against its peers, side by side, on a 1M-transition workload.

Workload: 1,000,000 transitions in 1,000-step episodes; float32 obs[32], actions[2], rewards[1].
Peers: Stable-Baselines3's ``ReplayBuffer`` (``pip install -e ".[bench]"``) and a raw numpy
fancy-index gather of the same arrays (the floor any Python memory pays).

Run: ``python benchmarks/memory_bench.py`` (or ``nox -s bench``). CPU, one torch thread; with
CUDA present, a CUDA table's sampling throughput is printed too. Resident bytes are measured in
fresh subprocesses (``--rss NAME``) so one structure's pages never count for another.
"""

from __future__ import annotations

import argparse
import gc
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np
import psutil
import torch

from emote_core.memory.columns import Column, VirtualColumn
from emote_core.memory.mappers import NextElementMapper, SyntheticDones, SyntheticMasks
from emote_core.memory.proxy import MemoryTableProxy
from emote_core.memory.strategies import (
    FifoEjectionStrategy,
    PrioritizedSampleStrategy,
    SampleStrategy,
    UniformSampleStrategy,
)
from emote_core.memory.table import ArrayMemoryTable
from emote_core.typing import DictObservation, DictResponse, EpisodeState

TRANSITIONS = 1_000_000
EPISODE_LENGTH = 1_000
OBS, ACT = 32, 2
EPISODES = TRANSITIONS // EPISODE_LENGTH


def columns() -> list:
    return [
        Column("obs", (OBS,), np.float32),
        Column("actions", (ACT,), np.float32),
        Column("rewards", (1,), np.float32),
        VirtualColumn("next_obs", (OBS,), np.float32, "obs", NextElementMapper()),
        VirtualColumn("dones", (1,), np.float32, "rewards", SyntheticDones()),
        VirtualColumn("masks", (1,), np.float32, "rewards", SyntheticMasks()),
    ]


def make_table(sampler: SampleStrategy | None = None, device: str = "cpu") -> ArrayMemoryTable:
    return ArrayMemoryTable(
        columns=columns(),
        maxlen=TRANSITIONS,
        sampler=sampler or UniformSampleStrategy(),
        ejector=FifoEjectionStrategy(),
        length_key="rewards",
        device=device,
        seed=0,
    )


def episode(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "obs": rng.standard_normal((EPISODE_LENGTH + 1, OBS), dtype=np.float32),
        "actions": rng.standard_normal((EPISODE_LENGTH, ACT), dtype=np.float32),
        "rewards": rng.standard_normal((EPISODE_LENGTH, 1), dtype=np.float32),
    }


def fill(table: ArrayMemoryTable) -> float:
    """Adds the workload's episodes; returns transitions per second."""
    rng = np.random.default_rng(0)
    episodes = [episode(rng) for _ in range(50)]  # reused data: we time the table, not the RNG
    start = time.perf_counter()
    for identity in range(EPISODES):
        table.add_sequence(identity, episodes[identity % 50], end_state=EpisodeState.INTERRUPTED)
    return TRANSITIONS / (time.perf_counter() - start)


def per_call(function: Callable[[], object], seconds: float = 1.5) -> float:
    """Median seconds per call over repeated timed blocks."""
    for _ in range(20):
        function()
    blocks = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(blocks) < 5:
        start = time.perf_counter()
        for _ in range(50):
            function()
        blocks.append((time.perf_counter() - start) / 50)
    return float(np.median(blocks))


def numpy_floor() -> tuple[Callable[[], object], Callable[[], object]]:
    rng = np.random.default_rng(0)
    observations = rng.standard_normal((TRANSITIONS + EPISODES, OBS), dtype=np.float32)
    actions = rng.standard_normal((TRANSITIONS + EPISODES, ACT), dtype=np.float32)
    rewards = rng.standard_normal((TRANSITIONS + EPISODES, 1), dtype=np.float32)
    last = np.zeros(TRANSITIONS + EPISODES, dtype=bool)

    def gather(rows: np.ndarray) -> dict[str, torch.Tensor]:
        dones = last[rows].astype(np.float32)
        return {
            "obs": torch.from_numpy(observations[rows]),
            "next_obs": torch.from_numpy(observations[rows + 1]),
            "actions": torch.from_numpy(actions[rows]),
            "rewards": torch.from_numpy(rewards[rows]),
            "dones": torch.from_numpy(dones),
            "masks": torch.from_numpy(1.0 - dones),
        }

    def single() -> object:
        return gather(rng.integers(0, TRANSITIONS, 256))

    def sequences() -> object:
        starts = rng.integers(0, TRANSITIONS - 8, 64)
        return gather((starts[:, None] + np.arange(8)).reshape(-1))

    return single, sequences


def sb3_buffer() -> tuple[object, float]:
    """A full SB3 ReplayBuffer of the workload, and its per-step ``add`` throughput."""
    from gymnasium import spaces
    from stable_baselines3.common.buffers import ReplayBuffer

    observation_space = spaces.Box(-np.inf, np.inf, (OBS,), np.float32)
    action_space = spaces.Box(-1, 1, (ACT,), np.float32)
    buffer = ReplayBuffer(TRANSITIONS, observation_space, action_space, device="cpu")
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((1, OBS), dtype=np.float32)
    action = rng.standard_normal((1, ACT), dtype=np.float32)
    reward, done, infos = np.zeros(1, np.float32), np.zeros(1, np.float32), [{}]
    steps = 100_000
    start = time.perf_counter()
    for _ in range(steps):
        buffer.add(obs, obs, action, reward, done, infos)
    rate = steps / (time.perf_counter() - start)
    buffer.observations[:] = rng.standard_normal(buffer.observations.shape, dtype=np.float32)
    buffer.next_observations[:] = buffer.observations
    buffer.pos, buffer.full = 0, True
    return buffer, rate


def proxy_throughput(agents: int = 16, steps: int = 6_000) -> float:
    """Agent-steps per second through MemoryTableProxy.add with ``agents`` agents."""
    table = make_table()
    proxy = MemoryTableProxy(table)
    rng = np.random.default_rng(0)
    obs = [rng.standard_normal(OBS, dtype=np.float32) for _ in range(agents)]
    actions = [rng.standard_normal(ACT, dtype=np.float32) for _ in range(agents)]
    responses = {a: DictResponse(list_data={"actions": actions[a]}) for a in range(agents)}
    initial = {
        a: DictObservation(
            episode_state=EpisodeState.INITIAL, array_data={"obs": obs[a]}, rewards={"reward": None}
        )
        for a in range(agents)
    }
    start = time.perf_counter()
    proxy.add(initial, responses)
    for step in range(1, steps):
        state = EpisodeState.INTERRUPTED if step % EPISODE_LENGTH == 0 else EpisodeState.RUNNING
        observations = {
            a: DictObservation(
                episode_state=state, array_data={"obs": obs[a]}, rewards={"reward": 1.0}
            )
            for a in range(agents)
        }
        if state is EpisodeState.INTERRUPTED:
            proxy.add(observations, {})
            proxy.add(initial, responses)
        else:
            proxy.add(observations, responses)
    return agents * steps / (time.perf_counter() - start)


def rss_mode(name: str) -> None:
    """Fills one structure in this fresh process and prints its resident bytes per transition."""
    process = psutil.Process()
    gc.collect()
    before = process.memory_info().rss
    if name == "emote":
        keep: object = make_table()
        fill(keep)  # type: ignore[arg-type]
    elif name == "sb3":
        keep = sb3_buffer()[0]
    else:
        raise SystemExit(f"unknown structure {name}")
    gc.collect()
    print((process.memory_info().rss - before) / TRANSITIONS)


def resident_bytes(name: str) -> float:
    output = subprocess.run(
        [sys.executable, __file__, "--rss", name], capture_output=True, text=True, check=True
    )
    return float(output.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rss", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.rss:
        rss_mode(arguments.rss)
        return
    torch.set_num_threads(1)

    table = make_table()
    add_rate = fill(table)
    single, sequences = numpy_floor()
    buffer, sb3_add_rate = sb3_buffer()

    emote_single = per_call(lambda: table.sample(256, 1))
    sb3_single = per_call(lambda: buffer.sample(256))  # type: ignore[attr-defined]
    floor_single = per_call(single)
    emote_sequences = per_call(lambda: table.sample(64, 8))
    floor_sequences = per_call(sequences)

    prioritized = make_table(PrioritizedSampleStrategy(alpha=0.6, beta=0.4))
    fill(prioritized)
    priorities = np.random.default_rng(1).random(256)

    def sample_and_update() -> None:
        prioritized.sample(256, 1)
        prioritized.update_priorities(priorities)

    emote_prioritized = per_call(sample_and_update)

    proxy_rate = proxy_throughput()
    raw = ((EPISODE_LENGTH + 1) * OBS * 4 + EPISODE_LENGTH * (ACT + 1) * 4) / EPISODE_LENGTH
    emote_bytes, sb3_bytes = resident_bytes("emote"), resident_bytes("sb3")

    print("memory_bench: 1M transitions in 1000-step episodes, obs[32] actions[2] rewards[1]")
    print(f"CPU, 1 torch thread, {psutil.cpu_count()} cores")
    print(f"{'measure':<42}{'emote':>14}{'SB3':>14}{'numpy floor':>14}  target")

    def row(label: str, emote: str, sb3: str, floor: str, target: str) -> None:
        print(f"{label:<42}{emote:>14}{sb3:>14}{floor:>14}  {target}")

    row("sample 256x1, us/batch", f"{emote_single * 1e6:.1f}", f"{sb3_single * 1e6:.1f}",
        f"{floor_single * 1e6:.1f}",
        f"SB3/emote {sb3_single / emote_single:.2f}x (>=1.5), "
        f"emote/floor {emote_single / floor_single:.2f}x (<=1.5)")  # fmt: skip
    row("sample 64x8 sequences, us/batch", f"{emote_sequences * 1e6:.1f}", "-",
        f"{floor_sequences * 1e6:.1f}", "< 500 us")  # fmt: skip
    row("prioritized sample 256 + update, us", f"{emote_prioritized * 1e6:.1f}", "-", "-",
        "< 500 us")  # fmt: skip
    row("bulk add, M transitions/s", f"{add_rate / 1e6:.2f}", f"{sb3_add_rate / 1e6:.3f}", "-",
        ">= 4 M/s (SB3: per-step add)")  # fmt: skip
    row("proxy add, 16 agents, k agent-steps/s", f"{proxy_rate / 1e3:.0f}", "-", "-", ">= 100 k/s")
    row("resident bytes per transition", f"{emote_bytes:.1f}", f"{sb3_bytes:.1f}",
        f"{raw:.1f} raw", f"emote/raw {emote_bytes / raw:.3f}x (<= 1.1)")  # fmt: skip

    if torch.cuda.is_available():
        cuda_table = make_table(device="cuda")
        fill(cuda_table)

        def cuda_sample() -> None:
            cuda_table.sample(256, 1)
            torch.cuda.synchronize()

        row("CUDA table sample 256x1, us/batch", f"{per_call(cuda_sample) * 1e6:.1f}", "-", "-",
            torch.cuda.get_device_name())  # fmt: skip


if __name__ == "__main__":
    main()
