"""FollowStores in a real Trainer: it waits (saying so, without spinning, stopping at once on a
shutdown) until collectors have committed enough, takes in what they commit while it trains, and
logs the data age and the ingest rate."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from emote_core.callback import Callback, Order
from emote_core.callbacks.generic import BackPropStepsTerminator
from emote_core.memory import MemoryLoader
from emote_core.stores.follow import StoreFollower
from emote_core.stores.follow_training import FollowStores
from emote_core.trainer import Trainer, TrainingShutdownException
from tests.stores.test_follow import append, held, new_store, table


class Slow(Callback):
    """Takes a few milliseconds per update, like real losses."""

    def backward(self) -> None:
        time.sleep(0.005)


def test_training_waits_for_enough_episodes_then_takes_in_new_ones_as_they_are_committed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = new_store(tmp_path / "s.zarr")
    append(url, "main", range(2))  # too few to train on
    memory = table()
    follower = StoreFollower(memory, [url])
    follower.fill()
    loader = MemoryLoader(table=memory, rollout_count=8, rollout_length=1)
    following = FollowStores(
        follower=follower, loader=loader, interval=5, warmup_transitions=30, poll_seconds=0.05,
        log_seconds=0.0,
    )  # fmt: skip
    committed = threading.Event()
    training = threading.Event()

    def collectors() -> None:
        time.sleep(0.5)
        append(url, "remote", range(100, 110))  # enough: training starts
        training.wait(timeout=60)  # a busy machine may take long to start
        append(url, "main", range(2, 6))  # while training
        committed.set()

    class Until(Callback):
        order = Order.TERMINATOR

        def end_batch(self, bp_step: int) -> None:
            training.set()
            if committed.is_set() and 109 in held(memory) and 5 in held(memory):
                raise TrainingShutdownException("everything arrived")

    caplog.set_level("INFO")
    thread = threading.Thread(target=collectors)
    thread.start()
    started = time.monotonic()
    state = Trainer(
        [
            following,
            Slow(name="slow"),
            Until(name="until"),
            BackPropStepsTerminator(bp_steps=5_000),
        ],
        loader,
    ).train()
    thread.join()
    assert time.monotonic() - started < 30 and state["bp_step"] < 5_000
    assert "waiting for episodes: the table holds 7 transitions in 2 episodes" in caplog.text
    assert "training starts after" in caplog.text
    assert sorted(held(memory)) == [0, 1, 2, 3, 4, 5, *range(100, 110)]
    assert follower.read == [{"main": 6, "remote": 10}]
    assert following.scalar_logs["follow/ingested_episodes"] == 16
    assert following.scalar_logs["follow/ingest_transitions_per_s"] > 0
    assert 0 <= following.scalar_logs["follow/data_age_max_s"] < 5
    assert following.windowed_means()["follow/data_age_s"] >= 0
    assert "follow: +" in caplog.text and "transitions/s" in caplog.text


def test_a_shutdown_while_waiting_stops_at_once_and_the_wait_does_not_spin(tmp_path: Path) -> None:
    url = new_store(tmp_path / "s.zarr")
    memory = table()
    follower = StoreFollower(memory, [url])
    looks = []
    poll = follower.poll

    def counted():
        looks.append(time.monotonic())
        return poll()

    follower.poll = counted  # type: ignore[method-assign]
    following = FollowStores(
        follower=follower, loader=MemoryLoader(table=memory, rollout_count=4, rollout_length=1),
        interval=1, poll_seconds=0.2,
    )  # fmt: skip
    stop = threading.Event()
    threading.Timer(1.0, stop.set).start()
    started = time.monotonic()
    with pytest.raises(TrainingShutdownException, match="waiting for episodes"):
        following.begin_training(shutdown_signal=stop)
    waited = time.monotonic() - started
    assert 0.9 < waited < 1.5  # woke when asked, not at the next poll or later
    assert 3 <= len(looks) <= 7  # about one look per poll_seconds: sleeping, not spinning
