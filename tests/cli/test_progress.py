"""The progress display of long commands: plain lines, the live Rich display, --quiet."""

from __future__ import annotations

import io
import re
import sys

import pytest
from rich.console import Console

from emote_cli.progress import (
    LINE_WIDTH,
    ProgressDisplay,
    episode_progress,
    fit_line,
    format_duration,
    training_sink,
)
from emote_core.callbacks.progress import ProgressSnapshot, TrainingPhase

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _plain(buffer: io.StringIO, **kwargs: object) -> ProgressDisplay:
    console = Console(file=buffer, force_terminal=False, width=80)
    return ProgressDisplay("train", "update", console=console, **kwargs)  # type: ignore[arg-type]


def _snapshot(**changes: object) -> ProgressSnapshot:
    values: dict[str, object] = {
        "phase": TrainingPhase.TRAINING,
        "bp_step": 123_456,
        "total": 1_000_000,
        "elapsed_seconds": 1_000.0,
        "updates_per_second": 123.4,
        "env_steps": 987_654,
        "env_steps_per_second": 432.0,
        "eta_seconds": 7_081.0,
        "episode_return": -173.25,
        "losses": {f"loss/q{i}": 0.001234 * i for i in range(1, 9)},
    }
    values.update(changes)
    return ProgressSnapshot(**values)  # type: ignore[arg-type]


def test_a_plain_training_line_fits_120_columns_and_cuts_only_the_tail() -> None:
    buffer = io.StringIO()
    with _plain(buffer) as display:
        training_sink(display)(_snapshot())
    (line,) = buffer.getvalue().splitlines()
    assert len(line) <= LINE_WIDTH
    assert line.startswith(
        "train update=123456/1000000 (12%) eta=1:58:01 updates/s=123 env_steps/s=432 "
        "env_steps=987654 return=-173"
    )
    assert "loss/q1=0.00123" in line  # the first loss fits...
    assert "loss/q2" not in line  # ...the next ones are cut, never the head


def test_plain_lines_come_at_most_every_interval_but_the_first_and_forced_ones_always() -> None:
    buffer = io.StringIO()
    with _plain(buffer, plain_interval=3600.0) as display:
        display.update(1, 10)
        display.update(2, 10)  # a moment later: skipped
        display.update(10, 10, force=True)
    lines = buffer.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == ["update=1/10", "update=10/10"]
    assert "updates/s=" in lines[1]  # measured by the display itself between the two


def test_plain_output_has_no_status_line_and_quiet_shows_nothing() -> None:
    buffer = io.StringIO()
    with _plain(buffer) as display:
        display.status("loading recipe")
    assert buffer.getvalue() == ""

    buffer = io.StringIO()
    with ProgressDisplay("eval", "episode", quiet=True, console=Console(file=buffer)) as quiet:
        quiet.status("loading")
        episode_progress(quiet, 2)([1.0, 2.0])
    assert buffer.getvalue() == ""


def test_the_starting_snapshot_is_shown_as_such() -> None:
    buffer = io.StringIO()
    starting = _snapshot(
        phase=TrainingPhase.STARTING,
        bp_step=0,
        total=300,
        updates_per_second=None,
        env_steps=None,
        env_steps_per_second=None,
        eta_seconds=None,
        episode_return=None,
        losses={},
    )
    with _plain(buffer) as display:
        training_sink(display)(starting)
    assert buffer.getvalue() == "train update=0/300 (0%) starting\n"


def test_on_a_terminal_the_display_is_live_two_lines_and_leaves_stdout_alone() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=LINE_WIDTH, color_system=None)
    stdout = sys.stdout
    with ProgressDisplay("train", "update", console=console) as display:
        display.status("loading sac_pendulum")
        assert display.live
        assert sys.stdout is stdout  # a --json document on stdout must not land in the display
        console.print("a log line")
        training_sink(display)(_snapshot(bp_step=500, total=1000))
    assert not display.live
    text = ANSI.sub("", buffer.getvalue())
    assert "train: loading sac_pendulum" in text and "a log line" in text
    lines = [line for chunk in text.split("\r") for line in chunk.split("\n")]
    assert all(len(line) <= LINE_WIDTH for line in lines)
    count = next(line for line in lines if "500/1000" in line)
    assert "eta 1:58:01" in count and "123 updates/s" in count
    metrics = lines[lines.index(count) + 1]
    assert metrics.strip().startswith("env steps 987654  return -173  loss/q1 0.00123  loss/q2")


def test_eval_progress_shows_episodes_and_the_mean_return_so_far() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=False)
    with ProgressDisplay("eval", "episode", console=console, plain_interval=0.0) as display:
        show = episode_progress(display, 3)
        for returns in ([1.0], [1.0, 2.0], [1.0, 2.0, 6.0]):
            show(returns)
    lines = buffer.getvalue().splitlines()
    assert lines[0] == "eval episode=1/3 (33%) mean_return=1"
    assert lines[-1].startswith("eval episode=3/3 (100%) eta=0:00 episodes/s=")
    assert lines[-1].endswith("mean_return=3")


@pytest.mark.parametrize(
    ("seconds", "shown"), [(None, "?"), (0.4, "0:00"), (75, "1:15"), (3_725, "1:02:05")]
)
def test_durations_read_like_a_clock(seconds: float | None, shown: str) -> None:
    assert format_duration(seconds) == shown


def test_fit_line_cuts_a_first_token_that_is_too_wide() -> None:
    assert fit_line(["x" * 200, "y"]) == "x" * LINE_WIDTH
    assert fit_line(["a", "b" * LINE_WIDTH]) == "a"
    assert fit_line([]) == ""
