"""Model-based RL: learned dynamics models and what trains and uses them.

:mod:`.normalizer` holds the running statistics that normalise a model's inputs and targets,
:mod:`.layers` the ensemble layer and its initialisation, :mod:`.ensemble` the networks (an
ensemble of Gaussian MLPs and a single deterministic MLP), :mod:`.model` the
:class:`DynamicModel` that wraps a network with normalisation and delta targets,
:mod:`.termination` the termination functions recipes name, :mod:`.model_env` the vector of
model-simulated environments that MBPO-style rollouts play, and :mod:`.callbacks` the callbacks
that train a model and the agent on its rollouts."""

from __future__ import annotations

from emote_core.models.callbacks import (
    BatchSampler,
    LossProgressCheck,
    LossProgressTestCheck,
    ModelBasedCollector,
    ModelLoss,
    is_holdout,
)
from emote_core.models.ensemble import DeterministicModel, EnsembleOfGaussian
from emote_core.models.layers import ACTIVATIONS, EnsembleLinearLayer, truncated_normal_init
from emote_core.models.model import DynamicModel, DynamicsNetwork
from emote_core.models.model_env import DynamicsSampler, ModelEnv
from emote_core.models.normalizer import Normalizer
from emote_core.models.termination import (
    TERMINATION_FUNCTIONS,
    TerminationFnType,
    register_termination_function,
    termination_function,
)

__all__ = [
    "ACTIVATIONS",
    "TERMINATION_FUNCTIONS",
    "BatchSampler",
    "DeterministicModel",
    "DynamicModel",
    "DynamicsNetwork",
    "DynamicsSampler",
    "EnsembleLinearLayer",
    "EnsembleOfGaussian",
    "LossProgressCheck",
    "LossProgressTestCheck",
    "ModelBasedCollector",
    "ModelEnv",
    "ModelLoss",
    "Normalizer",
    "TerminationFnType",
    "is_holdout",
    "register_termination_function",
    "termination_function",
    "truncated_normal_init",
]
