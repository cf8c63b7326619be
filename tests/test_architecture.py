"""The layers of docs/architecture.md hold: every import inside emote_core (lazy ones and
string-named ones included) goes down to a lower layer or stays inside its own package, and the
code that assembles, evaluates, collects and exports names no algorithm."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
CORE = ROOT / "emote_core"

# Ranks from the bottom up, as docs/architecture.md lists the layers. A module may import from
# its own package or from a lower rank; packages of one rank never import each other.
RANKS: dict[str, int] = {
    "emote_core": 0,  # the package's own names: __version__, install_command
    "errors": 0,
    "typing": 1,
    "spaces": 1,
    "schedules": 1,
    "utils": 1,
    "callback": 2,
    "trainer": 3,
    "callbacks": 4,
    "nn": 5,
    "memory": 5,
    "stores": 6,
    "proxies": 6,
    "env": 7,
    "onnx": 7,
    "models": 7,
    "integrations": 7,
    "algorithms": 8,
    "recipes": 9,
    "runs": 10,
    "assembly": 11,
    "scale": 12,
}
STRING_REFERENCE = re.compile(r"emote_core(?:\.[a-z_]+)+")


def unit(module: str) -> str:
    """The layer unit of a dotted module name: ``emote_core.stores.sources`` -> ``stores``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def module_name(path: Path) -> str:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return name.removesuffix(".__init__")


def references(path: Path) -> set[str]:
    """Every emote_core module a file imports (at any depth) or names in a string of its own."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            found.add(base)
        elif (  # a string that is a module name (importlib, lazy exports), not prose naming one
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and STRING_REFERENCE.fullmatch(node.value.rstrip("."))
        ):
            found.add(node.value.rstrip("."))
    return {name for name in found if name == "emote_core" or name.startswith("emote_core.")}


def test_every_package_has_a_layer() -> None:
    units = {unit(module_name(path)) for path in CORE.rglob("*.py")}
    assert units <= set(RANKS), f"add {sorted(units - set(RANKS))} to docs/architecture.md"
    documented = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    for name in units - {"emote_core"}:
        assert f"`{name}" in documented, f"docs/architecture.md does not mention {name}"


# The public face: its lazy table names every layer, so it is exempt from the layers and no
# module of emote_core may import those names from it (test_no_module_imports_the_public_face).
FACE = CORE / "__init__.py"
FACE_OWN_NAMES = {"DISTRIBUTION", "__version__", "install_command"}  # defined there, at layer 0


@pytest.mark.parametrize(
    "path", sorted(set(CORE.rglob("*.py")) - {FACE}), ids=lambda p: str(p.relative_to(ROOT))
)
def test_imports_go_down_the_layers(path: Path) -> None:
    here = unit(module_name(path))
    upward = sorted(
        target
        for target in references(path)
        if unit(target) != here and RANKS.get(unit(target), 99) >= RANKS[here]
    )
    assert not upward, f"{module_name(path)} (layer {RANKS[here]}) reaches up or across: {upward}"


def test_the_library_never_imports_the_command_line_or_the_tests() -> None:
    for path in CORE.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"^\s*(from|import) (emote_cli|tests)\b", text, re.M), path


def test_no_module_imports_the_public_face() -> None:
    found = []
    for path in sorted(CORE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == "emote_core" and not node.level:
                names = sorted({alias.name for alias in node.names} - FACE_OWN_NAMES)
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names if alias.name == "emote_core"]
            else:
                continue
            if names:
                found.append(f"{module_name(path)} line {node.lineno}: {names}")
    assert not found, f"import these from their own modules, not from emote_core: {found}"


# Where algorithms must not be named: everything that works for any registered algorithm.
GENERIC = [
    *sorted((CORE / "assembly").rglob("*.py")),
    *sorted((CORE / "onnx").rglob("*.py")),
    *sorted((CORE / "env").rglob("*.py")),
    *sorted((CORE / "recipes").rglob("*.py")),
    *sorted((CORE / "runs").rglob("*.py")),
    *sorted((ROOT / "emote_cli").rglob("*.py")),
]


@pytest.mark.parametrize("path", GENERIC, ids=lambda p: str(p.relative_to(ROOT)))
def test_generic_code_has_no_per_algorithm_branch(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    named = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in {"sac", "dqn"}:
            named.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                if isinstance(side, ast.Constant) and side.value in {"sac", "dqn"}:
                    named.append(f"line {node.lineno}: compares with {side.value!r}")
        elif isinstance(node, ast.ImportFrom | ast.Import):
            modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            modules += [alias.name for alias in node.names]
            for module in modules:
                if re.match(r"emote_core\.algorithms\.(sac|dqn)\b", module):
                    named.append(f"line {node.lineno}: imports {module}")
    assert not named, f"{path.relative_to(ROOT)} names algorithms: {named}"


def is_private(name: str) -> bool:
    """``_helper`` is private; ``__version__`` and other dunders are not."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def private_module_outside(target: str, importer: str) -> bool:
    """Whether ``target`` is (inside) a private module, ``pkg._helpers``, that ``importer`` does
    not live beside: private modules serve their own package only."""
    parts = target.split(".")
    for index, part in enumerate(parts):
        if is_private(part):
            package = ".".join(parts[:index])
            return not importer.startswith(package + ".")
    return False


