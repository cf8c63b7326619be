"""`emote collect` options of scale-out, refused with one line before anything starts: worker
counts, Ray addresses, a missing Ray, following a run that has published no policy yet."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from emote_cli.app import app
from emote_core import install_command
from emote_core.scale.ray_setup import (
    CONNECT_TIMEOUT_S,
    ClusterError,
    address_endpoint,
    check_answers_grpc,
)

COLLECT = ["collect", "sac_hit_the_middle", "--out", "h.zarr", "--episodes", "2"]


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


def test_zero_workers_is_a_usage_error(runner: CliRunner, in_tmp: Path) -> None:
    result = runner.invoke(app, [*COLLECT, "--workers", "0"])
    assert result.exit_code == 2
    assert "--workers" in result.output
    assert not (in_tmp / "h.zarr").exists()


def test_options_of_workers_need_workers(runner: CliRunner, in_tmp: Path) -> None:
    result = runner.invoke(app, [*COLLECT, "--ray-address", "auto", "--json"])
    assert result.exit_code == 2
    assert json.loads(result.stdout)["error"] == "--ray-address goes with --workers N"
    result = runner.invoke(app, [*COLLECT, "--max-restarts", "1"])
    assert result.exit_code == 2 and "--max-restarts goes with --workers N" in result.stderr
    result = runner.invoke(app, [*COLLECT, "--workers", "2", "--shard", "mine"])
    assert result.exit_code == 2 and "--workers N writes shards w0, w1" in result.stderr


def test_an_unreachable_ray_address_is_refused_after_one_bounded_connection_attempt(
    runner: CliRunner, in_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    attempts: list[tuple[object, object]] = []
    connect = socket.create_connection

    def recorded(address, timeout=None, *args, **kwargs):
        attempts.append((tuple(address), timeout))
        return connect(address, timeout, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", recorded)
    result = runner.invoke(app, [*COLLECT, "--workers", "2", "--ray-address", "127.0.0.1:1"])
    # One TCP connection, bounded by the connect timeout, and no Ray started: no long wait.
    assert attempts == [(("127.0.0.1", 1), CONNECT_TIMEOUT_S)]
    assert result.exit_code == 1, result.output
    [line] = error_lines(result.stderr)
    assert line.startswith("error: cannot reach Ray at '127.0.0.1:1'")
    assert "ray start --head" in line
    assert not (in_tmp / "h.zarr").exists()


def test_ray_addresses_name_their_endpoint() -> None:
    assert address_endpoint("auto") is None
    assert address_endpoint("10.0.0.2:6380") == ("10.0.0.2", 6380)
    assert address_endpoint("ray://head") == ("head", 10001)
    assert address_endpoint("head") == ("head", 6379)


def test_without_ray_the_error_names_the_extra(
    runner: CliRunner, in_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as if not installed
    result = runner.invoke(app, [*COLLECT, "--workers", "2"])
    assert result.exit_code == 1, result.output
    assert error_lines(result.stderr) == [
        "error: collecting on several workers needs Ray, which is not installed: "
        + install_command("ray")
    ]
    assert "[ray]" in install_command("ray")


def test_follow_policy_without_a_published_policy_and_no_wait_fails(
    runner: CliRunner, in_tmp: Path
) -> None:
    (in_tmp / "run").mkdir()
    result = runner.invoke(
        app, [*COLLECT, "--policy", "run", "--follow-policy", "--no-wait", "--json"]
    )
    assert result.exit_code == 1, result.output
    message = json.loads(result.stdout)["error"]
    assert message.startswith("no policy is published at 'run/exports/latest.onnx' yet")
    assert not (in_tmp / "h.zarr").exists()
    result = runner.invoke(app, [*COLLECT, "--follow-policy"])
    assert result.exit_code == 2 and "--follow-policy needs --policy RUN_DIR" in result.stderr
    result = runner.invoke(app, [*COLLECT, "--no-wait"])
    assert result.exit_code == 2 and "--no-wait goes with --follow-policy" in result.stderr


def test_following_a_run_whose_published_policy_is_damaged_fails_in_one_line(
    runner: CliRunner, in_tmp: Path, publish_policy: Callable[[bytes, Path], None]
) -> None:
    publish_policy(b"not an onnx file", in_tmp / "run")
    for workers in ([], ["--workers", "2"]):  # the Ray driver reads it before Ray starts
        result = runner.invoke(app, [*COLLECT, "--policy", "run", "--follow-policy", *workers])
        assert result.exit_code == 1, result.output
        [line] = [line for line in result.stderr.splitlines() if line]
        # the Ray driver names the run directory by its absolute path (workers run elsewhere)
        assert re.match(r"error: onnxruntime cannot load '(/.*/)?run/exports/latest\.onnx'", line)
        assert line.endswith(
            "; no policy is in use yet, so there is none to keep: publish one that loads there "
            "(the learner's next export replaces it) and run the command again"
        )
    assert not (in_tmp / "h.zarr").exists()


@pytest.fixture
def not_ray() -> Iterator[int]:
    """The port of a loopback TCP server that answers every connection with an HTTP/1 reply,
    as a proxy or another service at a mistyped address would; closed when the test ends."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.5)
    done = threading.Event()

    def answer() -> None:
        while not done.is_set():
            try:
                connection, _ = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with connection:
                connection.settimeout(5)
                with contextlib.suppress(OSError):
                    connection.recv(1024)
                    connection.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\nnot ray\n")

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        done.set()
        server.close()
        thread.join(timeout=10)


