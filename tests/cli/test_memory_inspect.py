"""``emote memory inspect``: reports on stores and every other format, human and JSON."""

from __future__ import annotations

import json
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from emote_cli._common import ExitCode
from emote_cli.app import app
from emote_core.integrations.convert import convert, write_target
from emote_core.stores.stored import ColumnSchema, StoredTable
from emote_core.typing import EpisodeState

ROOT = Path(__file__).parents[2]
LEGACY_ZIPS = sorted(
    (ROOT / "tests" / "integrations" / "upstream" / "data").glob("emote-rl-23-legacy-*.zip")
)


def _legacy_dump(path: Path) -> Path:
    """7 steps: two episodes end at dones (steps 2 and 4), a 2-step tail is INTERRUPTED."""
    steps = np.arange(7, dtype=np.float64)
    path.write_bytes(
        pickle.dumps(
            {
                "obs": np.repeat(steps, 3).reshape(7, 1, 1, 3),
                "next_obs": np.repeat(steps + 0.5, 3).reshape(7, 1, 1, 3),
                "actions": np.zeros((7, 1, 2)),
                "rewards": np.ones((7, 1, 1)),
                "dones": np.isin(np.arange(7), (2, 4)).reshape(7, 1, 1),
            }
        )
    )
    return path


def _inspect_json(runner: CliRunner, *args: str) -> dict:
    result = runner.invoke(app, ["memory", "inspect", "--json", *args])
    assert result.exit_code == ExitCode.OK, result.stderr
    return json.loads(result.stdout)


def test_the_upstream_v1_fixture_reports_100_episodes_and_400_transitions(runner, upstream_v1):
    report = _inspect_json(runner, str(upstream_v1))
    assert (report["format"], report["format_version"]) == ("emote-v1", 1)
    assert (report["episodes"], report["transitions"]) == (100, 400)
    assert report["columns"]["reward"]["dtype"] == "float32"
    assert report["columns"]["reward"]["shape"] == []
    assert report["columns"]["observation"]["rows"] == "observations"
    assert report["end_states"] == {"TERMINAL": 100, "INTERRUPTED": 0}
    assert report["episode_return"] == {"min": 10.0, "mean": 10.0, "max": 10.0}


@pytest.mark.parametrize("path", LEGACY_ZIPS, ids=lambda p: p.name)
def test_the_real_legacy_zips_report_their_four_episodes(runner, path):
    report = _inspect_json(runner, str(path))
    assert (report["format"], report["format_version"]) == ("emote-legacy", 0)
    assert (report["episodes"], report["transitions"]) == (4, 14)
    assert report["columns"]["obs"] == {
        "dtype": "float32",
        "shape": [3],
        "kind": "Column",
        "rows": "observations",
    }
    assert report["columns"]["terminal"]["kind"] == "TagColumn"


PEER_DATA = ROOT / "tests" / "integrations" / "data"
MINARI_DATA = ROOT / "tests" / "integrations" / "minari" / "data"
# (format, episodes, transitions, TERMINAL, INTERRUPTED); where the peer's buffer kept every step
# these are the counts of the env recording beside each file (see that folder's README).
PEER_COUNTS = {
    "sb3_dqn_cartpole_2envs.pkl": ("sb3-replay-buffer", 13, 304, 9, 4),
    "sb3_dqn_cartpole_optimized.pkl": ("sb3-replay-buffer", 6, 119, 5, 1),
    "sb3_sac_dict_2envs.pkl": ("sb3-replay-buffer", 8, 160, 0, 8),
    "sb3_sac_pendulum_wrapped.pkl": ("sb3-replay-buffer", 7, 300, 0, 7),
    **{f"skrl1_memory_2envs.{k}": ("skrl-memory", 8, 114, 5, 3) for k in ("csv", "npz", "pt")},
    **{f"skrl2_sac_pendulum.{k}": ("skrl-memory", 3, 130, 0, 3) for k in ("csv", "npz", "pt")},
    "tmrl_cartpole_mixed.data.pkl": ("tmrl-dataset", 6, 101, 2, 4),
    "tmrl_pendulum.data.pkl": ("tmrl-dataset", 6, 85, 0, 6),
}


