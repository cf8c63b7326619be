"""Other libraries' memories and files, each peer in one package, and the registry of formats.

- :mod:`~emote_core.integrations.skrl`: ``SkrlMemory`` (skrl's memory interface over a table) and
  skrl's ``Memory.save`` files, read and written.
- :mod:`~emote_core.integrations.tmrl`: tmrl's memories (``TmrlEpisodeMemory``, ``TmrlMemory``)
  and its ``data.pkl`` datasets.
- :mod:`~emote_core.integrations.sb3`: Stable-Baselines3 replay buffers.
- :mod:`~emote_core.integrations.minari`: Minari datasets, read and written.
- :mod:`~emote_core.integrations.upstream`: upstream emote's memory zips and pickles, and its
  ``MemoryImporterCallback``.
- :mod:`~emote_core.integrations.formats`, :mod:`~emote_core.integrations.inspect`,
  :mod:`~emote_core.integrations.convert`: every format by name, detected, inspected and
  converted (``emote memory inspect|verify|convert``).

Importing a package here loads no format module: each loads on first use, so
``emote memory inspect`` never imports torch.
"""
