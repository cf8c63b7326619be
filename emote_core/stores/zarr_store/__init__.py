"""emote-memory Zarr stores: durable, appendable, shardable, verifiable episode storage."""

from emote_core.stores.zarr_store.layout import (
    DEFAULT_SHARD,
    FORMAT_NAME,
    RowKind,
    StoreColumn,
    StoreVersion,
)
from emote_core.stores.zarr_store.reader import MemoryStore, ShardView
from emote_core.stores.zarr_store.writer import (
    ShardWriter,
    create_store,
    open_group,
    store_columns,
)

__all__ = [
    "DEFAULT_SHARD",
    "FORMAT_NAME",
    "MemoryStore",
    "RowKind",
    "ShardView",
    "ShardWriter",
    "StoreColumn",
    "StoreVersion",
    "create_store",
    "open_group",
    "store_columns",
]
