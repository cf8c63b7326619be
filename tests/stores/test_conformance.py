"""One conformance suite over every format ``emote memory convert`` reads or writes.

Each source format and each target format is a parametrisation of the same cases, run through
the command line: a source converts to a verified store; a store round-trips through every
target; a truncated or empty input, and a pickle that would run code, are refused in one line
that leaves nothing behind; odd names pass through; a destination is replaced only with
``--force``, and then only when it holds what that target writes. Decompression and allocation
bombs are the suite's declared-size case in ``tests/cli/test_memory_convert_bombs.py``.
"""

from __future__ import annotations

import builtins
import hashlib
import io
import json
import os
import pickle
import shutil
import subprocess
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner, Result

from emote_cli._common import ExitCode
from emote_cli._text import printable
from emote_cli.app import app
from emote_core.stores.stored import ColumnSchema
from emote_core.stores.zarr_store import MemoryStore, ShardWriter, create_store, store_columns
from emote_core.typing import EpisodeState

TESTS = Path(__file__).parents[1]


@cache
def shipped(*parts: str) -> Path:
    """A file or folder of the shipped test data, found by its last path parts wherever the
    tests of its format keep it."""
    found = sorted(p for p in TESTS.rglob(parts[-1]) if p.parts[-len(parts) :] == parts)
    assert found, f"test data {'/'.join(parts)} is missing under {TESTS}"
    return found[0]


# A small store: every kind of episode end, and values whose every bit a round trip must keep.

SCHEMAS = [
    ColumnSchema("obs", "Column", (3,), np.dtype(np.float32)),
    ColumnSchema("actions", "Column", (2,), np.dtype(np.float32)),
    ColumnSchema("rewards", "Column", (1,), np.dtype(np.float32)),
]
EPISODES = ((3, 4, EpisodeState.TERMINAL), (7, 1, EpisodeState.INTERRUPTED),
            (11, 5, EpisodeState.TERMINAL), (12, 2, EpisodeState.INTERRUPTED))  # fmt: skip


def episode(identity: int, length: int, end: EpisodeState) -> tuple:
    rng = np.random.default_rng(identity)
    data = {
        "obs": rng.standard_normal((length + 1, 3)).astype(np.float32) / 3,
        "actions": rng.uniform(-1, 1, (length, 2)).astype(np.float32),
        "rewards": rng.standard_normal((length, 1)).astype(np.float32) * 1e-3,
    }
    return identity, data, end


def make_store(path: Path, episodes: tuple = EPISODES) -> Path:
    example = episode(0, 1, EpisodeState.TERMINAL)
    create_store(path, columns=store_columns(SCHEMAS, example, "rewards"), length_key="rewards")
    if episodes:
        with ShardWriter(path) as writer:
            writer.append([episode(*e) for e in episodes])
    return path


def episodes_in(store: Path) -> list[tuple[int, dict[str, np.ndarray], EpisodeState]]:
    return [
        (int(i), data, EpisodeState(end)) for i, data, end in MemoryStore(store).read().episodes
    ]


def assert_same_episodes(expected: list, got: list, *, keeps_ids: bool = True) -> None:
    """Same ends and every column bit for bit (dtype, shape, values) in the same order."""
    assert [e for _, _, e in got] == [e for _, _, e in expected]
    ids = [i for i, _, _ in expected] if keeps_ids else list(range(len(expected)))
    assert [i for i, _, _ in got] == ids
    for (_, want, _), (_, have, _) in zip(expected, got, strict=True):
        assert sorted(have) == sorted(want)
        for column, values in want.items():
            assert have[column].dtype == values.dtype and have[column].shape == values.shape
            assert have[column].tobytes() == values.tobytes(), column


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def digest(path: Path) -> str:
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    sha = hashlib.sha256()
    for file in files:
        sha.update(str(file.relative_to(path) if path.is_dir() else file.name).encode())
        sha.update(file.read_bytes())
    return sha.hexdigest()


