"""First contact from a clone: the README's two set-up lines, what CI runs of them, and a test
run that says why anything was skipped."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_VENV = re.compile(r"^python3 -m venv (\S+) && \. (\S+)/bin/activate && ")


def _set_up_lines(readme: str) -> list[str]:
    block = readme.split("```bash\n", 1)[1].split("\n```", 1)[0]
    return block.splitlines()


def test_the_two_set_up_lines_build_venvs_of_their_own_and_say_what_they_take() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = _set_up_lines(readme)
    assert len(lines) == 2
    venvs = []
    for line in lines:
        match = _VENV.match(line)
        assert match, line
        assert match.group(1) == match.group(2)  # each activates the venv it made
        venvs.append(match.group(1))
    assert venvs[0] != venvs[1]  # running both never rewrites the other's environment
    assert lines[0].endswith("emote train sac_hit_the_middle")
    assert lines[1].endswith('pip install -e ".[dev]" && pytest')
    after = readme.split("```bash\n", 1)[1].split("\n```", 1)[1].split("\n## ", 1)[0]
    assert len(re.findall(r"about \d+ minutes?", after)) >= 2, after
    assert "2-core" in after


@pytest.fixture
def ci_clone(tmp_path: Path) -> Path:
    """A folder with .ci/run and a README whose test line is cheap: a venv without pip."""
    (tmp_path / ".ci").mkdir()
    shutil.copy(ROOT / ".ci" / "run", tmp_path / ".ci" / "run")
    (tmp_path / "README.md").write_text(
        "# x\n\n```bash\n"
        "python3 -m venv .venv && . .venv/bin/activate && echo first\n"
        "python3 -m venv .venv-t --without-pip && . .venv-t/bin/activate && touch ran\n"
        "```\n",
        encoding="utf-8",
    )
    return tmp_path


def test_ci_prints_the_readme_test_line_and_its_venv_without_running_it(ci_clone: Path) -> None:
    shown = subprocess.run(
        ["bash", ".ci/run", "--print"], cwd=ci_clone, capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == [
        "venv: .venv-t",
        "command: python3 -m venv .venv-t --without-pip && . .venv-t/bin/activate && touch ran",
    ]
    assert not (ci_clone / "ran").exists()


def test_ci_starts_the_test_line_s_venv_from_scratch_and_leaves_the_first_line_s_alone(
    ci_clone: Path,
) -> None:
    for venv in (".venv", ".venv-t"):
        (ci_clone / venv).mkdir()
        (ci_clone / venv / "left-over").write_text("x")
    ran = subprocess.run(
        ["bash", ".ci/run"], cwd=ci_clone, capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, ran.stderr
    assert (ci_clone / "ran").exists()
    assert not (ci_clone / ".venv-t" / "left-over").exists()
    assert (ci_clone / ".venv" / "left-over").exists()


def test_ci_refuses_a_test_line_that_makes_no_venv_of_its_own(ci_clone: Path) -> None:
    readme = ci_clone / "README.md"
    readme.write_text(readme.read_text().replace("python3 -m venv .venv-t", "python3 -m venv ."))
    ran = subprocess.run(
        ["bash", ".ci/run"], cwd=ci_clone, capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 1
    assert ran.stderr.startswith("error: the README's test command must start with")
    assert not (ci_clone / "ran").exists()


def test_the_default_test_run_lists_skip_reasons_and_installs_the_peers_it_needs() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    addopts = pyproject["tool"]["pytest"]["ini_options"]["addopts"].split()
    assert "-rs" in addopts
    # Two processes on the CI machine's two cores; pytest-xdist is what reads -n.
    assert addopts[addopts.index("-n") + 1] == "auto" and "--maxprocesses=2" in addopts
    dev = " ".join(pyproject["project"]["optional-dependencies"]["dev"])
    assert "pytest-xdist" in dev
    for peer in ("stable-baselines3", "skrl", "minari[hdf5,arrow,create]"):
        assert peer in dev


def _skips_without_reason(path: Path) -> list[str]:
    """``pytest.importorskip`` without ``reason=``, ``pytest.skip()`` without a message, and
    skip marks without ``reason=``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        name = ast.unparse(node.func)
        keywords = {keyword.arg for keyword in node.keywords}
        if (
            (name == "pytest.importorskip" and "reason" not in keywords)
            or (name == "pytest.skip" and not node.args and "reason" not in keywords)
            or (name in ("pytest.mark.skip", "pytest.mark.skipif") and "reason" not in keywords)
        ):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_every_skip_in_the_tests_says_why() -> None:
    files = sorted((ROOT / "tests").rglob("*.py"))
    assert [hit for path in files for hit in _skips_without_reason(path)] == []