def test_an_address_that_answers_but_is_not_ray_fails_in_one_line(
    in_tmp: Path, not_ray: int
) -> None:
    address = f"127.0.0.1:{not_ray}"
    done = subprocess.run(
        [sys.executable, "-m", "emote_cli", *COLLECT, "--workers", "2", "--ray-address", address],
        cwd=in_tmp, env={**os.environ, "COLUMNS": "200"}, capture_output=True, text=True,
        timeout=120,  # Ray's own retries took minutes
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        f"error: '{address}' accepts connections but does not answer as Ray does (no gRPC "
        "handshake within 3 s); give the address `ray start --head` printed, or leave out "
        "--ray-address to run a local Ray"
    ]
    assert done.stdout == ""
    assert not (in_tmp / "h.zarr").exists()


def test_the_handshake_is_not_checked_against_a_tls_cluster(
    not_ray: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray's TLS clusters answer only clients holding Ray's certificates: not refused here."""
    monkeypatch.setenv("RAY_USE_TLS", "1")
    check_answers_grpc(f"127.0.0.1:{not_ray}", timeout=0.5)
    monkeypatch.setenv("RAY_USE_TLS", "0")
    with pytest.raises(ClusterError, match="does not answer as Ray does"):
        check_answers_grpc(f"127.0.0.1:{not_ray}", timeout=0.5)


def test_ray_speaks_through_warning_lines_and_the_workers_progress_ends_with_the_totals(
    in_tmp: Path,
) -> None:
    """A real local Ray started by the command: what Ray logs on the driver reaches stderr as
    emote's ``warning: ...`` lines (its INFO lines not at all), never in Ray's own format."""
    env = {**os.environ, "COLUMNS": "200", "RAY_AUTH_MODE": "disabled"}
    command = [*COLLECT[:4], "--steps", "200", "--workers", "2", "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "emote_cli", *command],
        cwd=in_tmp, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["env_steps"] == 200
    lines = done.stderr.splitlines()
    assert [line for line in lines if not line.startswith(("collect ", "warning: "))] == []
    progress = [line for line in lines if line.startswith("collect ")]
    assert progress[0] == "collect env_step=0/200 (0%) workers=2 episodes=0"
    # every worker's count: 100 steps each, three whole 30-step episodes each
    assert progress[-1].startswith("collect env_step=200/200 (100%) eta=0:00 env_steps/s=")
    assert " workers=0 episodes=6" in progress[-1]
