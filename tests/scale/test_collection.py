"""Collection on Ray workers: one store from many shards, deaths and restarts, one writer per
shard. One local Ray instance serves the whole module (starting one costs seconds)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from typer.testing import CliRunner

from emote_cli.app import app
from emote_core.assembly import published_policy
from emote_core.errors import ConfigurationError, FormatError
from emote_core.recipes import load_recipe
from emote_core.scale.collection import RayCollection, ScaleProgress
from emote_core.scale.workers import CollectorWorker, WorkerTask, split_budget, worker_seed

EPISODE = 30  # HitTheMiddle episodes are always 30 steps


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    path = os.pathsep.join(entry for entry in sys.path if entry)
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
    )
    yield
    ray.shutdown()


def verify(runner: CliRunner, store: Path) -> dict[str, Any]:
    result = runner.invoke(app, ["memory", "verify", str(store), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_seeds_and_budgets_are_split_reproducibly() -> None:
    assert split_budget(10, 3) == [4, 3, 3] and split_budget(1, 2) == [1, 0]
    seeds = {worker_seed(7, worker, restart) for worker in range(4) for restart in range(3)}
    assert len(seeds) == 12  # distinct per worker and restart
    assert worker_seed(7, 1, 0) == worker_seed(7, 1, 0) != worker_seed(8, 1, 0)


def test_two_workers_write_one_store_that_verifies(
    local_ray: None, runner: CliRunner, tmp_path: Path
) -> None:
    store = tmp_path / "h.zarr"
    result = runner.invoke(
        app,
        ["collect", "sac_hit_the_middle", "--out", str(store), "--episodes", "9", "--workers", "2",
         "--seed", "3", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    workers = summary["workers"]
    assert [(local(summary, w["shard"]), w["status"]) for w in workers] == [
        ("w0", "finished"), ("w1", "finished")
    ]  # fmt: skip
    assert [w["episodes"] for w in workers] == [5, 4]  # the budget split
    assert workers[0]["seed"] != workers[1]["seed"]
    assert summary["episodes"] == 9 == sum(w["episodes"] for w in workers)
    assert summary["store_totals"] == {"episodes": 9, "transitions": 9 * EPISODE}
    assert summary["deaths"] == [] and summary["lost_workers"] == []
    checked = verify(runner, store)
    assert checked["episodes"] == 9


def local(summary: dict[str, Any], shard: str | None) -> str | None:
    """A shard's name without the command's random session prefix (``w0``, ``w0-r1``)."""
    if shard is None:
        return None
    prefix = f"{summary['session']}-"
    assert shard.startswith(prefix), (shard, prefix)
    return shard.removeprefix(prefix)


@pytest.mark.slow  # about a minute: two commands' workers share the module's two CPUs
def test_two_commands_writing_one_store_at_once_each_count_only_their_own_shards(
    local_ray: None, runner: CliRunner, tmp_path: Path
) -> None:
    store = tmp_path / "h.zarr"
    recipe = load_recipe("sac_hit_the_middle")
    # One worker each: the module's local Ray has a CPU for two actors.
    first = RayCollection(recipe, str(store), workers=1, episodes=10**6, flush_seconds=0.1)
    done = threading.Event()
    first.should_stop = done.is_set  # type: ignore[method-assign]
    running: list[dict[str, Any]] = []
    thread = threading.Thread(target=lambda: running.append(first.run()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not first.totals().committed_episodes and time.monotonic() < deadline:
        time.sleep(0.1)  # the first command's workers hold their shards and commit
    second = RayCollection(recipe, str(store), workers=1, episodes=6).run()
    done.set()
    thread.join(60)
    assert second["deaths"] == [] and second["lost_workers"] == []
    assert second["episodes"] == 6 == sum(w["episodes"] for w in second["workers"])
    [summary] = running
    assert summary["deaths"] == [] and summary["session"] != second["session"]
    mine = {w["shard"] for w in second["workers"]}
    assert not mine & {w["shard"] for w in summary["workers"]}
    assert verify(runner, store)["episodes"] == summary["episodes"] + 6


def _killer(collection: RayCollection, how: str, *, after_commit: bool) -> list[int]:
    """Wraps ``collection.totals`` (called at every poll) to kill worker 0's first run at the
    first poll (or once it has committed something: ``after_commit``); returns what it had
    committed then, once killed."""
    original = collection.totals
    killed: list[int] = []

    def totals() -> ScaleProgress:
        first = collection.runs[0]
        progress = first.progress
        committed = progress.committed_episodes if progress is not None else 0
        if not killed and first.status == "running" and (committed or not after_commit):
            if how == "sigkill":
                pid = ray.get(first.actor.pid.remote())
                os.kill(pid, signal.SIGKILL)
            else:
                ray.kill(first.actor)
            killed.append(committed)
        return original()

    collection.totals = totals  # type: ignore[method-assign]
    return killed


def test_a_killed_worker_loses_only_its_tail_and_restarts_on_a_new_shard(
    local_ray: None, runner: CliRunner, tmp_path: Path
) -> None:
    store = tmp_path / "h.zarr"
    recipe = load_recipe("sac_hit_the_middle", ["seed=5"])
    collection = RayCollection(  # 3,000 episodes a worker: ~2 s, several of the driver's polls
        recipe, str(store), workers=2, episodes=6_000, restart_delay=0.2, flush_seconds=0.1
    )
    killed = _killer(collection, "sigkill", after_commit=True)
    collection.on_progress = lambda progress: None  # totals() runs at every poll
    summary = collection.run()
    assert killed, "worker 0 finished before it could be killed"
    death = summary["deaths"][0]
    assert (death["worker"], local(summary, death["shard"]), death["status"]) == (0, "w0", "died")
    assert local(summary, death["restarted_as"]) == "w0-r1" and summary["restarts"] == 1
    shards = {local(summary, w["shard"]): w for w in summary["workers"]}
    assert set(shards) == {"w0", "w1", "w0-r1"}
    assert shards["w0"]["episodes"] >= killed[0]  # what it committed before dying stays
    assert shards["w0-r1"]["status"] == "finished" and shards["w1"]["status"] == "finished"
    # The restart collected what w0 had not committed: the budget is met in committed episodes.
    assert shards["w0"]["episodes"] + shards["w0-r1"]["episodes"] == 3_000
    assert summary["episodes"] == 6_000 == summary["store_totals"]["episodes"]
    assert summary["lost_workers"] == []
    assert verify(runner, store)["episodes"] == 6_000


def test_a_dead_workers_env_steps_cover_what_it_committed_after_its_last_report(
    local_ray: None, tmp_path: Path
) -> None:
    """The driver polls progress four times a second; a worker may commit and die between two
    polls. Its last report is made that old here: killed, and its report wound back to zero."""
    collection = RayCollection(load_recipe("sac_hit_the_middle"), str(tmp_path / "h.zarr"),
                               workers=1, episodes=10**6, max_restarts=0,
                               flush_seconds=0.1)  # fmt: skip
    collection.on_progress = lambda progress: None
    original = collection.totals
    killed: list[int] = []

    def totals() -> ScaleProgress:
        run = collection.runs[0]
        if not killed and run.progress is not None and run.progress.committed_episodes:
            os.kill(ray.get(run.actor.pid.remote()), signal.SIGKILL)
            killed.append(run.progress.committed_episodes)
            run.progress = dataclasses.replace(run.progress, env_steps=0)
        return original()

    collection.totals = totals  # type: ignore[method-assign]
    summary = collection.run()
    [entry] = summary["workers"]
    assert entry["status"] == "died" and entry["episodes"] >= killed[0] > 0
    assert entry["env_steps"] == entry["transitions"] == EPISODE * entry["episodes"]
    assert summary["dropped_steps"] == 0


def test_without_restarts_a_killed_worker_is_lost_and_the_command_fails(
    local_ray: None, runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    killed: list[list[int]] = []
    original = RayCollection.run

    def run_with_kill(self: RayCollection) -> dict[str, Any]:
        killed.append(_killer(self, "ray.kill", after_commit=False))
        return original(self)

    monkeypatch.setattr(RayCollection, "run", run_with_kill)
    store = tmp_path / "h.zarr"
    result = runner.invoke(
        app,
        ["collect", "sac_hit_the_middle", "--out", str(store), "--episodes", "400",
         "--workers", "2", "--max-restarts", "0", "--json"],
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    summary = json.loads(result.stdout)
    assert killed[0] == [0]  # killed at the first poll, before it finished
    assert summary["lost_workers"] == [0]
    assert [(d["worker"], d["restarted_as"]) for d in summary["deaths"]] == [(0, None)]
    [error] = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert error.startswith("error: 1 of 2 workers lost for good (worker 0")
    assert summary["store_totals"]["episodes"] == summary["episodes"]
    verify(runner, store)


def test_the_driver_and_the_lease_refuse_two_writers_on_one_shard(
    local_ray: None, tmp_path: Path
) -> None:
    store = str(tmp_path / "h.zarr")
    recipe = load_recipe("sac_hit_the_middle")
    collection = RayCollection(recipe, store, workers=1, episodes=1)
    task = WorkerTask(worker=0, restart=0, shard="same", seed=1, episodes=None, steps=10**8)
    collection._shards.add(task.shard)
    with pytest.raises(ConfigurationError, match="shard 'same' was already given"):
        collection.start_run(task)

    # Past the driver, the shard's lease refuses the second writer.
    remote = ray.remote(num_cpus=1, max_concurrency=3)(CollectorWorker)
    options = {"policy": "random", "num_envs": None, "device": "cpu", "follow_policy": False,
               "command": ["test"]}  # fmt: skip
    first = remote.remote(recipe, store, task, **options)
    first_run = first.run.remote()
    deadline = time.monotonic() + 60
    while ray.get(first.progress.remote()) is None:  # it holds the lease once it steps
        assert time.monotonic() < deadline, "the first writer never started"
        time.sleep(0.1)
    second = remote.remote(recipe, store, task, **options)
    with pytest.raises(ray.exceptions.RayTaskError, match="being written by"):
        ray.get(second.run.remote(), timeout=60)
    first.stop.remote()
    assert ray.get(first_run, timeout=60)["interrupted"] is True


def test_stopping_every_worker_commits_what_finished(
    local_ray: None, runner: CliRunner, tmp_path: Path
) -> None:
    store = tmp_path / "h.zarr"
    collection = RayCollection(
        load_recipe("sac_hit_the_middle"), str(store), workers=2, steps=10**9, flush_seconds=0.1
    )
    collection.on_progress = lambda progress: None
    deadline = time.monotonic() + 90  # the assertions below say what did not happen
    collection.should_stop = lambda: (
        time.monotonic() > deadline
        or all(  # type: ignore[method-assign]
            run.progress is not None and run.progress.committed_episodes for run in collection.runs
        )
    )
    summary = collection.run()  # what a Ctrl-C of `emote collect --workers` does, too
    assert summary["interrupted"] is True
    assert [w["status"] for w in summary["workers"]] == ["stopped", "stopped"]
    assert all(w["episodes"] > 0 for w in summary["workers"])
    assert summary["deaths"] == [] and summary["lost_workers"] == []
    assert summary["store_totals"]["episodes"] == summary["episodes"]
    assert verify(runner, store)["episodes"] == summary["episodes"]


def test_workers_follow_the_published_policy_and_a_restart_starts_with_the_newest(
    local_ray: None,
    runner: CliRunner,
    tmp_path: Path,
    exported_policies: dict[int, Path],
    publish_policy: Callable[[bytes, Path], None],
) -> None:
    run_dir = tmp_path / "learner"
    publish_policy(exported_policies[30].read_bytes(), run_dir)
    store = tmp_path / "h.zarr"
    collection = RayCollection(
        load_recipe("sac_hit_the_middle"),
        str(store),
        workers=2,
        steps=10**9,
        policy=str(run_dir),
        follow_policy=True,
        restart_delay=0.2,
        flush_seconds=0.2,
    )
    killed: list[bool] = []

    def on_progress(progress: ScaleProgress) -> None:
        first = collection.runs[0]
        if not killed and first.progress is not None and first.progress.committed_episodes:
            # The learner publishes a newer policy, then worker 0 dies before it switches.
            publish_policy(exported_policies[60].read_bytes(), run_dir)
            ray.kill(first.actor)
            killed.append(True)

    deadline = time.monotonic() + 90  # the assertions below say what did not happen

    def should_stop() -> bool:  # every run of a worker alive acts with the newest policy
        live = [run for run in collection.runs if run.status == "running"]
        return time.monotonic() > deadline or (
            len(collection.runs) == 3
            and all(run.progress is not None and run.progress.training_step == 60 for run in live)
        )

    collection.on_progress = on_progress
    collection.should_stop = should_stop  # type: ignore[method-assign]
    summary = collection.run()
    runs = {local(summary, entry["shard"]): entry for entry in summary["workers"]}
    assert set(runs) == {"w0", "w1", "w0-r1"}
    assert runs["w0-r1"]["policy_training_steps"] == [60]  # synced before it stepped
    assert runs["w1"]["policy_training_steps"] == [30, 60]  # switched between episodes
    assert summary["policy_training_steps"] == [30, 60]
    assert local(summary, summary["deaths"][0]["restarted_as"]) == "w0-r1"
    assert verify(runner, store)["episodes"] == summary["episodes"]


def _following(
    store: Path, run_dir: Path, workers: int, learner: Callable[[RayCollection], None]
) -> RayCollection:
    """A collection following ``run_dir`` until every running worker acts with the policy of
    training step 60; ``learner`` is called with the collection at every poll."""
    collection = RayCollection(load_recipe("sac_hit_the_middle"), str(store), workers=workers,
                               steps=10**9, policy=str(run_dir), follow_policy=True,
                               flush_seconds=0.2)  # fmt: skip
    deadline = time.monotonic() + 90  # the assertions below say what did not happen

    def should_stop() -> bool:
        live = [run for run in collection.runs if run.status == "running"]
        return time.monotonic() > deadline or all(
            run.progress is not None and run.progress.training_step == 60 for run in live
        )

    collection.on_progress = lambda progress: learner(collection)
    collection.should_stop = should_stop  # type: ignore[method-assign]
    return collection


def _acting_with(collection: RayCollection, step: int) -> bool:
    return all(run.progress is not None and run.progress.training_step == step
               for run in collection.runs)  # fmt: skip


def test_workers_act_with_policies_the_driver_relays_without_reading_its_run_directory(
    local_ray: None,
    runner: CliRunner,
    tmp_path: Path,
    exported_policies: dict[int, Path],
    publish_policy: Callable[[bytes, Path], None],
) -> None:
    run_dir = tmp_path / "learner"
    publish_policy(exported_policies[30].read_bytes(), run_dir)
    moved: list[Path] = []

    def learner(collection: RayCollection) -> None:
        assert collection.relay is not None
        if collection.relay.training_steps == [30] and _acting_with(collection, 30):
            publish_policy(exported_policies[60].read_bytes(), run_dir)
        elif collection.relay.training_steps == [30, 60] and not moved:
            # The driver has read it: from now on the learner's run directory is not there
            # for anyone, as it is not on the workers' machines of a cluster.
            moved.append(run_dir.rename(tmp_path / "elsewhere"))

    store = tmp_path / "h.zarr"
    summary = _following(store, run_dir, 2, learner).run()
    assert moved, "the driver never relayed the policy of training step 60"
    assert [w["policy_training_steps"] for w in summary["workers"]] == [[30, 60], [30, 60]]
    assert summary["policy_training_steps"] == [30, 60] and summary["policy"] == str(run_dir)
    assert verify(runner, store)["episodes"] == summary["episodes"] > 0


def test_the_workers_follow_their_own_mirror_and_remove_it(
    local_ray: None,
    tmp_path: Path,
    exported_policies: dict[int, Path],
    publish_policy: Callable[[bytes, Path], None],
) -> None:
    run_dir = tmp_path / "learner"
    publish_policy(exported_policies[30].read_bytes(), run_dir)
    collection = RayCollection(load_recipe("sac_hit_the_middle"), str(tmp_path / "h.zarr"),
                               workers=2, episodes=2, policy=str(run_dir),
                               follow_policy=True)  # fmt: skip
    summary = collection.run()
    assert [w["status"] for w in summary["workers"]] == ["finished", "finished"]
    mirrors = [Path(run.summary["policy"]) for run in collection.runs if run.summary]
    assert len(set(mirrors)) == 2  # one each, in the worker's temporary folder
    for mirror in mirrors:
        assert mirror.name.startswith("emote-policy-") and run_dir not in mirror.parents
        assert not mirror.exists()  # removed when the worker's run ended


def test_a_broken_published_file_is_logged_once_and_the_workers_keep_their_policy(
    local_ray: None,
    tmp_path: Path,
    exported_policies: dict[int, Path],
    publish_policy: Callable[[bytes, Path], None],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run_dir = tmp_path / "learner"
    publish_policy(exported_policies[30].read_bytes(), run_dir)
    broken_at: list[int] = []
    clock = types.SimpleNamespace(now=0.0, reads=0)  # the relay's: a poll interval a poll

    def monotonic() -> float:
        clock.reads += 1  # one a look: with the clock moved on, each poll looks at the file
        return clock.now

    monkeypatch.setattr(
        published_policy, "time", types.SimpleNamespace(monotonic=monotonic, sleep=time.sleep)
    )

    def learner(collection: RayCollection) -> None:
        clock.now += published_policy.POLL_INTERVAL_S
        if not broken_at and _acting_with(collection, 30):
            publish_policy(b"not an onnx file", run_dir)
            broken_at.append(clock.reads)
        elif len(broken_at) == 1 and clock.reads - broken_at[0] >= 3:  # looked at 3 times
            publish_policy(exported_policies[60].read_bytes(), run_dir)
            broken_at.append(clock.reads)

    caplog.set_level(logging.INFO, logger="emote_core")
    collection = _following(tmp_path / "h.zarr", run_dir, 1, learner)
    summary = collection.run()
    refused = [r for r in caplog.records if "is refused" in r.getMessage()]
    assert len(refused) == 1 and "latest.onnx" in refused[0].getMessage()
    assert collection.relay is not None and collection.relay.training_steps == [30, 60]
    [worker] = summary["workers"]
    assert worker["status"] == "stopped" and worker["policy_training_steps"] == [30, 60]


def test_without_a_policy_to_relay_no_wait_refuses_before_any_worker_starts(
    local_ray: None,
    runner: CliRunner,
    tmp_path: Path,
    publish_policy: Callable[[bytes, Path], None],
    exported_policies: dict[int, Path],
) -> None:
    run_dir = tmp_path / "learner"
    run_dir.mkdir()
    store = tmp_path / "h.zarr"
    result = runner.invoke(
        app,
        ["collect", "sac_hit_the_middle", "--out", str(store), "--episodes", "2", "--workers",
         "2", "--policy", str(run_dir), "--follow-policy", "--no-wait", "--json"],
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert json.loads(result.stdout)["error"].startswith("no policy is published at")
    recipe = load_recipe("sac_hit_the_middle")
    options: dict[str, Any] = {"workers": 2, "episodes": 2, "policy": str(run_dir),
                               "follow_policy": True, "wait_for_policy": False}  # fmt: skip
    collection = RayCollection(recipe, str(store), **options)
    with pytest.raises(ConfigurationError, match="no policy is published at"):
        collection.run()
    publish_policy(b"not an onnx file", run_dir)
    collection = RayCollection(recipe, str(store), **options)
    with pytest.raises(FormatError, match="cannot load"):
        collection.run()
    # A policy of HitTheMiddle does not fit Pendulum: the driver says so, no worker has to.
    publish_policy(exported_policies[30].read_bytes(), run_dir)
    collection = RayCollection(load_recipe("sac_pendulum"), str(store), **options)
    with pytest.raises(ConfigurationError, match="observation"):
        collection.run()
    assert collection.runs == [] and not store.exists()  # no worker was started
