"""Stores on S3 from the command line, against a real S3-compatible server on 127.0.0.1: collect
(create, append, two shards), inspect, verify (and damage found in the bucket), convert both
ways, train from the bucket; and the one-line errors of URLs that cannot be reached."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emote_cli._common import ExitCode
from emote_cli.app import app

EPISODE = 30  # HitTheMiddle episodes are always 30 steps
ROOT = Path(__file__).parents[2]


def run(runner: CliRunner, *args: str, code: int = ExitCode.OK) -> dict:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == code, result.output
    return json.loads(result.stdout)


def one_error_line(runner: CliRunner, *args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == ExitCode.ERROR, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def fresh_clients() -> None:
    """Drops the S3 clients made under the previous environment (collected now, so that their
    sessions' farewell is not written into the next command's stderr)."""
    import gc

    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    gc.collect()


def bucket_keys(bucket: str) -> list[str]:
    import s3fs

    fs = s3fs.S3FileSystem()
    fs.invalidate_cache()
    return sorted(fs.find(bucket.removeprefix("s3://")))


def test_collect_inspect_verify_convert_and_train_on_s3(
    runner: CliRunner, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = f"{s3_bucket}/runs/h.zarr"
    collect = ("collect", "sac_hit_the_middle", "--out", store, "--episodes")
    first = run(runner, *collect, "2")
    assert first["store_totals"] == {"episodes": 2, "transitions": 2 * EPISODE}
    again = run(runner, *collect, "1")  # appended to the same shard
    assert again["store_totals"] == {"episodes": 3, "transitions": 3 * EPISODE}
    other = run(runner, *collect, "2", "--shard", "w1", "--seed", "7")
    assert other["store_totals"] == {"episodes": 5, "transitions": 5 * EPISODE}
    # The writers let go of their leases: nothing of them is left in the bucket.
    assert not [key for key in bucket_keys(s3_bucket) if "/leases/" in key]

    report = run(runner, "memory", "inspect", store)
    assert report["location"] == store and report["format"] == "emote-memory"
    assert (report["episodes"], report["transitions"]) == (5, 5 * EPISODE)
    assert {s["name"]: s["episodes"] for s in report["shards"]} == {"main": 3, "w1": 2}
    assert report["bytes_on_disk"] > 0
    assert len(report["provenance"]["shards"]["main"]) == 2  # two collects wrote main
    human = runner.invoke(app, ["memory", "inspect", store])
    assert human.exit_code == 0 and store in human.stdout

    verified = run(runner, "memory", "verify", store)
    assert verified["ok"] is True and verified["episodes"] == 5

    exported = run(runner, "memory", "convert", store, "h.npz", "--to", "npz")
    assert exported["transitions"] == 5 * EPISODE and (tmp_path / "h.npz").is_file()
    assert run(runner, "memory", "convert", store, "local.zarr")["episodes"] == 5
    back = f"{s3_bucket}/copy.zarr"
    uploaded = run(runner, "memory", "convert", "local.zarr", back, "--to", "zarr")
    assert uploaded["destination"] == back and uploaded["episodes"] == 5
    assert run(runner, "memory", "verify", back)["episodes"] == 5
    assert not [key for key in bucket_keys(s3_bucket) if "leases" in key]
    refused = one_error_line(runner, "memory", "convert", "local.zarr", back, "--force")
    assert "exists" in refused and back in refused

    trained = run(runner, "train", "sac_hit_the_middle", "--memory", store, "--no-live",
                  "--steps", "3", "--run-dir", "r", "--set", "memory.warmup_steps=64",
                  "--threads", "1", "-q")  # fmt: skip
    assert trained["steps"] == 3
    began = json.loads((tmp_path / "r" / "run.json").read_text())["starts"][0]
    assert began["memory"] == [store]  # the URL as given, not made into a local path


def test_a_learner_follows_a_store_on_s3_that_another_writer_appends_to(
    runner: CliRunner, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from emote_core.stores.zarr_store import MemoryStore, ShardWriter

    monkeypatch.chdir(tmp_path)
    store = f"{s3_bucket}/follow.zarr"
    run(runner, "collect", "sac_hit_the_middle", "--out", store, "--episodes", "2")
    run(runner, "collect", "sac_hit_the_middle", "--out", "more.zarr", "--episodes", "6",
        "--seed", "7")  # fmt: skip
    episodes = list(MemoryStore("more.zarr").episodes())
    started = tmp_path / "run" / "tensorboard"

    def remote_collector() -> None:  # commits to its own shard once the learner trains
        deadline = time.monotonic() + 120
        while not any(started.glob("events.*")) and time.monotonic() < deadline:
            time.sleep(0.05)
        with ShardWriter(store, shard="remote") as writer:
            for k in range(0, len(episodes), 2):
                writer.append(episodes[k : k + 2])

    writer = threading.Thread(target=remote_collector, daemon=True)
    writer.start()
    trained = run(runner, "train", "sac_hit_the_middle", "--memory", store, "--follow",
                  "--no-live", "--steps", "150", "--run-dir", "run", "--threads", "1",
                  "--set", "memory.warmup_steps=200", "--set", "memory.batch_size=16",
                  "--set", "memory.follow_interval=5", "--set", "memory.follow_min_seconds=0",
                  "--set", "eval.interval=0", "-q")  # fmt: skip
    writer.join(60)
    followed = trained["follow"]
    assert followed["read"] == [{"main": 2, "remote": 6}]  # every episode, none twice
    assert followed["table_transitions"] == 8 * EPISODE
    assert run(runner, "memory", "verify", store)["episodes"] == 8
    assert run(runner, "memory", "convert", store, "all.npz", "--to", "npz")["episodes"] == 8


def test_verify_names_a_chunk_deleted_or_garbled_in_the_bucket(
    runner: CliRunner, s3_bucket: str
) -> None:
    import s3fs

    store = f"{s3_bucket}/d.zarr"
    run(runner, "collect", "sac_hit_the_middle", "--out", store, "--episodes", "3")
    fs = s3fs.S3FileSystem()
    prefix = f"{store.removeprefix('s3://')}/shards/main/columns"
    fs.invalidate_cache()
    chunks = sorted(key for key in fs.find(prefix) if "/c/" in key)
    actions = next(key for key in chunks if "/actions/" in key)
    intact = fs.cat_file(actions)
    fs.pipe_file(actions, b"not blosc at all")
    report = run(runner, "memory", "verify", store, code=ExitCode.ERROR)
    assert report["ok"] is False
    assert [(e["shard"], e["id"]) for e in report["damaged_episodes"]] == [
        ("main", 0), ("main", 1), ("main", 2)
    ]  # fmt: skip
    assert any(
        p.startswith("shard 'main': column 'actions' rows 0:")
        and "unreadable in shards/main/columns/actions/c/0/0" in p
        for p in report["problems"]
    ), report["problems"]

    fs.pipe_file(actions, intact)
    assert run(runner, "memory", "verify", store)["ok"] is True
    rewards = next(key for key in chunks if "/rewards/" in key)
    fs.rm_file(rewards)  # a lost object reads as fill values: the checksums fail
    line = one_error_line(runner, "memory", "verify", store)
    assert f"store '{store}' is damaged: shard 'main': 3 damaged episodes" in line
    assert "ids [0, 1, 2]; chunk files missing: shards/main/columns/rewards/c/0/0" in line


def test_a_convert_killed_mid_upload_is_replaced_by_the_next_and_its_staging_folder_removed(
    runner: CliRunner,
    s3_bucket: str,
    tmp_path: Path,
    upstream_v1: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import os
    import signal
    import subprocess
    import sys
    import tempfile

    staging = tmp_path / "tmp"
    staging.mkdir()
    store = f"{s3_bucket}/up.zarr"
    environment = {**os.environ, "TMPDIR": str(staging), "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "emote_cli", "memory", "convert", str(upstream_v1), store]
    killed = subprocess.Popen(
        [*command, "--debug"], env=environment, stderr=subprocess.PIPE, text=True
    )
    try:  # killed once its marker is up: the line after it says the upload has begun
        assert killed.stderr is not None
        said = next((line for line in killed.stderr if "uploading " in line), None)
        assert said is not None, "the upload never began"
    finally:
        killed.send_signal(signal.SIGKILL)
        killed.wait()
    left = bucket_keys(s3_bucket)
    assert left and f"{store.removeprefix('s3://')}/zarr.json" not in left  # cut off
    assert [p.name.split("-")[2] for p in staging.iterdir()] == [str(killed.pid)]

    monkeypatch.setattr(tempfile, "tempdir", str(staging))
    fresh_clients()
    converted = run(runner, "memory", "convert", str(upstream_v1), store)
    assert converted["episodes"] == 100
    assert run(runner, "memory", "verify", store)["episodes"] == 100
    assert not [key for key in bucket_keys(s3_bucket) if key.endswith("emote-upload.json")]
    assert list(staging.iterdir()) == []  # the killed one's swept, this one's removed


def test_objects_emote_cannot_prove_its_own_are_never_replaced(
    runner: CliRunner, s3_bucket: str, upstream_v1: Path
) -> None:
    import s3fs

    fs = s3fs.S3FileSystem()
    store = f"{s3_bucket}/other.zarr"
    fs.pipe_file(f"{store.removeprefix('s3://')}/data.bin", b"someone else's")
    line = one_error_line(runner, "memory", "convert", str(upstream_v1), store)
    assert "holds objects but no store (no zarr.json) and no upload marker" in line
    assert f"aws s3 rm --recursive {store}" in line
    marker = {"tool": "emote", "host": "another-host", "pid": 1, "since": "2026-01-01"}
    fs.pipe_file(f"{store.removeprefix('s3://')}/emote-upload.json", json.dumps(marker).encode())
    line = one_error_line(runner, "memory", "convert", str(upstream_v1), store)
    assert "unfinished upload (no zarr.json) by emote's pid 1 on host 'another-host'" in line
    assert bucket_keys(s3_bucket) == [
        f"{store.removeprefix('s3://')}/data.bin",
        f"{store.removeprefix('s3://')}/emote-upload.json",
    ]


@pytest.mark.parametrize(
    ("url", "package"), [("gs://b/x.zarr", "gcsfs"), ("az://b/x.zarr", "adlfs")]
)
def test_a_url_without_its_backend_names_the_package_for_every_command(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str, package: str
) -> None:
    pytest.importorskip("fsspec", reason="fsspec comes with zarr")
    try:
        __import__(package)
        pytest.skip(f"{package} is installed here")
    except ImportError:
        pass
    monkeypatch.chdir(tmp_path)
    commands = [
        ("collect", "sac_hit_the_middle", "--out", url, "--episodes", "1"),
        ("memory", "inspect", url),
        ("memory", "verify", url),
        ("memory", "convert", url, "x.npz", "--to", "npz"),
        ("train", "sac_hit_the_middle", "--memory", url, "--no-live", "--steps", "1"),
    ]
    for command in commands:
        line = one_error_line(runner, *command)
        assert f"pip install {package}" in line and url in line, (command, line)
    assert list(tmp_path.iterdir()) == []  # nothing written, no run directory
    unknown = one_error_line(runner, "memory", "inspect", "nope://b/x.zarr")
    assert "unknown URL scheme 'nope://'" in unknown


def test_unreachable_endpoint_missing_bucket_and_credentials_fail_in_one_line_without_waiting(
    runner: CliRunner, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import s3fs

    monkeypatch.chdir(tmp_path)
    collect = ("collect", "sac_hit_the_middle", "--episodes", "1", "--out")
    line = one_error_line(runner, *collect, "s3://no-such-bucket/x.zarr")
    assert "bucket" in line and "does not exist" in line and "no-such-bucket" in line
    line = one_error_line(runner, "memory", "inspect", "s3://no-such-bucket/x.zarr")
    assert "bucket 'no-such-bucket' does not exist" in line
    assert not s3fs.S3FileSystem().exists("no-such-bucket")  # no command made it

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    fresh_clients()
    attempts: list[object] = []
    connect = socket.socket.connect

    def counted(self: socket.socket, address: object) -> object:
        if isinstance(address, tuple) and address[:2] == ("127.0.0.1", 9):
            attempts.append(address)
        return connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", counted)
    for command in (
        (*collect, f"{s3_bucket}/x.zarr"),
        ("memory", "verify", f"{s3_bucket}/x.zarr"),
    ):
        attempts.clear()
        line = one_error_line(runner, *command)
        assert 0 < len(attempts) <= 3  # a few tries, then the answer: no minutes of back-off
        assert "does not answer" in line and "http://127.0.0.1:9" in line
    monkeypatch.setattr(socket.socket, "connect", connect)

    monkeypatch.delenv("AWS_ENDPOINT_URL")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    fresh_clients()
    line = one_error_line(runner, "memory", "inspect", f"{s3_bucket}/x.zarr")
    assert "no credentials" in line and "AWS_ACCESS_KEY_ID" in line
    assert list(tmp_path.iterdir()) == []
