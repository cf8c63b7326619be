"""Callbacks: the pieces a training run is composed of.

A callback implements some of a closed list of hooks. The trainer calls each hook with the values
of the training state whose names match the hook's parameters (values in the callback's data group
first, then top-level values), and merges what the hook returns back into the state. Extra hooks a
callback calls itself (``loss``, ``get_batch``) are declared in :attr:`Callback.extra_hooks` and get
the same by-name selection from the keyword arguments they are called with.
"""

from __future__ import annotations

import functools
import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from emote_core.errors import CallbackDefinitionError, MissingStateKeyError

LIFECYCLE_HOOKS: tuple[str, ...] = (
    "restore_state",
    "begin_training",
    "begin_cycle",
    "begin_batch",
    "backward",
    "end_batch",
    "end_cycle",
    "end_training",
)
"""The hooks the trainer calls, in the order a run reaches them."""


class Order:
    """Named positions for :attr:`Callback.order`; lower runs first within each hook."""

    RESTORE = -200
    """Loads checkpoints in ``restore_state`` before anything else looks at the state."""
    DATA = -100
    """Brings data in: memory importers, warm-up, extra batch fetchers."""
    REWARD = -75
    """Rewrites the batch's rewards (an imitation reward, shaping) before the targets read them."""
    TARGET = -50
    """Computes training targets before the losses use them."""
    DEFAULT = 0
    """Losses and most callbacks."""
    EVALUATION = 50
    """Plays the policy after this step's updates, so the loggers and checkpointers see it."""
    LOGGING = 100
    """Reads what the losses logged."""
    TERMINATOR = 200
    """Decides when training stops."""
    CHECKPOINT = 300
    """Writes checkpoints and exports after this step's updates and logs."""
    TEST_CHECK = 400
    """Judges the finished run."""


@dataclass(frozen=True)
class _HookPlan:
    """How to call one hook: its named parameters and whether it takes ``**kwargs``."""

    required: tuple[str, ...]
    optional: tuple[str, ...]
    takes_all: bool

    @classmethod
    def of(cls, function: Callable[..., Any]) -> _HookPlan:
        required: list[str] = []
        optional: list[str] = []
        takes_all = False
        parameters = list(inspect.signature(function).parameters.values())
        for parameter in parameters[1:]:  # skip self
            if parameter.kind is inspect.Parameter.VAR_KEYWORD:
                takes_all = True
            elif parameter.kind is inspect.Parameter.VAR_POSITIONAL:
                continue
            elif parameter.default is inspect.Parameter.empty:
                required.append(parameter.name)
            else:
                optional.append(parameter.name)
        return cls(tuple(required), tuple(optional), takes_all)


_EMPTY: Mapping[str, Any] = {}
"""Stands for a missing data group, so that argument selection needs no per-key test for it."""


def _is_hook_name(name: str) -> bool:
    return name.startswith(("begin_", "end_"))


