"""Compiled training steps: ``torch.compile`` of the losses, and the whole update in a CUDA graph.

A recipe's ``training.compile`` chooses: ``"compile"`` passes each callback's
``compiled_methods`` through ``torch.compile``; ``"cuda_graphs"`` (:class:`CapturedUpdate`)
records one whole update after a few eager warm-up batches and replays it for every later
batch; ``"compile+cuda_graphs"`` does both. Only callbacks with ``graph_safe = True`` (and no
:meth:`~emote_core.callback.Callback.capture_blocker`) are captured: a replay repeats exactly
what was recorded.
"""

from __future__ import annotations

import functools
import logging
import types
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

import torch

from emote_core.callback import Callback, Order, wrap_extra_hook
from emote_core.callbacks.loss import LossCallback, set_capturable
from emote_core.errors import ConfigurationError
from emote_core.trainer import StateDict

log = logging.getLogger(__name__)

COMPILE_MODES = ("none", "compile", "cuda_graphs", "compile+cuda_graphs")
"""The values of a recipe's ``training.compile``."""
_BATCH_HOOKS = ("begin_batch", "backward", "end_batch")
_UNSUPPORTED_HOOKS = ("begin_cycle", "end_cycle")


def check_compile_mode(mode: str, source: str = "training.compile") -> str:
    """``mode`` if it is one of :data:`COMPILE_MODES`."""
    if mode not in COMPILE_MODES:
        raise ConfigurationError(
            f"{source} must be one of {', '.join(repr(m) for m in COMPILE_MODES)}; got {mode!r}"
        )
    return mode


def compile_methods(callbacks: Iterable[Callback], **options: Any) -> int:
    """Replaces each callback's ``compiled_methods`` by ``torch.compile`` of them, in place.

    The callbacks keep their classes, names and checkpoints; only the listed methods of these
    instances run compiled. Returns how many methods were compiled.
    """
    count = 0
    for callback in callbacks:
        for name in getattr(callback, "compiled_methods", ()):
            method = getattr(callback, name)
            if getattr(method, "_emote_compiled", False):
                continue
            setattr(callback, name, _compiled(callback, name, method, options))
            count += 1
    return count


def _compiled(callback: Callback, name: str, method: Any, options: dict[str, Any]) -> Any:
    """``torch.compile`` of one callback's method, on a copy of its function of its own, run
    with the callback's pending logs set aside.

    Dynamo keeps compiled graphs per code object, up to ``recompile_limit`` (8) of them, and
    checks their guards in turn on every call. An extra hook (a loss's ``loss``) is a wrapper
    that selects its arguments by name, whose code every extra hook of every class shares:
    compiling it put every loss's graphs in one list, and from the ninth on the losses ran
    eagerly. Instances of one class share their method's code too (ten Q losses would). So each
    callback's method is compiled from a copy of the function with a code object of its own,
    and an extra hook's argument selection runs before it, uncompiled.

    Scalars logged inside a compiled method go to the callback's pending logs, a dict that
    dynamo guards: whether it held values on entry (it does until a logger reads them) would
    compile each method twice. The method always meets it empty; what it held is put back, and
    what the method logged added, afterwards.
    """
    function = getattr(method, "__func__", None)
    if function is None or getattr(method, "__self__", None) is not callback:
        return _with_logs_set_aside(torch.compile(method, **options), callback)  # not a method
    extra_hook = getattr(function, "_emote_extra_hook", False)
    body = torch.compile(_own_copy(function.__wrapped__ if extra_hook else function), **options)
    run = _with_logs_set_aside(body, callback)
    if extra_hook:
        run = wrap_extra_hook(name, run)
        run._emote_compiled = True  # type: ignore[attr-defined]
    return types.MethodType(run, callback)


def _own_copy(function: Any) -> Any:
    """``function`` with a code object of its own (equal to its own, not the same object)."""
    copy = types.FunctionType(
        function.__code__.replace(), function.__globals__, function.__name__,
        function.__defaults__, function.__closure__,
    )  # fmt: skip
    copy.__kwdefaults__ = function.__kwdefaults__
    return functools.update_wrapper(copy, function)


