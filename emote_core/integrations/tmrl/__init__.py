"""tmrl: its memory interface over an emote table
(:class:`~emote_core.integrations.tmrl.episode_memory.TmrlEpisodeMemory`, samples and CRC checks
in ``samples.py``), the memory that also reads and writes tmrl datasets
(:class:`~emote_core.integrations.tmrl.memory.TmrlMemory`), and ``data.pkl`` (``dataset.py``)."""
