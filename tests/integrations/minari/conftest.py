"""Fixtures for the Minari tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private Minari root, also as MINARI_DATASETS_PATH for plain minari calls."""
    path = tmp_path / "datasets"
    path.mkdir()
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(path))
    return path