def _with_logs_set_aside(compiled: Any, callback: Callback) -> Any:
    """``compiled`` run with ``callback``'s pending scalar logs emptied around it (the same
    dict, which CUDA-graph replays write to, holding what it held plus what was logged)."""
    attributes = callback.__dict__

    @functools.wraps(compiled)
    def run(*args: Any, **kwargs: Any) -> Any:
        pending = attributes.get("_pending_scalars")
        if not pending:
            return compiled(*args, **kwargs)
        held = dict(pending)
        pending.clear()
        try:
            return compiled(*args, **kwargs)
        finally:
            logged = dict(pending)
            pending.clear()
            pending.update(held)
            pending.update(logged)

    run._emote_compiled = True  # type: ignore[attr-defined]
    return run


def graph_counts() -> tuple[int, int]:
    """``(graphs, graph breaks)``: how many graphs ``torch.compile`` has made in this process,
    and how many graph breaks it met, since dynamo's counters were last cleared
    (``torch._dynamo.utils.counters.clear()``). Whole compiled updates make one graph per
    compiled method and no breaks."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


def batch_callbacks(callbacks: Iterable[Callback]) -> list[Callback]:
    """The callbacks among ``callbacks`` that implement a per-batch hook."""
    return [c for c in callbacks if any(c.overrides(hook) for hook in _BATCH_HOOKS)]


def capture_blockers(callbacks: Iterable[Callback]) -> list[str]:
    """Why each callback that cannot be captured in a CUDA graph cannot (empty: all can)."""
    reasons = []
    for callback in callbacks:
        reason = callback.capture_blocker()
        if reason is None and any(callback.overrides(h) for h in _UNSUPPORTED_HOOKS):
            reason = "it runs on a cycle (begin_cycle/end_cycle)"
        if reason is not None:
            reasons.append(f"'{callback.name}' ({type(callback).__name__}): {reason}")
    return reasons


def _refuse_blocked(callbacks: Sequence[Callback]) -> None:
    blocked = capture_blockers(callbacks)
    if blocked:
        raise ConfigurationError(
            "cannot record the update in a CUDA graph: " + "; ".join(blocked)
            + ". Use training.compile = 'compile' or 'none'"
        )  # fmt: skip


def _make_capturable(optimizer: torch.optim.Optimizer) -> None:
    """Switches ``optimizer`` to its CUDA-graph-safe form: step counters on the parameters'
    device, read there rather than on the host."""
    if any("capturable" not in group for group in optimizer.param_groups):
        raise ConfigurationError(
            f"{type(optimizer).__name__} has no capturable form, so its step cannot be "
            "recorded in a CUDA graph; use Adam or AdamW, or training.compile = 'compile'"
        )
    set_capturable(optimizer, [True] * len(optimizer.param_groups))


def _tensor_paths(
    state: Mapping[str, Any], skip: set[tuple[str, ...]], prefix: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], torch.Tensor]]:
    """Every tensor of the state, in data groups and observation dicts too, with where it is;
    except those at ``skip`` (what the update itself puts in the state)."""
    found = []
    for key, value in state.items():
        path = (*prefix, key)
        if path in skip:
            continue
        if isinstance(value, torch.Tensor):
            found.append((path, value))
        elif isinstance(value, Mapping):
            found += _tensor_paths(value, skip, path)
    return found


def _produced_paths(
    result: Mapping[str, Any], prefix: tuple[str, ...] = ()
) -> set[tuple[str, ...]]:
    """Where an update's result puts values in the state (its leaves, not the groups)."""
    paths = set()
    for key, value in result.items():
        path = (*prefix, key)
        if isinstance(value, Mapping):
            paths |= _produced_paths(value, path)
        else:
            paths.add(path)
    return paths


def _signature(paths: Sequence[tuple[tuple[str, ...], torch.Tensor]]) -> tuple[Any, ...]:
    return tuple((path, t.shape, t.dtype, t.device) for path, t in paths)


class _Graph:
    """One recorded update: its graph, input tensors, outputs and the logs it refreshes."""

    def __init__(self) -> None:
        self.graph = torch.cuda.CUDAGraph()
        self.inputs: list[torch.Tensor] = []
        self.result: dict[str, Any] = {}
        self.logs: list[tuple[dict[str, torch.Tensor], str, torch.Tensor]] = []
        self.step: Any = None


