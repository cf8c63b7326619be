"""skrl: :class:`~emote_core.integrations.skrl.memory.SkrlMemory`, skrl's memory interface over
an emote table (``memory*.py``), and skrl's ``Memory.save`` files read into and written from
stored tables (``reader.py``, ``writer.py``, ``files.py``, ``csv_tensors.py``)."""
