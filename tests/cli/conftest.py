"""Fixtures of the command-line tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh working directory: what a command writes by relative path lands in it."""
    monkeypatch.chdir(tmp_path)
    return tmp_path
