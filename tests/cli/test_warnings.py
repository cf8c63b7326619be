"""Library warnings reach the terminal as one ``warning: ...`` line, never as Python's raw
``file.py:123: Category: message`` dump."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from emote_cli._common import DebugOption, QuietOption, handle_errors, setup_logging
from emote_cli.app import app

demo = typer.Typer()


@demo.callback()
def _root() -> None:
    pass


@demo.command()
def warn(times: int = 2, quiet: QuietOption = False, debug: DebugOption = False) -> None:
    setup_logging(quiet=quiet, debug=debug)
    with handle_errors(debug=debug):
        for _ in range(times):  # as a library that forces "always" would, every step
            warnings.warn(
                "\x1b[33mWARN: The obs returned by `step()` is not within the observation space."
                "\n  Check your env.\x1b[0m",
                UserWarning,
                stacklevel=1,
            )


def test_a_warning_raised_in_a_command_is_one_clean_line_once(runner: CliRunner) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        result = runner.invoke(demo, ["warn", "--times", "3"])
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [
        "warning: The obs returned by `step()` is not within the observation space. "
        "Check your env. (UserWarning from test_warnings.py)"
    ]
    assert result.stdout == ""


def test_debug_names_where_a_warning_was_raised_and_quiet_still_shows_it(
    runner: CliRunner,
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        debug = runner.invoke(demo, ["warn", "--debug"])
        quiet = runner.invoke(demo, ["warn", "--quiet"])
    assert f"at {Path(__file__)}:" in debug.stderr
    assert len(quiet.stderr.splitlines()) == 1 and quiet.stderr.startswith("warning: ")


def test_gymnasium_s_deprecation_warning_during_training_is_one_line(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["train", "dqn_cartpole", "--set", "env.id=CartPole-v0", "--steps", "2", "--set",
            "memory.warmup_steps=32", "--set", "memory.batch_size=8", "--run-dir", "r"]  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    warned = [line for line in result.stderr.splitlines() if "CartPole-v0 is out of date" in line]
    assert warned == [
        "warning: The environment CartPole-v0 is out of date. You should consider upgrading to "
        "version `v1`. (DeprecationWarning from gymnasium)"
    ]
    assert "\x1b[" not in result.stderr
    assert "registration.py" not in result.stderr and "logger.deprecation" not in result.stderr
