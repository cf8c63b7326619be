"""docs/porting.md stays true: every emote_core name its tables give imports, its worked
example trains, and it covers both sides: every public name of upstream's package has a row,
every registered family and add-on and every public package of emote_core is named, and no "not
yet" row names something emote has."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import emote_core
from emote_core.algorithms import registry

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "porting.md"
UPSTREAM_NAMES = Path(__file__).resolve().parent / "data" / "upstream_public_names.txt"
PACKAGE_ROOT = Path(emote_core.__file__).resolve().parent
WORKED_EXAMPLE_HEADING = "## Worked example"
NOT_YET_HEADING = "## Not in emote yet"
ABSENT = "—"
MAPPING_HEADERS = (
    ["upstream", "emote_core", "differences"],
    ["upstream module", "emote_core module"],
)

# The worked example's constants and what the test runs it with: a few updates, enough warm-up
# for the loader's first batch (ten 30-step episodes), and a cutoff a short run always meets.
SHORT_RUN = {
    "BP_STEPS": "30",
    "WARMUP_STEPS": "400",
    "REWARD_CUTOFF": "-1_000.0",
}


def emote_core_cells(text: str) -> list[tuple[int, str]]:
    """``(line number, cell)`` of each row's emote_core cell, in tables headed ``emote_core``."""
    cells: list[tuple[int, str]] = []
    header: list[str] | None = None
    in_code = False
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith("```"):
            in_code = not in_code
            continue
        if in_code or not line.startswith("|"):
            header = None
            continue
        row = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if header is None:
            header = row
            continue
        if set(line) <= set("|-: ") or header != ["upstream", "emote_core", "differences"]:
            continue
        cells.append((number, row[1]))
    return cells


def resolve(dotted: str) -> object:
    """Imports the longest importable module prefix of ``dotted`` and walks the attributes left."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            value: object = importlib.import_module(".".join(parts[:split]))
        except ModuleNotFoundError as error:
            if error.name is None or not dotted.startswith(error.name):
                raise
            continue
        for attribute in parts[split:]:
            value = getattr(value, attribute)
        return value
    raise ModuleNotFoundError(dotted)


def named_paths(text: str) -> tuple[list[tuple[int, str]], list[str]]:
    """The dotted paths the tables name, and the rows whose emote_core cell is malformed."""
    paths: list[tuple[int, str]] = []
    malformed: list[str] = []
    for number, cell in emote_core_cells(text):
        if cell == ABSENT:
            continue
        found = re.fullmatch(r"`(emote_core(?:\.\w+)+)`", cell)
        if found is None:
            malformed.append(f"line {number}: {cell!r}")
        else:
            paths.append((number, found.group(1)))
    return paths, malformed


def missing_paths(text: str) -> list[str]:
    paths, _ = named_paths(text)
    missing: list[str] = []
    for number, dotted in paths:
        try:
            resolve(dotted)
        except (ImportError, AttributeError) as error:
            missing.append(f"line {number}: {dotted} ({type(error).__name__}: {error})")
    return missing


def mapping_rows(text: str) -> list[tuple[int, str, list[str]]]:
    """``(line number, section heading, cells)`` of each row of the upstream-to-emote tables."""
    rows: list[tuple[int, str, list[str]]] = []
    heading = ""
    header: list[str] | None = None
    in_code = False
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("|"):
            header = None
            heading = line if line.startswith("## ") and not in_code else heading
            continue
        row = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if header is None:
            header = row
        elif header in MAPPING_HEADERS and not set(line) <= set("|-: "):
            rows.append((number, heading, row))
    return rows


def spans(cell: str) -> list[str]:
    """The code spans of a table cell."""
    return re.findall(r"`([^`]+)`", cell)


def covers(cell: str, upstream_path: str) -> bool:
    """Whether an upstream cell names ``upstream_path``: as one span, or as a span of its module
    (or of another name in it) beside a span ending in its name: `` `emote` (`Trainer`) ``."""
    module, _, name = upstream_path.rpartition(".")
    found = spans(cell)
    if upstream_path in found:
        return True
    in_module = any(span == module or span.startswith(module + ".") for span in found)
    return in_module and any(span == name or span.endswith("." + name) for span in found)


def uncovered_upstream_names(text: str, objects: list[list[str]]) -> list[str]:
    """The upstream objects (each given by all its paths) that no row's upstream cell names."""
    upstream_cells = [cells[0] for _, _, cells in mapping_rows(text)]
    return [
        " / ".join(paths)
        for paths in objects
        if not any(covers(cell, path) for cell in upstream_cells for path in paths)
    ]


def upstream_public_names() -> list[list[str]]:
    """Upstream's public objects, each as its paths (tests/data/upstream_public_names.txt)."""
    lines = UPSTREAM_NAMES.read_text(encoding="utf-8").splitlines()
    return [line.split() for line in lines if line.strip() and not line.startswith("#")]


