"""`emote train --force` as a user runs it: it deletes the files the run wrote, never the user's
files beside them nor an input of the command; run files that are not files are one line."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emote_cli.app import app

TRAIN = ("train", "sac_hit_the_middle", "--steps", "5", "--threads", "1",
         "--set", "memory.warmup_steps=64")  # fmt: skip


def tree(folder: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None
            for p in folder.rglob("*")}  # fmt: skip


@pytest.fixture
def trained(runner: CliRunner, in_tmp: Path) -> Path:
    """A finished run, ``r1``, with checkpoints, an evaluation and its memory export."""
    result = runner.invoke(app, [*TRAIN, "--run-dir", "r1", "-q"])
    assert result.exit_code == 0, result.output
    assert (in_tmp / "r1" / "memory_export" / "zarr.json").is_file()
    return in_tmp / "r1"


def test_force_keeps_the_users_files_and_refuses_to_clear_a_run_holding_its_input(
    runner: CliRunner, in_tmp: Path, trained: Path
) -> None:
    runx = in_tmp / "runx"
    shutil.copytree(trained, runx)
    (runx / "my_notes.txt").write_text("notes")
    (in_tmp / "next_door.txt").write_text("neighbour")
    shutil.copytree(trained / "memory_export", runx / "mydata.zarr")
    before = tree(runx)

    refused = runner.invoke(app, [*TRAIN, "--memory", "runx/mydata.zarr", "--no-live",
                                  "--force", "--run-dir", "runx"])  # fmt: skip
    assert refused.exit_code == 1, refused.output
    assert refused.stderr == (
        "error: --force: the input 'runx/mydata.zarr' lies inside run directory 'runx', which "
        "--force would clear; move it out of the run directory or choose another --run-dir\n"
    )
    assert tree(runx) == before  # nothing deleted

    again = runner.invoke(app, [*TRAIN, "--force", "--run-dir", "runx", "--json"])
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["steps"] == 5
    assert (runx / "my_notes.txt").read_text() == "notes"
    assert (in_tmp / "next_door.txt").read_text() == "neighbour"
    assert tree(runx / "mydata.zarr") == tree(trained / "memory_export")
    starts = json.loads((runx / "run.json").read_text())["starts"]
    assert [s["resume"] for s in starts] == [False]  # a new run, not the copied one's record
    assert len(json.loads((runx / "eval.json").read_text())["history"]) == 1


def test_train_resume_eval_and_force_refuse_a_run_json_that_is_no_file(
    runner: CliRunner, in_tmp: Path, trained: Path, no_hang: None
) -> None:
    record = trained / "run.json"
    for hostile in ("fifo", "device"):
        record.unlink()
        if hostile == "fifo":
            os.mkfifo(record)  # reading it would wait for a writer forever
        else:
            record.symlink_to("/dev/zero")  # reading it would never end
        mode = "p" if hostile == "fifo" else "c"
        for args in (
            ("train", "--resume", "--run-dir", "r1"),
            ("eval", "r1", "--episodes", "1"),
            (*TRAIN, "--force", "--run-dir", "r1"),
        ):
            refused = runner.invoke(app, list(args))
            assert refused.exit_code == 1, (args, refused.output)
            assert refused.stderr.startswith(f"error: 'r1/run.json' is not a file (mode {mode}")
            assert refused.stderr.count("\n") == 1, refused.stderr
    assert (trained / "checkpoints" / "checkpoint_5.tar").is_file()
