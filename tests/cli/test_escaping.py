"""Text taken from files (a recipe, a run, a store, an ONNX file, a package's metadata) reaches
the terminal escaped: no escape sequence, bell or bidi override from a file drives it, and no
Rich markup from a file is interpreted."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emote_cli._common import ExitCode
from emote_cli.app import app
from emote_cli.collect_workers import describe_workers

EVIL = "\x1b]0;pwned\x07\x1b[2J\u202e[bold]x"
"""Retitles the terminal, clears the screen, reverses the text, and Rich markup."""
SHOWN = "\\x1b]0;pwned\\x07\\x1b[2J\\u202e[bold]x"
"""``EVIL`` as emote prints it."""
RAW = ("\x1b]", "\x1b[2J", "\x07", "\u202e")
"""What must never reach the terminal raw (a live display writes other escape sequences)."""
RECIPES = Path(__file__).parents[2] / "recipes"


@pytest.fixture(scope="module")
def evil_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, object]:
    """A recipe named ``EVIL``, trained for 30 updates into a run directory named with it too;
    returns the recipe, the run directory and the text-mode result of ``emote train``."""
    folder = tmp_path_factory.mktemp("evil")
    recipe = folder / "evil.toml"
    text = (RECIPES / "sac_hit_the_middle.toml").read_text()
    recipe.write_text(f"name = {json.dumps(EVIL)}\n" + text.replace("warmup_steps = 200", ""))
    run_dir = folder / f"run{EVIL}"
    result = CliRunner(env={"COLUMNS": "200"}).invoke(
        app,
        ["train", str(recipe), "--steps", "30", "--run-dir", str(run_dir),
         "--set", "training.checkpoint_interval=30", "--set", "memory.warmup_steps=64"],
    )  # fmt: skip
    assert result.exit_code == ExitCode.OK, result.output
    return recipe, run_dir, result


def _train(runner, tmp_path, evil_run, monkeypatch):
    return evil_run[2], f"training {SHOWN} on "


def _show(runner, tmp_path, evil_run, monkeypatch):
    result = runner.invoke(app, ["train", str(evil_run[0]), "--show"])
    return result, 'name = "\\u001b]0;pwned\\u0007\\u001b[2J\\u202e[bold]x"'


def _collect(runner, tmp_path, evil_run, monkeypatch):
    out = tmp_path / f"store{EVIL}.zarr"
    result = runner.invoke(app, ["collect", str(evil_run[0]), "--episodes", "1", "--out", str(out)])
    return result, f"store{SHOWN}.zarr now holds 1 episodes"


def _export(runner, tmp_path, evil_run, monkeypatch):
    checkpoint = evil_run[1] / "checkpoints" / "checkpoint_30.tar"
    out = tmp_path / "policy.onnx"
    result = runner.invoke(app, ["export", "onnx", str(checkpoint), "--out", str(out)])
    return result, f"run{SHOWN}/checkpoints/checkpoint_30.tar (update 30)"


def _env(runner, tmp_path, evil_run, monkeypatch):
    """A package whose installed metadata gives its version with ``EVIL`` in it."""
    info = tmp_path / "zarrs-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: zarrs\nVersion: 1.0{EVIL}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return runner.invoke(app, ["env"]), f"1.0{SHOWN}"


def _convert_live(runner, tmp_path, evil_run, monkeypatch):
    """``emote memory convert`` on a terminal shows ``reading SOURCE`` while it reads."""
    from tests.conftest import UPSTREAM_V1

    source = tmp_path / f"src{EVIL}.zip"
    shutil.copyfile(UPSTREAM_V1, source)
    result = runner.invoke(
        app,
        ["memory", "convert", str(source), str(tmp_path / "out.zarr")],
        env={"COLUMNS": "200", "TTY_COMPATIBLE": "1"},  # a live display, as on a terminal
    )
    return result, f"reading {tmp_path}/src{SHOWN}.zip"


Case = Callable[..., tuple[object, str]]


@pytest.mark.parametrize(
    "case",
    [_train, _show, _collect, _export, _env, _convert_live],
    ids=["train", "train --show", "collect", "export onnx", "env", "convert live"],
)
def test_text_from_files_is_printed_escaped(
    case: Case,
    runner: CliRunner,
    tmp_path: Path,
    evil_run: tuple[Path, Path, object],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    result, shown = case(runner, tmp_path, evil_run, monkeypatch)

    output = result.stdout + result.stderr
    assert not [raw for raw in RAW if raw in output], output
    assert shown in output, output


def test_the_workers_summary_escapes_shard_names_and_reasons() -> None:
    worker = {"worker": 0, "shard": f"w0{EVIL}", "status": "finished", "episodes": 1,
              "env_steps": 30, "env_steps_per_second": 0.0}  # fmt: skip
    death = {"worker": 1, "status": "died", "shard": "w1", "after_seconds": 1.0,
             "reason": f"ActorDiedError: {EVIL}", "restarted_as": f"w2{EVIL}"}  # fmt: skip
    summary = {"episodes": 1, "transitions": 30, "env_steps": 30, "store": "s.zarr",
               "dropped_steps": 0, "store_totals": None, "workers": [worker],
               "deaths": [death]}  # fmt: skip

    text = describe_workers(summary)

    assert not [raw for raw in RAW if raw in text]
    assert f"shard w0{SHOWN}: finished" in text
    assert f"(ActorDiedError: {SHOWN}); restarted on shard w2{SHOWN}" in text
