"""RandomAgentProxy: uniform random actions, for warm-up and ``emote collect --policy random``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from emote_core.errors import ConfigurationError
from emote_core.proxies.base import acting_agents
from emote_core.proxies.epsilon_greedy import allowed_actions
from emote_core.proxies.generic import ACTIONS_KEY
from emote_core.spaces import BoxSpace, DiscreteSpace
from emote_core.typing import AgentId, DictObservation, DictResponse


def _bounds(action_space: Any) -> tuple[int | None, np.ndarray | None, np.ndarray | None, Any]:
    """``(n, low, high, dtype)``: ``n`` for discrete spaces, bounds for boxes."""
    from gymnasium import spaces as gym_spaces

    if isinstance(action_space, gym_spaces.Discrete):
        if int(action_space.start) != 0:
            raise ConfigurationError(
                f"RandomAgentProxy acts in Discrete spaces starting at 0 (as DictGymWrapper "
                f"presents them); got start={action_space.start}"
            )
        return int(action_space.n), None, None, np.int64
    if isinstance(action_space, DiscreteSpace):
        return action_space.n, None, None, np.int64
    if isinstance(action_space, gym_spaces.Box):
        return None, action_space.low, action_space.high, action_space.dtype
    if isinstance(action_space, BoxSpace):
        return None, action_space.low, action_space.high, action_space.dtype
    raise ConfigurationError(
        f"RandomAgentProxy supports Box and Discrete action spaces; got {action_space!r}"
    )


class RandomAgentProxy:
    """Acts uniformly at random within an action space.

    Args:
        action_space: The space agents act in — pass ``DictGymWrapper.single_action_space`` (a
            ``[-1, 1]`` box when the wrapper rescales) or ``DictGymWrapper.spaces.actions``.
            A gymnasium ``Box``/``Discrete`` or an emote ``BoxSpace``/``DiscreteSpace``; boxes
            must be bounded.
        seed: Seeds the draws; ``None`` draws from fresh entropy.
        action_mask_key: For discrete actions, the observation holding each agent's action
            mask: draws are uniform among the actions it allows (and, depending on each step's
            observations, never drawn ahead: no ``act_steps``). ``None``: every action.

    Raises:
        ConfigurationError: If the space is of another kind, a box is unbounded, or a mask is
            given for box actions; at a call, as
            :func:`~emote_core.proxies.epsilon_greedy.allowed_actions` for the masks.
    """

    def __init__(
        self, *, action_space: Any, seed: int | None = None, action_mask_key: str | None = None
    ) -> None:
        n, low, high, dtype = _bounds(action_space)
        if action_mask_key is not None and n is None:
            raise ConfigurationError(
                f"RandomAgentProxy's action_mask_key masks discrete actions; {action_space!r} "
                "is a box — pass action_mask_key=None"
            )
        self.action_mask_key = action_mask_key
        if action_mask_key is not None:
            self.act_steps = None  # type: ignore[assignment]  # each step's draw reads its mask
        self._box: tuple[np.ndarray, np.ndarray] | None = None  # (low, high - low)
        if n is None:
            if low is None or high is None:
                low = high = np.full(1, np.inf)
            low, high = np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)
            if not np.all(np.isfinite(low) & np.isfinite(high)):
                raise ConfigurationError(
                    f"RandomAgentProxy draws uniform actions, which needs a bounded box; "
                    f"{action_space!r} is unbounded"
                )
            self._box = (low, high - low)
        self._n = n
        self._dtype = np.dtype(dtype)
        self._rng = np.random.default_rng(seed)

    def random_generators(self) -> dict[str, np.random.Generator]:
        """Its exploration draws, for checkpoints."""
        return {"actions": self._rng}

    @property
    def input_names(self) -> tuple[str, ...]:
        """No observation keys: random actions read nothing."""
        return ()

    @property
    def output_names(self) -> tuple[str, ...]:
        """``("actions",)``."""
        return (ACTIONS_KEY,)

    def __call__(
        self, observations: Mapping[AgentId, DictObservation]
    ) -> dict[AgentId, DictResponse]:
        """Draws an action for every ``INITIAL`` and ``RUNNING`` observation."""
        agents = acting_agents(observations)
        if self.action_mask_key is None:
            actions = self._draw((len(agents),))
        else:
            try:
                masks = [
                    np.asarray(observations[a].array_data[self.action_mask_key]) for a in agents
                ]
            except KeyError as error:
                raise ConfigurationError(
                    f"RandomAgentProxy reads the action mask {error}, which an observation lacks; "
                    "fix action_mask_key"
                ) from None
            names = [f"agent {a}" for a in agents]
            actions = self._draw_allowed(
                np.stack(masks) if masks else np.zeros((0, self._n)), names
            )
        return {
            agent: DictResponse(list_data={ACTIONS_KEY: actions[row]})
            for row, agent in enumerate(agents)
        }

    def act_batch(self, observations: Mapping[str, np.ndarray]) -> np.ndarray:
        """Actions for a batch of agents at once: one row per row of the observation arrays.

        Draws what :meth:`__call__` would draw for as many agents (``(B, 1)`` int64 indices, or
        ``(B, *shape)`` box actions).
        """
        count = len(next(iter(observations.values()))) if observations else 0
        if self.action_mask_key is None:
            return self._draw((count,))
        if self.action_mask_key not in observations:
            raise ConfigurationError(
                f"RandomAgentProxy reads the action mask '{self.action_mask_key}'; the "
                f"observations have {sorted(observations)} — fix action_mask_key"
            )
        masks = np.asarray(observations[self.action_mask_key])
        return self._draw_allowed(masks, [f"row {row}" for row in range(len(masks))])

    def _draw_allowed(self, masks: np.ndarray, rows: list[str]) -> np.ndarray:
        """``(B, 1)`` indices, each uniform among the actions its row of ``masks`` allows."""
        allowed = allowed_actions(masks, int(self._n or 1), rows)
        keys = np.where(allowed, self._rng.random(allowed.shape), -1.0)
        return keys.argmax(axis=1).astype(np.int64)[:, None]

    def act_steps(self, steps: int, count: int) -> np.ndarray:
        """The actions of ``steps`` successive :meth:`act_batch` calls for ``count`` agents, drawn
        at once: ``(steps, count, 1)`` indices or ``(steps, count, *shape)`` box actions.

        Random actions do not depend on the observations, so a collector may draw a whole run of
        steps ahead; the values, and the generator's state afterwards, are those of the
        ``steps`` calls one by one.
        """
        return self._draw((steps, count))

    def _draw(self, leading: tuple[int, ...]) -> np.ndarray:
        # Every draw is uniform doubles taken in order, so one draw of (steps, count, ...) equals
        # ``steps`` draws of (count, ...); ``Generator.integers`` would not (it buffers bits per
        # call), and it costs several times more per call.
        if self._box is None:
            n = self._n or 1
            unit = self._rng.random((*leading, 1))
            # u * n can round up to n for u just below 1: keep the index in range.
            return np.minimum((unit * n).astype(np.int64), n - 1)
        low, width = self._box
        unit = self._rng.random((*leading, *low.shape))
        return np.minimum(low + unit * width, low + width).astype(self._dtype)


__all__ = ["RandomAgentProxy"]
