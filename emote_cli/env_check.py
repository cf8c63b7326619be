"""``emote env check``: check an environment before training on it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from emote_cli._common import (
    DebugOption,
    ExitCode,
    JsonOption,
    QuietOption,
    abort,
    emit_json,
    handle_errors,
    setup_logging,
    stdout_console,
)
from emote_cli._text import printable

__all__ = ["check"]

_LABELS = {"pass": "ok  ", "warn": "warn", "fail": "FAIL", "skip": "skip"}
_STYLES = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def check(
    target: Annotated[
        str,
        typer.Argument(
            metavar="ENV_OR_RECIPE",
            help="A recipe file or name (its \\[env] table), a gymnasium id, module:EnvId, or an "
            "entry point package.module:callable.",
            show_default=False,
        ),
    ],
    steps: Annotated[
        int,
        typer.Option(
            "--steps",
            min=1,
            help="Random-action steps played to see episodes end, the "
            "observations' scale and the step time.",
        ),
    ] = 2_000,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the resets and actions.")] = 0,
    json_output: JsonOption = False,
    quiet: QuietOption = False,
    debug: DebugOption = False,
) -> None:
    """Check an environment before training on it, and say how to fix what fails.

    Runs gymnasium's env checker (PettingZoo's parallel_api_test for a ParallelEnv), then emote's:
    supported spaces and dtypes, the step API, finite observations inside their space,
    reproducible seeding, episodes that end, observation scale and step time.

    Modules are found on PYTHONPATH, in the current directory and in the recipe file's directory.
    Writes no file. Exit 1 when a check fails (warnings do not fail).
    """
    setup_logging(quiet=quiet, debug=debug)
    with handle_errors(debug=debug, json_output=json_output):
        report, recipe = _run_checks(target, steps=steps, seed=seed)
        document = {**report.to_json(), "recipe": recipe}
        if json_output:
            emit_json(document)
        else:
            _print_report(document)
        if not report.passed:
            failed = [item.name for item in report.checks if item.status == "fail"]
            count = f"{len(failed)} check{'s' if len(failed) != 1 else ''}"
            abort(
                f"env '{report.env}' failed {count} ({', '.join(failed)}); the checklist gives "
                "the fix for each",
                ExitCode.ERROR,
            )


def _run_checks(target: str, *, steps: int, seed: int) -> tuple[Any, str | None]:
    """The report for ENV_OR_RECIPE, and the recipe file it came from (``None`` for an env)."""
    from emote_core.env.checks import check_environment
    from emote_core.env.making import env_factory

    source, recipe, normalize = _source(target)
    factory = None

    def make() -> Any:
        nonlocal factory
        if factory is None:  # imports the user's modules: a failure is the 'made' check's
            factory = env_factory(source)
        return factory()

    writes_bytecode = sys.dont_write_bytecode
    sys.dont_write_bytecode = True  # importing the user's module must leave no __pycache__
    try:
        report = check_environment(
            make, env=source.name, steps=steps, seed=seed, normalize_observations=normalize
        )
    finally:
        sys.dont_write_bytecode = writes_bytecode
    return report, recipe


def _source(target: str) -> tuple[Any, str | None, bool]:
    """How to make the env ENV_OR_RECIPE names: ``(EnvSource, recipe file or None,
    normalize_observations)``. An env is read as ``--env`` reads it, with the default recipe.

    Raises:
        UsageError: If a plain name is neither a recipe nor a registered gymnasium id.
    """
    from emote_core.assembly.builders import env_source
    from emote_core.recipes import Recipe, available_recipes, load_recipe
    from emote_core.recipes.loading import find_recipe, with_env

    plain = ":" not in target
    path = Path(target)
    if path.suffix == ".toml" or path.is_file() or (plain and target in available_recipes()):
        recipe = load_recipe(target)
        return env_source(recipe), str(find_recipe(target)), recipe.env.normalize_observations
    if plain:
        _check_plain_name(target)
    return env_source(with_env(Recipe(), target)), None, False


def _check_plain_name(name: str) -> None:
    """A name without ``:`` must be a registered id (nothing is imported for it)."""
    import difflib

    import gymnasium

    import emote_core.env  # noqa: F401 - registers emote's own environments
    from emote_core.errors import UsageError
    from emote_core.recipes import available_recipes

    if name in gymnasium.registry:
        return
    known = [*available_recipes(), *gymnasium.registry]
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise UsageError(
        f"ENV_OR_RECIPE '{name}' is neither a recipe nor a registered gymnasium id{hint} (pass a "
        "recipe file or name, a gymnasium id, module:EnvId or package.module:callable)"
    )


def _print_report(document: dict[str, Any]) -> None:
    """The checklist: one line per check, the fix indented below a warning or failure."""
    from rich.text import Text

    console = stdout_console()
    origin = f" (recipe {document['recipe']})" if document["recipe"] else ""
    console.print(Text(printable(f"env check: {document['env']}{origin}"), style="bold"))
    for item in document["checks"]:
        line = Text(f"  {_LABELS[item['status']]}  ", style=_STYLES[item["status"]])
        line.append(printable(f"{item['name'].replace('_', ' ')}: {item['detail']}"))
        console.print(line, soft_wrap=True)
        if item["fix"] and item["status"] in ("warn", "fail"):
            console.print(Text(printable(f"        fix: {item['fix']}")), soft_wrap=True)
    failed = sum(item["status"] == "fail" for item in document["checks"])
    warned = sum(item["status"] == "warn" for item in document["checks"])
    warnings = f", {warned} warning{'s' if warned != 1 else ''}" if warned else ""
    if failed:
        summary = Text(f"FAILED: {failed} check{'s' if failed != 1 else ''} failed{warnings}")
        summary.stylize("bold red")
    else:
        summary = Text(f"passed{warnings}", style="bold green")
    console.print(summary)
