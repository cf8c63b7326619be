"""The vocabulary shared by environments, agent proxies and memory.

An agent's episode starts with an ``INITIAL`` observation, continues with ``RUNNING`` ones and ends
with ``TERMINAL`` (the task ended: do not bootstrap) or ``INTERRUPTED`` (a time limit or external
cut: bootstrap from the final observation).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    import torch

AgentId = int
"""Identifies one agent (and so one open episode) across observations."""

Tensor = npt.NDArray[np.generic]
"""An array as environments and proxies exchange them (numpy; torch only inside models)."""


RewardFnType = Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"]
"""A reward function for model-based rollouts, named as in upstream emote.

It is called with a batch of actions and the batch of next observations a dynamics model predicted
for them, in that order, and returns the batch of rewards. The torch types are written as strings
so that importing this module does not import torch; ``typing.get_type_hints`` resolves them.
"""


class EpisodeState(IntEnum):
    """Where in its episode an observation stands."""

    RUNNING = 0
    """A mid-episode observation; it carries the reward of the previous action."""
    INTERRUPTED = 1
    """The last observation of an episode cut short (time limit): bootstrap from it."""
    TERMINAL = 2
    """The last observation of an episode whose task ended: do not bootstrap."""
    INITIAL = 3
    """The first observation of an episode; it carries no reward."""

    @property
    def is_final(self) -> bool:
        """Whether this state closes an episode."""
        return self in (EpisodeState.TERMINAL, EpisodeState.INTERRUPTED)

    @classmethod
    def from_gymnasium(cls, *, terminated: bool, truncated: bool) -> EpisodeState:
        """Maps gymnasium's step flags onto an episode state.

        ``terminated`` wins over ``truncated`` when both are set: the task really ended, so the
        final observation must not be bootstrapped from.
        """
        if terminated:
            return cls.TERMINAL
        if truncated:
            return cls.INTERRUPTED
        return cls.RUNNING


@dataclass
class MetaData:
    """Extra per-step information an environment reports (logged, not trained on).

    Attributes:
        info: Named scalar values, such as a success flag or a distance.
        info_lists: Named lists of values gathered over the step, such as per-contact forces.
    """

    info: dict[str, float] = field(default_factory=dict)
    info_lists: dict[str, list[float]] = field(default_factory=dict)


@dataclass(kw_only=True)
class DictObservation:
    """One agent's observation at one step.

    Built by keyword only: upstream emote's field order is ``(rewards, episode_state, array_data,
    metadata)``, so a positional call ported from there would put the rewards in the episode
    state here. ``docs/porting.md`` lists it.

    Attributes:
        episode_state: Where in the episode this observation stands.
        array_data: The observation arrays by key (for example ``{"obs": array([...])}``).
        rewards: Rewards by key for the previous action (``{"reward": 1.0}``); ``None`` or empty
            for ``INITIAL`` observations.
        metadata: Optional extra information to log.
    """

    episode_state: EpisodeState
    array_data: dict[str, Tensor]
    rewards: dict[str, float | None] = field(default_factory=dict)
    metadata: MetaData | None = None


@dataclass
class DictResponse:
    """What an agent proxy answers for one agent: its action arrays and scalar side values.

    Attributes:
        list_data: Arrays by key (for example ``{"actions": array([...])}``).
        scalar_data: Scalars by key (for example a value estimate).
    """

    list_data: dict[str, Tensor]
    scalar_data: dict[str, float] = field(default_factory=dict)


__all__ = [
    "AgentId",
    "DictObservation",
    "DictResponse",
    "EpisodeState",
    "MetaData",
    "RewardFnType",
    "Tensor",
]
