"""emote-memory stores on S3, against a real S3-compatible server on 127.0.0.1 (moto's): leases
without locks or rename, fresh listings across processes, uploads that are all or nothing, and
the URL rules (backends, retries) every store command goes through."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from emote_core.errors import FormatError, StorageError
from emote_core.stores.locations import check_backend, filesystem, storage_options
from emote_core.stores.zarr_store import MemoryStore, ShardWriter, create_store, store_columns
from emote_core.stores.zarr_store.lease import ShardLease
from emote_core.stores.zarr_store.remote import check_url_destination, upload_store

ROOT = Path(__file__).parents[3]


def new_store(kit, url: str) -> str:
    create_store(url, columns=store_columns(kit.schemas, kit.make(1), "rewards"),
                 length_key="rewards")  # fmt: skip
    return url


def keys(url: str) -> list[str]:
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True)  # a client of its own: nothing cached
    return sorted(key.removeprefix(url.removeprefix("s3://") + "/") for key in fs.find(url))


def test_a_lease_on_s3_refuses_a_second_writer_and_a_stale_one_is_taken_over_once(
    kit, s3_bucket: str
) -> None:
    url = new_store(kit, f"{s3_bucket}/s.zarr")
    first = ShardWriter(url, lease_timeout=600)
    first.append([kit.make(k) for k in range(3)])
    assert [k for k in keys(url) if k.startswith("leases/")] == ["leases/main/000000000001.json"]
    with pytest.raises(StorageError, match=r"being written by pid \d+ on host .*heartbeat \d+ s"):
        ShardWriter(url, lease_timeout=600)
    second = ShardWriter(url, lease_timeout=0.0)  # the first looks stalled: taken over
    assert second.lease.previous["token"] == first.lease.token
    assert [k for k in keys(url) if k.startswith("leases/")] == ["leases/main/000000000002.json"]
    with pytest.raises(StorageError, match="lost the lease of shard 'main'"):
        first.append([kit.make(k) for k in range(3, 6)])  # commits nothing more
    second.append([kit.make(k) for k in range(3, 6)])
    first.close()  # the lease it lost stays with its new holder
    second.append([kit.make(6)])
    second.close()
    assert not [k for k in keys(url) if k.startswith("leases/")]
    with ShardWriter(url):  # a released lease is free at once
        pass
    store = MemoryStore(url)
    assert [record[0] for record in store.episodes()] == list(range(7))
    for record in store.episodes():
        kit.check(record)


def race(url: str, writers: int) -> tuple[list[ShardLease], list[str]]:
    """``writers`` threads that all take the lease of shard ``main`` at once, however fresh."""
    barrier = threading.Barrier(writers)
    won: list[ShardLease] = []
    refused: list[str] = []

    def take() -> None:
        barrier.wait()
        try:
            won.append(ShardLease(url, "main", timeout=0.0))
        except StorageError as error:
            refused.append(str(error))

    threads = [threading.Thread(target=take) for _ in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return won, refused


def test_writers_racing_for_a_stale_lease_leave_exactly_one_holder(kit, s3_bucket: str) -> None:
    url = new_store(kit, f"{s3_bucket}/race.zarr")
    stalled = ShardLease(url, "main")
    for _ in range(3):
        won, refused = race(url, 3)
        holders = []
        for lease in [stalled, *won]:
            try:
                lease.check(refresh=False)
                holders.append(lease)
            except StorageError:
                pass
        assert len(holders) == 1, (len(won), refused)
        assert all("at the same moment" in text for text in refused)
        stalled = holders[0]
    stalled.release()


WRITER = """
import runpy, sys
from emote_core.stores.zarr_store import ShardWriter
kit = runpy.run_path(sys.argv[1])
with ShardWriter(sys.argv[2], shard=sys.argv[3]) as writer:
    writer.append([kit["make_episode"](k) for k in range(2)])
