"""SystemLogger in a real Trainer: memory, memory growth and CPU use of this process."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
from tensorboard.backend.event_processing import event_accumulator as ea
from torch.utils.tensorboard import SummaryWriter

from emote_core.callback import Callback, Order
from emote_core.callbacks.logging import TensorboardLogger
from emote_core.callbacks.system_logger import SystemLogger
from emote_core.trainer import Trainer

MB = 1024 * 1024
RAM = "system/ram_usage_mb"
GROWTH = "system/ram_usage_growth_mb_per_step"
CPU = "system/cpu_percent"


class Recorder(Callback):
    """Copies the system logger's scalars, and this process's RSS, at every cycle."""

    order = Order.LOGGING

    def __init__(self, system: SystemLogger, cycle: int) -> None:
        super().__init__(name="recorder", cycle=cycle)
        self.system = system
        self.cycles: list[tuple[int, dict[str, float], float]] = []

    def end_cycle(self, bp_step: int) -> None:
        rss_mb = psutil.Process().memory_info().rss / MB
        self.cycles.append((bp_step, dict(self.system.scalar_logs), rss_mb))


class Allocator(Callback):
    """Allocates (and touches) a large array at one step and keeps it alive."""

    def __init__(self, at_step: int, megabytes: int) -> None:
        super().__init__(name="allocator")
        self.at_step = at_step
        self.megabytes = megabytes
        self.held: list[np.ndarray] = []

    def backward(self, bp_step: int) -> None:
        if bp_step == self.at_step:
            self.held.append(np.ones(self.megabytes * MB, dtype=np.uint8))


class Spinner(Callback):
    """Keeps the CPU busy for a fixed amount of this process's CPU time each step."""

    def backward(self) -> None:
        start = time.process_time()
        while time.process_time() - start < 0.05:
            pass


def run(*extra: Callback, cycle: int = 10, steps: int = 30) -> Recorder:
    system = SystemLogger(cycle=cycle)
    recorder = Recorder(system, cycle)
    batches: list[dict[str, Any]] = [{"batch_size": 2}] * steps
    Trainer([system, recorder, *extra], batches).train()
    return recorder


def test_ram_usage_matches_the_process_resident_memory() -> None:
    recorder = run()

    assert [step for step, _, _ in recorder.cycles] == [10, 20, 30]
    for _, logs, rss_mb in recorder.cycles:
        assert logs[RAM] > 0
        assert logs[RAM] == pytest.approx(rss_mb, abs=50)


def test_growth_is_zero_at_the_first_cycle_and_reported_after() -> None:
    recorder = run()

    growths = [logs[GROWTH] for _, logs, _ in recorder.cycles]
    assert growths[0] == 0.0
    assert all(np.isfinite(growths))
    # without allocations between cycles the process stays about the same size
    assert all(abs(g) < 1.0 for g in growths[1:])


def test_an_allocation_between_cycles_shows_up_as_growth() -> None:
    megabytes = 200
    recorder = run(Allocator(at_step=15, megabytes=megabytes), cycle=10)

    by_step = {step: logs for step, logs, _ in recorder.cycles}
    assert by_step[20][RAM] - by_step[10][RAM] > 0.8 * megabytes
    # 200 MB over the 10 steps between the cycles at 10 and 20
    assert by_step[20][GROWTH] == pytest.approx(megabytes / 10, rel=0.2)
    assert abs(by_step[30][GROWTH]) < 0.2 * megabytes / 10


def test_cpu_use_of_a_busy_process_is_reported() -> None:
    recorder = run(Spinner(name="spinner"), cycle=2, steps=4)

    cpu = [logs[CPU] for _, logs, _ in recorder.cycles]
    assert len(cpu) == 2
    assert all(c > 5 for c in cpu), cpu


def test_system_values_reach_tensorboard(tmp_path: Path) -> None:
    system = SystemLogger(cycle=5)
    writer = SummaryWriter(log_dir=str(tmp_path))
    logger = TensorboardLogger(callbacks=[system], writer=writer, log_interval=5)
    Trainer([logger, system], [{"batch_size": 1}] * 10).train()

    events = ea.EventAccumulator(str(tmp_path), size_guidance={ea.SCALARS: 0})
    events.Reload()
    ram = events.Scalars("system_bp_step/ram_usage_mb")
    assert [s.step for s in ram] == [5, 10]
    assert all(s.value > 0 for s in ram)
    assert "system_bp_step/ram_usage_growth_mb_per_step" in events.Tags()["scalars"]
    assert "system_bp_step/cpu_percent" in events.Tags()["scalars"]
