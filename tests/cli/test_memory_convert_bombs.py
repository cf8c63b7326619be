"""Small hostile files that declare gigabytes: `emote memory inspect` and `convert` refuse each
in one line naming the member and its declared size, before allocating it.

The commands run in one child process whose address space is capped 2 GiB above what its
imports take: a reader that allocated what a file declares would fail there with a
different message (or be killed), not with the budget's line.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from emote_core.integrations.upstream.v1 import write_v1_stored
from emote_core.stores.stored import ColumnSchema, StoredTable
from emote_core.typing import EpisodeState

ROOT = Path(__file__).parents[2]
PENDULUM = ROOT / "tests" / "integrations" / "minari" / "data" / "pendulum" / "random-v0"
HEADROOM = 2 << 30  # under the 3 GiB and more each file declares

DRIVER = f"""
import json, resource, sys
import h5py, minari, torch, zarr
from typer.testing import CliRunner
from emote_cli.app import app
import emote_core.integrations.convert, emote_core.integrations.inspect
import emote_core.integrations.detect, emote_core.integrations.minari.datasets
import emote_core.integrations.upstream

def vm_bytes():
    with open("/proc/self/status") as status:
        line = next(l for l in status if l.startswith("VmSize:"))
    return int(line.split()[1]) * 1024

limit = vm_bytes() + {HEADROOM}
resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
runner = CliRunner(env={{"COLUMNS": "200"}})
results = []
for command in json.loads(sys.argv[1]):
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = runner.invoke(app, command)
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) * 1024
    results.append(dict(exit_code=result.exit_code, stderr=result.stderr, grown=grown))
print(json.dumps(results))
"""


class _Allocates:
    """Pickles as ``func(*args)``: how a hostile pickle asks an allowlisted global to allocate."""

    def __init__(self, func, *args) -> None:
        self.call = (func, args)

    def __reduce__(self):
        return self.call


def _tmrl_lists(observations: list, entries: int) -> list[list]:
    return [[0.0] * entries, observations, [0.0] * entries, [False] * entries,
            [False] * entries, [{}] * entries, [False] * entries]  # fmt: skip


def tmrl_bytearray(folder: Path) -> tuple[Path, str, str]:
    path = folder / "bytearray" / "data.pkl"
    path.parent.mkdir()
    lists = _tmrl_lists([_Allocates(bytearray, 3 << 30), [0.0]], 2)
    path.write_bytes(pickle.dumps(lists, protocol=4))
    return path, "a pickled bytearray", "3,221,225,472 bytes"


def tmrl_shared_list(folder: Path) -> tuple[Path, str, str]:
    path = folder / "shared" / "data.pkl"
    path.parent.mkdir()
    row = [0.5] * 1000
    image = [row] * 1000  # one list referenced 1000 times, pickled once
    path.write_bytes(pickle.dumps(_tmrl_lists([image] * 830, 830), protocol=4))
    return path, "the observations list", "6,640,000,000 bytes"


def skrl_stride_zero(folder: Path) -> tuple[Path, str, str]:
    import torch

    path = folder / "memory.pt"
    one = torch.zeros(1)
    names = ("states", "next_states", "actions", "rewards", "terminated")
    torch.save({name: one.expand(100_000, 1, 8000) for name in names}, path)
    return path, "tensor 'states'", "3,200,000,000 bytes"


def _v1(path: Path, extra: dict[str, np.ndarray]) -> Path:
    """A genuine V1 zip of one episode with ``extra`` per-step columns, its members not zip64."""
    steps = np.arange(3, dtype=np.float32)[:, None]
    data = {"obs": np.arange(4, dtype=np.float32)[:, None], "actions": steps, **extra}
    columns = [ColumnSchema(n, "Column", v.shape[1:], v.dtype) for n, v in data.items()]
    stored = StoredTable("test", "emote-v1", columns, [(0, data, EpisodeState.TERMINAL)], "actions")
    written = path.with_suffix(".tmp.zip")
    write_v1_stored(stored, written)
    with zipfile.ZipFile(written) as old, zipfile.ZipFile(path, "w") as new:
        for name in old.namelist():
            new.writestr(name, old.read(name))
    written.unlink()
    return path


def declare_sizes(path: Path, sizes: dict[str, int]) -> None:
    """Rewrites the central directory's uncompressed sizes of some members (what zip readers
    trust before reading), leaving the data as it is."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        offset = archive.start_dir
    while data[offset : offset + 4] == b"PK\x01\x02":
        name_length, extra_length, comment_length = struct.unpack_from("<HHH", data, offset + 28)
        name = data[offset + 46 : offset + 46 + name_length].decode()
        if name in sizes:
            struct.pack_into("<I", data, offset + 24, sizes[name])
        offset += 46 + name_length + extra_length + comment_length
    path.write_bytes(bytes(data))