def public_packages() -> list[str]:
    """emote_core, its packages and its top-level modules, none of whose names starts with
    ``_``: the units a user looks for. The modules inside a package are its internal layout
    (split and merged as it grows), so the guide must name the package, not each module. None
    is exempt: the packages with no upstream counterpart are named in the "Import paths" table."""
    names = ["emote_core"]
    for init in sorted(PACKAGE_ROOT.rglob("__init__.py")):
        parts = init.parent.relative_to(PACKAGE_ROOT.parent).parts
        if len(parts) > 1 and not any(part.startswith("_") for part in parts):
            names.append(".".join(parts))
    names += [f"emote_core.{path.stem}" for path in sorted(PACKAGE_ROOT.glob("[!_]*.py"))]
    return names


def unnamed_modules(text: str, modules: list[str]) -> list[str]:
    """The modules no code span of the guide names, itself or a path inside it."""
    found = re.findall(r"`(emote_core[\w.]*)", text)
    return [m for m in modules if not any(span == m or span.startswith(m + ".") for span in found)]


def emote_modules() -> list[str]:
    """Every module and package of emote_core, by dotted path."""
    paths = []
    for path in PACKAGE_ROOT.rglob("*.py"):
        parts = path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts
        paths.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return paths


def not_yet_rows_emote_has(text: str, modules: list[str], plugins: list[str]) -> list[str]:
    """The "not yet" rows naming an upstream module or name that emote has: the same path under
    ``emote_core``, a module of the same last name, or a registered family or add-on of that
    name (``genrl`` for ``genrl_sac``)."""
    wrong: list[str] = []
    for number, heading, cells in mapping_rows(text):
        if heading != NOT_YET_HEADING:
            continue
        for span in spans(cells[0]):
            last = span.rpartition(".")[2]
            ours = [m for m in modules if m == "emote_core" + span[len("emote") :]]
            ours += [m for m in modules if m.rpartition(".")[2] == last]
            ours += [p for p in plugins if p == last or p.startswith(last + "_")]
            if ours:
                wrong.append(f"line {number}: {span} is in emote as {', '.join(sorted(set(ours)))}")
    return wrong


def worked_example(text: str) -> str:
    """The python block(s) under the worked-example heading, up to the next ``## `` heading."""
    start = text.index(WORKED_EXAMPLE_HEADING)
    end = text.find("\n## ", start + 1)
    section = text[start:] if end < 0 else text[start:end]
    blocks = re.findall(r"^```python\n(.*?)^```", section, flags=re.S | re.M)
    assert blocks, "the worked example has no ```python block"
    return "\n".join(blocks)


def shortened(code: str) -> str:
    for name, value in SHORT_RUN.items():
        code, count = re.subn(rf"^{name} = .*$", f"{name} = {value}", code, flags=re.M)
        assert count == 1, f"the worked example should set {name} once at the top level"
    return code


def test_every_row_names_one_emote_core_path_or_none() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    paths, malformed = named_paths(text)
    assert not malformed, "emote_core cells must be one `emote_core...` path or —:\n" + "\n".join(
        malformed
    )
    assert len(paths) > 100, f"only {len(paths)} rows found: is the table header still right?"


def test_every_emote_core_name_in_the_guide_imports() -> None:
    missing = missing_paths(GUIDE.read_text(encoding="utf-8"))
    assert not missing, "docs/porting.md names things emote_core lacks:\n" + "\n".join(missing)


def test_a_row_naming_something_absent_fails() -> None:
    text = (
        "| upstream | emote_core | differences |\n|---|---|---|\n"
        "| `emote.Trainer` | `emote_core.trainer.Trainer` | — |\n"
        "| `emote.Nope` | `emote_core.trainer.NoSuchTrainer` | — |\n"
        "| `emote.Gone` | `emote_core.no_such_module.Thing` | — |\n"
        "| `emote.Bad` | emote_core.trainer.Trainer | — |\n"
    )
    missing = missing_paths(text)
    assert [entry.split(" (")[0] for entry in missing] == [
        "line 4: emote_core.trainer.NoSuchTrainer",
        "line 5: emote_core.no_such_module.Thing",
    ]
    assert named_paths(text)[1] == ["line 6: 'emote_core.trainer.Trainer'"]


def test_every_public_upstream_name_has_a_row() -> None:
    objects = upstream_public_names()
    assert len(objects) > 160, f"only {len(objects)} names in {UPSTREAM_NAMES.name}"
    missing = uncovered_upstream_names(GUIDE.read_text(encoding="utf-8"), objects)
    assert not missing, "docs/porting.md has no row for these upstream names:\n" + "\n".join(
        missing
    )


