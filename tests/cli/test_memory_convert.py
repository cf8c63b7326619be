"""``emote memory convert``: real files in, atomic targets out, bad input refused in one line."""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from emote_cli._common import ExitCode
from emote_cli.app import app
from emote_cli.memory.convert import TargetFormat
from emote_cli.memory.inspect import SourceFormat
from emote_core.integrations.formats import read_source, source_formats, target_formats
from emote_core.stores.zarr_store import MemoryStore
from tests.stores.test_conformance import legacy_dump

ROOT = Path(__file__).parents[2]
LEGACY_ZIPS = sorted(
    (ROOT / "tests" / "integrations" / "upstream" / "data").glob("emote-rl-23-legacy-*.zip")
)


def _emote_script() -> str:
    script = shutil.which("emote", path=str(Path(sys.executable).parent))
    if script is None:
        pytest.fail("the `emote` console script is not installed; run `pip install -e .`")
    return script


def _convert(runner: CliRunner, *args: str):
    return runner.invoke(app, ["memory", "convert", *args])


def _rewrite_zip(source: Path, destination: Path, replace: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(destination, "w") as new:
        for name in old.namelist():
            new.writestr(name, replace.get(name, old.read(name)))
    return destination


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


class _Payload:
    """Pickles as a call of ``function(*args)``: what a malicious file does."""

    def __init__(self, function, *args) -> None:
        self.call = (function, args)

    def __reduce__(self):
        return self.call


def test_the_upstream_fixture_converts_to_a_store_with_a_json_summary(
    runner, tmp_path, upstream_v1
):
    destination = tmp_path / "memory.zarr"
    result = _convert(runner, str(upstream_v1), str(destination), "--json")

    assert result.exit_code == ExitCode.OK, result.stderr
    summary = json.loads(result.stdout)
    assert summary["source_format"] == "emote-v1" and summary["target_format"] == "zarr"
    assert (summary["episodes"], summary["transitions"]) == (100, 400)
    assert summary["source_sha256"] == hashlib.sha256(upstream_v1.read_bytes()).hexdigest()
    assert summary["destination"] == str(destination) and summary["seconds"] > 0
    store = MemoryStore(destination)
    assert (store.episode_count, store.transition_count) == (100, 400)
    assert store.attributes["source"]["sha256"] == summary["source_sha256"]
    assert runner.invoke(app, ["memory", "verify", str(destination)]).exit_code == ExitCode.OK


@pytest.mark.parametrize("kind", ["legacy-zip", "legacy-pickle"])
def test_legacy_sources_convert_to_stores_and_back_to_v1(runner, tmp_path, kind):
    source = LEGACY_ZIPS[0] if kind == "legacy-zip" else legacy_dump(tmp_path)
    _, original = read_source(source)
    assert _convert(runner, str(source), str(tmp_path / "a.zarr")).exit_code == ExitCode.OK
    result = _convert(runner, str(tmp_path / "a.zarr"), str(tmp_path / "a.zip"), "--to", "emote-v1")
    assert result.exit_code == ExitCode.OK, result.stderr

    name, back = read_source(tmp_path / "a.zip")
    assert name == "emote-v1"
    assert [(i, int(e)) for i, _, e in back.episodes] == [
        (i, int(e)) for i, _, e in original.episodes
    ]
    for (_, left, _), (_, right, _) in zip(original.episodes, back.episodes, strict=True):
        for column in ("obs", "actions", "rewards"):
            np.testing.assert_array_equal(left[column], right[column])


def _wrong_extension(tmp_path: Path, upstream: Path) -> Path:
    path = tmp_path / "notes.zip"
    path.write_text("these are my notes, not a memory\n")
    return path


def _plain_directory(tmp_path: Path, upstream: Path) -> Path:
    path = tmp_path / "folder"
    path.mkdir()
    (path / "readme.txt").write_text("hello")
    return path


def _mismatched_lengths(tmp_path: Path, upstream: Path) -> Path:
    ranges = np.load(io.BytesIO(zipfile.ZipFile(upstream).read("observation.ranges.npy")))
    ranges[0, 2] -= 2  # the first episode loses two observation rows
    return _rewrite_zip(upstream, tmp_path / "bad.zip", {"observation.ranges.npy": _npy(ranges)})


def _newer_version(tmp_path: Path, upstream: Path) -> Path:
    return _rewrite_zip(upstream, tmp_path / "newer.zip", {"version": b"7"})


BAD_INPUTS = {
    "wrong extension": (_wrong_extension, "not in a memory format emote knows"),
    "directory that is not a store": (_plain_directory, "not an emote memory store"),
    "mismatched column lengths": (_mismatched_lengths, "column lengths disagree in episode 0"),
    "unsupported version": (_newer_version, "version '7'; this emote reads versions [0, 1]"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
@pytest.mark.parametrize("target", ["zarr", "emote-v1"])
def test_bad_input_is_one_error_line_and_leaves_nothing_behind(
    runner, tmp_path, upstream_v1, case, target
):
    make, message = BAD_INPUTS[case]
    source = make(tmp_path, upstream_v1)
    before = sorted(p.name for p in tmp_path.iterdir())
    result = _convert(runner, str(source), str(tmp_path / "out"), "--to", target, "--json")

    assert result.exit_code == ExitCode.ERROR
    # --json: the failure is also the one document on stdout, so `| jq` never reads silence
    assert json.loads(result.stdout) == {
        "error": result.stderr.strip().removeprefix("error: "),
        "exit_code": ExitCode.ERROR,
    }
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert message in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no DST, no temporary files


def test_debug_shows_the_traceback(runner, tmp_path, upstream_v1):
    source = _newer_version(tmp_path, upstream_v1)
    result = _convert(runner, str(source), str(tmp_path / "out.zarr"), "--debug")
    assert result.exit_code == ExitCode.ERROR
    assert "Traceback" in result.stderr and result.stderr.strip().splitlines()[-1].startswith(
        "error:"
    )


def _malicious(tmp_path: Path) -> tuple[Path, Path]:
    """A legacy dump that runs ``os.system`` when loaded, and the file it would create."""
    marker = tmp_path / "payload-ran"
    path = tmp_path / "memory.pickle"
    path.write_bytes(pickle.dumps({"obs": _Payload(os.system, f"touch {marker}")}))
    return path, marker


PEER_DATA = ROOT / "tests" / "integrations" / "data"


@pytest.mark.parametrize(
    "name", ["sb3_sac_dict_2envs.pkl", "skrl1_memory_2envs.pt", "tmrl_cartpole_mixed.data.pkl"]
)
def test_peer_files_convert_to_stores_and_to_every_file_target(runner, tmp_path, name):
    source = PEER_DATA / name
    if not source.is_file():
        pytest.skip(f"{source} is not here")
    _, original = read_source(source)
    result = _convert(runner, str(source), str(tmp_path / "a.zarr"), "--json")
    assert result.exit_code == ExitCode.OK, result.stderr
    assert json.loads(result.stdout)["episodes"] == len(original.episodes)
    for kind in ("npz", "pt", "csv", "emote-v1"):
        destination = tmp_path / f"out.{kind}"
        result = _convert(runner, str(tmp_path / "a.zarr"), str(destination), "--to", kind, "-q")
        assert result.exit_code == ExitCode.OK, result.stderr
        _, back = read_source(destination)
        assert [int(e) for _, _, e in back.episodes] == [int(e) for _, _, e in original.episodes]
        assert sum(len(d["rewards"]) for _, d, _ in back.episodes) == sum(
            len(d["rewards"]) for _, d, _ in original.episodes
        )


@pytest.mark.parametrize("kind", ["pt", "npz", "csv"])
def test_a_skrl_ppo_memory_is_refused_as_on_policy_not_as_an_unknown_format(runner, tmp_path, kind):
    # A real export of skrl's PPO (RandomMemory(export=True)): no next observations.
    result = _convert(runner, str(PEER_DATA / f"skrl2_ppo_pendulum.{kind}"), str(tmp_path / "a"))
    assert result.exit_code == ExitCode.ERROR
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: skrl memory")
    assert "on-policy agent" in lines[0] and "final observations are not in the file" in lines[0]
    assert "format emote knows" not in lines[0]
    assert not (tmp_path / "a").exists()


def test_a_minari_dataset_is_a_target_and_a_source(runner, tmp_path, monkeypatch):
    pytest.importorskip("minari", reason="Minari comes with the dev and minari extras")
    pytest.importorskip(
        "h5py", reason="h5py (Minari's HDF5 backend) comes with the dev and minari extras"
    )
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    source = PEER_DATA / "sb3_dqn_cartpole_2envs.pkl"
    if not source.is_file():
        pytest.skip(f"{source} is not here")
    result = _convert(runner, str(source), "emote/cartpole-v0", "--to", "minari", "--json")
    assert result.exit_code == ExitCode.OK, result.stderr
    assert json.loads(result.stdout)["transitions"] == 304

    result = _convert(runner, str(source), "emote/cartpole-v0", "--to", "minari")
    assert result.exit_code == ExitCode.ERROR and "exists" in result.stderr
    result = _convert(runner, "emote/cartpole-v0", str(tmp_path / "back.zarr"), "--json")
    assert result.exit_code == ExitCode.OK, result.stderr
    summary = json.loads(result.stdout)
    assert (summary["source_format"], summary["episodes"]) == ("minari", 13)
    assert summary["source_sha256"] is not None


def test_trust_pickle_warns_loudly_even_when_quiet(runner, tmp_path):
    source = legacy_dump(tmp_path)
    result = _convert(runner, str(source), str(tmp_path / "a.zarr"), "--trust-pickle", "--quiet")
    assert result.exit_code == ExitCode.OK, result.stderr
    assert "--trust-pickle" in result.stderr and "WITHOUT restrictions" in result.stderr
    assert MemoryStore(tmp_path / "a.zarr").episode_count == 3


def test_progress_goes_to_stderr_as_plain_lines_and_quiet_silences_it(
    runner, tmp_path, upstream_v1
):
    result = _convert(runner, str(upstream_v1), str(tmp_path / "a.zarr"), "--json")
    assert json.loads(result.stdout)["episodes"] == 100
    assert "convert episode=100/100 (100%)" in result.stderr
    assert "\x1b[" not in result.stderr

    result = _convert(runner, str(upstream_v1), str(tmp_path / "b.zarr"), "--quiet")
    assert result.exit_code == ExitCode.OK
    assert result.stderr == ""
    assert "converted 100 episodes (400 transitions)" in result.stdout


def test_the_format_choices_are_the_registrys(runner):
    assert sorted(f.value for f in SourceFormat) == sorted(source_formats())
    assert sorted(f.value for f in TargetFormat) == sorted(target_formats())
    result = runner.invoke(app, ["memory", "convert", "a", "b", "--to", "emote-legacy"])
    assert result.exit_code == ExitCode.USAGE


def test_the_console_script_converts_and_refuses_a_malicious_pickle(tmp_path, upstream_v1):
    completed = subprocess.run(
        [
            _emote_script(),
            "memory",
            "convert",
            str(upstream_v1),
            str(tmp_path / "a.zarr"),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == ExitCode.OK, completed.stderr
    assert json.loads(completed.stdout)["transitions"] == 400

    source, marker = _malicious(tmp_path)
    completed = subprocess.run(
        [_emote_script(), "memory", "convert", str(source), str(tmp_path / "b.zarr")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == ExitCode.ERROR
    assert completed.stdout == ""
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: pickle names the global")
    assert not marker.exists() and not (tmp_path / "b.zarr").exists()


NONFINITE = {  # dump field, steps (of 7: episodes 0-2, 3-4, 5-6), value; the message's part
    "rewards": ("rewards", [3], np.nan, "'rewards' holds 1 non-finite value (NaN or inf) in 1 "
                "episode, the first in episode 1 at row 0"),
    "obs": ("obs", [5, 6], np.inf, "'obs' holds 6 non-finite values (NaN or inf) in 1 episode, "
            "the first in episode 2 at row 0"),
    "actions": ("actions", [1, 4, 6], -np.inf, "'actions' holds 3 non-finite values (NaN or inf) "
                "in 3 episodes, the first in episode 0 at row 1"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(NONFINITE))
def test_nonfinite_values_are_refused_unless_allowed(runner, tmp_path, case):
    field, steps, value, message = NONFINITE[case]
    state = pickle.loads(legacy_dump(tmp_path).read_bytes())
    state[field] = state[field].astype(np.float64)
    state[field][steps, 0, 0] = value
    source = tmp_path / "dump.pickle"
    source.write_bytes(pickle.dumps(state))
    refused = _convert(runner, str(source), str(tmp_path / "out.zarr"), "--json")
    assert refused.exit_code == ExitCode.ERROR
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and f"column {message};" in lines[0], lines
    assert "--allow-nonfinite" in lines[0]
    assert json.loads(refused.stdout)["exit_code"] == ExitCode.ERROR
    assert not (tmp_path / "out.zarr").exists()

    kept = _convert(runner, str(source), str(tmp_path / "out.zarr"), "--allow-nonfinite")
    assert kept.exit_code == 0, kept.output
    stored = MemoryStore(tmp_path / "out.zarr").read()
    column = message.split("'")[1]
    values = np.concatenate([data[column] for _, data, _ in stored.episodes])
    assert int((~np.isfinite(values)).sum()) == int(message.split()[2])


def test_a_collected_store_converts_to_a_minari_dataset_that_recovers_its_environment(
    runner, tmp_path, monkeypatch
):
    minari = pytest.importorskip("minari", reason="Minari comes with the dev and minari extras")
    from emote_core.recipes import load_recipe
    from emote_core.recipes.loading import recipe_to_toml

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    recipe = load_recipe("sac_pendulum", ["env.kwargs={g = 9.5}", "env.max_episode_steps=15"])
    (tmp_path / "pendulum.toml").write_text(recipe_to_toml(recipe), encoding="utf-8")
    store = str(tmp_path / "store.zarr")
    collected = runner.invoke(
        app, ["collect", str(tmp_path / "pendulum.toml"), "--out", store, "--episodes", "2", "-q"]
    )
    assert collected.exit_code == ExitCode.OK, collected.output
    result = _convert(runner, store, "emote/pendulum-v0", "--to", "minari", "--json")
    assert result.exit_code == ExitCode.OK, result.stderr
    assert json.loads(result.stdout)["transitions"] == 30

    dataset = minari.load_dataset("emote/pendulum-v0")
    env = dataset.recover_environment()
    try:
        assert env.spec.id == "Pendulum-v1" and env.spec.max_episode_steps == 15
        assert env.unwrapped.g == 9.5
        env.reset(seed=0)
    finally:
        env.close()
    back = _convert(runner, "emote/pendulum-v0", str(tmp_path / "back.zarr"), "--json")
    assert back.exit_code == ExitCode.OK, back.stderr
    assert json.loads(back.stdout)["episodes"] == 2
