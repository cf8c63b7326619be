"""A CUDA table samples exactly what the same table on the CPU samples: the index and mask
arrays reach the GPU through pinned, non-blocking copies (no host sync per sample)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from emote_core.memory.builders import DictObsMemoryTable, DictObsNStepMemoryTable
from emote_core.memory.strategies.prioritized import PrioritizedSampleStrategy
from emote_core.spaces import BoxSpace, DictSpace, MDPSpace
from emote_core.typing import EpisodeState

pytestmark = pytest.mark.gpu

SPACES = MDPSpace(
    rewards=BoxSpace(np.float32, (1,)),
    actions=BoxSpace(np.float32, (2,), -1.0, 1.0),
    state=DictSpace({"obs": BoxSpace(np.float32, (3,))}),
)


def filled(table_type: type, device: str, **options) -> DictObsMemoryTable:
    table = table_type(spaces=SPACES, maxlen=1_000, device=torch.device(device), seed=0, **options)
    rng = np.random.default_rng(0)
    for identity in range(20):
        length = 3 + identity % 7
        table.add_sequence(
            identity,
            {"obs": rng.standard_normal((length + 1, 3)).astype(np.float32),
             "actions": rng.uniform(-1, 1, (length, 2)).astype(np.float32),
             "rewards": rng.standard_normal(length).astype(np.float32)},
            end_state=EpisodeState.TERMINAL if identity % 3 else EpisodeState.INTERRUPTED,
        )  # fmt: skip
    return table


def assert_same(on_gpu: dict, on_cpu: dict, device: str) -> None:
    assert on_gpu.keys() == on_cpu.keys()
    for key, value in on_cpu.items():
        if isinstance(value, dict):
            assert_same(on_gpu[key], value, device)
        elif isinstance(value, torch.Tensor):
            assert on_gpu[key].device.type == device, key
            assert torch.equal(on_gpu[key].cpu(), value), key
        else:
            assert on_gpu[key] == value, key


@pytest.mark.parametrize(
    ("table_type", "length", "prioritized"),
    [(DictObsMemoryTable, 1, False), (DictObsMemoryTable, 3, False),
     (DictObsNStepMemoryTable, 3, False), (DictObsMemoryTable, 2, True)],
)  # fmt: skip
def test_a_cuda_table_samples_what_the_cpu_table_samples(
    table_type: type, length: int, prioritized: bool, device: str = "cuda"
) -> None:
    def options() -> dict:
        return {"sampler": PrioritizedSampleStrategy()} if prioritized else {}

    on_gpu, on_cpu = filled(table_type, device, **options()), filled(table_type, "cpu", **options())
    for _ in range(5):
        assert_same(on_gpu.sample(16, length), on_cpu.sample(16, length), device)
