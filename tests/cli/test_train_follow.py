"""`emote train --memory STORE --follow` as a user runs it beside collectors: a learner that
waits for enough episodes, takes in what another writer commits while it trains, publishes its
policy, resumes where its checkpoint pinned, and refuses bad input in one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import onnxruntime
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from typer.testing import CliRunner

from emote_cli.app import app
from emote_core.stores.zarr_store import MemoryStore, ShardWriter

FAST = (
    "--set", "memory.batch_size=16", "--set", "memory.follow_interval=5",
    "--set", "memory.follow_min_seconds=0", "--set", "eval.episodes=1",
    "--set", "eval.interval=0", "--set", "training.log_interval=20",
    "--set", "training.checkpoint_interval=1000", "--threads", "1",
)  # fmt: skip


def collect(runner: CliRunner, out: str, episodes: int, seed: int = 0) -> None:
    result = runner.invoke(app, ["collect", "sac_pendulum", "--out", out, "--episodes",
                                 str(episodes), "--seed", str(seed), "-q", "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output


def remote_collector(store: str, source: str, started: Path, batches: int) -> threading.Thread:
    """Another writer: once the learner has started training (its TensorBoard file exists), it
    commits the episodes of ``source`` to its own shard in ``batches`` commits."""
    episodes = list(MemoryStore(source).episodes())
    size = max(1, len(episodes) // batches)

    def run() -> None:
        deadline = time.monotonic() + 120
        while not any(started.glob("events.*")) and time.monotonic() < deadline:
            time.sleep(0.05)
        with ShardWriter(store, shard="remote") as writer:
            for k in range(0, len(episodes), size):
                writer.append(episodes[k : k + size])

    return threading.Thread(target=run, daemon=True)


def test_a_learner_waits_takes_in_what_another_writer_commits_and_publishes_its_policy(
    runner: CliRunner, in_tmp: Path
) -> None:
    collect(runner, "store.zarr", 1)  # 200 transitions: below the warm-up
    collect(runner, "more.zarr", 3, seed=7)
    writer = remote_collector("store.zarr", "more.zarr", in_tmp / "run" / "tensorboard", 3)
    writer.start()
    result = runner.invoke(app, [
        "train", "sac_pendulum", "--memory", "store.zarr", "--follow", "--no-live",
        "--steps", "120", "--run-dir", "run", "--json", "--publish-interval", "50",
        "--set", "memory.warmup_steps=400", *FAST,
    ])  # fmt: skip
    writer.join(60)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    followed = summary["follow"]
    assert followed["read"] == [{"main": 1, "remote": 3}]
    assert followed["ingested_episodes"] == 4 and followed["table_transitions"] == 800
    assert "waiting for episodes: the table holds 200 transitions" in result.stderr
    published = summary["published"]
    assert published["training_step"] == 120 and Path(published["path"]).name == "latest.onnx"
    session = onnxruntime.InferenceSession(published["path"])
    assert session.get_modelmeta().custom_metadata_map["training_step"] == "120"
    run = json.loads((in_tmp / "run" / "run.json").read_text())
    assert run["starts"][0]["follow"] is True
    events = EventAccumulator(str(in_tmp / "run" / "tensorboard"))
    events.Reload()
    scalars = events.Tags()["scalars"]
    for tag in ("data_age_s", "ingest_transitions_per_s", "ingested_transitions"):
        assert f"follow_bp_step/{tag}" in scalars, scalars
    ages = [e.value for e in events.Scalars("follow_bp_step/data_age_s")]
    assert all(0 <= age < 60 for age in ages)
    assert events.Scalars("follow_bp_step/ingested_transitions")[-1].value == 800


def test_a_following_run_resumed_reads_back_what_it_pinned_and_follows_on(
    runner: CliRunner, in_tmp: Path
) -> None:
    collect(runner, "store.zarr", 2)
    first = runner.invoke(app, [
        "train", "sac_pendulum", "--memory", "store.zarr", "--follow", "--no-live",
        "--steps", "20", "--run-dir", "run", "--json", "--publish-interval", "0", *FAST,
    ])  # fmt: skip
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout)["follow"]["read"] == [{"main": 2}]
    collect(runner, "more.zarr", 1, seed=3)
    with ShardWriter("store.zarr", shard="later") as writer:
        writer.append(list(MemoryStore("more.zarr").episodes()))

    resumed = runner.invoke(app, ["train", "--resume", "--run-dir", "run", "--no-live",
                                  "--steps", "30", "--json"])  # fmt: skip
    assert resumed.exit_code == 0, resumed.output
    followed = json.loads(resumed.stdout)["follow"]
    assert followed["read"] == [{"main": 2, "later": 1}]
    assert followed["table_episodes"] == 3 and followed["table_transitions"] == 600
    assert "as the checkpoint held them" in resumed.stderr


def test_follow_without_memory_is_a_usage_error(runner: CliRunner, in_tmp: Path) -> None:
    result = runner.invoke(app, ["train", "sac_pendulum", "--follow", "--no-live"])
    assert result.exit_code == 2
    assert "--follow follows the stores given with --memory" in result.stderr
    assert not (in_tmp / "runs").exists()


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_follow_on_a_path_that_is_not_a_store_is_one_line_exit_1(
    runner: CliRunner, in_tmp: Path, kind: str
) -> None:
    target = in_tmp / "notes"
    if kind == "file":
        target.write_text("hello")
    else:
        target.mkdir()
        (target / "data.csv").write_text("1,2\n")
    result = runner.invoke(app, ["train", "sac_pendulum", "--memory", str(target), "--follow",
                                 "--no-live", "--run-dir", "run"])  # fmt: skip
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: --follow:") and "not an emote memory store" in lines[-1]
    assert not (in_tmp / "run").exists()


def test_a_bad_follow_interval_is_refused(runner: CliRunner, in_tmp: Path) -> None:
    result = runner.invoke(app, ["train", "sac_pendulum", "--memory", "x.zarr", "--follow",
                                 "--set", "memory.follow_interval=0"])  # fmt: skip
    assert result.exit_code != 0
    assert "'memory.follow_interval' must be at least 1; got 0" in result.stderr


def test_ctrl_c_while_the_learner_waits_for_episodes_exits_130_at_once(
    runner: CliRunner, in_tmp: Path
) -> None:
    collect(runner, "store.zarr", 1)
    process = subprocess.Popen(
        [sys.executable, "-m", "emote_cli", "train", "sac_pendulum", "--memory", "store.zarr",
         "--follow", "--no-live", "--run-dir", "run", "--set", "memory.warmup_steps=100000",
         *FAST],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert process.stderr is not None
    errors: list[str] = []
    waiting = threading.Event()

    def read() -> None:
        for line in process.stderr:
            errors.append(line)
            if "waiting for episodes" in line:
                waiting.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert waiting.wait(timeout=120), errors
    assert any("waiting for episodes: the table holds 200" in e for e in errors), errors
    # Its warm-up never fills: only the signal can end the wait, so exit 130 is "at once".
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=60) == 130
    reader.join(timeout=30)
    assert "interrupted at update 0" in errors[-1]
