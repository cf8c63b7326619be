"""What `emote train` shows while it runs and says when it ends: progress, what to run next,
the run directory under --quiet, and life on a terminal before the heavy imports."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from tensorboard.backend.event_processing import event_accumulator as ea
from typer.testing import CliRunner

from emote_cli.app import app
from emote_cli.progress import LINE_WIDTH

FAST = ("--set", "memory.warmup_steps=64", "--threads", "1")


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_train_shows_progress_lines_and_ends_with_what_to_run_next(
    runner: CliRunner, in_tmp: Path, restore_torch_threads: None
) -> None:
    result = runner.invoke(
        app,
        ["train", "sac_hit_the_middle", "--steps", "40", "--run-dir", "r", *FAST,
         "--set", "training.log_interval=10"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output

    progress = [line for line in result.stderr.splitlines() if line.startswith("train ")]
    assert progress[0] == "train update=0/40 (0%) starting"  # before warm-up, not after a log
    assert progress[-1].startswith("train update=40/40 (100%) eta=0:00 updates/s=")
    for shown in ("env_steps/s=", "env_steps=", "return=", "loss/q1="):
        assert shown in progress[-1]
    # Stderr is not a terminal here: plain lines, no escape codes, none wider than 120 columns,
    # and no TerminalLogger line of every metric at each log interval.
    assert "\x1b[" not in result.stderr
    assert all(len(line) <= LINE_WIDTH for line in result.stderr.splitlines())
    assert "bp_step 10 |" not in result.stderr

    done, suggestion = result.stdout.splitlines()
    assert re.fullmatch(
        r"done: 40 updates in [0-9.]+ s; checkpoint r/checkpoints/checkpoint_40\.tar", done
    )
    assert suggestion == "next: emote eval r"

    # TensorBoard still gets every metric, at every log interval.
    events = ea.EventAccumulator(str(in_tmp / "r" / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"loss_bp_step/q1", "loss_bp_step/policy", "training_bp_step/alpha",
            "training_bp_step/q_target", "episode_bp_step/reward"} <= tags  # fmt: skip
    assert [event.step for event in events.Scalars("loss_bp_step/q1")] == [10, 20, 30, 40]

    # The command it suggests works, and shows its own progress one episode at a time.
    suggested = suggestion.removeprefix("next: emote ").split()
    # 40 updates do not reach the recipe's [eval] min_return (exit 3); judge by another.
    evaluated = runner.invoke(app, [*suggested, "--episodes", "2", "--min-return", "-100"])
    assert evaluated.exit_code == 0, evaluated.output
    assert "eval episode=1/2 (50%) mean_return=" in evaluated.stderr
    assert "eval episode=2/2 (100%)" in evaluated.stderr
    assert "2 episodes of emote/HitTheMiddle-v0" in evaluated.stdout


def test_quiet_train_prints_the_run_directory_alone_on_stdout(
    runner: CliRunner, in_tmp: Path, restore_torch_threads: None
) -> None:
    result = runner.invoke(
        app, ["train", "sac_hit_the_middle", "--steps", "5", "--run-dir", "runs/a b", *FAST, "-q"]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == "runs/a b\n"  # run=$(emote train RECIPE -q) && emote eval "$run"
    assert result.stderr == ""


def test_a_cuda_graph_recipe_trains_eagerly_on_a_cpu_with_one_warning_and_resumes(
    runner: CliRunner, in_tmp: Path, restore_torch_threads: None
) -> None:
    graphs = ("--set", "training.compile=cuda_graphs", "--set", "memory.batches_per_sample=4")
    result = runner.invoke(
        app, ["train", "sac_hit_the_middle", "--steps", "20", "--run-dir", "r", "--device",
              "cpu", *FAST, *graphs],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: training.compile = 'cuda_graphs': CUDA graphs need a CUDA device and training "
        "is on cpu; training with 'none' instead"
    ]
    resumed = runner.invoke(
        app, ["train", "--resume", "--run-dir", "r", "--steps", "30", "--device", "cpu", *FAST[2:],
              "--set", "training.compile=none"],
    )  # fmt: skip
    assert resumed.exit_code == 0, resumed.output
    starts = json.loads((in_tmp / "r" / "run.json").read_text())["starts"]
    assert starts[-1]["changes"] == {"training.compile": ["cuda_graphs", "none"]}
    refused = runner.invoke(
        app, ["train", "--resume", "--run-dir", "r", "--steps", "40", "--device", "cpu",
              "--set", "memory.batches_per_sample=8"],
    )  # fmt: skip
    assert refused.exit_code != 0 and "memory.batches_per_sample" in refused.output


def test_on_a_terminal_train_shows_life_before_it_imports_torch(in_tmp: Path) -> None:
    # `-X importtime` writes a line as each module is imported, to the same terminal as the
    # progress display: the display must be there before torch (seconds of importing) is.
    leader, terminal = pty.openpty()
    environment = {k: v for k, v in os.environ.items() if k not in ("TTY_INTERACTIVE", "NO_COLOR")}
    process = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "emote_cli", "train", "sac_hit_the_middle",
         "--steps", "2", "--run-dir", "r", *FAST],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=terminal,
        env={**environment, "TERM": "xterm", "COLUMNS": "120"},
    )  # fmt: skip
    os.close(terminal)
    output = bytearray()
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 1.0)
        if not ready:
            if process.poll() is not None:
                break
            continue
        try:
            chunk = os.read(leader, 1 << 16)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        output += chunk
    os.close(leader)
    assert process.wait(timeout=60) == 0
    text = output.decode(errors="replace")
    life = text.find("train: loading sac_hit_the_middle")
    torch = re.search(r"\|\s+torch\s*$", text, re.MULTILINE)
    assert life != -1, text[-2000:]
    assert torch is not None
    assert life < torch.start()
    assert "2/2" in text  # the live display counted the updates too


def test_ctrl_c_says_at_which_update_it_stopped_and_how_to_resume(in_tmp: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "emote_cli", "train", "sac_hit_the_middle", "--steps", "100000",
         "--run-dir", "my runs/a", *FAST, "--set", "training.checkpoint_interval=20", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert process.stderr is not None and process.stdout is not None
    errors: list[str] = []
    started, checkpointed = threading.Event(), threading.Event()

    def read() -> None:
        for line in process.stderr:
            errors.append(line)
            if "starting" in line:
                started.set()
            if "wrote checkpoint" in line:
                checkpointed.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert started.wait(timeout=120), errors
    assert "train update=0/100000 (0%) starting\n" in errors, errors  # it has shown progress
    assert checkpointed.wait(timeout=120), errors  # it has trained a little: a checkpoint is out
    checkpoints = in_tmp / "my runs" / "a" / "checkpoints"
    assert any(checkpoints.glob("checkpoint_*.tar")), errors
    process.send_signal(signal.SIGINT)
    document = json.loads(process.stdout.read())
    assert process.wait(timeout=120) == 130
    reader.join(timeout=60)

    # The newest checkpoint is the one written where it stopped.
    written = checkpoints.glob("checkpoint_*.tar")
    update = max(int(path.stem.removeprefix("checkpoint_")) for path in written)
    assert update >= 20
    message = (
        f"interrupted at update {update}; resume with: emote train --resume --run-dir 'my runs/a'"
    )
    assert errors[-1] == f"error: {message}\n"
    # --json: the summary is the one document, and it carries the error too.
    assert document["interrupted"] is True and document["steps"] == update
    assert document["evaluation"] is None  # an interrupted run is evaluated later, by emote eval
    assert (document["error"], document["exit_code"]) == (message, 130)


def test_json_summary_carries_the_final_evaluation_and_stderr_says_each_thing_once(
    runner: CliRunner, in_tmp: Path, restore_torch_threads: None
) -> None:
    quick_eval = ("--set", "eval.interval=10", "--set", "eval.episodes=2",
                  "--set", "eval.min_return=-1000")  # fmt: skip
    result = runner.invoke(
        app, ["train", "sac_hit_the_middle", "--steps", "40", "--run-dir", "r", *FAST,
              *quick_eval, "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    report = json.loads((in_tmp / "r" / "eval.json").read_text())
    assert document["evaluation"] == {
        "bp_step": 40, "episodes": 2, "mean_return": report["mean_return"],
        "std_return": report["std_return"], "lowest_return": report["lowest_return"],
        "highest_return": report["highest_return"], "deterministic": True,
        "threshold": -1000.0, "passed": True,
    }  # fmt: skip
    assert (document["steps"], document["updates"]) == (40, 40)

    lines = result.stderr.splitlines()
    # Reaching --steps is how every run ends: nothing to say about it.
    assert not [line for line in lines if "asked training to stop" in line]
    # Each evaluation that beats the best and the final checkpoint export the memory; the user
    # hears of it once, at the end.
    evaluations = [k for k, line in enumerate(lines) if line.startswith("info: evaluation at")]
    exported = [k for k, line in enumerate(lines) if line.startswith("info: exported ")]
    assert len(evaluations) == 4 and len(exported) == 1, result.stderr
    assert exported[0] > evaluations[-1]
    assert re.fullmatch(
        r"info: exported \d+ episodes of memory 'memory' to r/memory_export", lines[exported[0]]
    )
    stored = json.loads(runner.invoke(app, ["memory", "inspect", "r/memory_export", "--json"])
                        .stdout)  # fmt: skip
    told = int(lines[exported[0]].split()[2])
    assert told == stored["episodes"] > 0


def test_a_resume_says_how_many_updates_it_did_and_where_the_run_stands(
    runner: CliRunner, in_tmp: Path, restore_torch_threads: None
) -> None:
    first = runner.invoke(app, ["train", "sac_hit_the_middle", "--steps", "20", "--run-dir", "r",
                                *FAST])  # fmt: skip
    assert first.exit_code == 0, first.output
    resumed = runner.invoke(
        app, ["train", "--resume", "--run-dir", "r", "--steps", "30", *FAST[2:]]
    )
    assert resumed.exit_code == 0, resumed.output
    done = resumed.stdout.splitlines()[0]
    assert re.fullmatch(
        r"done: 10 updates \(30 in all\) in [0-9.]+ s; checkpoint r/checkpoints/checkpoint_30\.tar",
        done,
    )
    again = runner.invoke(
        app, ["train", "--resume", "--run-dir", "r", "--steps", "35", *FAST[2:], "--json"]
    )
    assert again.exit_code == 0, again.output
    document = json.loads(again.stdout)
    assert (document["steps"], document["updates"]) == (35, 5)


def test_a_run_whose_env_was_overridden_is_named_after_that_env(
    runner: CliRunner, in_tmp: Path, restore_torch_threads: None
) -> None:
    small = ("--set", "memory.batch_size=8", "--set", "eval.episodes=1")
    result = runner.invoke(
        app, ["train", "sac_hit_the_middle", "--steps", "1", *FAST, *small,
              "--set", "env.id=Pendulum-v1", "-q"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    run = Path(result.stdout.strip())
    assert run.parent == Path("runs") and run.is_dir()
    assert re.fullmatch(r"sac_hit_the_middle-Pendulum-v1-\d{8}-\d{6}", run.name)
    # The recipe's own env keeps the plain name.
    same = runner.invoke(
        app, ["train", "sac_hit_the_middle", "--steps", "1", *FAST, *small,
              "--set", "env.id=emote/HitTheMiddle-v0", "-q"],
    )  # fmt: skip
    assert same.exit_code == 0, same.output
    assert re.fullmatch(r"runs/sac_hit_the_middle-\d{8}-\d{6}", same.stdout.strip())


def test_networks_too_large_for_the_machine_are_one_line_before_the_run_starts(
    runner: CliRunner, in_tmp: Path
) -> None:
    result = runner.invoke(
        app, ["train", "sac_hit_the_middle", "--run-dir", "r", "--set",
              "sac.hidden_dims=[1000000, 1000000]"],
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(
        "error: training the networks of sac.hidden_dims = [1000000, 1000000] needs about "
    )
    assert re.search(r"\(5,000,030,000,006 parameters, each held as weights, gradients", line)
    assert line.endswith(" GiB of RAM available; lower sac.hidden_dims")
    assert not (in_tmp / "r").exists()


def test_an_absurd_number_of_environments_is_refused_before_any_is_made(
    runner: CliRunner, in_tmp: Path
) -> None:
    result = runner.invoke(
        app, ["train", "sac_hit_the_middle", "--steps", "200", "--run-dir", "r", "--set",
              "env.num_envs=100000"],
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith(
        "error: --set env.num_envs=100000: env.num_envs = 100,000 is more than 4,096, the most "
        "environments one process steps together"
    )
    assert not (in_tmp / "r").exists()
