"""MaskedGrid: a small grid walk whose legal moves come as an action mask.

The agent walks (up, down, left, right) from the top-left to the bottom-right corner of a
``size x size`` grid with random walls. Observations: ``obs``, the position scaled to ``[0, 1]``,
and ``action_mask``, 1 per move that stays on the grid and enters no wall (the walls are in the
mask only). Each step costs 0.02, the goal pays 1, a masked move ends the episode with -1.
Importing this module registers ``emote/MaskedGrid-v0``.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from emote_core.errors import ConfigurationError

ENV_ID = "emote/MaskedGrid-v0"
"""The id under which :class:`MaskedGrid` is registered with gymnasium."""

MOVES = np.array([(-1, 0), (1, 0), (0, -1), (0, 1)])
"""The row and column change of each action: up, down, left, right."""


class MaskedGrid(gymnasium.Env[dict[str, np.ndarray], np.int64]):
    """Walk to the far corner of a walled grid through the moves an action mask allows.

    Args:
        size: The grid's side (at least 2).
        wall_probability: The chance of each cell but the start and the goal being a wall.
        episode_length: Steps before the episode is truncated.
        render_mode: Only ``None`` is supported.

    Raises:
        ConfigurationError: If a parameter is out of range.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(
        self,
        *,
        size: int = 5,
        wall_probability: float = 0.25,
        episode_length: int = 30,
        render_mode: str | None = None,
    ) -> None:
        if size < 2 or episode_length < 1 or not 0.0 <= wall_probability < 1.0:
            raise ConfigurationError(
                f"MaskedGrid needs size >= 2, episode_length >= 1 and wall_probability in "
                f"[0, 1); got size={size}, episode_length={episode_length}, "
                f"wall_probability={wall_probability}"
            )
        if render_mode is not None:
            raise ConfigurationError(f"MaskedGrid renders nothing; got render_mode={render_mode!r}")
        self.size = size
        self.wall_probability = wall_probability
        self.episode_length = episode_length
        self.observation_space = spaces.Dict(
            {
                "obs": spaces.Box(0.0, 1.0, (2,), np.float32),
                "action_mask": spaces.Box(0, 1, (len(MOVES),), np.int8),
            }
        )
        self.action_space = spaces.Discrete(len(MOVES))
        self._walls = np.zeros((size, size), dtype=bool)
        self._position = np.zeros(2, dtype=np.int64)
        self._steps = 0

    def action_mask(self) -> np.ndarray:
        """The moves allowed from the current cell, 1 where allowed."""
        targets = self._position + MOVES
        inside = np.all((targets >= 0) & (targets < self.size), axis=1)
        clipped = np.clip(targets, 0, self.size - 1)
        free = ~self._walls[clipped[:, 0], clipped[:, 1]]
        return (inside & free).astype(np.int8)

    def _observation(self) -> dict[str, np.ndarray]:
        position = (self._position / (self.size - 1)).astype(np.float32)
        return {"obs": position, "action_mask": self.action_mask()}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        super().reset(seed=seed)
        walls = self.np_random.random((self.size, self.size)) < self.wall_probability
        walls[0, 0] = walls[-1, -1] = False
        if walls[0, 1] and walls[1, 0]:  # the start always has a way out
            walls[0, 1] = False
        self._walls = walls
        self._position = np.zeros(2, dtype=np.int64)
        self._steps = 0
        return self._observation(), {}

    def step(
        self, action: np.int64
    ) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        self._steps += 1
        truncated = self._steps >= self.episode_length
        move = int(action)
        if not self.action_mask()[move]:
            return self._observation(), -1.0, True, truncated, {"forfeit": True}
        self._position = self._position + MOVES[move]
        if np.all(self._position == self.size - 1):
            return self._observation(), 1.0, True, truncated, {}
        return self._observation(), -0.02, False, truncated, {}


def register() -> None:
    """Registers :data:`ENV_ID` with gymnasium, once (importing this module does it)."""
    if ENV_ID not in gymnasium.registry:
        gymnasium.register(id=ENV_ID, entry_point=f"{__name__}:MaskedGrid")


register()

__all__ = ["ENV_ID", "MOVES", "MaskedGrid", "register"]