@pytest.mark.parametrize("name", sorted(PEER_COUNTS))
def test_real_peer_files_report_their_episodes(runner, name):
    path = PEER_DATA / name
    if not path.is_file():
        pytest.skip(f"{path} is not here")
    report = _inspect_json(runner, str(path))
    found, episodes, transitions, terminal, interrupted = PEER_COUNTS[name]
    assert (report["format"], report["episodes"], report["transitions"]) == (
        found,
        episodes,
        transitions,
    )
    assert report["end_states"] == {"TERMINAL": terminal, "INTERRUPTED": interrupted}
    assert {"actions", "rewards"} <= set(report["columns"])
    assert report["bytes_on_disk"] == path.stat().st_size


@pytest.mark.parametrize(
    ("dataset", "episodes", "transitions"),
    [("cartpole/random-v0", 5, 54), ("pendulum/random-v0", 3, 43)],
)
def test_real_minari_datasets_report_their_episodes(runner, dataset, episodes, transitions):
    pytest.importorskip("minari", reason="Minari comes with the dev and minari extras")
    pytest.importorskip(
        "h5py", reason="h5py (Minari's HDF5 backend) comes with the dev and minari extras"
    )
    report = _inspect_json(runner, str(MINARI_DATA / dataset))
    assert (report["format"], report["episodes"], report["transitions"]) == (
        "minari",
        episodes,
        transitions,
    )
    assert report["columns"]["obs"]["rows"] == "observations"


def test_a_legacy_dump_reports_terminal_and_interrupted_episodes(runner, tmp_path):
    report = _inspect_json(runner, str(_legacy_dump(tmp_path / "dump.pickle")))
    assert report["format"] == "legacy-pickle"
    assert (report["episodes"], report["transitions"]) == (3, 7)
    assert report["end_states"] == {"TERMINAL": 2, "INTERRUPTED": 1}
    assert report["episode_length"] == {"min": 2.0, "mean": 7 / 3, "max": 3.0}


def _returns_table(returns: list[float], ends: list[EpisodeState]) -> StoredTable:
    """Episodes of two steps each whose rewards add up to ``returns``."""
    columns = [
        ColumnSchema("obs", "Column", (1,), np.dtype(np.float32)),
        ColumnSchema("actions", "Column", (1,), np.dtype(np.float32)),
        ColumnSchema("rewards", "Column", (1,), np.dtype(np.float32)),
    ]
    episodes = [
        (i, {"obs": np.zeros((3, 1), np.float32), "actions": np.zeros((2, 1), np.float32),
             "rewards": np.full((2, 1), value / 2, np.float32)}, end)
        for i, (value, end) in enumerate(zip(returns, ends, strict=True))
    ]  # fmt: skip
    return StoredTable("generated", "test", columns, episodes, length_key="actions")


@pytest.mark.parametrize("target", ["zarr", "npz"])
def test_returns_shows_the_distribution_of_episode_returns(runner, tmp_path, target):
    T, I = EpisodeState.TERMINAL, EpisodeState.INTERRUPTED  # noqa: E741
    returns = [1.0, 2.0, 3.0, 4.0, 10.0, 7.0, -2.0, 3.0, 3.0]
    path = tmp_path / f"memory.{target}"
    write_target(_returns_table(returns, [T, I, T, T, I, T, T, I, T]), path, target)
    if target == "zarr":  # read from the episode table alone: no column is needed
        for chunks in path.glob("shards/main/columns/*/c"):
            shutil.rmtree(chunks)

    report = _inspect_json(runner, str(path))["returns"]  # in every report
    values = np.array(returns)
    assert report["episodes"] == 9 and report["nonfinite"] == 0
    expected = {"min": -2.0, "p25": 2.0, "median": 3.0, "p75": 4.0, "max": 10.0,
                "mean": values.mean(), "std": values.std()}  # fmt: skip
    for key, value in expected.items():
        assert report[key] == pytest.approx(value), key
    counts, edges = np.histogram(values, bins=10)
    assert report["histogram"]["counts"] == counts.tolist()
    assert report["histogram"]["edges"] == pytest.approx(edges.tolist())
    assert report["end_states"] == {"TERMINAL": 6, "INTERRUPTED": 3}
    assert report["episode_ends"] == {"terminal": 6, "truncated": 3}

    shown = runner.invoke(app, ["memory", "inspect", str(path)])
    assert shown.exit_code == ExitCode.OK, shown.output
    assert "episode return min / p25 / median / p75 / max │ -2 / 2 / 3 / 4 / 10" in shown.stdout
    assert "episodes ending │ terminal 6, truncated (interrupted) 3" in " ".join(
        shown.stdout.split()
    )
    # one character per bin of the histogram, a dot where no return fell
    assert counts.tolist() == [1, 0, 1, 1, 3, 1, 0, 1, 0, 1]
    assert "-2 ▃·▃▃█▃·▃·▃ 10" in shown.stdout
    assert "ended terminal" not in shown.stdout  # the histogram table is --returns'

    shown = runner.invoke(app, ["memory", "inspect", str(path), "--returns"])
    assert shown.exit_code == ExitCode.OK, shown.output
    assert "episode returns of 9 episodes: 6 ended terminal, 3 truncated" in shown.stdout
    bars = [line.count("█") for line in shown.stdout.splitlines() if "█" in line]
    assert bars[1:] == [round(40 * c / counts.max()) for c in counts if c]  # the fullest: 40


