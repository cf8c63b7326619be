"""Model-based RL: learned dynamics models and what trains and uses them.

:mod:`.normalizer` holds the running statistics that normalise a model's inputs and targets,
:mod:`.layers` the ensemble layer and its initialisation, :mod:`.ensemble` the networks (an
ensemble of Gaussian MLPs and a single deterministic MLP) and :mod:`.model` the
:class:`DynamicModel` that wraps a network with normalisation and delta targets."""

from __future__ import annotations

from emote_core.models.ensemble import DeterministicModel, EnsembleOfGaussian
from emote_core.models.layers import ACTIVATIONS, EnsembleLinearLayer, truncated_normal_init
from emote_core.models.model import DynamicModel, DynamicsNetwork
from emote_core.models.normalizer import Normalizer

__all__ = [
    "ACTIVATIONS",
    "DeterministicModel",
    "DynamicModel",
    "DynamicsNetwork",
    "EnsembleLinearLayer",
    "EnsembleOfGaussian",
    "Normalizer",
    "truncated_normal_init",
]
