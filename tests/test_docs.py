"""The docs site stays true: it builds with ``mkdocs build --strict``, the README links only to
files that exist, and every ```python, ```bash, ```sh and ```console block of the guides in
``docs/`` runs as written.

A page's blocks run in order in one empty folder of their own: a block with a title
(```python title="mygame.py"```) is written there as that file, python blocks run in a
subprocess (consecutive ones share it and their names), shell blocks under ``bash -euo pipefail``
with this environment's ``emote`` first on PATH. A block preceded by ``<!-- slow: REASON -->``
runs only in the slow variant, and one preceded by ``<!-- not run: REASON -->`` never runs;
both must say why. ``docs/tutorial.md`` is run by ``tests/test_tutorial.py``, which checks its
outputs too.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RUN_ELSEWHERE = {"tutorial.md": "tests/test_tutorial.py"}
SHELLS = ("bash", "sh", "console")
RUNNABLE = ("python", *SHELLS)
TIMEOUT_S = 900

_FENCE = re.compile(r'^```([\w-]*)(?: title="([^"]+)")?\n(.*?)^```[ \t]*$', re.M | re.S)
_MARKER = re.compile(r"<!--[ \t]*(not run|slow)[ \t]*(?::([^\n]*?))?[ \t]*-->\n\Z")
_ANY_MARKER = re.compile(r"<!--\s*(not run|slow)\b")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page: its first line's number (the fence), language, title
    (a file name), text, and the marker before it (``"slow"``, ``"not run"`` or None) with its
    reason."""

    page: str
    line: int
    language: str
    title: str | None
    body: str
    marker: str | None = None
    reason: str = ""

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    def commands(self) -> str:
        """A shell block's script: a console block's ``$ `` lines, else the whole text."""
        if self.language == "console":
            prompts = [line[2:] for line in self.body.splitlines() if line.startswith("$ ")]
            if prompts:
                return "\n".join(prompts) + "\n"
        return self.body


def page_blocks(text: str, page: str = "page.md") -> list[Block]:
    """Every fenced block of ``text`` at the start of a line, in page order, with the marker
    comment on the line right before its fence."""
    blocks = []
    for match in _FENCE.finditer(text):
        before = text[: match.start()]
        marker = _MARKER.search(before[-2000:])
        blocks.append(
            Block(
                page=page,
                line=before.count("\n") + 1,
                language=match.group(1),
                title=match.group(2),
                body=match.group(3),
                marker=marker.group(1) if marker else None,
                reason=(marker.group(2) or "").strip() if marker else "",
            )
        )
    return blocks


def marker_problems(text: str, page: str = "page.md") -> list[str]:
    """Markers without a reason, and markers that stand before no runnable block."""
    blocks = page_blocks(text, page)
    marked = {block.line for block in blocks if block.marker}
    problems = [
        f"{block.where}: `<!-- {block.marker}: REASON -->` needs a reason"
        for block in blocks
        if block.marker and not block.reason
    ]
    problems += [
        f"{block.where}: a ```{block.language} block never runs; drop its marker"
        for block in blocks
        if block.marker and block.language not in RUNNABLE
    ]
    for match in _ANY_MARKER.finditer(text):
        fence_line = text.count("\n", 0, match.start()) + 2
        if fence_line not in marked:
            problems.append(f"{page}:{fence_line - 1}: a marker must stand right before a block")
    return problems


def guides() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def _name(path: Path) -> str:
    return str(path.relative_to(DOCS))


def runs_of(path: Path, *, slow: bool) -> list[Block]:
    """The blocks of a page that run: in the default run those without a marker, in the slow
    run the slow ones too; titled blocks are files and always written."""
    wanted = (None, "slow") if slow else (None,)
    return [
        block
        for block in page_blocks(path.read_text(encoding="utf-8"), _name(path))
        if block.title or (block.language in RUNNABLE and block.marker in wanted)
    ]


_DRIVER = """
import json, sys
namespace = {"__name__": "__main__"}
for where, line, body in json.load(open(sys.argv[1], encoding="utf-8")):
    print(f"--- {where}", flush=True)
    exec(compile("\\n" * (line) + body, where.split(":")[0], "exec"), namespace)
"""


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["COLUMNS"] = "120"
    return env


def _check(ran: subprocess.CompletedProcess[str], where: str) -> None:
    assert ran.returncode == 0, f"{where} failed (exit {ran.returncode}):\n{ran.stdout[-6000:]}"


