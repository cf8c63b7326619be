"""``emote memory inspect``: what a memory holds, for a Zarr store and every other format.

Read-only. A store's report reads only its episode tables (fast on any size); other formats are
read whole. The formats are those of :mod:`emote_core.integrations.formats`.
"""

from __future__ import annotations

import logging
from enum import StrEnum
from typing import Annotated, Any

import typer

from emote_cli._common import (
    DebugOption,
    JsonOption,
    QuietOption,
    emit_json,
    handle_errors,
    setup_logging,
    stdout_console,
)
from emote_cli._text import printable

__all__ = ["SourceFormat", "TrustPickleOption", "inspect", "trust_pickle_warning"]


class SourceFormat(StrEnum):
    """The formats ``--from`` accepts (the readable entries of the library's format registry)."""

    ZARR = "zarr"
    EMOTE_V1 = "emote-v1"
    EMOTE_LEGACY = "emote-legacy"
    SB3_REPLAY_BUFFER = "sb3-replay-buffer"
    SKRL_MEMORY = "skrl-memory"
    TMRL_DATASET = "tmrl-dataset"
    LEGACY_PICKLE = "legacy-pickle"
    MINARI = "minari"


FromOption = Annotated[
    SourceFormat | None,
    typer.Option(
        "--from",
        help="Read SOURCE as this format instead of detecting it from its content.",
        case_sensitive=False,
        show_default=False,
    ),
]

TrustPickleOption = Annotated[
    bool,
    typer.Option(
        "--trust-pickle",
        help=(
            "Unpickle without emote's allowlist. A pickle can run any code: use only on files "
            "you made or fully trust."
        ),
    ),
]


log = logging.getLogger("emote_cli.memory")
_COVERAGE_BINS = 10
"""The bins of Box action coverage (``emote_core.stores.summary.COVERAGE_BINS``; not imported,
so that ``--help`` loads no numpy)."""


def trust_pickle_warning(location: str) -> None:
    """Warn on stderr (also under --quiet) that a source is about to be unpickled unrestricted."""
    log.warning(
        "--trust-pickle: '%s' is unpickled WITHOUT restrictions; any code in it runs with your "
        "permissions. Use it only on files you made or fully trust.",
        location,
    )


def inspect(
    source: Annotated[
        str,
        typer.Argument(
            metavar="SOURCE", help="A store, memory file or dataset id.", show_default=False
        ),
    ],
    source_format: FromOption = None,
    trust_pickle: TrustPickleOption = False,
    returns: Annotated[
        bool,
        typer.Option(
            "--returns",
            help="Also print the distribution of episode returns as tables: quartiles, mean, "
            "std and a histogram (--json always holds it).",
        ),
    ] = False,
    actions: Annotated[
        bool,
        typer.Option(
            "--actions/--no-actions",
            help="Show action coverage (reads the actions column; --no-actions reads the episode "
            "tables only): each discrete action's "
            "count and the actions never taken; per Box dimension min/max/mean/std and the "
            f"share of {_COVERAGE_BINS} equal-width bins between its bounds that actions visit.",
        ),
    ] = True,
    json_output: JsonOption = False,
    quiet: QuietOption = False,
    debug: DebugOption = False,
) -> None:
    """Show what a memory holds: format, schema, spaces, episodes, transitions and statistics.

    Works on emote's Zarr stores and, read-only, on every format emote memory convert reads.
    The episode returns' quartiles, episodes ending terminal vs truncated and a store's reference
    returns come from the episode tables alone; action coverage reads the actions column too
    (--no-actions skips it).
    """
    setup_logging(quiet=quiet, debug=debug)
    with handle_errors(debug=debug, json_output=json_output):
        from emote_core.integrations.inspect import inspect_source

        if trust_pickle:
            trust_pickle_warning(source)
        report = inspect_source(
            source,
            source_format=source_format.value if source_format else None,
            trust_pickle=trust_pickle,
            actions=actions,
        )
        for shard, problem in (report.get("damaged_shards") or {}).items():
            log.warning("damaged shard '%s': %s", printable(shard), printable(problem))
        for problem in ((report.get("actions") or {}).get("problems") or [])[:3]:
            log.warning("action coverage leaves out %s", printable(problem))
        if json_output:
            emit_json(report)
        else:
            _print_report(report, returns=returns)


