"""Fixtures shared by the CLI tests."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner


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
