"""`emote memory convert` never loses a user's data: not its own source, a store a killed
conversion set aside, nor (even with --force) a place the source lies in or under. What --force
replaces for each target format is a case of test_conformance.py."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

from emote_cli.app import app
from emote_core.stores.stored import ColumnSchema
from emote_core.stores.zarr_store import MemoryStore, ShardWriter, create_store, store_columns
from emote_core.stores.zarr_store.verify import verify_store
from emote_core.typing import EpisodeState

SCHEMAS = [
    ColumnSchema("obs", "Column", (2,), np.dtype(np.float32)),
    ColumnSchema("actions", "Column", (1,), np.dtype(np.float32)),
    ColumnSchema("rewards", "Column", (1,), np.dtype(np.float32)),
]


def episode(identity: int) -> tuple:
    steps = np.arange(5, dtype=np.float32)
    data = {"obs": np.stack([steps, steps + identity], 1), "actions": steps[:4, None],
            "rewards": steps[:4, None]}  # fmt: skip
    return identity, data, EpisodeState.TERMINAL


def make_store(path: Path, count: int = 6) -> str:
    create_store(path, columns=store_columns(SCHEMAS, episode(0), "rewards"), length_key="rewards")
    with ShardWriter(path) as writer:
        writer.append([episode(k) for k in range(count)])
    return str(path)


def digest(path: Path) -> str:
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    sha = hashlib.sha256()
    for file in files:
        if "leases" not in file.parts:
            sha.update(str(file.relative_to(path) if path.is_dir() else file.name).encode())
            sha.update(file.read_bytes())
    return sha.hexdigest()


def convert(runner, *args: str):
    return runner.invoke(app, ["memory", "convert", *args])


@pytest.mark.parametrize("force", [False, True])
def test_a_destination_inside_the_source_is_refused(runner, tmp_path, force) -> None:
    source = make_store(tmp_path / "s.zarr")
    before = digest(Path(source))
    flags = ["--force"] if force else []
    for inside in (f"{source}/copy.zarr", f"{source}/shards/main/copy.zarr"):
        result = convert(runner, source, inside, *flags)
        assert result.exit_code == 1, result.output
        assert "is inside the source" in result.stderr
    assert digest(Path(source)) == before and verify_store(source).ok


def test_a_destination_holding_the_source_is_refused_even_with_force(runner, tmp_path) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    source = make_store(folder / "s.zarr")
    result = convert(runner, source, str(folder), "--force")
    assert result.exit_code == 1 and "holds the source" in result.stderr
    assert MemoryStore(source).episode_count == 6


def bomb(path: Path, declared_mib: int = 256) -> Path:
    """A valid upstream V1 memory zip whose 'obs.npy' inflates from ~0.3 MB to ``declared_mib``."""
    import zipfile

    from emote_core.integrations.convert import convert as convert_memory

    honest = path.with_name("honest.zip")
    convert_memory(make_store(path.with_name("b.zarr")), honest, target_format="emote-v1")
    with zipfile.ZipFile(honest) as source, zipfile.ZipFile(path, "w") as archive:
        for name in source.namelist():
            if name != "obs.npy":
                archive.writestr(name, source.read(name))
        info = zipfile.ZipInfo("obs.npy")
        info.compress_type = zipfile.ZIP_DEFLATED
        with archive.open(info, "w", force_zip64=True) as member:
            block = bytes(1 << 20)
            for _ in range(declared_mib):
                member.write(block)
    return path


def test_a_decompression_bomb_is_refused_before_it_is_inflated(runner, tmp_path) -> None:
    import tracemalloc
    import zipfile

    path = bomb(tmp_path / "bomb.zip")
    info = zipfile.ZipFile(path).getinfo("obs.npy")
    assert info.file_size == 256 << 20 and info.compress_size < 1 << 20  # a real bomb
    from emote_core.errors import FormatError
    from emote_core.stores.stored import read_member

    tracemalloc.start()
    try:
        with zipfile.ZipFile(path) as archive, pytest.raises(FormatError) as refused:
            read_member(archive, "obs.npy", source=str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"{peak:,} bytes allocated to refuse it"
    assert "declares 268,435,456 bytes" in str(refused.value)
    for command in (["memory", "inspect", str(path)], ["memory", "convert", str(path), "o.zarr"]):
        result = runner.invoke(app, command)
        assert result.exit_code == 1 and "decompression bomb" in result.stderr, result.output
        assert len(result.stderr.strip().splitlines()) == 1


def test_leftovers_of_killed_conversions_are_tidied_by_the_next_one(runner, tmp_path) -> None:
    import subprocess
    import sys

    source = make_store(tmp_path / "s.zarr")
    assert convert(runner, source, str(tmp_path / "kept.npz"), "--to", "npz").exit_code == 0
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()  # fmt: skip
    alive = str(os.getpid())
    (tmp_path / f".emote-tmp-{dead}-abc").mkdir()  # an unfinished store
    (tmp_path / f".emote-tmp-{dead}-abc" / "zarr.json").write_text("{}")
    (tmp_path / f".emote-tmp-{alive}-def-x.npz").write_text("another conversion, running")
    # Killed after setting the old destination aside, before the new one arrived:
    os.rename(tmp_path / "kept.npz", tmp_path / f".emote-old-{dead}-kept.npz")
    (tmp_path / "notes.txt").write_text("mine")

    assert convert(runner, source, str(tmp_path / "new.npz"), "--to", "npz").exit_code == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted([f".emote-tmp-{alive}-def-x.npz", "kept.npz", "new.npz", "notes.txt",
                            "s.zarr"])  # fmt: skip
    assert np.load(tmp_path / "kept.npz").files  # the set-aside file is whole again
