"""Wrappers around a memory proxy: forwarding to the wrapped proxy, and periodic table exports.

A wrapper is itself a proxy: it takes the same ``add(observations, responses)`` calls, does its
own work and passes them on. Attributes, methods and properties it does not define are looked up
on the wrapped proxy, so a stack of wrappers behaves like the proxy at its bottom
(``wrapper.table``, ``wrapper.timers``, ``wrapper.size()``).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from emote_core.memory.proxy import MemoryProxy
from emote_core.typing import AgentId, DictObservation, DictResponse, EpisodeState
from emote_core.utils import BlockTimers

if TYPE_CHECKING:
    from emote_core.memory.table import ArrayMemoryTable

log = logging.getLogger(__name__)

_RUNNING = EpisodeState.RUNNING
_INITIAL = EpisodeState.INITIAL
_FINAL = (EpisodeState.TERMINAL, EpisodeState.INTERRUPTED)


def agent_steps(observations: Mapping[AgentId, DictObservation]) -> int:
    """Observations that got an action (INITIAL and RUNNING ones): one inference each."""
    return sum(1 for o in observations.values() if o.episode_state in (_RUNNING, _INITIAL))


class MemoryProxyWrapper:
    """Base of proxy wrappers: passes ``add`` on and forwards the methods and properties of the
    proxies below it (a plain attribute of one is read from it: :attr:`inner`, :attr:`unwrapped`).

    Whole episodes (``add_episode``) pass through a wrapper that has no ``add`` of its own, or
    that overrides ``add_episode`` too: a wrapper whose ``add`` does work must see every step
    unless it says what to do with a whole episode, so a stack holding one that does not say
    does not accept episodes, and its collector adds steps.

    Args:
        inner: The wrapped proxy (a :class:`~emote_core.memory.proxy.MemoryTableProxy` or another
            wrapper).
    """

    def __init__(self, inner: MemoryProxy) -> None:
        self._inner = inner

    @property
    def inner(self) -> MemoryProxy:
        """The wrapped proxy."""
        return self._inner

    @property
    def unwrapped(self) -> MemoryProxy:
        """The proxy at the bottom of the stack of wrappers."""
        proxy: Any = self._inner
        while isinstance(proxy, MemoryProxyWrapper):
            proxy = proxy.inner
        return proxy

    def add(
        self,
        observations: Mapping[AgentId, DictObservation],
        responses: Mapping[AgentId, DictResponse],
    ) -> None:
        """Passes one step of every agent on to the wrapped proxy."""
        self._inner.add(observations, responses)

    def is_initial(self, identity: AgentId) -> bool:
        """Whether agent ``identity`` has no open episode."""
        return self._inner.is_initial(identity)

    @property
    def accepts_episodes(self) -> bool:
        """Whether every proxy in the stack takes whole episodes."""
        cls = type(self)
        handles = cls.add is MemoryProxyWrapper.add or (
            cls.add_episode is not MemoryProxyWrapper.add_episode
        )
        return handles and bool(getattr(self._inner, "accepts_episodes", False))

    def add_episode(self, sequence: Mapping[str, np.ndarray], end_state: EpisodeState) -> None:
        """Passes one whole finished episode on (see ``MemoryTableProxy.add_episode``).

        Raises:
            TypeError: If a proxy in the stack works on steps only.
        """
        if not self.accepts_episodes:
            raise TypeError(
                f"{self!r} takes steps only (add): a wrapper with an add of its own takes whole "
                "episodes once it overrides add_episode too"
            )
        self._inner.add_episode(sequence, end_state)  # type: ignore[attr-defined]

    def _class_attribute(self, name: str) -> Any:
        """``name`` as the class of a proxy down the stack defines it (``None`` if none does)."""
        inner = self._inner
        found = inspect.getattr_static(type(inner), name, None)
        if found is None and isinstance(inner, MemoryProxyWrapper):
            return inner._class_attribute(name)
        return found

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails. Dunder names and the wrapped proxy itself are not
        # forwarded: copy/pickle probe dunders before __init__ has run.
        if name.startswith("__") or name == "_inner":
            raise AttributeError(name)
        try:
            inner = self.__dict__["_inner"]
        except KeyError:
            raise AttributeError(name) from None
        value = getattr(inner, name)
        if inspect.ismethod(value) or isinstance(self._class_attribute(name), property):
            return value
        raise AttributeError(
            f"{type(self).__name__} forwards only methods and properties of the proxy it wraps; "
            f"'{name}' is a plain attribute of it: read it from the wrapped proxy (.inner or "
            ".unwrapped)"
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._inner!r})"


class MemoryTableProxyWrapper(MemoryProxyWrapper):
    """A wrapper of a :class:`~emote_core.memory.proxy.MemoryTableProxy` (or of a wrapper of one).

    Adds the table proxy's API, typed, on top of :class:`MemoryProxyWrapper`'s forwarding.
    """

    @property
    def table(self) -> ArrayMemoryTable:
        """The table the proxy adds episodes to."""
        return self._inner.table  # type: ignore[attr-defined]

    @property
    def timers(self) -> BlockTimers:
        """The proxy's block timers."""
        return self._inner.timers  # type: ignore[attr-defined]

    def size(self) -> int:
        """Transitions held by the table."""
        return self._inner.size()  # type: ignore[attr-defined]

    def resize(self, maxlen: int) -> None:
        """Changes the table's ``maxlen``."""
        self._inner.resize(maxlen)  # type: ignore[attr-defined]


__all__ = [
    "MemoryProxyWrapper",
    "MemoryTableProxyWrapper",
    "agent_steps",
]
