"""zarr's temporary files (``<name>.<32 hex>.partial``) that a writer killed mid-write leaves in
a local store: creating a store over what a creation cut off left, verify naming them, and the
next writer on a shard removing them; nothing that could belong to a write still running, or to
anything but emote, is touched."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from emote_cli.app import app
from emote_core.errors import FormatError
from emote_core.stores.zarr_store import MemoryStore, ShardWriter, create_store, store_columns
from emote_core.stores.zarr_store.groups import STALE_SECONDS

NAME = "0123456789abcdef0123456789abcdef"


def temporary(path: Path, content: bytes = b"", *, stale: bool = True) -> Path:
    """A temporary file as zarr's atomic write leaves it when killed (written ``stale``
    enough ago that no write can still be running)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    if stale:
        past = time.time() - 10 * STALE_SECONDS
        os.utime(path, (past, past))
    return path


def new_store(kit, url: Path) -> None:
    create_store(url, columns=store_columns(kit.schemas, kit.make(1), "rewards"),
                 length_key="rewards")  # fmt: skip


def test_a_store_is_created_over_what_a_creation_cut_off_left(kit, tmp_path) -> None:
    url = tmp_path / "s.zarr"
    temporary(url / f"zarr.{NAME}.partial")  # killed before a byte was written
    new_store(kit, url)
    assert sorted(p.name for p in url.iterdir()) == ["shards", "zarr.json"]

    written = json.dumps({"attributes": {"format": "emote-memory"}})[:40].encode()
    again = tmp_path / "t.zarr"
    temporary(again / f"zarr.{NAME}.partial", written)  # killed mid-write: emote's
    new_store(kit, again)
    assert MemoryStore(again).episode_count == 0


@pytest.mark.parametrize(
    ("content", "stale", "other"),
    [(b"", False, None), (b'{"attributes": {"format": "another tool"', True, None),
     (b"", True, "data.bin")],
    ids=["being written", "not emote's", "beside other files"],
)  # fmt: skip
def test_what_may_not_be_a_creation_cut_off_is_left_alone(
    kit, tmp_path, content, stale, other
) -> None:
    url = tmp_path / "s.zarr"
    left = temporary(url / f"zarr.{NAME}.partial", content, stale=stale)
    if other:
        (url / other).write_bytes(b"someone's")
    with pytest.raises(FormatError, match="already holds data"):
        new_store(kit, url)
    assert left.read_bytes() == content


def test_verify_names_leftovers_and_the_next_writer_removes_its_own(kit, tmp_path, runner) -> None:
    url = tmp_path / "s.zarr"
    new_store(kit, url)
    for shard in ("main", "other"):
        with ShardWriter(url, shard=shard) as writer:
            writer.append([kit.make(k) for k in range(3)])
    root = temporary(url / f"zarr.{NAME}.partial", (url / "zarr.json").read_bytes())
    chunk = temporary(url / "shards" / "main" / "columns" / "obs" / "c" / "0" / f"0.{NAME}.partial")
    fresh = temporary(url / "shards" / "main" / f"zarr.{NAME}.partial", stale=False)
    others = temporary(url / "shards" / "other" / f"zarr.{NAME}.partial")

    verified = runner.invoke(app, ["memory", "verify", str(url), "--json"])
    assert verified.exit_code == 0, verified.output
    notes = json.loads(verified.stdout)["notes"]
    for path in (root, chunk, others):
        assert any(note.startswith(str(path.relative_to(url))) for note in notes), notes
    assert root.exists() and chunk.exists()  # verify changes nothing

    with ShardWriter(url, shard="main") as writer:  # holds main's lease: all of main's go
        writer.append([kit.make(3)])
    assert not root.exists() and not chunk.exists() and not fresh.exists()
    assert others.exists()  # another shard's: its own writer's to remove
    assert [r[0] for r in MemoryStore(url).episodes()] == [0, 1, 2, 3, 4, 5, 6]
