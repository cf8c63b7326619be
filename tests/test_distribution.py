"""The distribution's name and the pip commands emote prints: right from a clone and from the
package index, and never naming the unrelated ``emote`` package on the index."""

from __future__ import annotations

import json
import re
import sys
import tomllib
from importlib.metadata import PackageNotFoundError
from pathlib import Path

import pytest

import emote_core
from emote_core import DISTRIBUTION, install_command

ROOT = Path(__file__).resolve().parents[1]

# On the public package index, "emote" is an unrelated emoji package and "emote-rl" is Embark's
# upstream emote; installing either instead of this project is the mistake these tests prevent.
TAKEN = {"emote", "emote-rl"}


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_the_distribution_is_named_by_one_constant_that_is_not_a_taken_index_name() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["name"] == DISTRIBUTION
    assert _normalized(project["name"]) not in TAKEN
    assert "emote" in project["scripts"]  # the command keeps its name


def _fake_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct_url: dict | None) -> None:
    """Metadata of an installed emote that importlib.metadata finds first on sys.path."""
    info = tmp_path / "site" / f"{DISTRIBUTION.replace('-', '_')}-9.9.9.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {DISTRIBUTION}\nVersion: 9.9.9\n", encoding="utf-8"
    )
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url), encoding="utf-8")
    monkeypatch.setattr(sys, "path", [str(info.parent), *sys.path])


def test_an_editable_install_from_a_clone_is_told_to_install_the_extra_from_that_clone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clone = tmp_path / "my clone"
    url = "file://" + str(clone).replace(" ", "%20")
    _fake_install(tmp_path, monkeypatch, {"url": url, "dir_info": {"editable": True}})
    assert install_command("minari") == f'pip install -e "{clone}[minari]"'


def test_an_install_from_the_index_is_told_the_distribution_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_install(tmp_path, monkeypatch, None)
    assert install_command("minari") == f'pip install "{DISTRIBUTION}[minari]"'


def test_an_install_from_a_built_wheel_or_a_folder_is_told_to_install_the_extra_from_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheel = tmp_path / "dist" / f"{DISTRIBUTION.replace('-', '_')}-9.9.9-py3-none-any.whl"
    _fake_install(tmp_path, monkeypatch, {"url": wheel.as_uri(), "archive_info": {}})
    assert install_command("mujoco") == f'pip install "{wheel}[mujoco]"'


def test_a_clone_whose_own_metadata_is_found_first_is_told_to_install_from_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Running from a clone puts its ``emote_toolkit.egg-info`` (no direct_url.json) first."""
    clone = tmp_path / "clone"
    info = clone / f"{DISTRIBUTION.replace('-', '_')}.egg-info"
    info.mkdir(parents=True)
    (clone / "emote_core").mkdir()
    (clone / "pyproject.toml").write_text(f'[project]\nname = "{DISTRIBUTION}"\n')
    (info / "PKG-INFO").write_text(f"Metadata-Version: 2.1\nName: {DISTRIBUTION}\nVersion: 9\n")
    monkeypatch.setattr(sys, "path", [str(clone), *sys.path])
    assert install_command("mujoco") == f'pip install -e "{clone}[mujoco]"'


def test_a_source_tree_that_was_never_installed_is_told_to_install_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def missing(name: str) -> None:
        raise PackageNotFoundError(name)

    monkeypatch.setattr(emote_core, "distribution", missing)
    assert install_command("dev") == 'pip install -e ".[dev]"'


# A pip command that would install the unrelated index package "emote" (with or without extras).
_WRONG_PIP = re.compile(r"""pip install\s+(?:-U\s+)?["']?emote(?:\[|["'\s]|$)""", re.MULTILINE)


@pytest.mark.parametrize(
    "where", ["README.md", "docs", "emote_core", "emote_cli", "benchmarks", "noxfile.py", ".ci"]
)
def test_no_hint_installs_the_unrelated_emote_package(where: str) -> None:
    root = ROOT / where
    files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
    texts = {p: p.read_text(encoding="utf-8", errors="replace") for p in files}
    wrong = {str(p.relative_to(ROOT)): _WRONG_PIP.findall(t) for p, t in texts.items()}
    assert {path: found for path, found in wrong.items() if found} == {}
    assert not any(f'"{p}[' in t for t in texts.values() for p in ("emote", "emote-rl"))