class Callback:
    """Base of every callback.

    Subclasses override any of :data:`LIFECYCLE_HOOKS`; each hook's parameters are filled by name
    from the training state. A hook may return a dict to merge back into the state; a value under
    a data group's name (``{"default": {...}}``) merges into that group.

    Class attributes:
        order: Position within each hook relative to other callbacks (see :class:`Order`).
        extra_hooks: Names of further hooks this callback calls itself, such as ``loss``; they
            select their arguments by name like the lifecycle hooks.
        graph_safe: Whether the batch hooks do the same GPU work every step, with no host
            synchronisation, so that one recorded CUDA graph can replay them
            (``training.compile = "cuda_graphs"``; see :meth:`capture_blocker`).
        compiled_methods: Methods that ``training.compile = "compile"`` runs through
            ``torch.compile`` (a loss's ``loss``).

    Args:
        name: A unique name, used for logs and checkpoints. Defaults to the class name.
        cycle: ``begin_cycle`` runs when ``(bp_step - 1) % cycle == 0`` and ``end_cycle`` when
            ``bp_step % cycle == 0``; ``None`` or ``0`` never runs them (``0`` is stored as
            ``None``).
        data_group: The data group whose values this callback's hooks see first.
    """

    order: ClassVar[int] = Order.DEFAULT
    extra_hooks: ClassVar[tuple[str, ...]] = ()
    graph_safe: ClassVar[bool] = False
    compiled_methods: ClassVar[tuple[str, ...]] = ()
    _hook_plans: ClassVar[dict[str, _HookPlan]] = {}

    def __init__(
        self, *, name: str | None = None, cycle: int | None = None, data_group: str | None = None
    ) -> None:
        if cycle is not None and (
            not isinstance(cycle, int) or isinstance(cycle, bool) or cycle < 0
        ):
            raise CallbackDefinitionError(
                f"callback '{name or type(self).__name__}' has cycle={cycle!r}; a cycle must be a "
                "positive integer, or 0 or None for never"
            )
        if cycle == 0:  # upstream emote's spelling of "never"
            cycle = None
        self.name = name if name is not None else type(self).__name__
        self.cycle = cycle
        self.data_group = data_group

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        known = set(LIFECYCLE_HOOKS) | set(cls.extra_hooks)
        clashing = set(cls.extra_hooks) & set(LIFECYCLE_HOOKS)
        if clashing:
            raise CallbackDefinitionError(
                f"callback class {cls.__qualname__} declares lifecycle hooks {sorted(clashing)} "
                "as extra hooks; extra hooks need names of their own"
            )
        for attribute, value in vars(cls).items():
            if _is_hook_name(attribute) and callable(value) and attribute not in known:
                raise CallbackDefinitionError(
                    f"callback class {cls.__qualname__} defines '{attribute}', which is not a "
                    f"hook; the hooks are {', '.join(LIFECYCLE_HOOKS)}"
                    + (f" and extra hooks {', '.join(cls.extra_hooks)}" if cls.extra_hooks else "")
                    + " — rename the method or declare it in extra_hooks"
                )
        plans = {hook: _HookPlan.of(getattr(cls, hook)) for hook in LIFECYCLE_HOOKS}
        for hook in cls.extra_hooks:
            function = vars(cls).get(hook)
            if function is not None and not getattr(function, "_emote_extra_hook", False):
                setattr(cls, hook, wrap_extra_hook(hook, function))
            declared = getattr(cls, hook, None)
            if declared is None:
                raise CallbackDefinitionError(
                    f"callback class {cls.__qualname__} declares extra hook '{hook}' but defines "
                    "no method of that name"
                )
            plans[hook] = declared._emote_plan
        cls._hook_plans = plans

    # The lifecycle hooks. Parameters of overrides are filled from the training state by name.

    def restore_state(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        """Called once before training starts, to load checkpoints or warm up."""

    def begin_training(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        """Called once before the first batch."""

    def begin_cycle(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        """Called before the first batch of each cycle of :attr:`cycle` steps."""

    def begin_batch(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        """Called for every batch before ``backward``; the place to compute targets."""

    def backward(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        """Called for every batch; the place to compute losses and step optimizers."""

    def end_batch(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        """Called for every batch after ``backward``."""

    def end_cycle(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        """Called after the last batch of each cycle of :attr:`cycle` steps."""

    def end_training(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        """Called once when training stops, however it stops."""

    # State for checkpoints.

    def state_dict(self) -> dict[str, Any]:
        """Returns what this callback needs to resume: tensors, numbers, strings, lists, dicts."""
        return {}

    def load_state_dict(
        self,
        state_dict: dict[str, Any],
        load_network: bool = True,
        load_optimizer: bool = True,
        load_hparams: bool = True,
    ) -> None:
        """Restores what :meth:`state_dict` returned.

        Args:
            state_dict: The saved state.
            load_network: Whether to restore network weights.
            load_optimizer: Whether to restore optimizer state.
            load_hparams: Whether to restore hyperparameters such as learning rates.
        """

    # Calling hooks.

    def capture_blocker(self) -> str | None:
        """Why this callback's batch hooks cannot be recorded once in a CUDA graph and replayed
        (``None``: they can). Classes declare ``graph_safe = True`` when their update is the same
        every step; subclasses add the settings that break it (a learning-rate schedule, say)."""
        if type(self).graph_safe:
            return None
        return "it does not declare its update safe to record in a CUDA graph (graph_safe)"

    def overrides(self, hook: str) -> bool:
        """Whether this callback's class implements ``hook`` (base no-ops are skipped)."""
        return getattr(type(self), hook) is not getattr(Callback, hook, None)

    def call_hook(self, hook: str, state: Mapping[str, Any]) -> Any:
        """Calls ``hook`` with its parameters selected by name from ``state``.

        Values in ``state[self.data_group]`` are found before top-level values.

        Raises:
            MissingStateKeyError: If a required parameter is in neither place.
        """
        plan = self._hook_plans[hook]
        data_group = self.data_group
        group = state.get(data_group) if data_group is not None else None
        if group is not None and type(group) is not dict and not isinstance(group, Mapping):
            group = None
        method = getattr(self, hook)
        if plan.takes_all:
            return method(**state) if group is None else method(**{**state, **group})
        if group is None:
            group = _EMPTY
        arguments = {}
        for key in plan.required:
            if key in group:
                arguments[key] = group[key]
            elif key in state:
                arguments[key] = state[key]
            else:
                raise self._missing_key(hook, key, state, group if group is not _EMPTY else None)
        for key in plan.optional:
            if key in group:
                arguments[key] = group[key]
            elif key in state:
                arguments[key] = state[key]
        return method(**arguments)

    def _missing_key(
        self, hook: str, key: str, available: Mapping[str, Any], group: Mapping[str, Any] | None
    ) -> MissingStateKeyError:
        top = sorted(k for k in available if not isinstance(available[k], Mapping))
        where = f"data group '{self.data_group}' or the top level" if self.data_group else "state"
        keys = f"top level: {top}"
        if self.data_group is not None:
            in_group = sorted(group) if group is not None else "(group not in the state yet)"
            keys += f"; group '{self.data_group}': {in_group}"
        return MissingStateKeyError(
            f"callback '{self.name}' ({type(self).__name__}) hook '{hook}' needs '{key}', which "
            f"is not in the {where}; available keys — {keys}. Provide '{key}' from the data "
            "loader or an earlier callback, or give the parameter a default"
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def wrap_extra_hook(hook: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """Makes an extra hook select its keyword arguments by name, like a lifecycle hook.

    The wrapped ``function`` is the result's ``__wrapped__``; every extra hook shares the
    wrapper's code, so ``torch.compile`` is given the hook's own function (see
    :func:`~emote_core.callbacks.compiled.compile_methods`)."""
    plan = _HookPlan.of(function)

    @functools.wraps(function)
    def select_and_call(self: Callback, *args: Any, **kwargs: Any) -> Any:
        if plan.takes_all or args:
            return function(self, *args, **kwargs)
        selected = {}
        for key in plan.required:
            if key not in kwargs:
                raise self._missing_key(hook, key, kwargs, None)
            selected[key] = kwargs[key]
        for key in plan.optional:
            if key in kwargs:
                selected[key] = kwargs[key]
        return function(self, **selected)

    select_and_call._emote_extra_hook = True  # type: ignore[attr-defined]
    select_and_call._emote_plan = plan  # type: ignore[attr-defined]
    return select_and_call


def repeated_names(callbacks: Iterable[Callback]) -> list[str]:
    """The callback names that occur more than once (names key logs and checkpoints)."""
    names = [c.name for c in callbacks]
    return sorted({n for n in names if names.count(n) > 1})


Callback._hook_plans = {hook: _HookPlan.of(getattr(Callback, hook)) for hook in LIFECYCLE_HOOKS}


class BatchCallback(Callback, ABC):
    """A callback that fetches batches of its own through the ``get_batch`` extra hook.

    Algorithms that train on a second data source (demonstrations, a discriminator's expert data)
    implement :meth:`get_batch` and call it from their hooks with the state's values.
    """

    extra_hooks: ClassVar[tuple[str, ...]] = ("get_batch",)

    @abstractmethod
    def get_batch(self, *args: Any, **kwargs: Any) -> Any:
        """Returns a batch; parameters are selected by name from the keyword arguments given."""


__all__ = [
    "LIFECYCLE_HOOKS",
    "BatchCallback",
    "Callback",
    "Order",
    "repeated_names",
    "wrap_extra_hook",
]
