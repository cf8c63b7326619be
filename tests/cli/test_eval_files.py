"""``emote eval`` on a run whose files are not regular files: a named pipe where a checkpoint or
the recipe should be is refused as "not a file" in one line, and never waited on."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emote_cli._common import ExitCode
from emote_cli.app import app


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny sac_hit_the_middle run with one checkpoint, at update 30."""
    run_dir = tmp_path_factory.mktemp("runs") / "htm"
    result = CliRunner(env={"COLUMNS": "200"}).invoke(
        app,
        ["train", "sac_hit_the_middle", "--steps", "30", "--run-dir", str(run_dir),
         "--set", "training.checkpoint_interval=30", "--set", "memory.warmup_steps=64",
         "--json", "-q"],
    )  # fmt: skip
    assert result.exit_code == ExitCode.OK, result.output
    return run_dir


def _eval(target: Path) -> subprocess.CompletedProcess[str]:
    """``emote eval TARGET`` as a user runs it; a read waiting on a pipe would time out."""
    return subprocess.run(
        [sys.executable, "-m", "emote_cli", "eval", str(target), "--episodes", "1"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip


def _run_with_a_pipe(trained: Path, tmp_path: Path, name: str) -> Path:
    """A copy of the run with a named pipe in place of its file ``name``."""
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    (run_dir / name).unlink()
    os.mkfifo(run_dir / name, 0o600)  # opening it for reading would wait for a writer forever
    return run_dir


@pytest.mark.parametrize(
    "name", ["checkpoints/checkpoint_30.tar", "recipe.toml"], ids=["checkpoint", "recipe"]
)
def test_a_pipe_in_place_of_a_run_file_is_not_a_file(
    trained: Path, tmp_path: Path, name: str
) -> None:
    run_dir = _run_with_a_pipe(trained, tmp_path, name)

    result = _eval(run_dir)

    assert result.returncode == ExitCode.ERROR, result.stderr
    assert f"'{run_dir / name}' is not a file (mode prw" in result.stderr
    assert "does not exist" not in result.stderr and "no recipe.toml" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and result.stderr.endswith(errors[0] + "\n"), result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_a_pipe_given_as_the_checkpoint_is_not_a_file(trained: Path, tmp_path: Path) -> None:
    run_dir = _run_with_a_pipe(trained, tmp_path, "checkpoints/checkpoint_30.tar")
    pipe = run_dir / "checkpoints" / "checkpoint_30.tar"

    result = _eval(pipe)

    assert result.returncode == ExitCode.ERROR, result.stderr
    assert result.stderr.splitlines() == [
        f"error: '{pipe}' is not a file (mode prw-------); pass runs/<run>, a "
        "checkpoint_<step>.tar or an .onnx file"
    ]