def memory(runner: CliRunner, command: str, *args: str | Path) -> Result:
    return runner.invoke(app, ["memory", command, *map(str, args)])


def one_error_line(result: Result) -> str:
    """The one line a refused command prints: exit 1, no traceback, nothing on stdout."""
    assert result.exit_code == ExitCode.ERROR, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


@pytest.fixture
def minari_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private Minari root for the dataset targets and sources."""
    pytest.importorskip("minari", reason="Minari comes with the dev and minari extras")
    pytest.importorskip("h5py", reason="h5py (Minari's HDF5 backend) comes with the dev extra")
    root = tmp_path / "datasets"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    return root


# Sources: one real file (or folder) of each format emote reads.


@dataclass(frozen=True)
class Source:
    """A source format and a sample of it: ``make(folder)`` puts one in ``folder``."""

    name: str
    make: Callable[[Path], Path]
    damage: str
    """What the refusal of the sample cut in half says, detected or named with ``--from``."""
    damaged_part: str = ""
    """The part of the sample that the damage case cuts (a folder's file), '' for the file."""


def _copy(*parts: str) -> Callable[[Path], Path]:
    def make(folder: Path) -> Path:
        source = shipped(*parts)
        copy = shutil.copytree if source.is_dir() else shutil.copy
        return Path(copy(source, folder / parts[-1]))

    return make


def legacy_dump(folder: Path) -> Path:
    """A legacy emote ``.pickle`` dump: 7 steps of one env, episodes ending at steps 2 and 4."""
    steps = np.arange(7, dtype=np.float64)
    state = {
        "obs": np.repeat(steps, 3).reshape(7, 1, 1, 3),
        "next_obs": np.repeat(steps + 0.5, 3).reshape(7, 1, 1, 3),
        "actions": np.zeros((7, 1, 2)),
        "rewards": np.ones((7, 1, 1)),
        "dones": np.isin(np.arange(7), (2, 4)).reshape(7, 1, 1),
    }
    path = folder / "dump.pickle"
    path.write_bytes(pickle.dumps(state))
    return path


SOURCES = {
    "zarr": Source("zarr", lambda folder: make_store(folder / "memory.zarr"),
                   "damaged episodes", "shards/main/columns/actions/c/0/0"),
    "emote-v1": Source("emote-v1", _copy("emote-export-v1.zip"), "truncated or damaged"),
    "emote-legacy": Source("emote-legacy", _copy("emote-rl-23-legacy-numpy1.26.zip"),
                           "truncated or damaged"),
    "sb3-replay-buffer": Source("sb3-replay-buffer", _copy("sb3_dqn_cartpole_nstep.pkl"),
                                "not a readable pickle"),
    "skrl-memory.pt": Source("skrl-memory", _copy("skrl2_sac_pendulum.pt"), "not a readable"),
    "skrl-memory.npz": Source("skrl-memory", _copy("skrl2_sac_pendulum.npz"), "not a readable"),
    "skrl-memory.csv": Source("skrl-memory", _copy("skrl2_sac_pendulum.csv"),
                              "truncated or damaged"),
    "tmrl-dataset": Source("tmrl-dataset", _copy("tmrl_pendulum.data.pkl"),
                           "not a readable pickle"),
    "legacy-pickle": Source("legacy-pickle", legacy_dump, "not a readable pickle"),
    "minari": Source("minari", _copy("cartpole", "random-v0"), "cannot be read",
                     "data/main_data.hdf5"),
}  # fmt: skip


def make_source(case: str, folder: Path, request: pytest.FixtureRequest) -> tuple[Source, Path]:
    source = SOURCES[case]
    if source.name == "minari":
        request.getfixturevalue("minari_root")
    return source, source.make(folder)


@pytest.mark.parametrize("case", list(SOURCES))
def test_every_source_converts_to_a_verified_store_with_what_inspect_reports(
    runner, tmp_path, request, case
) -> None:
    source, path = make_source(case, tmp_path, request)
    inspected = memory(runner, "inspect", path, "--json")
    assert inspected.exit_code == ExitCode.OK, inspected.stderr
    report = json.loads(inspected.stdout)
    assert report["format"] == ("emote-memory" if source.name == "zarr" else source.name)

    for flags, destination in (([], "detected.zarr"), (["--from", source.name], "named.zarr")):
        result = memory(runner, "convert", path, tmp_path / destination, "--json", *flags)
        assert result.exit_code == ExitCode.OK, result.stderr
        summary = json.loads(result.stdout)
        assert summary["source_format"] == source.name
        assert (summary["episodes"], summary["transitions"]) == (
            report["episodes"], report["transitions"]
        )  # fmt: skip
        assert summary["episodes"] > 0
        verified = memory(runner, "verify", tmp_path / destination, "--json")
        assert verified.exit_code == ExitCode.OK and json.loads(verified.stdout)["ok"] is True
        assert MemoryStore(tmp_path / destination).episode_count == summary["episodes"]
    assert_same_episodes(
        episodes_in(tmp_path / "detected.zarr"), episodes_in(tmp_path / "named.zarr")
    )


# Targets: each format emote writes, and what it cannot keep.


@dataclass(frozen=True)
class Target:
    """A target format, the destination a test writes, and whether episode ids survive."""

    name: str
    destination: str
    keeps_ids: bool = True
    """skrl's files hold one stream of transitions without episode ids: they come back 0, 1, ..."""


TARGETS = {
    "zarr": Target("zarr", "out.zarr"),
    "emote-v1": Target("emote-v1", "out.zip"),
    "npz": Target("npz", "out.npz", keeps_ids=False),
    "pt": Target("pt", "out.pt", keeps_ids=False),
    "csv": Target("csv", "out.csv", keeps_ids=False),
    "minari": Target("minari", "emote/out-v0"),
}
FILE_TARGETS = [name for name in TARGETS if name not in ("zarr", "minari")]


def destination_of(target: Target, folder: Path, request: pytest.FixtureRequest) -> str:
    if target.name == "minari":
        request.getfixturevalue("minari_root")
        return target.destination
    return str(folder / target.destination)


@pytest.mark.parametrize("stored", [EPISODES, ()], ids=["episodes", "no-episodes"])
@pytest.mark.parametrize("name", list(TARGETS))
def test_a_store_round_trips_through_every_target(runner, tmp_path, request, name, stored):
    target = TARGETS[name]
    store = make_store(tmp_path / "a.zarr", stored)
    destination = destination_of(target, tmp_path, request)
    result = memory(runner, "convert", store, destination, "--to", name, "--json")
    assert result.exit_code == ExitCode.OK, result.stderr
    summary = json.loads(result.stdout)
    assert (summary["target_format"], summary["episodes"]) == (name, len(stored))
    assert summary["transitions"] == sum(length for _, length, _ in stored)
    inspected = memory(runner, "inspect", destination, "--json")
    assert inspected.exit_code == ExitCode.OK, inspected.stderr
    assert json.loads(inspected.stdout)["episodes"] == len(stored)

    back = memory(runner, "convert", destination, tmp_path / "back.zarr", "-q")
    assert back.exit_code == ExitCode.OK, back.stderr
    expected = episodes_in(store)
    assert_same_episodes(expected, episodes_in(tmp_path / "back.zarr"), keeps_ids=target.keeps_ids)
    written = [] if name == "minari" else [target.destination]
    extra = ["datasets"] if name == "minari" else []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["a.zarr", "back.zarr", *written, *extra]
    )  # no temporary files


