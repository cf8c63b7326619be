"""docs/porting.md stays true: every emote_core name its tables give imports, and its worked
example trains."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "porting.md"
WORKED_EXAMPLE_HEADING = "## Worked example"
ABSENT = "—"

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
