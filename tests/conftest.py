"""Test-wide rules and fixtures: tests marked ``gpu`` skip cleanly on machines without CUDA."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture
def restore_torch_threads() -> Iterator[None]:
    """Puts torch's CPU thread count back after a test that changes it (``--threads``)."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def one_torch_thread(restore_torch_threads: None) -> None:
    """Small networks train fastest on one thread, and do not stall when other work shares the
    cores (several threads contending for two cores made such tests ten times slower)."""
    import torch

    torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_tests = [item for item in items if "gpu" in item.keywords]
    if not gpu_tests:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA; this machine has none")
    for item in gpu_tests:
        item.add_marker(skip)
