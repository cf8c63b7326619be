"""Reinforcement-learning algorithms as training callbacks: :mod:`.sac` and :mod:`.dqn`.

Both modules define a ``QTarget`` and a ``QLoss``; import them through their module
(``from emote_core.algorithms import sac``, ``sac.QTarget``) to keep the two apart.
"""

from __future__ import annotations

from emote_core.algorithms import dqn, sac

__all__ = ["dqn", "sac"]
