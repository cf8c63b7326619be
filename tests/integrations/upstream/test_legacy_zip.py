"""Upstream emote-rl 23's Legacy zips: real files restore, hostile ones never run."""

from __future__ import annotations

import io
import os
import pickle
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from emote_core.errors import FormatError, UnsafePickleError
from emote_core.integrations.upstream import read_table_file, restore_table
from emote_core.stores.safe_pickle import safe_loads
from emote_core.typing import EpisodeState

DATA = Path(__file__).parent / "data"
LEGACY_ZIPS = sorted(DATA.glob("emote-rl-23-legacy-*.zip"))
# What data/make_legacy_zip.py added, after upstream ejected episode 11 (maxlen 20).
SURVIVORS = [(0, 3), (1, 5), (-3, 2), (7, 4)]


def _expected(identity: int, length: int) -> dict[str, np.ndarray]:
    base = 100.0 * (identity % 1000)
    steps = np.arange(length, dtype=np.float32)
    return {
        "actions": np.stack([base + steps, -(base + steps)], axis=1),
        "rewards": (base + steps + 0.5)[:, None],
        "obs": base + np.arange((length + 1) * 3, dtype=np.float32).reshape(length + 1, 3),
        "terminal": np.float32(identity % 2),
    }


def test_the_legacy_test_files_are_real_upstream_exports():
    assert len(LEGACY_ZIPS) == 2
    for path in LEGACY_ZIPS:
        with zipfile.ZipFile(path) as archive:
            assert b"emote.memory.storage" in archive.read("obs.npy")
            assert b"FifoEjectionStrategy" in archive.read("data.pickle")


@pytest.mark.parametrize("path", LEGACY_ZIPS, ids=lambda p: p.stem)
def test_a_legacy_zip_restores_its_episodes_with_their_values(path, legacy_table):
    table = legacy_table()
    restore_table(table, path)

    episodes = list(table.episodes())
    assert [(identity, len(data["actions"])) for identity, data, _ in episodes] == SURVIVORS
    for identity, data, end_state in episodes:
        expected = _expected(identity, len(data["actions"]))
        for name, values in expected.items():
            np.testing.assert_array_equal(data[name], values, err_msg=f"{name} of {identity}")
        assert end_state == EpisodeState.TERMINAL
    batch = table.sample_by_index([1], [4], 1)  # the last transition of episode 1
    np.testing.assert_array_equal(batch["next_obs"].numpy(), _expected(1, 5)["obs"][5:6])
    assert batch["dones"].tolist() == [[True]] and batch["masks"].tolist() == [[0.0]]
    assert "emote" not in sys.modules  # nothing of upstream was imported


@pytest.mark.parametrize("path", LEGACY_ZIPS, ids=lambda p: p.stem)
def test_read_table_file_describes_a_legacy_zip(path):
    stored = read_table_file(path)
    assert stored.format == "emote-legacy" and stored.length_key == "actions"
    kinds = {c.name: (c.kind, c.mapper) for c in stored.columns}
    assert kinds["masks"] == ("VirtualColumn", {"type": "SyntheticMasks"})
    assert kinds["next_obs"] == ("VirtualColumn", {"type": "NextElementMapper", "n": 1})
    assert kinds["terminal"] == ("TagColumn", None)
    assert (stored.maxlen, stored.ejector_type) == (20, "FifoEjectionStrategy")


def test_a_legacy_schema_mismatch_leaves_the_table_unchanged(legacy_table, table_snapshot):
    table = legacy_table(obs_shape=(4,))
    episode = {
        "actions": np.zeros((2, 2)),
        "rewards": np.zeros((2, 1)),
        "obs": np.zeros((3, 4)),
        "terminal": 1.0,
    }
    table.add_sequence(5, episode)
    before = table_snapshot(table)
    with pytest.raises(FormatError, match=r"column 'obs' differs.*\(3,\).*\(4,\)"):
        restore_table(table, LEGACY_ZIPS[0])
    assert table_snapshot(table) == before


