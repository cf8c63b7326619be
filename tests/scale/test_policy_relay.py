"""A worker's policy mirror: its own temporary run directory, published atomically, removed
whole on close and nothing beside it."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from emote_core.scale.policy_relay import PolicyMirror


def test_a_mirror_publishes_newer_offers_only_and_removes_only_its_own_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    neighbour = tmp_path / "someone-elses.txt"
    neighbour.write_text("kept")
    mirror = PolicyMirror()
    assert mirror.run_dir.parent == tmp_path
    assert mirror.publish(b"two", 2) and mirror.path.read_bytes() == b"two"
    assert not mirror.publish(b"one", 1)  # a late, older offer
    assert mirror.path.read_bytes() == b"two"
    assert [p.name for p in mirror.path.parent.iterdir()] == [mirror.path.name]
    mirror.close()
    assert not mirror.run_dir.exists()
    assert not mirror.publish(b"three", 3)  # offers after close are ignored, nothing recreated
    assert not mirror.run_dir.exists()
    assert neighbour.read_text() == "kept"
    assert [p.name for p in tmp_path.iterdir()] == ["someone-elses.txt"]