class CapturedUpdate(Callback):
    """Runs a block of update callbacks as one CUDA graph (see the module's notes).

    The block's callbacks leave the trainer's list; this callback runs their batch hooks, in
    their order, during the trainer's ``backward`` and forwards ``restore_state``,
    ``begin_training`` and ``end_training`` to them. They stay what checkpoints and loggers see.

    Args:
        callbacks: The update callbacks, each ``graph_safe``.
        device: The CUDA device they train on.
        warmup: Eager updates before the capture (at least 1: optimizers create their state).
        name: Unique name.

    Raises:
        ConfigurationError: If a callback cannot be captured, the device is not CUDA or an
            optimizer has no capturable form.
    """

    order: ClassVar[int] = Order.DEFAULT
    max_graphs: ClassVar[int] = 4
    """Batch layouts kept recorded (a layout beyond them is run eagerly)."""

    def __init__(
        self,
        callbacks: Sequence[Callback],
        *,
        device: torch.device | str,
        warmup: int = 3,
        name: str = "captured_update",
    ) -> None:
        super().__init__(name=name)
        self.device = torch.device(device)
        if self.device.type != "cuda":
            raise ConfigurationError(f"CUDA graphs need a CUDA device; training is on {device}")
        if warmup < 1:
            raise ConfigurationError(f"{name}: warmup must be at least 1; got {warmup}")
        self.inner = sorted(callbacks, key=lambda c: c.order)
        _refuse_blocked(self.inner)
        self.warmup = warmup
        self.eager_steps = 0
        self.replays = 0
        self._graphs: dict[tuple[Any, ...], _Graph] = {}
        self._stream: torch.cuda.Stream | None = None
        self._produced: set[tuple[str, ...]] = set()
        self._optimizers: list[torch.optim.Optimizer] = []

    # Forwarded lifecycle.

    def _forward(self, hook: str, state: Mapping[str, Any]) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        for callback in self.inner:
            if callback.overrides(hook):
                result = callback.call_hook(hook, state)
                if result:
                    merged.update(result)
        return merged

    def restore_state(self, **state: Any) -> dict[str, Any]:
        """The inner callbacks' ``restore_state``."""
        return self._forward("restore_state", state)

    def begin_training(self, **state: Any) -> dict[str, Any]:
        """The inner callbacks' ``begin_training``; then the optimizers turn capturable."""
        result = self._forward("begin_training", state)
        _refuse_blocked(self.inner)  # a gradient hook may have been set since
        self._optimizers = [c.optimizer for c in self.inner if isinstance(c, LossCallback)]
        for optimizer in self._optimizers:
            _make_capturable(optimizer)
        return result

    def end_training(self, **state: Any) -> dict[str, Any]:
        """The inner callbacks' ``end_training``."""
        return self._forward("end_training", state)

    # The update.

    def _run_block(self, state: dict[str, Any]) -> dict[str, Any]:
        """The inner callbacks' batch hooks, phase by phase, as the trainer would run them."""
        state, merged = StateDict(state), StateDict()
        for hook in _BATCH_HOOKS:
            for callback in self.inner:
                if not callback.overrides(hook):
                    continue
                result = callback.call_hook(hook, state)
                if result:
                    state.merge(result)
                    merged.merge(result)
        return merged

    def backward(self, **state: Any) -> dict[str, Any]:
        """One update: eager while warming up, else the recorded graph of this batch layout."""
        paths = _tensor_paths(state, self._produced)
        key = _signature(paths)
        graph = self._graphs.get(key)
        if graph is not None:
            for target, (_, value) in zip(graph.inputs, paths, strict=True):
                target.copy_(value, non_blocking=True)
            graph.graph.replay()
            self.replays += 1
            for pending, log_key, value in graph.logs:
                pending[log_key] = value
            return _restamp(graph.result, graph.step, state.get("bp_step"))
        if self.eager_steps < self.warmup:
            return self._warm_up(state)
        if len(self._graphs) >= self.max_graphs:
            return self._run_block(_copy_state(state))
        return self._capture(key, state, paths)

    def _warm_up(self, state: dict[str, Any]) -> dict[str, Any]:
        """An eager update on a side stream, as CUDA graph capture asks of the steps before it."""
        stream = self._side_stream()
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            result = self._run_block(_copy_state(state))
        torch.cuda.synchronize(self.device)
        self._produced |= _produced_paths(result)
        self.eager_steps += 1
        return result

    def _capture(
        self, key: tuple[Any, ...], state: dict[str, Any],
        paths: Sequence[tuple[tuple[str, ...], torch.Tensor]],
    ) -> dict[str, Any]:  # fmt: skip
        """Records this batch's update, then replays it once (capture itself computes nothing)."""
        torch.cuda.synchronize(self.device)
        graph = _Graph()
        static = _copy_state(state)
        for path, value in paths:
            copy = value.detach().clone()
            _set_path(static, path, copy)
            graph.inputs.append(copy)
        logged = [c for c in self.inner if hasattr(c, "scalar_logs")]
        for callback in logged:
            _ = callback.scalar_logs  # converts what was logged eagerly; pending is now empty
        for optimizer in self._optimizers:
            optimizer.zero_grad(set_to_none=True)
        graph.step = state.get("bp_step")
        # Each graph has a memory pool of its own: layouts replay in any order, and a shared
        # pool would let one graph's temporaries overwrite what another keeps between replays.
        with torch.cuda.graph(graph.graph, capture_error_mode="thread_local"):
            graph.result = self._run_block(static)
        for callback in logged:
            pending = callback.__dict__.setdefault("_pending_scalars", {})
            graph.logs += [(pending, k, v) for k, v in pending.items()]
        self._graphs[key] = graph
        log.info(
            "%s: recorded the update as a CUDA graph after %d eager updates (%d layouts)",
            self.name, self.eager_steps, len(self._graphs),
        )  # fmt: skip
        graph.graph.replay()
        self.replays += 1
        return graph.result

    def _side_stream(self) -> torch.cuda.Stream:
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        return self._stream


