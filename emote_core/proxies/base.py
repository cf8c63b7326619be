"""What collectors call: the agent-proxy protocol and the helpers proxies share.

An agent proxy turns the observations of many agents into their responses in one batched call.
Only agents whose observation is ``INITIAL`` or ``RUNNING`` act; final observations (``TERMINAL``,
``INTERRUPTED``) get no response.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol, runtime_checkable

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

    The network's previous train/eval mode is restored afterwards, so a proxy may act with the
    very network a loss is training. A network already in eval mode is used as it is: switching
    modes walks every submodule, which costs more than a small policy's forward pass.
    """
    if not network.training:
        with torch.no_grad():
            yield
        return
    network.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        network.train(True)


def as_generator(seed: int | None) -> torch.Generator:
    """A CPU torch generator seeded with ``seed``, or from fresh entropy when ``None``."""
    generator = torch.Generator()
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(int(seed))
    return generator


__all__ = ["AgentProxy", "MemoryProxy", "acting_agents", "as_generator", "inference_mode_of"]
