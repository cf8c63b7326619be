"""The training loop's lifecycle, cycles, state merging and exit paths."""

from __future__ import annotations

import re
import threading

import pytest

from emote_core.callback import Callback, Order
from emote_core.callbacks.generic import BackPropStepsTerminator
from emote_core.errors import CallbackDefinitionError, ConfigurationError
from emote_core.trainer import StateDict, Trainer, TrainingShutdownException


def batches(count: int, size: int = 4) -> list[dict]:
    return [{"batch_size": size, "default": {"x": float(i)}} for i in range(count)]


class Recorder(Callback):
    """Records every hook it sees, with the step it saw it at."""

    def __init__(self, events: list, **kwargs) -> None:
        super().__init__(**kwargs)
        self.events = events

    def _record(self, hook: str, bp_step: int) -> None:
        self.events.append((self.name, hook, bp_step))

    def restore_state(self, bp_step):
        self._record("restore_state", bp_step)

    def begin_training(self, bp_step):
        self._record("begin_training", bp_step)

    def begin_cycle(self, bp_step):
        self._record("begin_cycle", bp_step)

    def begin_batch(self, bp_step):
        self._record("begin_batch", bp_step)

    def backward(self, bp_step):
        self._record("backward", bp_step)

    def end_batch(self, bp_step):
        self._record("end_batch", bp_step)

    def end_cycle(self, bp_step):
        self._record("end_cycle", bp_step)

    def end_training(self, bp_step):
        self._record("end_training", bp_step)


def test_lifecycle_order_across_callbacks_follows_their_order() -> None:
    events: list = []
    late = Recorder(events, name="late", cycle=1)
    late.order = Order.LOGGING
    early = Recorder(events, name="early", cycle=1)
    Trainer([late, early], batches(1)).train()
    assert events == [
        ("early", "restore_state", 0),
        ("late", "restore_state", 0),
        ("early", "begin_training", 0),
        ("late", "begin_training", 0),
        ("early", "begin_cycle", 1),
        ("late", "begin_cycle", 1),
        ("early", "begin_batch", 1),
        ("late", "begin_batch", 1),
        ("early", "backward", 1),
        ("late", "backward", 1),
        ("early", "end_batch", 1),
        ("late", "end_batch", 1),
        ("early", "end_cycle", 1),
        ("late", "end_cycle", 1),
        ("early", "end_training", 1),
        ("late", "end_training", 1),
    ]


def test_cycles_begin_at_step_after_a_multiple_and_end_at_multiples() -> None:
    events: list = []
    Trainer([Recorder(events, cycle=3)], batches(10)).train()
    assert [s for _, h, s in events if h == "begin_cycle"] == [1, 4, 7, 10]
    assert [s for _, h, s in events if h == "end_cycle"] == [3, 6, 9]
    assert [s for _, h, s in events if h == "backward"] == list(range(1, 11))


def test_callbacks_without_cycle_never_see_cycle_hooks() -> None:
    events: list = []
    Trainer([Recorder(events)], batches(5)).train()
    assert not [e for e in events if "cycle" in e[1]]


def test_steps_and_samples_are_counted() -> None:
    state = Trainer([], batches(6, size=32)).train()
    assert state["bp_step"] == 6
    assert state["bp_samples"] == 6 * 32


def test_batch_values_and_returned_values_reach_later_callbacks() -> None:
    class Target(Callback):
        order = Order.TARGET

        def begin_batch(self, x):
            return {"default": {"target": x * 10}}

    seen = []

    class Loss(Callback):
        def backward(self, target, x):
            seen.append((x, target))

    Trainer([Loss(data_group="default"), Target(data_group="default")], batches(3)).train()
    assert seen == [(0.0, 0.0), (1.0, 10.0), (2.0, 20.0)]


def test_hooks_before_the_first_batch_work_with_data_groups() -> None:
    class Warmup(Callback):
        def restore_state(self, bp_step):
            return {"default": {"scale": 2.0}}

        def begin_training(self, scale):
            return {"ready": scale}

    seen = []

    class Loss(Callback):
        def backward(self, x, scale, ready):
            seen.append(x * scale + ready)

    Trainer([Warmup(data_group="default"), Loss(data_group="default")], batches(2)).train()
    assert seen == [2.0, 4.0]


def test_state_merge_updates_groups_and_replaces_values() -> None:
    state = StateDict(a=1, g={"x": 1, "y": 2})
    state.merge({"a": 5, "g": {"y": 3, "z": 4}, "h": {"w": 0}})
    assert state == {"a": 5, "g": {"x": 1, "y": 3, "z": 4}, "h": {"w": 0}}


def test_end_training_runs_when_the_loader_runs_out() -> None:
    events: list = []
    Trainer([Recorder(events)], batches(2)).train()
    assert events[-1] == ("Recorder", "end_training", 2)


def test_shutdown_signal_set_from_another_thread_stops_training() -> None:
    events: list = []
    signal = threading.Event()

    def endless():
        step = 0
        while True:
            step += 1
            if step == 5:
                threading.Thread(target=signal.set).start()
                threading.Event().wait(0.2)  # give the setter thread time to run
            yield {"batch_size": 1}

    state = Trainer([Recorder(events)], endless()).train(shutdown_signal=signal)
    assert state["bp_step"] == 4
    assert events[-1] == ("Recorder", "end_training", 4)


