"""The callbacks of MBPO-style training: a dynamics model learns from the real batches, branches
short rollouts from their observations with the current policy, and the RL losses train on a mix
of real and imagined transitions.

Within each update's ``begin_batch`` (before the targets and the losses read the batch):

1. :class:`ModelLoss` takes one optimisation step of the model on the real batch (episodes held
   out for validation excluded);
2. :class:`LossProgressCheck`, every few updates, scores each ensemble member on the held-out
   episodes, keeps the best as elites and logs whether the held-out error still falls;
3. :class:`ModelBasedCollector` rolls the model out from the batch's observations with the
   policy, into the model memory (a table of its own, holding the last few updates' rollouts);
4. :class:`BatchSampler` draws whether this update's RL data group is a batch of the model
   memory or stays the real batch.

Held-out episodes are chosen by their identity (:func:`is_holdout`): a fixed, evenly spread
fraction of the replay table's episodes that the model never trains on.

The callbacks live by role in :mod:`.model_training` (the model's step and its held-out check)
and :mod:`.rollouts` (rollouts into the model memory and the choice of the RL batch); this module
gathers them under upstream emote's module name.
"""

from __future__ import annotations

from emote_core.models._callback_parts import is_holdout
from emote_core.models.model_training import LossProgressCheck, ModelLoss
from emote_core.models.rollouts import BatchSampler, ModelBasedCollector

__all__ = ["BatchSampler", "LossProgressCheck", "ModelBasedCollector", "ModelLoss", "is_holdout"]
