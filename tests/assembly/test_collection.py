"""One collector following the policy a run publishes: it waits for the first, switches to newer
ones between episodes, keeps its policy when a published file is refused."""

from __future__ import annotations

import errno
import logging
import os
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from emote_core.assembly import published_policy
from emote_core.assembly.collection import CollectionProgress, collect_to_store
from emote_core.errors import ConfigurationError, FormatError, StorageError
from emote_core.recipes import load_recipe
from emote_core.stores.zarr_store import MemoryStore


def test_a_follower_switches_to_each_newly_published_policy_and_keeps_its_own_on_a_bad_file(
    exported_policies: dict[int, Path],
    publish_policy: Callable[[bytes, Path], None],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    policies, publish = exported_policies, publish_policy
    run_dir = tmp_path / "run"
    publish(policies[30].read_bytes(), run_dir)
    seen: list[int | None] = []
    started = time.monotonic()
    published_60 = False
    clock = types.SimpleNamespace(now=0.0, reads=0)  # the follower's: a poll interval a report

    def monotonic() -> float:
        clock.reads += 1  # one a poll: with the clock moved on, each poll looks at the file
        return clock.now

    monkeypatch.setattr(published_policy, "time", types.SimpleNamespace(monotonic=monotonic))
    bad_at = 0

    def on_progress(progress: CollectionProgress) -> None:
        nonlocal published_60, bad_at
        seen.append(progress.training_step)
        clock.now += published_policy.POLL_INTERVAL_S
        if progress.phase == "start":
            publish(b"not an onnx file", run_dir)  # refused, the policy in use is kept
            bad_at = clock.reads
        elif not published_60 and clock.reads - bad_at >= 3:  # it looked at it three times
            publish(policies[60].read_bytes(), run_dir)
            published_60 = True

    def should_stop() -> bool:
        return seen[-1] == 60 or time.monotonic() - started > 60

    caplog.set_level(logging.INFO, logger="emote_core")
    result = collect_to_store(
        load_recipe("sac_hit_the_middle"),
        str(tmp_path / "h.zarr"),
        steps=10**9,
        policy=str(run_dir),
        follow_policy=True,
        on_progress=on_progress,
        should_stop=should_stop,
        flush_seconds=0.5,
    )
    assert result.summary["policy_training_steps"] == [30, 60]
    assert seen[0] == 30 and seen[-1] == 60
    assert seen == sorted(seen)  # switched once, never back
    refused = [r for r in caplog.records if "is refused" in r.getMessage()]
    assert len(refused) == 1  # logged once, though the file was looked at three times
    assert result.interrupted  # stopped by should_stop, with what finished committed
    assert MemoryStore(tmp_path / "h.zarr").episode_count == result.summary["episodes"] > 0


def test_without_a_published_policy_a_follower_waits_or_refuses(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = load_recipe("sac_hit_the_middle")
    store = tmp_path / "h.zarr"
    with pytest.raises(ConfigurationError, match=r"no policy is published at .*latest\.onnx"):
        collect_to_store(recipe, str(store), episodes=1, policy=str(tmp_path), follow_policy=True,
                         wait_for_policy=False)  # fmt: skip
    caplog.set_level(logging.INFO, logger="emote_core")
    asked: list[int] = []
    slept: list[float] = []  # the waits between looks, taken at once here
    clock = types.SimpleNamespace(monotonic=time.monotonic, sleep=slept.append)
    monkeypatch.setattr(published_policy, "time", clock)

    def should_stop() -> bool:
        asked.append(len(slept))
        return len(asked) >= 2

    result = collect_to_store(recipe, str(store), episodes=1, policy=str(tmp_path),
                              follow_policy=True, should_stop=should_stop)  # fmt: skip
    assert result.interrupted and result.summary["episodes"] == 0
    assert result.summary["policy_training_steps"] == []
    # It looked again a poll interval later: one wait of a second between the two asks.
    assert asked == [0, 1] and slept == [published_policy.POLL_INTERVAL_S] == [1.0]
    assert any("waiting for a policy" in r.getMessage() for r in caplog.records)
    assert not store.exists()  # nothing written while waiting


@pytest.mark.parametrize(
    ("where", "calls", "env_steps", "transitions"),
    [
        ("step", 1, 0, 0),  # before any step returned
        ("step", 31, 30 * 8, 30 * 8),  # just after all eight first episodes ended
        ("step", 70, 69 * 8, 60 * 8),  # in the second call of 64 vector steps
        ("final_observation", 1, 30 * 8, 0),  # a step torn while its ended episodes are recorded
    ],
)
def test_an_interrupt_at_any_step_leaves_committed_plus_dropped_equal_to_env_steps(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    where: str,
    calls: int,
    env_steps: int,
    transitions: int,
) -> None:
    """Ctrl-C (KeyboardInterrupt) raised on the ``calls``-th call of the vector env's ``step``
    or of the wrapper's ``final_observation``; HitTheMiddle episodes are 30 steps, 8 envs."""
    from emote_core.assembly import builders

    make_env = builders.make_env

    def interrupting_env(*args: Any, **kwargs: Any) -> Any:
        env = make_env(*args, **kwargs)
        owner = env.env if where == "step" else env
        original = getattr(owner, where)
        made = 0

        def interrupt_on_call(*call_args: Any, **call_kwargs: Any) -> Any:
            nonlocal made
            made += 1
            if made == calls:
                raise KeyboardInterrupt
            return original(*call_args, **call_kwargs)

        setattr(owner, where, interrupt_on_call)
        return env

    monkeypatch.setattr(builders, "make_env", interrupting_env)
    store = tmp_path / "h.zarr"
    result = collect_to_store(
        load_recipe("sac_hit_the_middle"), str(store), steps=10_000, num_envs=8
    )
    summary = result.summary
    assert result.interrupted
    assert (summary["env_steps"], summary["transitions"]) == (env_steps, transitions)
    assert summary["dropped_steps"] == env_steps - transitions >= 0
    assert summary["store_totals"] == {
        "episodes": transitions // 30,
        "transitions": transitions,
    }


def test_a_damaged_first_published_policy_is_an_error_not_a_policy_in_use(
    publish_policy: Callable[[bytes, Path], None],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    run_dir = tmp_path / "run"
    publish_policy(b"not an onnx file", run_dir)
    store = tmp_path / "h.zarr"
    asked: list[bool] = []

    def should_stop() -> bool:  # bounds the wait, should the damaged file be waited on
        asked.append(True)
        return len(asked) >= 3

    for wait in (True, False):
        caplog.clear()
        with pytest.raises(FormatError, match=r"cannot load '.*latest\.onnx'") as refused:
            collect_to_store(load_recipe("sac_hit_the_middle"), str(store), episodes=1,
                             policy=str(run_dir), follow_policy=True, wait_for_policy=wait,
                             should_stop=should_stop)  # fmt: skip
        assert any("no policy is in use yet" in note for note in refused.value.__notes__)
        assert not any("kept the policy in use" in r.getMessage() for r in caplog.records)
    assert not store.exists()


def test_a_store_write_that_fails_says_how_many_episodes_this_collection_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from emote_core.stores.zarr_store.tables import StoreAppender

    append = StoreAppender.append_batch
    calls = 0

    def full_at_third(self: StoreAppender, episodes: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        append(self, episodes)

    monkeypatch.setattr(StoreAppender, "append_batch", full_at_third)
    store = tmp_path / "h.zarr"
    with pytest.raises(StorageError) as failed:  # every finished episode is its own append
        collect_to_store(load_recipe("sac_hit_the_middle"), str(store), episodes=5,
                         flush_seconds=0.0)  # fmt: skip
    assert str(failed.value).startswith(
        f"cannot write to store '{store}': No space left on device (errno 28); it keeps the 2 "
        "episodes (60 transitions) committed before, 2 of them from this collection"
    )
    assert calls == 3  # nothing more was tried after the failure
    assert MemoryStore(store).episode_count == 2


@pytest.mark.parametrize("other_commits", [False, True])
def test_a_refused_collection_removes_its_new_store_only_while_no_shard_holds_an_episode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, other_commits: bool
) -> None:
    """The env turns out bad (a ConfigurationError from its step) after this call created the
    store; meanwhile another collector may have committed to another shard of it: then the
    store and that collector's episodes stay."""
    from emote_core.assembly import builders

    make_env = builders.make_env
    store = tmp_path / "h.zarr"
    recipe = load_recipe("sac_hit_the_middle")
    made = 0

    def failing_env(*args: Any, **kwargs: Any) -> Any:
        nonlocal made
        made += 1
        env = make_env(*args, **kwargs)
        if made > 1:  # the other collector's env: a sound one
            return env

        def bad_step(*_: Any, **__: Any) -> Any:
            if other_commits:
                collect_to_store(recipe, str(store), episodes=1, shard="other")
            raise ConfigurationError("env 'bad': step() returned an observation with NaN")

        env.env.step = bad_step
        return env

    monkeypatch.setattr(builders, "make_env", failing_env)
    with pytest.raises(ConfigurationError, match="NaN"):
        collect_to_store(recipe, str(store), episodes=2)
    if other_commits:
        assert MemoryStore(str(store)).committed()["other"] == 1
    else:
        assert not store.exists()


def test_a_refused_collection_keeps_its_new_store_where_a_user_put_a_file_in_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store this call created is empty, but a user's file went into it meanwhile: the store
    stays with the file, and so does the user's file beside it."""
    from emote_core.assembly import builders

    make_env = builders.make_env
    store = tmp_path / "h.zarr"
    beside = tmp_path / "notes.txt"
    beside.write_text("mine")

    def failing_env(*args: Any, **kwargs: Any) -> Any:
        env = make_env(*args, **kwargs)

        def bad_step(*_: Any, **__: Any) -> Any:
            (store / "shards" / "notes.txt").write_text("mine too")
            raise ConfigurationError("env 'bad': step() returned an observation with NaN")

        env.env.step = bad_step
        return env

    monkeypatch.setattr(builders, "make_env", failing_env)
    with pytest.raises(ConfigurationError, match="NaN"):
        collect_to_store(load_recipe("sac_hit_the_middle"), str(store), episodes=2)
    assert (store / "shards" / "notes.txt").read_text() == "mine too"
    assert MemoryStore(str(store)).episode_count == 0
    assert beside.read_text() == "mine"
