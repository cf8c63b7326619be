"""What collectors call: the agent-proxy protocol and the helpers proxies share.

An agent proxy turns the observations of many agents into their responses in one batched call.
Only agents whose observation is ``INITIAL`` or ``RUNNING`` act; final observations (``TERMINAL``,
``INTERRUPTED``) get no response.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from emote_core.errors import ConfigurationError
from emote_core.memory.proxy import MemoryProxy
from emote_core.typing import AgentId, DictObservation, DictResponse, EpisodeState

_ACTING = (EpisodeState.INITIAL, EpisodeState.RUNNING)


@runtime_checkable
class AgentProxy(Protocol):
    """Answers a step's observations with the acting agents' responses."""

    def __call__(
        self, observations: Mapping[AgentId, DictObservation]
    ) -> dict[AgentId, DictResponse]:
        """Returns one response per ``INITIAL`` or ``RUNNING`` observation, none for others."""
        ...

    @property
    def input_names(self) -> tuple[str, ...]:
        """The observation keys the proxy reads."""
        ...

    @property
    def output_names(self) -> tuple[str, ...]:
        """The ``list_data`` keys of the responses it returns."""
        ...


def acting_agents(observations: Mapping[AgentId, DictObservation]) -> list[AgentId]:
    """The agents whose observation asks for an action (``INITIAL`` or ``RUNNING``)."""
    return [agent for agent, o in observations.items() if o.episode_state in _ACTING]


def key_names(owner: str, what: str, keys: Sequence[str]) -> tuple[str, ...]:
    """Validates a non-empty sequence of distinct key names.

    Raises:
        ConfigurationError: If ``keys`` is a string, empty, or holds a non-string or duplicate.
    """
    if isinstance(keys, str):
        raise ConfigurationError(
            f"{owner}: {what} must be a sequence of key names, not the string {keys!r}; "
            f"write [{keys!r}]"
        )
    names = tuple(keys)
    if not names or not all(isinstance(k, str) and k for k in names):
        raise ConfigurationError(
            f"{owner}: {what} must name at least one key, each a non-empty string; got {keys!r}"
        )
    if len(set(names)) != len(names):
        raise ConfigurationError(f"{owner}: {what} names a key twice: {list(names)}")
    return names


@contextlib.contextmanager
def inference_mode_of(network: nn.Module) -> Iterator[None]:
    """Runs a block with ``network`` in eval mode and without gradients.

    Each module's previous train/eval mode is restored afterwards, so a proxy may act with the
    very network a loss is training. A network already in eval mode is used as it is. The
    switch sets the modules' flags directly (``nn.Module.train`` walks the tree through
    ``__setattr__``, costing nearly a forward pass per act); a tree with a module of its own
    ``train`` goes through ``train``.
    """
    if not network.training:
        with torch.no_grad():
            yield
        return
    modules = _switchable_modules(network)
    if modules is None:
        network.eval()
        try:
            with torch.no_grad():
                yield
        finally:
            network.train(True)
        return
    modes = [m.__dict__["training"] for m in modules]
    for module in modules:
        module.__dict__["training"] = False
    try:
        with torch.no_grad():
            yield
    finally:
        for module, mode in zip(modules, modes, strict=True):
            module.__dict__["training"] = mode


_TREES: weakref.WeakKeyDictionary[nn.Module, list[tuple[nn.Module, tuple[Any, ...]]]] = (
    weakref.WeakKeyDictionary()
)


def _switchable_modules(network: nn.Module) -> list[nn.Module] | None:
    """Every module of ``network`` (itself first), from a cache checked against each module's
    current children; ``None`` when a module overrides ``train`` (its own switch must run)."""
    tree = _TREES.get(network)
    if tree is not None and all(
        tuple(module._modules.values()) == children for module, children in tree
    ):
        return [module for module, _ in tree]
    modules = list(network.modules())
    if any(type(module).train is not nn.Module.train for module in modules):
        return None
    if any("training" not in module.__dict__ for module in modules):
        return None
    _TREES[network] = [(module, tuple(module._modules.values())) for module in modules]
    return modules


def as_generator(seed: int | None) -> torch.Generator:
    """A CPU torch generator seeded with ``seed``, or from fresh entropy when ``None``."""
    generator = torch.Generator()
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(int(seed))
    return generator


__all__ = ["AgentProxy", "MemoryProxy", "acting_agents", "as_generator", "inference_mode_of"]