def v1_many_columns(folder: Path) -> tuple[Path, str, str]:
    extra = {f"extra_{k:02d}": np.zeros((3, 1), np.float32) for k in range(40)}
    path = _v1(folder / "columns.zip", extra)
    declare_sizes(path, {f"{name}.npy": 64 << 20 for name in extra})  # each at the member rule
    return path, "member 'extra_", "67,108,864 bytes"


def v1_compressible(folder: Path) -> tuple[Path, str, str]:
    path = _v1(folder / "compressible.zip", {"big": np.zeros((3, 1), np.float32)})
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    noise = np.random.default_rng(0).bytes(8 << 20)  # 8 MiB on disk after the 3 rows
    members["big.npy"] += noise
    with zipfile.ZipFile(path, "w") as archive:
        for name, content in members.items():
            archive.writestr(name, content)
    declare_sizes(path, {"big.npy": 1 << 30})  # 128x its stored size: under the member rule
    return path, "member 'big.npy'", "1,073,741,824 bytes"


def minari_unallocated(folder: Path) -> tuple[Path, str, str]:
    import h5py

    path = folder / "minari" / "random-v0"
    shutil.copytree(PENDULUM, path)
    with h5py.File(path / "data" / "main_data.hdf5", "r+") as handle:
        del handle["episode_2/observations"]
        handle.create_dataset("episode_2/observations", shape=(1 << 29, 3), dtype=np.float32)
    return path, "HDF5 dataset 'episode_2/observations'", "6,442,450,944 bytes"


HOSTILE = {
    "tmrl-bytearray": tmrl_bytearray,
    "tmrl-shared-list": tmrl_shared_list,
    "skrl-stride-zero": skrl_stride_zero,
    "v1-many-columns": v1_many_columns,
    "v1-compressible": v1_compressible,
    "minari-unallocated": minari_unallocated,
}


@pytest.fixture(scope="module")
def refusals(tmp_path_factory) -> dict[tuple[str, str], tuple[dict, Path, str, str]]:
    """Each hostile file inspected and converted in the capped child: its result, the folder
    the targets go to, the member and the size the refusal must name."""
    folder = tmp_path_factory.mktemp("bombs")
    commands, keys, files = [], [], {}
    for case, make in HOSTILE.items():
        path, member, size = make(folder)
        files[case] = (path, member, size)
        assert sum(f.stat().st_size for f in [path, *path.rglob("*")] if f.is_file()) < 9 << 20
        for verb in ("inspect", "convert"):
            extra = [str(folder / f"{case}.zarr")] if verb == "convert" else []
            commands.append(["memory", verb, str(path), *extra])
            keys.append((case, verb))
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(commands)],
        capture_output=True, text=True, timeout=600, cwd=folder,
        env={**os.environ, "MALLOC_ARENA_MAX": "2"},  # threads' arenas reserve address space
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        key: (result, folder, *files[key[0]][1:]) for key, result in zip(keys, results, strict=True)
    }


@pytest.mark.parametrize("verb", ["inspect", "convert"])
@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_file_declaring_gigabytes_is_refused_before_allocating(refusals, case, verb) -> None:
    result, folder, member, size = refusals[case, verb]
    lines = result["stderr"].strip().splitlines()
    assert result["exit_code"] == 1, result
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert member in lines[0] and f"declares {size}" in lines[0], lines[0]
    assert "may make emote allocate" in lines[0], lines[0]
    assert result["grown"] < 256 << 20, f"peak memory grew by {result['grown']:,} bytes"
    if verb == "convert":
        assert not (folder / f"{case}.zarr").exists()