def test_an_upstream_name_is_covered_by_its_path_or_its_module_and_name() -> None:
    text = (
        "| upstream module | emote_core module |\n|---|---|\n"
        "| `emote` (`Trainer`, `Callback`) | `emote_core.trainer` |\n\n"
        "| upstream | emote_core | differences |\n|---|---|---|\n"
        "| `emote.memory.memory.MemoryLoader` | `emote_core.memory.loaders.MemoryLoader` | — |\n"
        "| `emote.algorithms.dqn.QLoss` | `emote_core.algorithms.dqn.QLoss` | — |\n"
    )
    objects = [
        ["emote.trainer.Trainer", "emote.Trainer"],
        ["emote.memory.memory.MemoryLoader", "emote.memory.MemoryLoader"],
        ["emote.algorithms.sac.QLoss"],
        ["emote.Callback"],
        ["emote.__version__"],
    ]
    assert uncovered_upstream_names(text, objects) == [
        "emote.algorithms.sac.QLoss",
        "emote.__version__",
    ]


def test_every_registered_family_and_addon_has_a_row() -> None:
    paths, _ = named_paths(GUIDE.read_text(encoding="utf-8"))
    named = {id(resolve(dotted)) for _, dotted in paths}
    plugins = [registry.get_algorithm(n) for n in registry.algorithm_names()]
    plugins += [registry.get_addon(n) for n in registry.addon_names()]
    ours = [p for p in plugins if type(p).__module__.startswith("emote_core.")]
    assert len(ours) >= 10, f"only {len(ours)} families and add-ons registered"
    unnamed = [
        f"{p.name} ({type(p).__module__}.{type(p).__qualname__})"
        for p in ours
        if id(type(p)) not in named and id(p.config_class) not in named
    ]
    assert not unnamed, (
        "docs/porting.md has no row naming these families or add-ons (their class or their "
        "table's config class):\n" + "\n".join(unnamed)
    )


def test_every_public_package_of_emote_core_is_named() -> None:
    modules = public_packages()
    assert "emote_core.memory.strategies" in modules
    assert "emote_core.trainer" in modules
    missing = unnamed_modules(GUIDE.read_text(encoding="utf-8"), modules)
    assert not missing, "docs/porting.md never names these emote_core packages:\n" + "\n".join(
        missing
    )


def test_no_not_yet_row_names_something_emote_has() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    assert NOT_YET_HEADING in text
    plugins = registry.algorithm_names() + registry.addon_names()
    wrong = not_yet_rows_emote_has(text, emote_modules(), plugins)
    assert not wrong, "docs/porting.md says emote lacks what it has:\n" + "\n".join(wrong)


def test_a_not_yet_row_naming_an_emote_module_or_family_fails() -> None:
    text = (
        f"{NOT_YET_HEADING}\n\n"
        "| upstream | emote_core | differences |\n|---|---|---|\n"
        "| `emote.nn.curl` | — | Not yet. |\n"
        "| `emote.algorithms.genrl` | — | Not yet. |\n"
        "| `emote.ppo` | — | Not yet. |\n\n"
        "## Next\n\n"
        "| upstream | emote_core | differences |\n|---|---|---|\n"
        "| `emote.nn.curl` | — | Elsewhere, not a not-yet row. |\n"
    )
    modules = ["emote_core.nn.curl", "emote_core.algorithms.curl", "emote_core.nn"]
    assert not_yet_rows_emote_has(text, modules, ["genrl_sac", "sac"]) == [
        "line 5: emote.nn.curl is in emote as emote_core.algorithms.curl, emote_core.nn.curl",
        "line 6: emote.algorithms.genrl is in emote as genrl_sac",
    ]
    assert unnamed_modules("`emote_core.nn.curl.CurlLoss`", modules) == [
        "emote_core.algorithms.curl"
    ]


def test_the_worked_example_trains(one_torch_thread: None) -> None:
    namespace: dict[str, object] = {"__name__": "porting_guide_example"}
    code = shortened(worked_example(GUIDE.read_text(encoding="utf-8")))
    exec(compile(code, "porting.md", "exec"), namespace)
    trainer = namespace["trainer"]
    assert trainer.state["bp_step"] == int(SHORT_RUN["BP_STEPS"])  # type: ignore[attr-defined]
    for callback in namespace["logged_cbs"][:4]:  # type: ignore[index]
        loss_keys = [key for key in callback.scalar_logs if key.startswith("loss/")]
        assert loss_keys, f"{callback.name} never stepped"


def test_the_worked_example_names_the_cli_run() -> None:
    section = GUIDE.read_text(encoding="utf-8").split(WORKED_EXAMPLE_HEADING, 1)[1]
    assert "emote train sac_hit_the_middle" in section
    recipes = Path(__file__).resolve().parents[1] / "recipes"
    assert (recipes / "sac_hit_the_middle.toml").is_file()
