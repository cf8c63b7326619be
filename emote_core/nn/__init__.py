"""Neural network building blocks: policies, Q networks, encoders, CURL, initialisers and
optimisers."""

from __future__ import annotations

from emote_core.nn.action_value import (
    ActionValueMlp,
    DiscreteActionValueMlp,
    SharedEncoderActionValueNet,
    StackedActionValueMlp,
)
from emote_core.nn.augmentation import ImageAugmentor
from emote_core.nn.categorical_value import ActionLogitMlp, DiscreteActionLogitMlp
from emote_core.nn.curl import CurlLoss
from emote_core.nn.discriminator import Discriminator
from emote_core.nn.encoders import Conv1dEncoder, Conv2dEncoder, ImageEncoder, MlpEncoder
from emote_core.nn.initialization import (
    LayerInit,
    normal_init_,
    orthogonal_init_,
    xavier_uniform_init_,
)
from emote_core.nn.inputs import flatten_observation, observation_dim
from emote_core.nn.optim import (
    ModifiedAdamW,
    separate_modules_for_weight_decay,
    split_decay_parameters,
)
from emote_core.nn.policies import GaussianMlpPolicy, GaussianPolicy, GaussianPolicyHead

__all__ = [
    "ActionLogitMlp",
    "ActionValueMlp",
    "Conv1dEncoder",
    "Conv2dEncoder",
    "CurlLoss",
    "DiscreteActionLogitMlp",
    "DiscreteActionValueMlp",
    "Discriminator",
    "GaussianMlpPolicy",
    "GaussianPolicy",
    "GaussianPolicyHead",
    "ImageAugmentor",
    "ImageEncoder",
    "LayerInit",
    "MlpEncoder",
    "ModifiedAdamW",
    "SharedEncoderActionValueNet",
    "StackedActionValueMlp",
    "flatten_observation",
    "normal_init_",
    "observation_dim",
    "orthogonal_init_",
    "separate_modules_for_weight_decay",
    "split_decay_parameters",
    "xavier_uniform_init_",
]