def test_a_shutdown_function_is_polled_once_before_each_batch_as_upstream_passes_it() -> None:
    calls: list[int] = []

    def shutdown_after_three_batches() -> bool:
        calls.append(len(calls))
        return len(calls) > 3

    events: list = []
    trainer = Trainer([Recorder(events)], batches(100))
    state = trainer.train(shutdown_signal=shutdown_after_three_batches)
    assert state["bp_step"] == 3  # the fourth poll said stop before the fourth batch
    assert len(calls) == 4
    assert [e for e in events if e[1] == "backward"] == [
        ("Recorder", "backward", s) for s in (1, 2, 3)
    ]
    assert state["shutdown_signal"].is_set()  # waiting callbacks see the stop too


def test_a_shutdown_function_that_never_says_stop_trains_every_batch() -> None:
    state = Trainer([Recorder([])], batches(6)).train(shutdown_signal=lambda: False)
    assert state["bp_step"] == 6 and not state["shutdown_signal"].is_set()


@pytest.mark.parametrize("signal", [True, "stop", 0.5])
def test_a_shutdown_signal_of_another_type_is_a_type_error_naming_it(signal) -> None:
    expected = re.escape(f"got {signal!r} ({type(signal).__name__})")
    with pytest.raises(TypeError, match=rf"threading.Event or a function.*{expected}"):
        Trainer([Recorder([])], batches(2)).train(shutdown_signal=signal)


def test_shutdown_request_lets_later_callbacks_finish_the_hook() -> None:
    events: list = []
    after = Recorder(events, name="after", cycle=5)
    after.order = Order.CHECKPOINT
    state = Trainer([BackPropStepsTerminator(bp_steps=5), after], batches(100)).train()
    assert state["bp_step"] == 5
    assert ("after", "end_cycle", 5) in events
    assert events[-1] == ("after", "end_training", 5)
    assert state["training_error"] is None


def test_loader_can_request_shutdown() -> None:
    def loader():
        yield {"batch_size": 1}
        raise TrainingShutdownException()

    events: list = []
    state = Trainer([Recorder(events)], loader()).train()
    assert state["bp_step"] == 1 and events[-1][1] == "end_training"


@pytest.mark.parametrize(
    "failing_hook", ["restore_state", "begin_training", "begin_batch", "backward"]
)
def test_errors_propagate_named_and_end_training_still_runs(failing_hook: str) -> None:
    events: list = []

    def fail(self, **kwargs):
        raise RuntimeError("boom")

    Broken = type("Broken", (Callback,), {failing_hook: fail})
    with pytest.raises(RuntimeError, match="boom") as caught:
        Trainer([Broken(name="broken"), Recorder(events)], batches(3)).train()
    notes = " ".join(getattr(caught.value, "__notes__", []))
    assert "'broken'" in notes and f"'{failing_hook}'" in notes
    assert events[-1][1] == "end_training"


def test_error_in_end_training_does_not_hide_the_original_error() -> None:
    class FailsAtEnd(Callback):
        def end_training(self):
            raise ValueError("cleanup failed")

    class FailsInBackward(Callback):
        def backward(self):
            raise RuntimeError("original")

    with pytest.raises(RuntimeError, match="original"):
        Trainer([FailsInBackward(), FailsAtEnd()], batches(1)).train()


def test_error_in_end_training_alone_propagates_after_all_ran() -> None:
    events: list = []

    class FailsAtEnd(Callback):
        def end_training(self):
            raise ValueError("cleanup failed")

    with pytest.raises(ValueError, match="cleanup failed"):
        Trainer([FailsAtEnd(), Recorder(events)], batches(1)).train()
    assert events[-1][1] == "end_training"


def test_training_error_is_visible_to_end_training() -> None:
    seen = []

    class Watcher(Callback):
        def end_training(self, training_error):
            seen.append(training_error)

    class FailsInBackward(Callback):
        def backward(self):
            raise RuntimeError("original")

    with pytest.raises(RuntimeError):
        Trainer([FailsInBackward(), Watcher()], batches(1)).train()
    assert isinstance(seen[0], RuntimeError)


def test_missing_batch_size_key_is_a_clear_error() -> None:
    with pytest.raises(ConfigurationError, match="no 'batch_size' key"):
        Trainer([], [{"default": {}}]).train()


def test_a_batch_without_its_size_counts_the_states_value() -> None:
    trainer = Trainer([], [{"default": {}}, {"batch_size": 3}, {"default": {}}])
    trainer.state["batch_size"] = 5
    assert trainer.train()["bp_samples"] == 5 + 3 + 3


def test_a_never_cycle_skips_the_cycle_hooks() -> None:
    events: list = []
    Trainer([Recorder(events, cycle=0)], batches(3)).train()
    assert not [e for e in events if e[1] in ("begin_cycle", "end_cycle")]
    assert [e[1] for e in events].count("backward") == 3


def test_duplicate_callback_names_are_rejected() -> None:
    with pytest.raises(CallbackDefinitionError, match=r"\['same'\]"):
        Trainer([Callback(name="same"), Callback(name="same")], [])


def test_non_callbacks_are_rejected() -> None:
    with pytest.raises(CallbackDefinitionError, match="every entry must be"):
        Trainer([object()], [])  # type: ignore[list-item]