def run_blocks(blocks: list[Block], folder: Path) -> None:
    """Runs ``blocks`` in order in ``folder``; a failing block fails with its page and line."""
    scripts = folder.parent / f"{folder.name}-scripts"
    scripts.mkdir(exist_ok=True)
    pending: list[Block] = []

    def flush() -> None:
        if not pending:
            return
        batch = scripts / f"python-{pending[0].line}.json"
        batch.write_text(json.dumps([[b.where, b.line, b.body] for b in pending]), "utf-8")
        ran = subprocess.run(
            [sys.executable, "-c", _DRIVER, str(batch)],
            cwd=folder, env=_environment(), capture_output=True, text=True, timeout=TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        _check(ran, ", ".join(block.where for block in pending))
        pending.clear()

    for block in blocks:
        if block.title:
            flush()
            (folder / block.title).write_text(block.body, encoding="utf-8")
        elif block.language == "python":
            pending.append(block)
        else:
            flush()
            ran = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", block.commands()],
                cwd=folder, env=_environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL,
            )  # fmt: skip
            _check(ran, block.where)
    flush()


def _pages(*, slow: bool) -> list[str]:
    """Pages with blocks to run: in the slow variant, only those that have slow blocks."""
    names = []
    for path in guides():
        if _name(path) in RUN_ELSEWHERE:
            continue
        blocks = [block for block in runs_of(path, slow=slow) if not block.title]
        if blocks and (not slow or any(block.marker == "slow" for block in blocks)):
            names.append(_name(path))
    return names


@pytest.mark.parametrize("page", _pages(slow=False))
def test_the_guide_s_code_runs(page: str, tmp_path: Path) -> None:
    folder = tmp_path / "page"
    folder.mkdir()
    run_blocks(runs_of(DOCS / page, slow=False), folder)


@pytest.mark.slow
@pytest.mark.parametrize("page", _pages(slow=True))
def test_the_guide_s_code_runs_with_its_slow_blocks(page: str, tmp_path: Path) -> None:
    folder = tmp_path / "page"
    folder.mkdir()
    run_blocks(runs_of(DOCS / page, slow=True), folder)


def test_every_marker_says_why_and_stands_before_a_block() -> None:
    problems = [
        problem
        for path in guides()
        for problem in marker_problems(path.read_text(encoding="utf-8"), _name(path))
    ]
    assert problems == []


def test_markers_without_a_reason_or_a_block_are_found() -> None:
    text = (
        "<!-- not run: needs a GPU -->\n```bash\nemote env\n```\n\n"
        "<!-- slow -->\n```python\nprint(1)\n```\n\n"
        "<!-- not run: shown only -->\n```toml\n[a]\n```\n\n"
        "<!-- slow: a stray one -->\n\nsome prose\n"
    )
    blocks = page_blocks(text, "x.md")
    assert [(block.marker, block.reason) for block in blocks] == [
        ("not run", "needs a GPU"), ("slow", ""), ("not run", "shown only"),
    ]  # fmt: skip
    assert marker_problems(text, "x.md") == [
        "x.md:7: `<!-- slow: REASON -->` needs a reason",
        "x.md:12: a ```toml block never runs; drop its marker",
        "x.md:16: a marker must stand right before a block",
    ]


def test_a_failing_block_fails_with_its_page_and_line(tmp_path: Path) -> None:
    text = '```python title="helper.py"\nVALUE = 3\n```\n\n```bash\ntest -f helper.py\n```\n'
    text += "\n```python\nfrom helper import VALUE\nassert VALUE == 4\n```\n"
    folder = tmp_path / "page"
    folder.mkdir()
    with pytest.raises(AssertionError, match=r"x\.md:9 failed"):
        run_blocks(page_blocks(text, "x.md"), folder)


def test_the_site_builds_strictly_with_the_cli_and_api_references(tmp_path: Path) -> None:
    site = tmp_path / "site"
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(site)],
        cwd=ROOT, env={**_environment(), "NO_MKDOCS_2_WARNING": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout[-6000:]
    cli = (site / "cli" / "index.html").read_text(encoding="utf-8")
    for command in ("emote train", "emote memory convert", "emote export onnx"):
        assert command in cli, command
    assert "--no-live" in cli
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    assert "install_command" in api
    results = (site / "benchmarks" / "index.html").read_text(encoding="utf-8")
    assert "Benchmark results" in results


def test_every_guide_is_in_the_site_s_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    listed = set(re.findall(r":\s*([\w/]+\.md)\s*$", nav, flags=re.M))
    assert {_name(path) for path in guides()} == listed


_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


def test_the_readme_links_only_to_files_that_exist() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = [link for link in _LINK.findall(readme) if "://" not in link]
    assert any(link.startswith("docs/") for link in links)
    assert [link for link in links if not (ROOT / link).exists()] == []


def test_the_readme_is_a_front_door_that_leaves_the_rest_to_the_guides() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    quickstart = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    for command in ("emote train", "emote eval", "emote export onnx", "emote collect"):
        assert command in quickstart, command
    contract = readme.split("## The command-line contract", 1)[1].split("\n## ", 1)[0]
    for term in ("--json", "--device", "Exit codes", "3 threshold not met", "130 interrupted"):
        assert term in contract, term
    assert "nox -s docs" in readme