def _text(*lines: Any) -> Any:
    """A table cell or title of text from the source, one line per argument: control
    characters escaped (:func:`printable`), never read as Rich markup."""
    from rich.text import Text

    return Text("\n".join(printable(line) for line in lines))


def _number(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.{digits}g}"
    return f"{int(value):,}"


def _size(count: Any) -> str:
    if count is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if count < 1000 or unit == "GB":
            return f"{count:,.0f} {unit}" if unit == "B" else f"{count:,.1f} {unit}"
        count /= 1000
    return str(count)  # pragma: no cover - the loop always returns


def _statistics(stats: dict[str, Any] | None) -> str:
    if not stats or stats.get("mean") is None:
        return "-"
    return " / ".join(_number(stats[key]) for key in ("min", "mean", "max"))


def _print_report(report: dict[str, Any], *, returns: bool = False) -> None:
    """The report as Rich tables on stdout: overview, columns, shards, spaces and provenance."""
    from rich.table import Table

    console = stdout_console()
    overview = Table(title=_text(f"emote memory: {report.get('location')}"), show_header=False)
    overview.title_justify = "left"
    overview.add_column("item", style="bold")
    overview.add_column("value", overflow="fold")
    version = report.get("format_version")
    overview.add_row(
        "format", _text(f"{report['format']}" + (f" v{version}" if version is not None else ""))
    )
    overview.add_row("episodes", _number(report["episodes"]))
    overview.add_row("transitions", _number(report["transitions"]))
    overview.add_row("episode length min / mean / max", _statistics(report.get("episode_length")))
    overview.add_row("episode return min / mean / max", _statistics(report.get("episode_return")))
    distribution = report.get("returns") or {}
    if distribution.get("median") is not None:
        keys = ("min", "p25", "median", "p75", "max")
        overview.add_row(
            "episode return min / p25 / median / p75 / max",
            " / ".join(_number(distribution[key]) for key in keys),
        )
        overview.add_row("episode return histogram", _sparkline_of_returns(distribution))
    ends = report.get("episode_ends") or {}
    overview.add_row(
        "episodes ending",
        f"terminal {ends['terminal']:,}, truncated (interrupted) {ends['truncated']:,}"
        if ends
        else "-",
    )
    references = report.get("reference_returns")
    if references:
        overview.add_row(
            "reference returns",
            _text(
                f"random {_number(references['random'])}, expert "
                f"{_number(references['expert'])} ({references['source']})"
            ),
        )
    overview.add_row("length key", _text(report.get("length_key") or "-"))
    overview.add_row("bytes on disk", _size(report.get("bytes_on_disk")))
    producer = report.get("producer")
    if isinstance(producer, dict):
        described = f"{producer.get('tool', '?')} {producer.get('version', '')}".strip()
        overview.add_row("producer", _text(f"{described} (python {producer.get('python', '?')})"))
    if report.get("created"):
        overview.add_row("created", _text(report["created"]))
    source = report.get("source")
    if isinstance(source, dict):
        sha = source.get("sha256")
        overview.add_row(
            "converted from",
            _text(
                f"{source.get('format')} {source.get('path')}"
                + (f" (sha256 {str(sha)[:16]}…)" if sha else "")
            ),
        )
    console.print(overview)

    columns = Table(title="columns", title_justify="left")
    for header in ("name", "kind", "dtype", "shape", "rows"):
        columns.add_column(header)
    for name, column in report["columns"].items():
        columns.add_row(
            _text(name),
            _text(column.get("kind", "")),
            _text(column.get("dtype")),
            _text(tuple(column.get("shape", ()))),
            _text(column.get("rows", "")),
        )
    console.print(columns)

    shards = report.get("shards")
    if shards:
        table = Table(title="shards", title_justify="left")
        for header in ("shard", "episodes", "transitions", "commits"):
            table.add_column(header, justify="left" if header == "shard" else "right")
        for shard in shards:
            table.add_row(
                _text(shard["name"]),
                _number(shard["episodes"]),
                _number(shard["transitions"]),
                _number(shard.get("commit_sequence")),
            )
        console.print(table)
    _print_spaces(console, report.get("spaces"))
    _print_agents(console, report.get("agents"))
    _print_provenance(console, report.get("provenance"))
    if returns and report.get("returns") is not None:
        _print_returns(console, report["returns"])
    if "actions" in report:
        _print_actions(console, report.get("actions"))


