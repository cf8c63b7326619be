"""Scale-out: many collectors on Ray, each writing its own shard of one store.

The store is the data bus and the run directory the policy bus; Ray only places and supervises
the processes (:mod:`emote_core.scale.ray_setup`), each worker runs the one-process collector of
:mod:`emote_core.assembly.collection` (:mod:`emote_core.scale.workers`), and the driver
(:mod:`emote_core.scale.collection`) splits the budget, aggregates progress and restarts workers
that die. Ray is an optional extra (``ray``: ``pip install "emote-toolkit[ray]"``), imported
only when used.
"""
