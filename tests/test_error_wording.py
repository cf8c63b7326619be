"""Library errors speak of arguments and recipe keys, never of the command line's flags: the
CLI prints its flags in their place (emote_cli._common.in_flags). A whole ``emote ...`` command
given as advice ("make one with: emote collect RECIPE --out STORE") is not a flag of the call."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import typer

from emote_cli.app import app

ROOT = Path(__file__).parents[1]
CORE = ROOT / "emote_core"

_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z-]*")
_ADVICE = re.compile(r"`[^`]*`|emote (?:train|collect|eval|export|memory|env)\b[^;)'`]*")


def _command_flags() -> set[str]:
    found: set[str] = set()

    def walk(command: typer.core.TyperGroup, context: typer.Context) -> None:
        for parameter in command.params:
            found.update(o for o in [*parameter.opts, *parameter.secondary_opts] if "--" in o)
        if hasattr(command, "list_commands"):
            for name in command.list_commands(context):
                sub = command.get_command(context, name)
                walk(sub, typer.Context(sub, parent=context))

    root = typer.main.get_command(app)
    walk(root, typer.Context(root))
    return found


FLAGS = _command_flags()


def _text(node: ast.AST) -> str:
    """A string's text; an f-string's literal parts with ``{}`` for each value."""
    if isinstance(node, ast.JoinedStr):
        return "".join(
            _text(part) if isinstance(part, ast.Constant) else "{}" for part in node.values
        )
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""


def _error_texts(tree: ast.AST) -> list[tuple[int, str]]:
    """The text of every string in an error a module raises or builds (``...Error(...)``)."""
    texts = []
    for node in ast.walk(tree):
        call = node.exc if isinstance(node, ast.Raise) else node
        if not isinstance(call, ast.Call):
            continue
        function = call.func
        name = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", "")
        if not (isinstance(node, ast.Raise) or name.endswith("Error")):
            continue
        inner = {id(v) for n in ast.walk(call) if isinstance(n, ast.JoinedStr) for v in n.values}
        texts += [
            (part.lineno, _text(part))
            for part in ast.walk(call)
            if isinstance(part, ast.JoinedStr | ast.Constant) and id(part) not in inner
        ]
    return texts


def flags_named(path: Path) -> list[str]:
    """``line N: --flag ...`` for each error text of ``path`` that names the CLI's flags."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    named = []
    for line, text in _error_texts(tree):
        flags = sorted(set(_FLAG.findall(_ADVICE.sub("", text))) & FLAGS)
        if flags:
            named.append(f"line {line}: {' '.join(flags)}")
    return sorted(set(named))


def test_the_flags_are_read_from_the_command_line() -> None:
    assert {"--force", "--resume", "--run-dir", "--device", "--memory", "--set"} <= FLAGS


def test_an_error_naming_a_flag_is_found_and_advice_to_run_a_command_is_not(tmp_path) -> None:
    module = tmp_path / "module.py"
    module.write_text(
        "def f(run, name):\n"
        "    if run:\n"
        "        raise ValueError(f'{run} exists; pass --force, or `emote memory verify --json`')\n"
        "    raise ValueError(f'make one: emote collect {name} --out STORE; pass `force=True`')\n"
    )
    assert flags_named(module) == ["line 3: --force"]


@pytest.mark.parametrize(
    "path",
    sorted(CORE.rglob("*.py")),
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_library_errors_name_arguments_not_flags(path: Path) -> None:
    assert not flags_named(path), f"{path.relative_to(ROOT)} names flags: {flags_named(path)}"
