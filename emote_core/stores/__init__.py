"""Experience on disk: the emote-memory Zarr store and what every format shares.

- :mod:`~emote_core.stores.zarr_store`: the emote-memory Zarr store (writer, reader, verify,
  loading into and appending from tables).
- :mod:`~emote_core.stores.stored`: :class:`StoredTable`, what every reader returns;
  :mod:`~emote_core.stores.sources`: a store read into and written from one, and the checks
  every source passes; :mod:`~emote_core.stores.inspect`: a store's report.
- :mod:`~emote_core.stores.safe_pickle`: the one module that unpickles (through an allowlist).
- :mod:`~emote_core.stores.memory_export`: a run's live episodes appended to a store.

Other libraries' formats, upstream emote's files and the registry of every format are
:mod:`emote_core.integrations`, which builds on this package. Importing it loads no format
module, so ``emote memory inspect`` never imports torch.
"""
