"""Learning algorithms that plug in by name: :mod:`.sac` and :mod:`.dqn`, the :mod:`.amp`,
:mod:`.symmetry`, :mod:`.curl` and :mod:`.mbpo` (the ``model`` table) add-ons, and the
:mod:`.registry` they (and other packages' algorithms and add-ons) register with; GenRL's two
families (``genrl_vae``, ``genrl_sac``) in :mod:`.genrl`; the offline-only families, trained
from stores: behaviour cloning (``bc``) in :mod:`.bc`, Implicit Q-Learning (``iql``) in
:mod:`.iql` and Conservative Q-Learning (``cql``) in :mod:`.cql`; image observations through
:mod:`.pixels`.

Importing this package registers emote's own families. Both modules define a ``QTarget`` and a
``QLoss``; import them through their module (``from emote_core.algorithms import sac``,
``sac.QTarget``) to keep the two apart.
"""

from __future__ import annotations

from emote_core.algorithms import amp, bc, cql, curl, dqn, genrl, iql, mbpo, registry, sac, symmetry

__all__ = ["amp", "bc", "cql", "curl", "dqn", "genrl", "iql", "mbpo", "registry", "sac", "symmetry"]