"""


def test_a_reader_sees_a_shard_another_process_commits_after_it_listed(kit, s3_bucket: str) -> None:
    url = new_store(kit, f"{s3_bucket}/grow.zarr")
    with ShardWriter(url) as writer:
        writer.append([kit.make(0)])
    assert MemoryStore(url).committed() == {"main": 1}  # listed (and cached, were it allowed)
    another = [sys.executable, "-c", WRITER, str(kit.conftest), url, "w1"]
    subprocess.run(another, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert MemoryStore(url).committed() == {"main": 1, "w1": 2}


def test_an_upload_is_all_or_nothing_and_never_replaces(
    kit, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = new_store(kit, str(tmp_path / "local.zarr"))
    with ShardWriter(local) as writer:
        writer.append([kit.make(k) for k in range(4)])
    url = f"{s3_bucket}/up.zarr"
    fs, _ = filesystem(url)  # the client emote uses for this URL
    original = fs.put_file

    def refuse_root(lpath: str, rpath: str, *args: object, **kwargs: object) -> object:
        if rpath.endswith("up.zarr/zarr.json"):
            raise PermissionError("AccessDenied: refused by the test")
        return original(lpath, rpath, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(fs, "put_file", refuse_root)
        with pytest.raises(StorageError, match=r"access to .*up\.zarr' refused"):
            upload_store(local, url)
    assert keys(url) == []  # what went up before the root metadata was removed

    assert upload_store(local, url) > 0
    assert "leases/main.lock" not in keys(url)  # the local writer's lease stays local
    assert [record[0] for record in MemoryStore(url).episodes()] == [0, 1, 2, 3]
    with pytest.raises(FormatError, match="exists; convert does not replace"):
        check_url_destination(local, url, "zarr")
    with pytest.raises(FormatError, match="inside the source"):
        check_url_destination(url, f"{url}/inner.zarr", "zarr")
    with pytest.raises(StorageError, match=r"bucket of 's3://no-such-bucket/x\.zarr' .*not exist"):
        check_url_destination(local, "s3://no-such-bucket/x.zarr", "zarr")
    with pytest.raises(FormatError, match="npz files to local paths"):
        check_url_destination(local, f"{s3_bucket}/x.npz", "npz")


def test_url_schemes_need_their_backend_and_s3_retries_are_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if importlib.util.find_spec("gcsfs") is None:
        with pytest.raises(StorageError, match=r"needs the gcsfs package .*pip install gcsfs$"):
            check_backend("gs://bucket/x.zarr")
    with pytest.raises(StorageError, match="unknown URL scheme 'nope://'"):
        check_backend("nope://bucket/x.zarr")
    check_backend("memory://x.zarr")
    assert storage_options("memory://x.zarr") == {}
    for name in ("AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE"):
        monkeypatch.delenv(name, raising=False)
    options = storage_options("s3://bucket/x.zarr")
    assert options["use_listings_cache"] is False
    assert options["config_kwargs"]["retries"] == {"total_max_attempts": 3, "mode": "standard"}
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "10")  # the user's choice stands
    assert "retries" not in storage_options("s3://bucket/x.zarr")["config_kwargs"]


def test_writers_on_separate_shards_may_create_a_store_on_s3_at_the_same_moment(
    kit, s3_bucket: str
) -> None:
    from emote_core.memory.columns import Column, VirtualColumn
    from emote_core.memory.mappers import NextElementMapper
    from emote_core.memory.strategies import FifoEjectionStrategy, UniformSampleStrategy
    from emote_core.memory.table import ArrayMemoryTable
    from emote_core.stores.zarr_store.tables import StoreAppender
    from emote_core.stores.zarr_store.verify import verify_store

    columns = [Column(s.name, s.shape, s.dtype) for s in kit.schemas]
    columns.append(VirtualColumn("next_obs", (3,), "float32", "obs", NextElementMapper()))
    table = ArrayMemoryTable(
        columns=columns, maxlen=100,
        sampler=UniformSampleStrategy(), ejector=FifoEjectionStrategy(), length_key="rewards",
    )  # fmt: skip
    for trial in range(2):
        url = f"{s3_bucket}/race{trial}.zarr"
        start = threading.Barrier(2)
        errors: list[BaseException] = []

        def write(shard: str, first: int, url: str = url, start=start, errors=errors) -> None:
            try:
                start.wait()
                with StoreAppender(url, table, shard=shard) as appender:
                    appender.append([kit.make(k) for k in range(first, first + 3)])
            except BaseException as error:
                errors.append(error)

        threads = [threading.Thread(target=write, args=(s, f)) for s, f in (("a", 0), ("b", 50))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, f"trial {trial}: {errors}"
        assert MemoryStore(url).committed() == {"a": 3, "b": 3}
        assert verify_store(url).ok


def test_an_endpoint_lost_mid_run_is_one_error_and_closing_still_works(
    kit, s3_bucket: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import gc

    import s3fs
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{host}:{port}")  # a server of its own
    s3fs.S3FileSystem.clear_instance_cache()
    s3fs.S3FileSystem().mkdir("lost")
    url = new_store(kit, "s3://lost/s.zarr")
    writer = ShardWriter(url)
    writer.append([kit.make(0)])
    server.stop()
    with pytest.raises(StorageError, match=r"cannot reach 's3://lost/s\.zarr': .*does not answer"):
        writer.append([kit.make(1)])
    writer.close()  # no exception on top of the one the caller is handling
    assert "could not let go of the lease of shard 'main'" in caplog.text
    s3fs.S3FileSystem.clear_instance_cache()
    gc.collect()
