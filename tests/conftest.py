"""Test-wide rules and fixtures: tests marked ``gpu`` skip cleanly on machines without CUDA, and
CLI runs (``runner``) leave logging as they found it."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner


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


@pytest.fixture
def runner() -> CliRunner:
    """A CliRunner with a wide terminal so Rich never wraps what the tests look for."""
    return CliRunner(env={"COLUMNS": "200"})


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """Undo what `setup_logging` does inside a command, so other tests see default logging."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    emote_levels = {name: logging.getLogger(name).level for name in ("emote_core", "emote_cli")}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, emote_level in emote_levels.items():
        logging.getLogger(name).setLevel(emote_level)


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
