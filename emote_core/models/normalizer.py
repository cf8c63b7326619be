"""The running statistics that normalise a model's inputs and targets: the one implementation,
:class:`emote_core.nn.normalization.Normalizer`, which observation normalisation shares."""

from __future__ import annotations

from emote_core.nn.normalization import Normalizer

__all__ = ["Normalizer"]
