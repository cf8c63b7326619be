"""The callbacks of MBPO-style training, gathered under upstream emote's module name.

In each update's ``begin_batch``: :class:`ModelLoss` steps the dynamics model on the real batch,
:class:`LossProgressCheck` scores the ensemble on held-out episodes (:func:`is_holdout`) and
keeps the elites (:class:`LossProgressTestCheck` judges a test run's model instead),
:class:`ModelBasedCollector` rolls the model out into the model memory, and :class:`BatchSampler`
picks a model or a real batch for the RL losses. They live by role in
:mod:`.model_training` and :mod:`.rollouts`.
"""

from __future__ import annotations

from emote_core.models._callback_parts import is_holdout
from emote_core.models.model_training import LossProgressCheck, LossProgressTestCheck, ModelLoss
from emote_core.models.rollouts import BatchSampler, ModelBasedCollector

__all__ = [
    "BatchSampler",
    "LossProgressCheck",
    "LossProgressTestCheck",
    "ModelBasedCollector",
    "ModelLoss",
    "is_holdout",
]