# Damage, emptiness and hostile content: one line, exit 1, nothing left behind.


def refused_everywhere(
    runner: CliRunner, source: Path, folder: Path, *flags: str, inspect: bool = True
) -> str:
    """Converts ``source`` to a store and to a V1 zip (``--json``) and inspects it: each is
    refused with the same one line and the one JSON error document; returns the line."""
    before = listing(folder)
    commands = [
        ["convert", source, folder / name, "--to", target]
        for target, name in (("zarr", "out.zarr"), ("emote-v1", "out.zip"))
    ]
    lines = set()
    for command in [*commands, *([["inspect", source]] if inspect else [])]:
        result = memory(runner, *command, "--json", *flags)
        line = one_error_line(result)
        document = json.loads(result.stdout)  # --json: `| jq` never reads silence
        assert document == {"error": document["error"], "exit_code": ExitCode.ERROR}
        assert printable(document["error"]) == line.removeprefix("error: ")
        lines.add(line)
    assert len(lines) == 1, lines
    assert listing(folder) == before  # no destination, no temporary files
    return lines.pop()


@pytest.mark.parametrize("named", [False, True], ids=["detected", "from"])
@pytest.mark.parametrize("case", list(SOURCES))
def test_a_truncated_source_is_one_line_naming_it(runner, tmp_path, request, case, named):
    source, path = make_source(case, tmp_path, request)
    cut = path / source.damaged_part if source.damaged_part else path
    content = cut.read_bytes()
    cut.write_bytes(content[: len(content) // 2])
    flags = ["--from", source.name] if named else []
    # A store's inspect reads its metadata, not its chunks: verify is what names the damage.
    line = refused_everywhere(runner, path, tmp_path, *flags, inspect=source.name != "zarr")
    assert str(path) in line and source.damage in line
    if source.name == "zarr":
        assert source.damaged_part in line and "--skip-damaged" in line
        verified = one_error_line(memory(runner, "verify", path))
        assert source.damaged_part in verified and "is damaged" in verified


EMPTY_DIRECTORY = {  # what an empty folder given as a format that is a folder is told
    "zarr": "no emote memory store at",
    "minari": "is not a Minari dataset: it has no data/metadata.json",
    "tmrl-dataset": "is a directory without data.pkl",
}


@pytest.mark.parametrize("case", list(SOURCES))
def test_an_empty_source_is_one_line_naming_it(runner, tmp_path, request, case):
    source = SOURCES[case]
    if source.name == "minari":
        request.getfixturevalue("minari_root")
    (tmp_path / "sample").mkdir()
    suffix = "".join(source.make(tmp_path / "sample").suffixes)
    folder = tmp_path / "case"
    folder.mkdir()
    empty = folder / f"empty{suffix}"
    if source.name in ("zarr", "minari"):
        empty.mkdir()
        detected = "is a directory but not an emote memory store"
    else:
        empty.touch()
        detected = "is empty; it holds no memory"
    assert detected in refused_everywhere(runner, empty, folder)
    line = refused_everywhere(runner, empty, folder, "--from", source.name)
    assert str(empty) in line


@pytest.mark.parametrize("name", ["zarr", "minari", "tmrl-dataset"])
def test_an_empty_folder_named_as_a_folder_format_is_one_line(runner, tmp_path, request, name):
    if name == "minari":
        request.getfixturevalue("minari_root")
    empty = tmp_path / "folder"
    empty.mkdir()
    line = refused_everywhere(runner, empty, tmp_path, "--from", name)
    assert str(empty) in line and EMPTY_DIRECTORY[name] in line


class Payload:
    """Pickles as a call of ``function(*args)``: what a malicious file does."""

    def __init__(self, function: Callable, *args: object) -> None:
        self.call = (function, args)

    def __reduce__(self) -> tuple:
        return self.call


PAYLOADS = {  # the payload, and the global the refusal names
    "os.system": (lambda marker: Payload(os.system, f"touch {marker}"), "system"),
    "builtins.eval": (
        lambda marker: Payload(builtins.eval, f"open({str(marker)!r}, 'w').close()"),
        "builtins.eval",
    ),
    "subprocess.Popen": (
        lambda marker: Payload(subprocess.Popen, ["touch", str(marker)]),
        "subprocess.Popen",
    ),
}


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def _rewrite_zip(source: Path, destination: Path, replace: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(destination, "w") as new:
        for name in old.namelist():
            new.writestr(name, replace.get(name, old.read(name)))
    return destination


def _hostile_dump(folder: Path, call: Payload) -> Path:
    path = folder / "memory.pickle"
    path.write_bytes(pickle.dumps({"obs": call, "dones": np.zeros(3)}))
    return path


def _hostile_tmrl(folder: Path, call: Payload) -> Path:
    path = folder / "memory.pickle"
    path.write_bytes(pickle.dumps([[0.0], [call], [0.0], [False], [False], [{}], [False]]))
    return path


def _hostile_sb3(folder: Path, call: Payload) -> Path:
    buffers = pytest.importorskip(
        "stable_baselines3.common.buffers",
        reason="Stable-Baselines3 writes these inputs; it comes with the dev extra",
    )
    path = folder / "memory.pickle"
    path.write_bytes(pickle.dumps(Payload(buffers.ReplayBuffer, call)))
    return path


def _hostile_legacy_zip(folder: Path, call: Payload) -> Path:
    original = shipped("emote-rl-23-legacy-numpy1.26.zip")
    return _rewrite_zip(original, folder / "memory.zip", {"data.pickle": pickle.dumps(call)})


def _hostile_v1(folder: Path, call: Payload) -> Path:
    column = _npy(np.array([call], dtype=object))
    original = shipped("emote-export-v1.zip")
    return _rewrite_zip(original, folder / "memory.zip", {"observation.npy": column})


def _hostile_pt(folder: Path, call: Payload) -> Path:
    import torch

    path = folder / "memory.pt"
    names = ("states", "next_states", "actions", "rewards", "terminated")
    torch.save({name: call for name in names}, path)
    return path


def _hostile_npz(folder: Path, call: Payload) -> Path:
    path = folder / "memory.npz"
    buffer = io.BytesIO()
    np.savez(buffer, states=np.array([call], dtype=object))
    path.write_bytes(buffer.getvalue())
    return path


HOSTILE = {  # format: (maker, what the refusal says besides naming nothing it ran)
    "legacy-pickle": (_hostile_dump, "outside emote's allowlist"),
    "tmrl-dataset": (_hostile_tmrl, "outside emote's allowlist"),
    "sb3-replay-buffer": (_hostile_sb3, "outside emote's allowlist"),
    "emote-legacy": (_hostile_legacy_zip, "outside emote's allowlist"),
    "emote-v1": (_hostile_v1, "holds pickled objects where plain data is expected"),
    "skrl-memory.pt": (_hostile_pt, "--trust-pickle"),
    "skrl-memory.npz": (_hostile_npz, "holds pickled objects where plain data is expected"),
}


@pytest.mark.parametrize("payload", list(PAYLOADS))
@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_pickle_that_runs_code_is_refused_and_never_runs(runner, tmp_path, case, payload):
    make, message = HOSTILE[case]
    marker = tmp_path / "payload-ran"
    build, global_name = PAYLOADS[payload]
    path = make(tmp_path, build(marker))
    flags = ["--from", "skrl-memory"] if case == "skrl-memory.npz" else []  # no detector claims it
    line = refused_everywhere(runner, path, tmp_path, *flags)
    assert message in line
    if message == "outside emote's allowlist":
        assert global_name in line
    assert not marker.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


ODD = "mé mory 'a' \"b\" $(touch x);#"
"""Spaces, quotes, a non-ASCII letter and shell syntax, in every name a test gives."""


@pytest.mark.parametrize("name", [*FILE_TARGETS, "zarr"])
def test_odd_names_pass_through_every_target(runner, tmp_path, name):
    target = TARGETS[name]
    store = make_store(tmp_path / f"{ODD}.zarr")
    destination = tmp_path / f"{ODD}{target.destination}"
    result = memory(runner, "convert", store, destination, "--to", name, "--json")
    assert result.exit_code == ExitCode.OK, result.stderr
    assert json.loads(result.stdout)["destination"] == str(destination)
    back = tmp_path / f"{ODD} back.zarr"
    assert memory(runner, "convert", destination, back, "-q").exit_code == ExitCode.OK
    assert_same_episodes(episodes_in(store), episodes_in(back), keeps_ids=target.keeps_ids)
    assert not (tmp_path / "x").exists() and len(list(tmp_path.iterdir())) == 3

    damaged = tmp_path / f"{ODD}.zip"
    damaged.write_bytes(b"PK\x03\x04" + bytes(30))
    assert f"'{damaged}'" in refused_everywhere(runner, damaged, tmp_path)


# Replacing: never without --force, and with it only what the target writes.


def _a_users_file(path: Path) -> None:
    path.write_text("a user's own file that happens to have this name\n")


@pytest.mark.parametrize("name", list(TARGETS))
def test_a_destination_is_replaced_only_with_force_and_only_by_its_own_kind(
    runner, tmp_path, request, name
):
    target = TARGETS[name]
    first = make_store(tmp_path / "first.zarr", EPISODES[:1])
    second = make_store(tmp_path / "second.zarr")
    destination = destination_of(target, tmp_path, request)
    assert memory(runner, "convert", first, destination, "--to", name).exit_code == ExitCode.OK
    place = tmp_path / "datasets" / target.destination if name == "minari" else Path(destination)
    assert place.exists()
    before = digest(place)

    line = one_error_line(memory(runner, "convert", second, destination, "--to", name, "-q"))
    assert "exists" in line and "--force" in line and destination in line
    if name != "minari":
        assert line == f"error: destination '{destination}' exists; pass --force to replace it"
    assert digest(place) == before

    replaced = memory(runner, "convert", second, destination, "--to", name, "--force", "--json")
    assert replaced.exit_code == ExitCode.OK, replaced.stderr
    assert json.loads(replaced.stdout)["episodes"] == len(EPISODES)
    back = memory(runner, "convert", destination, tmp_path / "back.zarr", "-q")
    assert back.exit_code == ExitCode.OK, back.stderr
    assert len(episodes_in(tmp_path / "back.zarr")) == len(EPISODES)
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".emote-")]
    assert leftovers == []


@pytest.mark.parametrize("name", list(TARGETS))
def test_force_never_replaces_what_the_target_did_not_write(runner, tmp_path, request, name):
    target = TARGETS[name]
    store = make_store(tmp_path / "s.zarr")
    destination = destination_of(target, tmp_path, request)
    place = tmp_path / "datasets" / target.destination if name == "minari" else Path(destination)
    place.parent.mkdir(parents=True, exist_ok=True)

    # A folder of the user's files where the target goes.
    place.mkdir()
    _a_users_file(place / "paper.tex")
    refused = memory(runner, "convert", store, destination, "--to", name, "--force", "-q")
    line = one_error_line(refused)
    expected = {
        "zarr": "is not an emote memory store; --force replaces only a store",
        "minari": "exists and is not a Minari dataset",
    }.get(name, "is a directory; --force replaces only")
    assert expected in line and "choose another" in line
    assert (place / "paper.tex").read_text().startswith("a user's own file")
    shutil.rmtree(place)

    if name in FILE_TARGETS:  # and a file of another kind under the target's name
        _a_users_file(place)
        line = one_error_line(
            memory(runner, "convert", store, destination, "--to", name, "--force")
        )
        assert f"is not a {name} file" in line
        assert place.read_text().startswith("a user's own file")
    leftovers = [p.name for p in place.parent.iterdir() if p.name.startswith(".emote-")]
    assert leftovers == []
