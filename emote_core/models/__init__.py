"""Model-based RL: learned dynamics models and what trains and uses them. :mod:`.normalizer`
holds the running statistics that normalise a model's inputs and targets; :mod:`.termination`
the termination functions recipes name; :mod:`.model_env` the vector of model-simulated
environments that MBPO-style rollouts play."""

from __future__ import annotations

from emote_core.models.model_env import DynamicsSampler, ModelEnv
from emote_core.models.normalizer import Normalizer
from emote_core.models.termination import (
    TERMINATION_FUNCTIONS,
    TerminationFnType,
    register_termination_function,
    termination_function,
)

__all__ = [
    "TERMINATION_FUNCTIONS",
    "DynamicsSampler",
    "ModelEnv",
    "Normalizer",
    "TerminationFnType",
    "register_termination_function",
    "termination_function",
]
