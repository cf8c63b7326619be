"""Model-based RL: learned dynamics models and what trains and uses them. :mod:`.normalizer`
holds the running statistics that normalise a model's inputs and targets."""

from __future__ import annotations

from emote_core.models.normalizer import Normalizer

__all__ = ["Normalizer"]
