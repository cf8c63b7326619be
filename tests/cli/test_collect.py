"""What `emote collect` reports: progress, the steps committed and dropped, the store totals."""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emote_cli.app import app

# HitTheMiddle episodes are always 30 steps (cut by its time limit), so the counts are exact.
EPISODE = 30


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_collect_steps_says_what_it_committed_what_it_dropped_and_why(
    runner: CliRunner, in_tmp: Path
) -> None:
    result = runner.invoke(
        app, ["collect", "sac_hit_the_middle", "--out", "h.zarr", "--steps", "100", "--json"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["env_steps"] == 100
    assert (summary["episodes"], summary["transitions"]) == (3, 3 * EPISODE)
    assert summary["dropped_steps"] == 100 - 3 * EPISODE  # the fourth episode was still running
    assert summary["store_totals"] == {"episodes": 3, "transitions": 3 * EPISODE}
    progress = [line for line in result.stderr.splitlines() if line.startswith("collect ")]
    assert progress[0] == "collect env_step=0/100 (0%) episodes=0"
    assert progress[-1].startswith("collect env_step=100/100 (100%) eta=0:00 env_steps/s=")
    assert re.search(r" episodes=3 return=-[0-9.]+$", progress[-1])

    human = runner.invoke(
        app, ["collect", "sac_hit_the_middle", "--out", "h.zarr", "--steps", "45"]
    )
    assert human.exit_code == 0, human.output
    assert human.stdout.splitlines() == [
        f"committed 1 episodes ({EPISODE} transitions) of 45 env steps to h.zarr",
        "dropped 15 env steps: their episodes were still running when collection stopped, and a "
        "store keeps only whole episodes",
        f"h.zarr now holds 4 episodes ({4 * EPISODE} transitions)",
    ]


def test_every_collect_reports_the_stores_new_totals_over_all_shards(
    runner: CliRunner, in_tmp: Path
) -> None:
    first = ["collect", "sac_hit_the_middle", "--out", "h.zarr", "--episodes", "2", "--json"]
    assert json.loads(runner.invoke(app, first).stdout)["store_totals"] == {
        "episodes": 2,
        "transitions": 2 * EPISODE,
    }
    result = runner.invoke(
        app, ["collect", "sac_hit_the_middle", "--out", "h.zarr", "--episodes", "3", "--shard", "b"]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        f"committed 3 episodes ({3 * EPISODE} transitions) of {3 * EPISODE} env steps to h.zarr",
        f"h.zarr now holds 5 episodes ({5 * EPISODE} transitions)",
    ]
    progress = [line for line in result.stderr.splitlines() if line.startswith("collect ")]
    assert progress[0] == "collect episode=0/3 (0%) env_steps=0"
    assert progress[-1].startswith("collect episode=3/3 (100%) eta=0:00 episodes/s=")
    assert f"env_steps={3 * EPISODE}" in progress[-1]


def test_an_onnx_policy_that_is_a_pipe_or_a_device_is_refused_in_one_line(
    runner: CliRunner, in_tmp: Path
) -> None:
    os.mkfifo(in_tmp / "pipe.onnx")
    (in_tmp / "zero.onnx").symlink_to("/dev/zero")
    for name, mode in (("pipe.onnx", "p"), ("zero.onnx", "c")):
        for command in (
            ["collect", "sac_hit_the_middle", "--out", "h.zarr", "--episodes", "1", "--policy"],
            ["eval", "--episodes", "1"],
        ):
            result = runner.invoke(app, [*command, name, "--json"])
            assert result.exit_code == 1, result.output
            error = json.loads(result.stdout)["error"]
            assert error.startswith(f"'{name}' is not a file (mode {mode}"), error
            assert [line for line in result.stderr.splitlines() if line] == [f"error: {error}"]
    assert not (in_tmp / "h.zarr").exists()


def test_a_full_disk_names_the_store_and_the_episodes_it_keeps(
    runner: CliRunner, in_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from emote_core.stores.zarr_store.tables import StoreAppender

    first = runner.invoke(
        app, ["collect", "sac_hit_the_middle", "--out", "h.zarr", "--episodes", "2"]
    )
    assert first.exit_code == 0, first.output

    def disk_full(self: StoreAppender, episodes: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(StoreAppender, "append_batch", disk_full)
    result = runner.invoke(
        app,
        ["collect", "sac_hit_the_middle", "--out", "h.zarr", "--episodes", "3", "--shard", "b",
         "--json"],
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    error = json.loads(result.stdout)["error"]
    assert error == (
        "cannot write to store 'h.zarr': No space left on device (errno 28); it keeps the 2 "
        f"episodes ({2 * EPISODE} transitions) committed before, 0 of them from this collection "
        "— free space there (or write another store) and collect again"
    )
    assert [line for line in result.stderr.splitlines() if line.startswith("error")] == [
        f"error: {error}"
    ]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--steps", "10", "--envs", "64"],
         "--envs 64 is more than the 10 env steps of --steps: one step of every environment "
         "alone would pass it; lower --envs to at most 10"),
        (["--steps", "100", "--envs", "64", "--workers", "4"],
         "--envs 64 is more than the 25 env steps of each worker's share of --steps 100: one step "
         "of every environment alone would pass it; lower --envs to at most 25"),
        (["--episodes", "5", "--envs", "100000"],
         "--envs 100,000 is more than 4,096, the most environments one process steps together "
         "(one after another: more add memory, not speed); lower --envs (emote collect --workers "
         "N spreads collection over processes)"),
    ],
)  # fmt: skip
def test_more_environments_than_the_budget_or_one_process_takes_are_a_usage_error(
    runner: CliRunner, in_tmp: Path, options: list[str], message: str
) -> None:
    result = runner.invoke(
        app, ["collect", "sac_hit_the_middle", "--out", "s.zarr", *options, "--json"]
    )
    assert result.exit_code == 2, result.output
    assert json.loads(result.stdout) == {"error": message, "exit_code": 2}
    assert not (in_tmp / "s.zarr").exists()
