"""Text read from stores and files, made safe to print on a terminal.

A store's attributes, column names, provenance or a file's metadata may hold control
characters: printed raw, an escape sequence would drive the user's terminal (move the cursor,
retitle the window, hide text). :func:`printable` shows them escaped instead; ``--json`` output
needs nothing of the kind, JSON escapes them itself.
"""

from __future__ import annotations

__all__ = ["printable", "printable_lines"]


def printable(text: object) -> str:
    """``str(text)`` with every character that is not printable (control and format
    characters, line and paragraph separators, spaces other than ' ') written as Python writes
    it in a string literal: ``\\x1b``, ``\\n``, ``\\u202e``.

    Args:
        text: What to print (anything; ``str`` of it is escaped).

    Returns:
        The text, safe to print as it is.
    """
    value = str(text)
    if value.isprintable():
        return value
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in value)


def printable_lines(text: object) -> str:
    """``str(text)`` escaped as :func:`printable` does, line by line: its ``\\n`` are kept.

    Args:
        text: What to print (anything; ``str`` of it is escaped).

    Returns:
        The lines, each safe to print as it is, joined by ``\\n``.
    """
    return "\n".join(map(printable, str(text).split("\n")))
