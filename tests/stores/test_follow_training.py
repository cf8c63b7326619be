"""FollowStores in a real Trainer: it waits (saying so, without spinning, stopping at once on a
shutdown) until collectors have committed enough, takes in what they commit while it trains, and
logs the data age and the ingest rate."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from emote_core.callback import Callback, Order
from emote_core.callbacks.generic import BackPropStepsTerminator
from emote_core.memory import MemoryLoader
from emote_core.stores.follow import StoreFollower
from emote_core.stores.follow_training import FollowStores
from emote_core.trainer import Trainer, TrainingShutdownException
from tests.memory.test_memory_callbacks import RecordedEvent
from tests.stores.test_follow import append, held, new_store, table


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
    waiting = threading.Event()

    class Said(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("waiting for episodes"):
                waiting.set()

    def collectors() -> None:
        waiting.wait(timeout=60)  # the learner says it waits: only then do enough arrive
        append(url, "remote", range(100, 110))  # enough: training starts
        training.wait(timeout=60)  # a busy machine may take long to start
        append(url, "main", range(2, 6))  # while training
        committed.set()

    class Until(Callback):
        order = Order.TERMINATOR

        def end_batch(self, bp_step: int) -> None:
            training.set()
            assert committed.wait(timeout=60)  # the second commit lands while training runs
            if 109 in held(memory) and 5 in held(memory):
                raise TrainingShutdownException("everything arrived")

    caplog.set_level("INFO")
    said = Said()
    logging.getLogger(FollowStores.__module__).addHandler(said)
    thread = threading.Thread(target=collectors)
    thread.start()
    try:
        state = Trainer(
            [following, Until(name="until"), BackPropStepsTerminator(bp_steps=5_000)], loader
        ).train()
    finally:
        logging.getLogger(FollowStores.__module__).removeHandler(said)
    thread.join()
    assert state["bp_step"] < 5_000
    assert "waiting for episodes: the table holds 7 transitions in 2 episodes" in caplog.text
    assert "training starts after" in caplog.text
    assert sorted(held(memory)) == [0, 1, 2, 3, 4, 5, *range(100, 110)]
    assert follower.read == [{"main": 6, "remote": 10}]
    assert following.scalar_logs["follow/ingested_episodes"] == 16
    assert following.scalar_logs["follow/ingest_transitions_per_s"] > 0
    assert 0 <= following.scalar_logs["follow/data_age_max_s"] < 5
    assert following.windowed_means()["follow/data_age_s"] >= 0
    assert "follow: +" in caplog.text and "transitions/s" in caplog.text


def test_a_shutdown_while_waiting_stops_at_once_and_the_wait_does_not_spin(
    tmp_path: Path, no_hang: None
) -> None:
    url = new_store(tmp_path / "s.zarr")
    memory = table()
    follower = StoreFollower(memory, [url])
    looks = []
    poll = follower.poll

    def counted():
        looks.append(len(looks))
        return poll()

    follower.poll = counted  # type: ignore[method-assign]
    # A poll period no test outlasts: only a wait that wakes on the signal can end this one.
    following = FollowStores(
        follower=follower, loader=MemoryLoader(table=memory, rollout_count=4, rollout_length=1),
        interval=1, poll_seconds=3_600,
    )  # fmt: skip
    stop = RecordedEvent()
    threading.Thread(target=lambda: stop.waiting.wait(timeout=60) and stop.set()).start()
    with pytest.raises(TrainingShutdownException, match="waiting for episodes"):
        following.begin_training(shutdown_signal=stop)
    # One look, then one wait of poll_seconds on the signal (sleeping, not spinning), ended by it.
    assert stop.timeouts == [3_600] and looks == [0]