class _RunShell:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class _Eval:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (eval, (f"open({str(self.marker)!r}, 'w').close()",))


class _Popen:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (subprocess.Popen, (["touch", str(self.marker)],))


def _raw_call(module: str, name: str, argument: str) -> bytes:
    # A protocol-0 pickle calling module.name(argument): GLOBAL, MARK, STRING, TUPLE, REDUCE.
    return f"c{module}\n{name}\n(S'{argument}'\ntR.".encode()


def _in_parts(payload: object) -> bytes:
    # The payload hides where upstream's ejector would be, in a genuine-looking data.pickle.
    return pickle.dumps({"ejector": payload, "length_key": "actions", "columns": {}, "lengths": {}})


PAYLOADS = {
    "posix.system": lambda m: _in_parts(_RunShell(m)),
    "os.system": lambda m: _raw_call("os", "system", f"touch {m}"),
    "builtins.eval": lambda m: _in_parts(_Eval(m)),
    "subprocess.Popen": lambda m: _in_parts(_Popen(m)),
    "evil_payloads.run": lambda m: _raw_call("evil_payloads", "run", str(m)),
}


def _legacy_zip_with(path: Path, **members: bytes) -> Path:
    with zipfile.ZipFile(LEGACY_ZIPS[0]) as old, zipfile.ZipFile(path, "w") as new:
        for name in old.namelist():
            new.writestr(name, members.get(name.replace(".", "_"), old.read(name)))
    return path


@pytest.fixture
def held(legacy_table):
    table = legacy_table()
    episode = {
        "actions": np.zeros((1, 2)),
        "rewards": np.zeros((1, 1)),
        "obs": np.zeros((2, 3)),
        "terminal": 0.0,
    }
    table.add_sequence(1, episode)
    return table


@pytest.mark.parametrize("global_name", [name for name in PAYLOADS if "evil" not in name])
def test_the_hostile_payloads_are_live_when_the_user_trusts_the_file(global_name, tmp_path):
    # Control for the refusals below: the same bytes do run under plain pickle.
    marker = tmp_path / "payload-ran"
    loaded = safe_loads(PAYLOADS[global_name](marker), trust=True)
    if isinstance(loaded, dict) and isinstance(loaded["ejector"], subprocess.Popen):
        loaded["ejector"].wait()
    assert marker.exists()


@pytest.mark.parametrize("global_name", PAYLOADS)
def test_a_hostile_data_pickle_is_refused_before_it_runs(
    global_name, held, table_snapshot, tmp_path
):
    marker = tmp_path / "payload-ran"
    path = _legacy_zip_with(tmp_path / "hostile.zip", data_pickle=PAYLOADS[global_name](marker))
    before = table_snapshot(held)
    with pytest.raises(UnsafePickleError, match=re.escape(f"'{global_name}'")):
        restore_table(held, path)
    assert not marker.exists()
    assert table_snapshot(held) == before
    assert "evil_payloads" not in sys.modules


def test_a_hostile_column_pickle_is_refused_before_it_runs(held, table_snapshot, tmp_path):
    marker = tmp_path / "payload-ran"
    buffer = io.BytesIO()
    np.save(buffer, np.array(_RunShell(marker), dtype=object), allow_pickle=True)
    path = _legacy_zip_with(tmp_path / "hostile.zip", obs_npy=buffer.getvalue())
    before = table_snapshot(held)
    with pytest.raises(UnsafePickleError, match=r"'posix.system'|'os.system'"):
        restore_table(held, path)
    assert not marker.exists()
    assert table_snapshot(held) == before


def test_a_truncated_data_pickle_is_a_format_error(held, table_snapshot, tmp_path):
    original = zipfile.ZipFile(LEGACY_ZIPS[0]).read("data.pickle")
    path = _legacy_zip_with(tmp_path / "cut.zip", data_pickle=original[: len(original) // 2])
    before = table_snapshot(held)
    with pytest.raises(FormatError, match=r"not a readable pickle"):
        restore_table(held, path)
    assert table_snapshot(held) == before
