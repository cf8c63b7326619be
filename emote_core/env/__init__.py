"""Gymnasium glue: vector environments as dict observations, collectors, test envs, wrappers.

Importing this package registers ``emote/HitTheMiddle-v0``, ``emote/MaskedGrid-v0``,
``emote/PixelPendulum-v0`` and ``emote/PixelCarRacing-v0`` with gymnasium.
"""

from __future__ import annotations

from emote_core.env.batch_collector import BatchGymCollector
from emote_core.env.collectors import GymCollector
from emote_core.env.dict_gym import DictGymWrapper, make_vector_env
from emote_core.env.frames import (
    FrameStack,
    FrameStackBox,
    LazyFrames,
    ScaledFloatFrame,
    WarpFrame,
)
from emote_core.env.hit_the_middle import ENV_ID as HIT_THE_MIDDLE_ID
from emote_core.env.hit_the_middle import HitTheMiddle, middle_controller
from emote_core.env.masked_grid import ENV_ID as MASKED_GRID_ID
from emote_core.env.masked_grid import MaskedGrid
from emote_core.env.pixel_envs import (
    PIXEL_CAR_RACING_ID,
    PIXEL_PENDULUM_ID,
    PixelPendulum,
    make_vision_box2d_env,
    render_pendulum,
)
from emote_core.env.threaded_collector import ThreadedGymCollector

__all__ = [
    "HIT_THE_MIDDLE_ID",
    "MASKED_GRID_ID",
    "PIXEL_CAR_RACING_ID",
    "PIXEL_PENDULUM_ID",
    "BatchGymCollector",
    "DictGymWrapper",
    "FrameStack",
    "FrameStackBox",
    "GymCollector",
    "HitTheMiddle",
    "LazyFrames",
    "MaskedGrid",
    "PixelPendulum",
    "ScaledFloatFrame",
    "ThreadedGymCollector",
    "WarpFrame",
    "make_vector_env",
    "make_vision_box2d_env",
    "middle_controller",
    "render_pendulum",
]
