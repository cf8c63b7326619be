"""HitTheMiddle: a tiny continuous-control task for smoke tests and quick experiments.

A point slides on the line ``[-1, 1]``. The agent pushes it with a force in ``[-1, 1]`` that
changes its velocity; walls at the ends stop it dead. Every step costs the distance from the
middle, ``reward = -|position|``, and an episode is cut after 30 steps (``truncated``: the task
has no end of its own, so episodes are ``INTERRUPTED`` and their last state is bootstrapped).

A return of -5 needs real control: random forces and doing nothing score far below it, the
hand-written :func:`middle_controller` far above (benchmarks/RESULTS.md).

Importing this module registers the environment as ``emote/HitTheMiddle-v0``.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from emote_core.errors import ConfigurationError

ENV_ID = "emote/HitTheMiddle-v0"
"""The id under which :class:`HitTheMiddle` is registered with gymnasium."""


class HitTheMiddle(gymnasium.Env[np.ndarray, np.ndarray]):
    """Steer a point on a line to the middle and keep it there.

    Observation: ``(position, velocity)`` as float32. Action: a force in ``[-1, 1]`` (shape
    ``(1,)``). Each step the velocity changes by ``acceleration * force`` (capped at
    ``max_speed``), the position by ``dt * velocity``; reaching a wall clamps the position and
    zeroes the velocity. The start position is uniform on ``[-1, 1]``, the start velocity 0.

    Args:
        episode_length: Steps before the episode is truncated.
        acceleration: Velocity change per step at full force.
        dt: Position change per step per unit of velocity.
        max_speed: The largest speed.
        render_mode: Only ``None`` is supported.

    Raises:
        ConfigurationError: If a parameter is not positive.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(
        self,
        *,
        episode_length: int = 30,
        acceleration: float = 0.5,
        dt: float = 0.2,
        max_speed: float = 2.0,
        render_mode: str | None = None,
    ) -> None:
        if isinstance(episode_length, bool) or not isinstance(episode_length, int):
            raise ConfigurationError(f"episode_length must be an integer; got {episode_length!r}")
        for name, value in (
            ("episode_length", episode_length),
            ("acceleration", acceleration),
            ("dt", dt),
            ("max_speed", max_speed),
        ):
            if not value > 0:
                raise ConfigurationError(f"HitTheMiddle's {name} must be positive; got {value!r}")
        if render_mode is not None:
            raise ConfigurationError(f"HitTheMiddle does not render; got {render_mode=!r}")
        self.episode_length = episode_length
        self.acceleration = float(acceleration)
        self.dt = float(dt)
        self.max_speed = float(max_speed)
        self.render_mode = render_mode
        self.observation_space = spaces.Box(
            low=np.array([-1.0, -max_speed], dtype=np.float32),
            high=np.array([1.0, max_speed], dtype=np.float32),
            dtype=np.float32,
        )
        self.action_space = spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        self._position = 0.0
        self._velocity = 0.0
        self._steps = 0

    def _observation(self) -> np.ndarray:
        return np.array([self._position, self._velocity], dtype=np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Starts an episode at a uniform position with zero velocity."""
        super().reset(seed=seed)
        self._position = float(self.np_random.uniform(-1.0, 1.0))
        self._velocity = 0.0
        self._steps = 0
        return self._observation(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Applies the force and returns ``(obs, -|position|, False, truncated, {})``."""
        force = float(np.clip(np.asarray(action, dtype=np.float64).reshape(-1)[0], -1.0, 1.0))
        velocity = self._velocity + self.acceleration * force
        velocity = min(max(velocity, -self.max_speed), self.max_speed)
        position = self._position + self.dt * velocity
        if abs(position) >= 1.0:
            position = float(np.sign(position))
            velocity = 0.0
        self._position, self._velocity = position, velocity
        self._steps += 1
        truncated = self._steps >= self.episode_length
        return self._observation(), -abs(position), False, truncated, {}


def middle_controller(observation: np.ndarray) -> np.ndarray:
    """The hand-written controller quoted above: a proportional-derivative push to the middle.

    Args:
        observation: ``(position, velocity)``.

    Returns:
        The force, shape ``(1,)``, in ``[-1, 1]``.
    """
    position, velocity = float(observation[0]), float(observation[1])
    return np.array([np.clip(-8.0 * position - 2.0 * velocity, -1.0, 1.0)], dtype=np.float32)


def register() -> None:
    """Registers :data:`ENV_ID` with gymnasium, once (importing this module does it)."""
    if ENV_ID not in gymnasium.registry:
        gymnasium.register(id=ENV_ID, entry_point=f"{__name__}:HitTheMiddle")


register()

__all__ = ["ENV_ID", "HitTheMiddle", "middle_controller", "register"]