def private_reach_ins(source: str, here: str, *, is_package: bool = False) -> list[str]:
    """Each place where module ``here`` (its ``source``) uses another emote module's
    ``_private`` name or module: a from-import (relative and lazy ones included), an attribute of
    an imported module (``module._name``), or a module name given as a string (``importlib``)."""
    tree = ast.parse(source)
    package = here.split(".") if is_package else here.split(".")[:-1]
    bound: dict[str, str] = {}  # a local name -> the emote module it holds
    found: list[str] = []

    def check_module(target: str, line: int) -> None:
        if private_module_outside(target, here):
            found.append(f"line {line}: imports private module {target}")

    nodes = sorted(ast.walk(tree), key=lambda node: getattr(node, "lineno", 0))
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in {"emote_core", "emote_cli"}:
                    check_module(alias.name, node.lineno)
                    if alias.asname:
                        bound[alias.asname] = alias.name
                    else:
                        bound[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] not in {"emote_core", "emote_cli"}:
                continue
            check_module(base, node.lineno)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if is_module(full):
                    check_module(full, node.lineno)
                    bound[alias.asname or alias.name] = full
                elif is_private(alias.name) and base != here:
                    found.append(f"line {node.lineno}: imports {alias.name} from {base}")
        elif isinstance(node, ast.Attribute) and is_private(node.attr):
            chain, value = [], node.value
            while isinstance(value, ast.Attribute):
                chain.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in bound:
                owner = ".".join([bound[value.id], *reversed(chain)])
                if owner != here and is_module(owner):
                    found.append(f"line {node.lineno}: uses {owner}.{node.attr}")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and STRING_REFERENCE.fullmatch(node.value.rstrip("."))
        ):
            check_module(node.value.rstrip("."), node.lineno)
    return found


LIBRARY_AND_CLI = sorted([*CORE.rglob("*.py"), *(ROOT / "emote_cli").rglob("*.py")])


@pytest.mark.parametrize("path", LIBRARY_AND_CLI, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_uses_another_modules_private_names(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    found = private_reach_ins(source, module_name(path), is_package=path.name == "__init__.py")
    assert not found, (
        f"{path.relative_to(ROOT)} reaches into another module's private names: {found}; make "
        "the helper public where it lives (or move it to the module that owns it)"
    )


@pytest.mark.parametrize(
    ("source", "reported"),
    [
        ("from emote_core.nn.augmentation import _helper", "imports _helper from"),
        ("def f():\n    from .augmentation import ImageAugmentor, _helper", "imports _helper from"),
        ("import emote_core.nn.augmentation as aug\naug._helper(1)", "uses emote_core.nn."),
        ("import emote_core.nn.augmentation\nemote_core.nn.augmentation._helper", "uses emote_co"),
        ("from emote_core.nn import augmentation\naugmentation._helper", "uses emote_core.nn."),
        ("from emote_core.models._callback_parts import is_holdout", "private module emote_co"),
        ("from emote_core.models import _callback_parts", "private module emote_core.models."),
        ("importlib.import_module('emote_core.models._callback_parts')", "private module"),
    ],
)
def test_each_form_of_reach_in_is_reported(source: str, reported: str) -> None:
    found = private_reach_ins(source, "emote_core.nn.curl")
    assert len(found) == 1 and reported in found[0], found


def test_own_names_dunders_and_a_packages_own_private_modules_are_allowed() -> None:
    source = (
        "from emote_core import __version__\n"
        "from emote_core.models._callback_parts import is_holdout\n"
        "from emote_core.models import _callback_parts\n"
        "import emote_core.models.layers as layers\n"
        "layers.ACTIVATIONS, layers.__name__\n"
        "_local = 1\n"
    )
    assert private_reach_ins(source, "emote_core.models.rollouts") == []
    assert (
        private_reach_ins("from emote_cli._common import abort", "emote_cli.memory.convert") == []
    )