def test_a_store_reports_schema_shards_producer_and_source(runner, tmp_path, upstream_v1):
    convert(upstream_v1, tmp_path / "memory.zarr")
    report = _inspect_json(runner, str(tmp_path / "memory.zarr"))

    assert (report["format"], report["format_version"]) == ("emote-memory", 1)
    assert (report["episodes"], report["transitions"]) == (100, 400)
    assert report["columns"]["observation"] == {
        "dtype": "float32",
        "shape": [],
        "kind": "Column",
        "rows": "observations",
    }
    assert [s["name"] for s in report["shards"]] == ["main"]
    assert report["producer"]["tool"] == "emote"
    assert report["source"]["format"] == "emote-v1"
    assert report["bytes_on_disk"] > 0


def test_the_human_report_shows_counts_columns_and_shards(runner, tmp_path, upstream_v1):
    convert(upstream_v1, tmp_path / "memory.zarr")
    result = runner.invoke(app, ["memory", "inspect", str(tmp_path / "memory.zarr")])

    assert result.exit_code == ExitCode.OK, result.stderr
    for text in ("emote-memory v1", "episodes", "400", "observation", "float32", "main"):
        assert text in result.stdout
    assert "terminal 100, truncated (interrupted) 0" in result.stdout
    with pytest.raises(json.JSONDecodeError):
        json.loads(result.stdout)


ESCAPES = "\x1b[2J\x1b]0;owned\x07\x9b31m\u202e"
"""Clears the screen, retitles the terminal, a C1 CSI and a right-to-left override."""


def _store_with_escapes(tmp_path: Path, upstream_v1: Path) -> Path:
    """A converted store whose column, shard, producer, creation time, source and provenance
    carry terminal escape sequences, and a second shard, damaged, named with them too."""
    url = tmp_path / f"m{ESCAPES}.zarr"
    convert(upstream_v1, url)
    root = json.loads((url / "zarr.json").read_text())
    attributes = root["attributes"]
    attributes["columns"][0]["name"] = f"observation{ESCAPES}"
    attributes["producer"]["tool"] = f"emote{ESCAPES}"
    attributes["created"] = ESCAPES
    attributes["source"]["path"] = f"src{ESCAPES}"
    (url / "zarr.json").write_text(json.dumps(root))
    shard = url / "shards" / f"main{ESCAPES}"
    (url / "shards" / "main").rename(shard)
    (shard / "columns" / "observation").rename(shard / "columns" / f"observation{ESCAPES}")
    document = json.loads((shard / "zarr.json").read_text())
    document["attributes"]["provenance"][0]["command"] = ["emote", ESCAPES]
    rows = document["attributes"]["commit"]["rows"]
    rows[f"observation{ESCAPES}"] = rows.pop("observation")
    (shard / "zarr.json").write_text(json.dumps(document))
    damaged = url / "shards" / f"bad{ESCAPES}"
    damaged.mkdir()
    (damaged / "zarr.json").write_text("{not json")
    return url


