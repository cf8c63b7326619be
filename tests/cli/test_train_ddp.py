"""``torchrun -m emote_cli train`` and ``emote train --nproc-per-node 2``: two data-parallel ranks
on the CPU (gloo) train one run.

The ranks are real ``torchrun`` processes. Rank 1 writes nothing of its own, so the training runs
go through ``ddp_rank_dump.py``, which runs the real ``emote`` app in each rank and then saves what
that rank trained; the tests compare the ranks with each other and with rank 0's checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import torch
from typer.testing import CliRunner

from emote_cli.app import app

DUMP = Path(__file__).with_name("ddp_rank_dump.py")
ROOT = Path(__file__).parents[2]
TINY = [
    "--threads", "1", "--set", "memory.batch_size=32", "--set", "memory.warmup_steps=64",
    "--set", "training.checkpoint_interval=15", "--set", "eval.episodes=1", "--json",
]  # fmt: skip


def _environment() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "COLUMNS": "200", "EMOTE_DDP_TIMEOUT_S": "60"}
    env.pop("OMP_NUM_THREADS", None)  # so the launcher would log that it sets it
    return env


def _torchrun(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return subprocess.run(
        [*command, "--nproc-per-node", "2", *args], cwd=cwd, env=_environment(),
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip


def _emote(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "emote_cli", *args], cwd=cwd, env=_environment(),
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip


def _ranks(out: Path) -> list[dict[str, Any]]:
    return [torch.load(out / f"rank{rank}.pt", weights_only=True) for rank in range(2)]


def _assert_same(first: Any, second: Any, where: str = "") -> None:
    if isinstance(first, dict):
        assert first.keys() == second.keys(), where
        for key in first:
            _assert_same(first[key], second[key], f"{where}.{key}")
    elif isinstance(first, list | tuple):
        for k, (a, b) in enumerate(zip(first, second, strict=True)):
            _assert_same(a, b, f"{where}[{k}]")
    elif isinstance(first, torch.Tensor):
        assert torch.equal(first, second), f"{where} differs across ranks"
    else:
        assert first == second, where


def _assert_identical_weights(ranks: list[dict[str, Any]], checkpoint: Path) -> None:
    """Both ranks hold the same networks and optimiser moments, and so does the checkpoint."""
    _assert_same(ranks[0]["networks"], ranks[1]["networks"], "networks")
    _assert_same(ranks[0]["optimizers"], ranks[1]["optimizers"], "optimizers")
    saved = torch.load(checkpoint, weights_only=True)["callbacks"]
    for name in ("policy", "q1", "q2"):
        _assert_same(saved[name]["network_state_dict"], ranks[1]["networks"][name], name)
    _assert_same(saved["q_target"]["q1_target_state_dict"], ranks[1]["networks"]["targets.q1"])
    assert torch.equal(saved["alpha"]["ln_alpha"], ranks[1]["networks"]["ln_alpha"])


def _run_files(run: Path) -> list[str]:
    return sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file())


def test_two_ranks_train_one_run_and_resume_it(tmp_path: Path) -> None:
    out, run = tmp_path / "ranks", tmp_path / "run"
    out.mkdir()
    started = _torchrun(
        str(DUMP), str(out), "train", "sac_pendulum", "--steps", "30", "--run-dir", str(run),
        *TINY, cwd=tmp_path,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr[-3000:]
    summary = json.loads(started.stdout)  # rank 0's document, and nothing from rank 1
    assert (summary["ranks"], summary["steps"]) == (2, 30)
    assert started.stderr.count("training sac_pendulum on cpu") == 1
    first = _ranks(out)
    assert first[0]["bp_step"] == first[1]["bp_step"] == 30
    _assert_identical_weights(first, run / "checkpoints" / "checkpoint_30.tar")
    # Each rank samples its own batches: the replay tables' generators went separate ways.
    assert first[0]["table_random_state"] != first[1]["table_random_state"]
    # Rank 0 alone wrote the run: one TensorBoard file, each checkpoint once, one export shard.
    files = _run_files(run)
    assert len([f for f in files if f.startswith("tensorboard/")]) == 1
    checkpoints = sorted(f for f in files if f.startswith("checkpoints/checkpoint_"))
    assert checkpoints == ["checkpoints/checkpoint_15.tar", "checkpoints/checkpoint_30.tar"]
    shards = run / "memory_export" / "shards"
    assert sorted(p.name for p in shards.iterdir() if p.is_dir()) == ["main"]
    assert json.loads((run / "eval.json").read_text())["bp_step"] == 30

    resumed = _torchrun(
        str(DUMP), str(out), "train", "--resume", "--run-dir", str(run), "--steps", "45",
        "--threads", "1", "--json", cwd=tmp_path,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads(resumed.stdout)["steps"] == 45
    second = _ranks(out)
    assert second[0]["bp_step"] == second[1]["bp_step"] == 45
    _assert_identical_weights(second, run / "checkpoints" / "checkpoint_45.tar")
    assert second[0]["table_random_state"] != second[1]["table_random_state"]
    # The resume went on from the checkpoint: the weights moved since update 30.
    assert not torch.equal(
        first[0]["networks"]["policy"]["hidden.layers.0.weight"],
        second[0]["networks"]["policy"]["hidden.layers.0.weight"],
    )
    files = _run_files(run)
    assert len([f for f in files if f.startswith("tensorboard/")]) == 2  # one per part
    assert sorted(p.name for p in shards.iterdir() if p.is_dir()) == ["main", "resume-1"]


def test_a_failure_on_rank_zero_stops_every_rank(tmp_path: Path) -> None:
    """``python -m emote_cli`` is torchrun's module entry; rank 0 refuses a directory that is
    not a run, and rank 1, waiting for the run directory, stops too instead of hanging."""
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("not a run")
    result = _torchrun(
        "-m", "emote_cli", "train", "sac_pendulum", "--steps", "5", "--run-dir", str(taken),
        "--threads", "1", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 1
    # Rank 1's line: it stopped on hearing rank 0's error, not at a collective's timeout.
    assert "rank 0 could not start the run" in result.stderr
    assert sorted(p.name for p in taken.iterdir()) == ["notes.txt"]


def test_nproc_per_node_launches_the_ranks_itself(tmp_path: Path) -> None:
    """No torchrun: ``emote train --nproc-per-node 2`` runs two ranks of the same command (its
    repeated ``--set`` included), rank 0 prints the one JSON document, the launcher stays quiet."""
    run = tmp_path / "run"
    result = _emote(
        "train", "sac_hit_the_middle", "--nproc-per-node", "2", "--steps", "20", "--run-dir",
        str(run), *TINY, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert (summary["ranks"], summary["steps"], summary["run_dir"]) == (2, 20, str(run))
    assert summary["checkpoint"] == str(run / "checkpoints" / "checkpoint_20.tar")
    assert (run / "checkpoints" / "checkpoint_15.tar").is_file()  # the --set reached the ranks
    assert result.stderr.count("training sac_hit_the_middle on cpu") == 1
    assert "OMP_NUM_THREADS" not in result.stderr  # torch's launcher logs nothing


def test_ctrl_c_of_nproc_per_node_saves_and_exits_130_without_a_traceback(tmp_path: Path) -> None:
    """A terminal's Ctrl-C reaches the whole process group; the launcher passes it on to the
    ranks, which stop after the same update and save, and the command exits 130. (Plain
    torchrun, whose own process turns the Ctrl-C into an exception, prints a traceback and exits
    1 here.)"""
    run = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-m", "emote_cli", "train", "sac_hit_the_middle", "--nproc-per-node", "2",
         "--steps", "100000", "--run-dir", str(run), *TINY],
        cwd=tmp_path, env=_environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    assert process.stdout is not None and process.stderr is not None
    errors: list[str] = []
    seen = threading.Event()  # the first checkpoint, or the end of stderr

    def read_errors(stream: Any) -> None:
        for line in stream:
            errors.append(line)
            if "checkpoint_15.tar" in line:  # both ranks are in their updates
                seen.set()
        seen.set()

    reader = threading.Thread(target=read_errors, args=(process.stderr,), daemon=True)
    reader.start()
    try:
        seen.wait(timeout=180)
        assert any("checkpoint_15.tar" in line for line in errors), "".join(errors)[-3000:]
        os.killpg(process.pid, signal.SIGINT)
        document = json.loads(process.stdout.read())
        assert process.wait(timeout=120) == 130
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    reader.join(timeout=60)
    stderr = "".join(errors)
    assert "Traceback" not in stderr and "SignalException" not in stderr
    assert document["ranks"] == 2 and document["interrupted"] is True
    assert document["exit_code"] == 130
    update = document["steps"]
    assert update >= 15 and (run / "checkpoints" / f"checkpoint_{update}.tar").is_file()
    assert f"error: interrupted at update {update}; resume with: emote train --resume" in stderr


def test_a_rank_that_fails_gives_its_exit_code(tmp_path: Path) -> None:
    """A usage error in the ranks' command ends the launch with rank 0's status, 2, whichever
    rank ends first (rank 1 stops with 1 when rank 0 cannot start the run; torchrun says 1),
    with rank 0's one line and its JSON document."""
    result = _emote(
        "train", "sac_hit_the_middle", "--nproc-per-node", "2", "--set", "nosuch=1", "--json",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-3000:]
    assert json.loads(result.stdout)["exit_code"] == 2
    assert "Traceback" not in result.stderr
    assert "error: --set nosuch=1: unknown key 'nosuch'" in result.stderr


def test_nproc_per_node_under_torchrun_is_a_usage_error(tmp_path: Path) -> None:
    runner = CliRunner(env={"COLUMNS": "200", "LOCAL_RANK": "0"})
    result = runner.invoke(
        app, ["train", "sac_hit_the_middle", "--nproc-per-node", "2", "--run-dir",
              str(tmp_path / "run"), "--json"],
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    document = json.loads(result.stdout)
    assert document["exit_code"] == 2
    assert "--nproc-per-node 2 under torchrun (LOCAL_RANK=0)" in document["error"]
    assert not (tmp_path / "run").exists()
