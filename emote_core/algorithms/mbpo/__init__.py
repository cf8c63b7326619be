"""Model-based RL (MBPO) as the ``model`` add-on: the ``[model]`` table and its callbacks. The
models themselves (dynamics ensembles, the model environment, their callbacks) are in
:mod:`emote_core.models`."""

from __future__ import annotations

from emote_core.algorithms.mbpo.addon import (
    Activation,
    ModelBasedAddOn,
    ModelConfig,
    ModelKind,
    build_model,
)

__all__ = ["Activation", "ModelBasedAddOn", "ModelConfig", "ModelKind", "build_model"]