HISTOGRAM_WIDTH = 40
"""Characters of the longest bar of the return histogram."""
_LEVELS = "▁▂▃▄▅▆▇█"


def _sparkline(counts: list[int]) -> str:
    """One character per bin, its height the bin's count; an empty bin is a dot."""
    largest = max(counts, default=0) or 1
    return "".join(
        _LEVELS[min(len(_LEVELS) - 1, (len(_LEVELS) * c - 1) // largest)] if c else "·"
        for c in counts
    )


def _sparkline_of_returns(distribution: dict[str, Any]) -> str:
    histogram = distribution.get("histogram") or {}
    edges, counts = histogram.get("edges") or [], histogram.get("counts") or []
    if not counts:
        return "-"
    return f"{_number(edges[0])} {_sparkline(counts)} {_number(edges[-1])}"


def _print_actions(console: Any, coverage: dict[str, Any] | None) -> None:
    """Action coverage: per discrete action its count and share, or per Box dimension its
    statistics and the bins between its bounds that actions visit."""
    from rich.table import Table

    if coverage is None:
        console.print("[bold]actions[/bold]: the memory has no actions column", highlight=False)
        return
    what = f"{coverage['transitions']:,} actions in column '{coverage['column']}'"
    if coverage.get("nonfinite"):
        what += f", {coverage['nonfinite']:,} left out as not finite"
    if coverage.get("unreadable_rows"):
        what += f", {coverage['unreadable_rows']:,} unreadable"
    if coverage["kind"] == "discrete":
        never = coverage["never_taken"]
        console.print(
            _text(
                f"action coverage: {what}; {coverage['n'] - len(never)} of {coverage['n']} "
                "discrete actions taken"
                + (f"; never taken: {', '.join(str(a) for a in never)}" if never else "")
                + (f"; {coverage['outside']:,} values are no action" if coverage["outside"] else "")
            )
        )
        table = Table(title="actions", title_justify="left")
        for header in ("action", "count", "share"):
            table.add_column(header, justify="right")
        for action, (count, share) in enumerate(
            zip(coverage["counts"], coverage["shares"], strict=True)
        ):
            table.add_row(str(action), _number(count), f"{100 * share:.1f}%")
        console.print(table)
        return
    console.print(_text(f"action coverage: {what}"))
    table = Table(title="actions", title_justify="left")
    for header in ("dim", "min", "mean", "std", "max", "bounds", "bins visited", "histogram"):
        table.add_column(header, justify="left" if header == "histogram" else "right")
    for d, dim in enumerate(coverage["dimensions"]):
        bounds = (
            f"{_number(dim['low'])} … {_number(dim['high'])}"
            if dim["low"] is not None and dim["high"] is not None
            else "unbounded"
        )
        visited = (
            f"{dim['bins_visited']}/{coverage['bins']} ({100 * dim['coverage']:.0f}%)"
            if dim["coverage"] is not None
            else "-"
        )
        histogram = _sparkline(dim["bin_counts"]) if dim["bin_counts"] is not None else ""
        table.add_row(
            str(d), *(_number(dim[k]) for k in ("min", "mean", "std", "max")), bounds, visited,
            histogram,
        )  # fmt: skip
    console.print(table)


def _print_returns(console: Any, returns: dict[str, Any]) -> None:
    """The return distribution: quantiles, mean and std, the end states, and a histogram of
    bars drawn with block characters."""
    from rich.table import Table

    ends = returns["end_states"]
    console.print(
        f"[bold]episode returns[/bold] of {returns['episodes']:,} episodes: "
        f"{ends['TERMINAL']:,} ended terminal, {ends['INTERRUPTED']:,} truncated",
        highlight=False,
    )
    if returns.get("median") is None:
        console.print("no finite returns (the source holds no rewards)", highlight=False)
        return
    keys = ("min", "p25", "median", "p75", "max", "mean", "std")
    table = Table(title="returns", title_justify="left")
    for key in keys:
        table.add_column(key, justify="right")
    table.add_row(*(_number(returns[key]) for key in keys))
    console.print(table)
    if returns.get("nonfinite"):
        console.print(f"{returns['nonfinite']:,} returns not finite (left out)", highlight=False)
    edges, counts = returns["histogram"]["edges"], returns["histogram"]["counts"]
    histogram = Table(title="histogram", title_justify="left")
    histogram.add_column("return from", justify="right")
    histogram.add_column("to", justify="right")
    histogram.add_column("episodes", justify="right")
    histogram.add_column("")
    largest = max(counts, default=0) or 1
    for low, high, count in zip(edges, edges[1:], counts, strict=False):
        bar = "█" * round(HISTOGRAM_WIDTH * count / largest)
        histogram.add_row(_number(low), _number(high), _number(count), bar)
    console.print(histogram)


def _print_spaces(console: Any, spaces: dict[str, Any] | None) -> None:
    """The recorded spaces as a table: what each observation entry, the actions and the rewards
    hold, in words, with dtypes and bounds."""
    import json

    from rich.table import Table

    from emote_core.errors import ConfigurationError
    from emote_core.spaces import MDPSpace, describe_bounds, describe_space

    if not spaces:
        console.print("[bold]spaces[/bold]: not recorded")
        return
    try:
        mdp = MDPSpace.from_json(spaces)
    except (ConfigurationError, AttributeError):
        console.print(
            "[bold]spaces[/bold] (unreadable):", _text(json.dumps(spaces)), soft_wrap=True
        )
        return
    table = Table(title="spaces", title_justify="left")
    for header in ("entry", "dtype", "holds", "bounds"):
        table.add_column(header)
    entries = [(f"observation '{key}'", space) for key, space in mdp.state.spaces.items()]
    for name, space in (*entries, ("actions", mdp.actions), ("rewards", mdp.rewards)):
        table.add_row(
            _text(name),
            _text(space.dtype),
            _text(describe_space(space)),
            _text(describe_bounds(space)),
        )
    console.print(table)


def _print_agents(console: Any, agents: dict[str, Any] | None) -> None:
    """The agent groups of multi-agent shards: one row per group (its agents, its episodes)."""
    from rich.table import Table

    for shard, record in (agents or {}).items():
        table = Table(title=_text(f"shard '{shard}': agent groups"), title_justify="left")
        for header in ("group", "agents", "episodes"):
            table.add_column(header, justify="right" if header == "episodes" else "left")
        for group in record["groups"]:
            table.add_row(
                _text(group["name"]), _text(", ".join(group["agents"])), _number(group["episodes"])
            )
        console.print(table)


def _print_provenance(console: Any, provenance: dict[str, Any] | None) -> None:
    """Who wrote each shard: one table per shard, one block of rows per writing session."""
    from rich.table import Table

    if provenance is None:
        return
    if provenance.get("env_id"):
        console.print("[bold]made on[/bold]:", _text(provenance["env_id"]), highlight=False)
    for shard, sessions in provenance.get("shards", {}).items():
        if not sessions:
            console.print(_text(f"shard '{shard}': who wrote it is not recorded"))
            continue
        table = Table(
            title=_text(f"shard '{shard}': who wrote it"), title_justify="left", show_lines=True
        )
        table.add_column("episodes", justify="right")
        table.add_column("session", overflow="fold")
        for session in sessions:
            first, count = session.get("first_episode", 0), session.get("episodes", 0)
            span = {0: "none", 1: f"{first:,}"}.get(count, f"{first:,}-{first + count - 1:,}")
            table.add_row(span, _text(*_session_lines(session)))
        console.print(table)


def _session_lines(session: dict[str, Any]) -> list[str]:
    lines = [f"command: {' '.join(session.get('command') or []) or 'unknown'}"]
    if session.get("env_id"):
        lines.append(f"env: {session['env_id']}")
    if session.get("recipe_name"):
        lines.append(f"recipe: {session['recipe_name']} (its TOML is in --json)")
    if session.get("seed") is not None:
        seeds = session.get("env_seeds") or []
        resets = f" (env resets {', '.join(str(s) for s in seeds)})" if seeds else ""
        lines.append(f"seed: {session['seed']}{resets}")
    policy = session.get("policy")
    if isinstance(policy, dict):
        described = str(policy.get("kind"))
        if policy.get("path"):
            described += f" {policy['path']}"
        if policy.get("sha256"):
            described += f" (sha256 {policy['sha256']})"
        lines.append(f"policy: {described}")
    source = session.get("source")
    if isinstance(source, dict):
        sha = f" (sha256 {source['sha256']})" if source.get("sha256") else ""
        lines.append(f"converted from: {source.get('format')} {source.get('path')}{sha}")
    lines.append(f"emote {session.get('emote_version', '?')}, {session.get('time') or '?'}")
    return lines
