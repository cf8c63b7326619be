"""Developer sessions: `nox -s tests`, `nox -s slow`, `nox -s lint`, `nox -s docs`, `nox -s bench`.

Each session installs the CPU build of torch first where no GPU build is wanted, so a session
does not spend minutes downloading CUDA libraries (see README).
"""

from __future__ import annotations

from pathlib import Path

import nox

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True

TORCH_CPU = "torch==2.13.0"


def install(session: nox.Session, extras: str = "dev") -> None:
    session.install(TORCH_CPU)
    session.install("-e", f".[{extras}]")


@nox.session(python="3.11")
def tests(session: nox.Session) -> None:
    """The default test run (no slow or GPU tests)."""
    install(session)
    session.run("pytest", *session.posargs)


@nox.session(python="3.11")
def slow(session: nox.Session) -> None:
    """Tests marked slow (minutes each)."""
    install(session)
    session.run("pytest", "-m", "slow", *session.posargs)


@nox.session(python="3.11")
def gpu(session: nox.Session) -> None:
    """Tests marked gpu; run on a machine with CUDA (installs the default torch build)."""
    session.install("-e", ".[dev]")
    session.run("pytest", "-m", "gpu", "-n", "0", *session.posargs)  # one process per GPU


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    """ruff check and format check."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python="3.11")
def docs(session: nox.Session) -> None:
    """The documentation site, built with `mkdocs build --strict` into site/ (any warning fails)."""
    install(session, extras="docs")
    session.run("mkdocs", "build", "--strict", *session.posargs, env={"NO_MKDOCS_2_WARNING": "1"})


@nox.session(python="3.11")
def bench(session: nox.Session) -> None:
    """Every benchmark in benchmarks/, printing its figures (not run by CI)."""
    install(session, extras="dev,bench")
    found = Path("benchmarks").glob("*_bench.py")
    # offline_bench.py needs datasets and d3rlpy installed apart: `nox -s bench_offline`.
    benchmarks = session.posargs or sorted(str(p) for p in found if p.name != "offline_bench.py")
    for script in benchmarks:
        session.run("python", script)


D3RLPY = ["d3rlpy==2.8.1", "structlog", "dataclasses-json", "marshmallow", "typing-inspect",
          "mypy-extensions", "scikit-learn", "scipy", "joblib", "threadpoolctl", "narwhals", "gym",
          "cloudpickle", "gym-notices"]  # fmt: skip
"""d3rlpy and what it imports, installed without its pins (gymnasium==1.0.0 would replace
emote's gymnasium)."""


@nox.session(python="3.11")
def bench_offline(session: nox.Session) -> None:
    """The offline families against d3rlpy (benchmarks/offline_bench.py) on Pendulum datasets
    that benchmarks/offline_datasets.py makes once, then where each side's update time goes
    (benchmarks/offline_profile.py); arguments go to offline_bench.py.

    d3rlpy goes into a folder of this session's virtualenv that only the benchmark's d3rlpy
    processes put on their PYTHONPATH.
    """
    install(session, extras="dev")
    target = Path(session.virtualenv.location) / "d3rlpy"
    session.install("--target", str(target), "--upgrade", "--no-deps", *D3RLPY)
    datasets = Path(session.create_tmp()) / "offline_datasets" / "pendulum"
    if not (datasets / "datasets.json").is_file():
        session.run("python", "benchmarks/offline_datasets.py", "--env", "pendulum",
                    "--out", str(datasets))  # fmt: skip
    session.run("python", "benchmarks/offline_bench.py", "--datasets", str(datasets),
                "--d3rlpy-path", str(target), *session.posargs)  # fmt: skip
    for family in ("bc", "iql", "cql"):  # where each side's update time goes
        session.run("python", "benchmarks/offline_profile.py", "--family", family,
                    "--d3rlpy-path", str(target))  # fmt: skip