def test_text_from_a_store_is_printed_escaped_and_json_keeps_it(runner, tmp_path, upstream_v1):
    url = _store_with_escapes(tmp_path, upstream_v1)
    raw = ("\x1b", "\x07", "\x9b", "\u202e")
    shown = "\\x1b[2J\\x1b]0;owned\\x07\\x9b31m\\u202e"

    result = runner.invoke(app, ["memory", "inspect", str(url)])
    assert result.exit_code == ExitCode.OK, result.output
    assert not any(c in result.stdout + result.stderr for c in raw)
    for text in (f"observation{shown}", f"main{shown}", f"emote{shown}", f"src{shown}"):
        assert text in result.stdout
    assert f"damaged shard 'bad{shown}'" in result.stderr

    report = _inspect_json(runner, str(url))
    assert report["producer"]["tool"] == f"emote{ESCAPES}"  # JSON keeps the text, escaped
    assert f"observation{ESCAPES}" in report["columns"]
    assert report["provenance"]["shards"][f"main{ESCAPES}"][0]["command"] == ["emote", ESCAPES]

    verified = runner.invoke(app, ["memory", "verify", str(url)])
    assert verified.exit_code == ExitCode.ERROR
    assert not any(c in verified.stderr for c in raw) and f"shard 'bad{shown}'" in verified.stderr
    document = json.loads(runner.invoke(app, ["memory", "verify", str(url), "--json"]).stdout)
    assert any(f"shard 'bad{ESCAPES}'" in problem for problem in document["problems"])

    out = tmp_path / f"out{ESCAPES}.zarr"
    converted = runner.invoke(app, ["memory", "convert", str(url), str(out), "--skip-damaged"])
    assert converted.exit_code == ExitCode.OK, converted.output
    assert not any(c in converted.stdout + converted.stderr for c in raw)
    assert f"out{shown}.zarr" in converted.stdout


def test_from_overrides_detection_and_a_wrong_override_is_one_error_line(runner, upstream_v1):
    assert _inspect_json(runner, str(upstream_v1), "--from", "emote-v1")["episodes"] == 100
    result = runner.invoke(app, ["memory", "inspect", str(upstream_v1), "--from", "emote-legacy"])
    assert result.exit_code == ExitCode.ERROR
    assert result.stderr.startswith("error: ") and len(result.stderr.splitlines()) == 1
    result = runner.invoke(app, ["memory", "inspect", str(upstream_v1), "--from", "nope"])
    assert result.exit_code == ExitCode.USAGE


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: None, "does not exist"),
    ],
)
def test_bad_sources_are_one_error_line(runner, tmp_path, make, message):
    path = tmp_path / "memory.zip"
    make(path)
    result = runner.invoke(app, ["memory", "inspect", str(path), "--json"])
    assert result.exit_code == ExitCode.ERROR
    # --json: the failure is also the one document on stdout, so `| jq` never reads silence
    assert json.loads(result.stdout) == {
        "error": result.stderr.strip().removeprefix("error: "),
        "exit_code": ExitCode.ERROR,
    }
    assert result.stderr.splitlines() == [result.stderr.strip()]
    assert message in result.stderr and "Traceback" not in result.stderr


