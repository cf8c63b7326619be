"""Upstream emote's ``MemoryImporterCallback``: a table filled from an earlier run's export."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from emote_core.callback import Callback, Order
from emote_core.errors import CheckpointError
from emote_core.integrations.upstream import restore_table
from emote_core.stores.memory_export import export_path

if TYPE_CHECKING:
    from emote_core.memory.table import ArrayMemoryTable

log = logging.getLogger(__name__)


class MemoryImporterCallback(Callback):
    """Fills a table from an earlier run's export before training starts (``restore_state``).

    Reads ``<experiment_load_dir>/<target_memory_name>_export`` (or ``load_fname_override``): an
    emote-memory store (the newest episodes that fit the table) or an upstream V1/Legacy zip;
    either replaces whatever the table held.

    Args:
        memory: The table to fill.
        target_memory_name: The memory's name, as given to the exporter.
        experiment_load_dir: The directory of the earlier run's export.
        load_fname_override: A file name (inside ``experiment_load_dir``) or path to read instead.
        name: The callback's name.
    """

    order = Order.DATA

    def __init__(
        self,
        *,
        memory: ArrayMemoryTable,
        target_memory_name: str,
        experiment_load_dir: str | os.PathLike[str],
        load_fname_override: str | os.PathLike[str] | None = None,
        name: str = "memory_importer",
    ) -> None:
        super().__init__(name=name)
        self.memory = memory
        self.target_memory_name = target_memory_name
        if load_fname_override is None:
            self.path = export_path(experiment_load_dir, target_memory_name)
        else:
            self.path = Path(experiment_load_dir) / load_fname_override

    def restore_state(self) -> None:
        """Restores the table from the export.

        Raises:
            CheckpointError: If the export is missing.
            FormatError: If it is damaged or its columns differ from the table's.
        """
        candidates = (self.path, self.path.with_name(self.path.name + ".zip"))
        if self.path.is_dir():  # an emote-memory store, as MemoryExporterProxyWrapper writes
            from emote_core.stores.zarr_store.tables import load_table

            load_table(self.memory, [self.path])
            log.info("loaded memory '%s' from store %s", self.target_memory_name, self.path)
            return
        if not any(path.exists() for path in candidates):
            raise CheckpointError(
                f"memory importer '{self.name}' found no export of memory "
                f"'{self.target_memory_name}' at {self.path} (or {candidates[1].name}); check "
                "experiment_load_dir and target_memory_name, or pass load_fname_override"
            )
        restore_table(self.memory, self.path)
        log.info(
            "restored memory '%s' from %s: %d episodes, %d transitions",
            self.target_memory_name,
            self.path,
            self.memory.episode_count,
            self.memory.size(),
        )


__all__ = ["MemoryImporterCallback"]
