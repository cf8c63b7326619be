"""The training loop: feeds batches through the callbacks' hooks in a fixed lifecycle.

``restore_state`` -> ``begin_training`` -> for each batch: [``begin_cycle``] ``begin_batch`` ->
``backward`` -> ``end_batch`` [``end_cycle``] -> ``end_training``. ``end_training`` runs on every
exit path: the loader running out, a shutdown request, or an error (which still propagates, with
the callback and hook that raised it named in a note).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from emote_core.callback import LIFECYCLE_HOOKS, Callback, repeated_names
from emote_core.errors import CallbackDefinitionError, ConfigurationError, MissingStateKeyError

log = logging.getLogger(__name__)


class TrainingShutdownException(Exception):
    """Raised by a hook or a data loader to end training cleanly.

    The other callbacks still run the hook that was in progress (so every callback sees the last
    ``end_cycle`` and a final checkpoint is written), then ``end_training`` runs and
    :meth:`Trainer.train` returns normally.
    """

    log_level: int = logging.INFO
    """How loudly the trainer logs the request."""


class BudgetReached(TrainingShutdownException):
    """Training reached the updates it was planned for: the normal end, logged at debug level."""

    log_level = logging.DEBUG


class StateDict(dict[str, Any]):
    """The training state: named values shared by all callbacks, with data groups as sub-dicts.

    Merging (:meth:`merge`) replaces top-level values and updates existing data-group dicts in
    place, so ``{"default": {"q_target": t}}`` adds one value to the ``default`` group.
    """

    def merge(self, update: Mapping[str, Any]) -> None:
        """Merges ``update`` into the state; dict values update existing dicts one level deep."""
        for key, value in update.items():
            if type(value) is dict or isinstance(value, Mapping):
                current = self.get(key)
                if isinstance(current, dict):
                    current.update(value)
                else:
                    self[key] = dict(value)
            else:
                self[key] = value


class Trainer:
    """Runs callbacks over the batches of a data loader.

    Args:
        callbacks: The callbacks; they run in ascending ``order`` (ties keep the given order).
        dataloader: An iterable of batches: dicts holding data groups and ``batch_size_key``.
        batch_size_key: The top-level batch key giving the number of samples in the batch; it is
            summed into ``bp_samples``. A batch without it counts the state's value of the key.

    Raises:
        CallbackDefinitionError: If two callbacks share a name or an entry is not a callback.
    """

    def __init__(
        self,
        callbacks: Iterable[Callback],
        dataloader: Iterable[Mapping[str, Any]],
        batch_size_key: str = "batch_size",
    ) -> None:
        callbacks = list(callbacks)
        for callback in callbacks:
            if not isinstance(callback, Callback):
                raise CallbackDefinitionError(
                    f"Trainer got {callback!r} ({type(callback).__name__}) among its callbacks; "
                    "every entry must be an emote_core.callback.Callback"
                )
        duplicated = repeated_names(callbacks)
        if duplicated:
            raise CallbackDefinitionError(
                f"callback names must be unique (they key logs and checkpoints); {duplicated} "
                "appear more than once — pass name=... to tell them apart"
            )
        self.callbacks = sorted(callbacks, key=lambda c: c.order)
        self.dataloader = dataloader
        self.batch_size_key = batch_size_key
        self.state = StateDict(bp_step=0, bp_samples=0)
        self.shutdown_signal = threading.Event()

    def train(
        self, shutdown_signal: threading.Event | Callable[[], bool] | None = None
    ) -> StateDict:
        """Trains until the loader is exhausted, a shutdown is requested, or an error escapes.

        Args:
            shutdown_signal: What stops training before the next batch. Either an event that,
                once set (from any thread), stops it; or, as upstream emote takes it, a function
                of no arguments returning whether to stop, called once for every batch before
                that batch is trained. The state's ``shutdown_signal`` is always an event (set
                when the function says stop) for callbacks that wait, such as memory warm-up. A
                new event is made when omitted.

        Returns:
            The final training state (``bp_step`` is the number of the last completed step).

        Raises:
            TypeError: If ``shutdown_signal`` is neither an event nor a callable.
        """
        self._poll: Callable[[], bool] | None = None
        if isinstance(shutdown_signal, threading.Event):
            self.shutdown_signal = shutdown_signal
        elif callable(shutdown_signal):
            self._poll = shutdown_signal
        elif shutdown_signal is not None:
            raise TypeError(
                "Trainer.train(shutdown_signal=...) takes a threading.Event or a function of no "
                f"arguments returning whether to stop; got {shutdown_signal!r} "
                f"({type(shutdown_signal).__name__})"
            )
        self._implementers = {
            hook: [c for c in self.callbacks if c.overrides(hook)] for hook in LIFECYCLE_HOOKS
        }
        self.state["shutdown_signal"] = self.shutdown_signal
        try:
            if self._run_hook("restore_state") and self._run_hook("begin_training"):
                self._loop()
        except BaseException as error:
            self._end_training(during_error=error)
            raise
        self._end_training(during_error=None)
        return self.state

    def _loop(self) -> None:
        state = self.state
        batches = iter(self.dataloader)
        while not self.shutdown_signal.is_set():
            try:
                batch = next(batches)
            except StopIteration:
                break
            except TrainingShutdownException:
                log.info("the data loader asked training to stop at bp_step %d", state["bp_step"])
                break
            if self._stop_requested():  # before this batch is trained
                break
            # A batch without the key counts the state's value (set by the user or an earlier
            # batch), as upstream emote did.
            batch_size = batch.get(self.batch_size_key, state.get(self.batch_size_key))
            if batch_size is None:
                raise ConfigurationError(
                    f"a batch from the data loader has no '{self.batch_size_key}' key (the "
                    f"trainer's batch_size_key) and the state has none; batch keys: "
                    f"{sorted(batch)} — yield it with each batch or set "
                    f"trainer.state['{self.batch_size_key}']"
                )
            bp_step = state["bp_step"] + 1
            state["bp_step"] = bp_step
            state["bp_samples"] = state["bp_samples"] + int(batch_size)
            state.merge(batch)
            if not self._run_hook("begin_cycle", bp_step - 1):
                break
            if not (
                self._run_hook("begin_batch")
                and self._run_hook("backward")
                and self._run_hook("end_batch")
                and self._run_hook("end_cycle", bp_step)
            ):
                break

    def _stop_requested(self) -> bool:
        """Whether the event is set (perhaps while the loader produced a batch) or the polled
        function, called once here, says stop; its answer sets the event for the callbacks."""
        if self.shutdown_signal.is_set():
            return True
        if self._poll is not None and self._poll():
            log.info(
                "the shutdown function asked training to stop at bp_step %d", self.state["bp_step"]
            )
            self.shutdown_signal.set()
            return True
        return False

    def _run_hook(self, hook: str, cycle_position: int | None = None) -> bool:
        """Runs ``hook`` on every callback that implements it (and whose cycle is due).

        Returns:
            False when a callback asked for shutdown; the remaining callbacks still ran the hook.
        """
        keep_going = True
        state = self.state
        for callback in self._implementers[hook]:
            if cycle_position is not None and (
                callback.cycle is None or cycle_position % callback.cycle != 0
            ):
                continue
            try:
                result = callback.call_hook(hook, state)
            except TrainingShutdownException as request:
                log.log(
                    request.log_level,
                    "callback '%s' asked training to stop during '%s' at bp_step %d",
                    callback.name,
                    hook,
                    state["bp_step"],
                )
                keep_going = False
                continue
            except Exception as error:
                _name_culprit(error, callback, hook, state["bp_step"])
                raise
            if result:
                state.merge(result)
        return keep_going

    def _end_training(self, during_error: BaseException | None) -> None:
        """Runs ``end_training`` everywhere; the first error is raised unless one is in flight.

        The state's ``training_error`` holds the error that ended training, or ``None``.
        """
        self.state["training_error"] = during_error
        first_error: BaseException | None = None
        for callback in self._implementers["end_training"]:
            try:
                result = callback.call_hook("end_training", self.state)
                if result:
                    self.state.merge(result)
            except TrainingShutdownException:
                continue
            except Exception as error:
                _name_culprit(error, callback, "end_training", self.state["bp_step"])
                if during_error is not None:
                    log.error(
                        "callback '%s' failed in end_training while handling an earlier error: %s",
                        callback.name,
                        error,
                    )
                elif first_error is None:
                    first_error = error
        if first_error is not None:
            raise first_error


def _name_culprit(error: BaseException, callback: Callback, hook: str, bp_step: int) -> None:
    if isinstance(error, MissingStateKeyError):
        return  # its message already names the callback, the hook and the key
    error.add_note(
        f"raised by callback '{callback.name}' ({type(callback).__name__}) in hook '{hook}' "
        f"at bp_step {bp_step}"
    )


__all__ = ["BudgetReached", "StateDict", "Trainer", "TrainingShutdownException"]