def test_inspecting_a_million_transition_store_without_actions_reads_no_column_data_or_torch(
    tmp_path,
):
    columns = [
        ColumnSchema("obs", "Column", (1,), np.dtype(np.float32)),
        ColumnSchema("actions", "Column", (1,), np.dtype(np.float32)),
        ColumnSchema("rewards", "Column", (1,), np.dtype(np.float32)),
    ]
    ones = np.ones((1001, 1), np.float32)
    episodes = [
        (i, {"obs": ones, "actions": ones[:1000], "rewards": ones[:1000]}, EpisodeState.TERMINAL)
        for i in range(1000)
    ]
    store = tmp_path / "big.zarr"
    write_target(StoredTable("generated", "test", columns, episodes, length_key="actions"), store)
    # What makes inspect fast: it reads the episode table, never the columns' chunks (garbled
    # here, so that reading any would fail the command).
    chunks = [path for path in store.glob("shards/*/columns/*/c/**/*") if path.is_file()]
    assert chunks
    for chunk in chunks:
        chunk.write_bytes(b"not a blosc chunk")
    probe = (
        "import json, sys\n"
        f"sys.argv = ['emote', 'memory', 'inspect', {str(store)!r}, '--json', '--no-actions']\n"
        "from emote_cli.app import main\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as exit_:\n"
        "    assert exit_.code in (0, None), exit_.code\n"
        "print(json.dumps('torch' in sys.modules), file=sys.stderr)\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert completed.returncode == 0, completed.stderr
    torch_imported = json.loads(completed.stderr.strip().splitlines()[-1])
    assert json.loads(completed.stdout)["transitions"] == 1_000_000
    assert not torch_imported


def test_memory_help_lists_its_three_commands(runner):
    result = runner.invoke(app, ["memory", "--help"])
    assert result.exit_code == ExitCode.OK
    for command in ("inspect", "verify", "convert"):
        assert command in result.stdout
    result = runner.invoke(app, ["--help"])
    assert "memory" in result.stdout


def _actions_table(actions: np.ndarray, space: Any) -> StoredTable:
    """Episodes of 10 steps taking ``actions`` in turn, recorded with ``space``."""
    from emote_core.spaces import BoxSpace, DictSpace, MDPSpace

    spaces = MDPSpace(rewards=BoxSpace(np.float32, (1,)), actions=space,
                      state=DictSpace({"obs": BoxSpace(np.float32, (1,))}))  # fmt: skip
    columns = [
        ColumnSchema("obs", "Column", (1,), np.dtype(np.float32)),
        ColumnSchema("actions", "Column", actions.shape[1:], actions.dtype),
        ColumnSchema("rewards", "Column", (1,), np.dtype(np.float32)),
    ]
    episodes = [
        (i, {"obs": np.zeros((11, 1), np.float32), "actions": actions[10 * i : 10 * i + 10],
             "rewards": np.ones((10, 1), np.float32)}, EpisodeState.INTERRUPTED)
        for i in range(len(actions) // 10)
    ]  # fmt: skip
    return StoredTable("generated", "test", columns, episodes, length_key="actions",
                       spaces=spaces.to_json())  # fmt: skip


@pytest.mark.parametrize("target", ["zarr", "npz"])
def test_actions_shows_box_coverage_so_actions_bunched_near_zero_show(runner, tmp_path, target):
    from emote_core.spaces import BoxSpace

    rng = np.random.default_rng(0)
    actions = np.stack([rng.uniform(-0.1, 0.1, 40), rng.uniform(-2, 2, 40)], axis=1)
    path = tmp_path / f"memory.{target}"
    space = BoxSpace(np.float32, (2,), low=-2.0, high=2.0)
    write_target(_actions_table(actions.astype(np.float32), space), path, target)

    assert "actions" not in _inspect_json(runner, str(path), "--no-actions")
    report = _inspect_json(runner, str(path))["actions"]
    assert (report["column"], report["kind"], report["transitions"]) == ("actions", "box", 40)
    near_zero, spread = report["dimensions"]
    assert near_zero["mean"] == pytest.approx(actions[:, 0].mean(), abs=1e-6)
    assert near_zero["std"] == pytest.approx(actions[:, 0].std(), abs=1e-6)
    shown = runner.invoke(app, ["memory", "inspect", str(path), "--actions"])
    assert shown.exit_code == ExitCode.OK, shown.output
    assert "action coverage: 40 actions in column 'actions'" in shown.stdout
    row = next(line for line in shown.stdout.splitlines() if line.startswith("│   0 "))
    if target == "npz":  # skrl's files keep no spaces: no bounds to bin between
        assert near_zero["coverage"] is None and "unbounded" in row
        return
    assert near_zero["bins_visited"] == 2 and near_zero["coverage"] == 0.2
    assert spread["coverage"] >= 0.8
    assert "-2 … 2" in row and "2/10 (20%)" in row and row.count("·") == 8


def test_actions_names_the_discrete_actions_never_taken(runner, tmp_path):
    from emote_core.spaces import DiscreteSpace

    actions = np.array([0, 0, 0, 3, 1] * 4, dtype=np.int64).reshape(-1, 1)
    path = tmp_path / "memory.zarr"
    write_target(_actions_table(actions, DiscreteSpace(n=5)), path)
    report = _inspect_json(runner, str(path), "--actions")["actions"]
    assert report["counts"] == [12, 4, 0, 4, 0] and report["never_taken"] == [2, 4]
    shown = runner.invoke(app, ["memory", "inspect", str(path), "--actions"])
    assert "3 of 5 discrete actions taken; never taken: 2, 4" in shown.stdout
    assert "60.0%" in shown.stdout


def test_a_store_shows_its_reference_returns(runner, tmp_path, upstream_v1):
    from emote_core.stores.provenance import set_reference_returns

    convert(upstream_v1, tmp_path / "memory.zarr")
    assert _inspect_json(runner, str(tmp_path / "memory.zarr"))["reference_returns"] is None
    set_reference_returns(tmp_path / "memory.zarr", random=-3.5, expert=10.0,
                          source="emote eval of a random and a trained policy")  # fmt: skip
    report = _inspect_json(runner, str(tmp_path / "memory.zarr"))
    assert report["reference_returns"] == {
        "random": -3.5, "expert": 10.0, "source": "emote eval of a random and a trained policy"
    }  # fmt: skip
    shown = runner.invoke(app, ["memory", "inspect", str(tmp_path / "memory.zarr")])
    assert (
        "reference returns │ random -3.5, expert 10 (emote eval of a random and a trained policy)"
        in " ".join(shown.stdout.split())
    )
