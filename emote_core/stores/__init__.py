"""Experience on disk: every file and store format emote reads or writes, and conversion.

- :mod:`~emote_core.stores.zarr_store`: the emote-memory Zarr store (writer, reader, verify,
  loading into and appending from tables).
- :mod:`~emote_core.stores.upstream`: upstream emote's V1 and Legacy memory zips and its older
  ``.pickle`` dumps (``store_table`` / ``restore_table`` for in-RAM tables).
- :mod:`~emote_core.stores.peers`: Stable-Baselines3, skrl/rofunc, tmrl and Minari files.
- :mod:`~emote_core.stores.safe_pickle`: the one module that unpickles (through an allowlist).
- :mod:`~emote_core.stores.sources`, :mod:`~emote_core.stores.inspect`,
  :mod:`~emote_core.stores.convert`: detecting, summarising and converting any of them
  (``emote memory inspect|verify|convert``).
- :mod:`~emote_core.stores.memory_export`: a run's live episodes appended to a store, and read
  back before training.

This package builds on :mod:`emote_core.memory` (tables to fill and to read from); nothing in
``emote_core.memory`` imports it. Importing it loads no format module: each loads on first use,
so ``emote memory inspect`` never imports torch.
"""