def _copy_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """The state with its dicts copied (hooks merge into data groups; inputs are swapped in)."""
    return {k: _copy_state(v) if isinstance(v, Mapping) else v for k, v in state.items()}


def _set_path(state: dict[str, Any], path: tuple[str, ...], value: torch.Tensor) -> None:
    for key in path[:-1]:
        state = state[key]
    state[path[-1]] = value


def _restamp(result: dict[str, Any], recorded: Any, now: Any) -> dict[str, Any]:
    """``result`` with the recording's ``bp_step`` (the step its outputs are stamped with, such
    as ``policy_log_probs_step``) replaced by this step's."""
    if not isinstance(recorded, int) or recorded == now:
        return result

    def stamp(value: Any) -> Any:
        return now if type(value) is int and value == recorded else value

    return {
        k: {ik: stamp(iv) for ik, iv in v.items()} if isinstance(v, Mapping) else stamp(v)
        for k, v in result.items()
    }


def compiled_training_callbacks(
    callbacks: Sequence[Callback], *, mode: str, device: torch.device
) -> tuple[list[Callback], str]:
    """The update callbacks as the trainer should run them under ``training.compile = mode``.

    Returns:
        ``(callbacks, mode)``: the list (the batch callbacks replaced by one
        :class:`CapturedUpdate` when CUDA graphs are used) and the mode actually applied, which
        drops ``cuda_graphs`` with a warning when training is not on a CUDA device.

    Raises:
        ConfigurationError: If the mode is unknown or a callback cannot be captured.
    """
    check_compile_mode(mode)
    wants_graphs = mode.endswith("cuda_graphs")
    if wants_graphs and device.type != "cuda":
        applied = "compile" if mode.startswith("compile") else "none"
        log.warning(
            "training.compile = '%s': CUDA graphs need a CUDA device and training is on %s; "
            "training with '%s' instead", mode, device, applied,
        )  # fmt: skip
        mode, wants_graphs = applied, False
    if mode.startswith("compile"):
        compile_methods(callbacks)
    if not wants_graphs:
        return list(callbacks), mode
    block = batch_callbacks(callbacks)
    captured = CapturedUpdate(block, device=device)
    at = min(callbacks.index(c) for c in block)
    rest = [c for c in callbacks if c not in block]
    return [*rest[:at], captured, *rest[at:]], mode


__all__ = [
    "COMPILE_MODES",
    "CapturedUpdate",
    "batch_callbacks",
    "capture_blockers",
    "check_compile_mode",
    "compile_methods",
    "compiled_training_callbacks",
    "graph_counts",
]
