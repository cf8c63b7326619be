"""Test-wide rules and fixtures: tests marked ``gpu`` skip cleanly on machines without CUDA,
CLI runs (``runner``) leave logging as they found it, ``s3_bucket`` is a fresh bucket on a
real S3-compatible server (moto's) on 127.0.0.1, and ``exported_policies`` are the ONNX policies
of a tiny trained run for the tests of collectors that follow published policies."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner


@pytest.fixture
def restore_torch_threads() -> Iterator[None]:
    """Puts torch's CPU thread count back after a test that changes it (``--threads``)."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def one_torch_thread(restore_torch_threads: None) -> None:
    """Small networks train fastest on one thread, and do not stall when other work shares the
    cores (several threads contending for two cores made such tests ten times slower)."""
    import torch

    torch.set_num_threads(1)


UPSTREAM_V1 = Path(__file__).parent / "integrations" / "upstream" / "data" / "emote-export-v1.zip"


@pytest.fixture
def upstream_v1() -> Path:
    """upstream emote's own V1 export (100 episodes of 4 rewards and 5 observations), shipped in
    the test data (its README says where it came from)."""
    return UPSTREAM_V1


@pytest.fixture
def no_hang() -> Iterator[None]:
    """Ends the test run with every thread's traceback if the test blocks for 60 s (a read
    waiting on a named pipe), rather than leave it hanging."""
    import faulthandler

    faulthandler.dump_traceback_later(60, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture
def runner() -> CliRunner:
    """A CliRunner with a wide terminal so Rich never wraps what the tests look for."""
    return CliRunner(env={"COLUMNS": "200"})


@pytest.fixture
def graph_counts() -> Callable[[], tuple[int, int]]:
    """Dynamo reset (graphs of other tests' callbacks would count against its limits) and its
    counters cleared; returns the reader of ``(graphs made, graph breaks met)`` since."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from emote_core.callbacks.compiled import graph_counts as counts

    torch._dynamo.reset()
    counters.clear()
    return counts


EMOTE_LEVELS = {name: logging.getLogger(name).level for name in ("emote_core", "emote_cli")}
"""emote's logger levels before any test: what every test starts from, whatever a module or
session fixture's command set them to (a test's own restore runs after those fixtures)."""


@contextmanager
def kept_logging() -> Iterator[None]:
    """Undo what `setup_logging` does inside a command, so other tests see default logging."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        for name, emote_level in EMOTE_LEVELS.items():
            logging.getLogger(name).setLevel(emote_level)


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    with kept_logging():
        yield


@pytest.fixture(scope="session")
def exported_policies(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """The policies of a tiny sac_hit_the_middle run at training steps 30 and 60, exported."""
    from emote_cli.app import app

    # A session fixture runs before the per-test restore records logging: keep it here.
    with kept_logging():
        folder = tmp_path_factory.mktemp("policies")
        run_dir = folder / "htm"
        runner = CliRunner(env={"COLUMNS": "200"})
        result = runner.invoke(
            app,
            ["train", "sac_hit_the_middle", "--steps", "60", "--run-dir", str(run_dir),
             "--set", "training.checkpoint_interval=30", "--json", "-q"],
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        exported = {}
        for step in (30, 60):
            out = folder / f"policy_{step}.onnx"
            checkpoint = run_dir / "checkpoints" / f"checkpoint_{step}.tar"
            export = ["export", "onnx", str(checkpoint), "--out", str(out), "-q"]
            result = runner.invoke(app, export)
            assert result.exit_code == 0, result.output
            exported[step] = out
    return exported


@pytest.fixture
def publish_policy() -> Callable[[bytes, Path], None]:
    """Publishes a policy file's bytes in a run directory as a learner does: written next to
    ``exports/latest.onnx``, then renamed over it."""

    def publish(data: bytes, run_dir: Path) -> None:
        path = run_dir / "exports" / "latest.onnx"
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(".latest.onnx.tmp")
        temporary.write_bytes(data)
        os.replace(temporary, path)

    return publish


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_tests = [item for item in items if "gpu" in item.keywords]
    if not gpu_tests:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA; this machine has none")
    for item in gpu_tests:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """The URL of an S3-compatible server (moto's server mode) on 127.0.0.1, one per session."""
    server_module = pytest.importorskip(
        "moto.server", reason="the S3 tests need moto's server: pip install 'moto[server]'"
    )
    pytest.importorskip("s3fs", reason="the S3 tests need s3fs: pip install s3fs")
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_bucket(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``s3://<bucket>``: a fresh bucket on :func:`s3_endpoint`, reached as a user would reach
    an S3-compatible server: credentials and ``AWS_ENDPOINT_URL`` in the environment."""
    import s3fs

    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "emote-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "emote-test")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    _drop_s3_clients()  # made under another environment
    bucket = f"emote-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem().mkdir(bucket)
    yield f"s3://{bucket}"
    _drop_s3_clients()


def _drop_s3_clients() -> None:
    """Forgets the cached S3 clients and collects them now: a client collected later says
    "Unclosed client session" on the log, into whatever command runs then."""
    import gc

    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    gc.collect()
