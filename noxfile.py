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
    session.run("pytest", "-m", "gpu", *session.posargs)


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
    benchmarks = session.posargs or sorted(str(p) for p in Path("benchmarks").glob("*_bench.py"))
    for script in benchmarks:
        session.run("python", script)
