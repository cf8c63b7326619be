"""MkDocs hook: the command-line reference page gets the text Typer generates from the `emote`
app (`typer emote_cli.app utils docs`), so the page always matches the installed commands."""

from __future__ import annotations

import subprocess
import sys

MARKER = "<!-- the emote command's reference, generated at build time -->"


def cli_reference() -> str:
    """Typer's Markdown for every `emote` command, its headings one level down; raises
    ``CalledProcessError`` when Typer cannot load the app, so the build fails."""
    generated = subprocess.run(
        [sys.executable, "-m", "typer", "emote_cli.app", "utils", "docs", "--name", "emote"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    lines, fenced = [], False
    for line in generated.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        lines.append("#" + line if line.startswith("#") and not fenced else line)
    return "\n".join(lines)


def on_page_markdown(markdown: str, page, **_: object) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, cli_reference())
