"""``emote collect --workers N``: the Ray driver's progress, summary and exit status."""

from __future__ import annotations

import logging
from typing import Any

from emote_cli._common import ExitCode, abort, emit_json, stdout_console
from emote_cli._text import printable_lines
from emote_cli.progress import ProgressDisplay

__all__ = ["collect_on_workers", "describe_workers", "route_ray_logging"]


def collect_on_workers(
    recipe: Any,
    out: str,
    display: ProgressDisplay,
    *,
    workers: int,
    address: str | None,
    max_restarts: int,
    json_output: bool,
    episodes: int | None,
    steps: int | None,
    **options: Any,
) -> None:
    """Runs :class:`~emote_core.scale.collection.RayCollection`, shows its progress, prints the
    summary and exits 1 when a worker was lost for good, 130 when interrupted.

    Args:
        recipe: The resolved recipe.
        out: The store.
        display: The command's progress display.
        workers: How many Ray workers.
        address: The Ray cluster (``None``: a local Ray).
        max_restarts: Restarts allowed per worker.
        json_output: Print the summary as the command's JSON document.
        episodes: The episode budget of all workers together.
        steps: The env-step budget of all workers together.
        **options: ``policy``, ``num_envs``, ``device``, ``follow_policy``,
            ``wait_for_policy``.
    """
    from emote_core.scale.collection import RayCollection, ScaleProgress
    from emote_core.scale.ray_setup import require_ray

    require_ray()  # before anything starts: the one-line message naming the extra
    route_ray_logging()
    display.status(f"starting {workers} Ray workers")

    def show(progress: ScaleProgress, *, force: bool = False) -> None:
        metrics: dict[str, float | int | None] = {"workers": progress.running}
        if steps is not None:
            metrics["episodes"] = progress.episodes
            done, total = progress.env_steps, steps
        else:
            metrics["env steps"] = progress.env_steps
            done, total = progress.episodes, episodes
        metrics["return"] = progress.recent_return
        metrics["policy step"] = progress.training_step
        metrics["deaths"] = progress.deaths or None
        display.update(done, total, metrics=metrics, force=force)

    collection = RayCollection(recipe, out, workers=workers, episodes=episodes, steps=steps,
                               address=address, max_restarts=max_restarts, on_progress=show,
                               **options)  # fmt: skip
    summary = collection.run()
    show(collection.totals(), force=True)  # the last line, with every worker's final count
    display.close()
    if json_output:
        emit_json(summary)
    else:
        stdout_console().print(
            describe_workers(summary), markup=False, highlight=False, soft_wrap=True
        )
    if summary["interrupted"]:
        abort(
            f"interrupted after {summary['env_steps']} env steps; every worker committed what "
            f"had finished: the {summary['episodes']} episodes committed to {out} are kept",
            ExitCode.INTERRUPTED,
        )
    lost = summary["lost_workers"]
    if lost:
        reasons = {d["reason"] for d in summary["deaths"] if d["restarted_as"] is None}
        abort(
            f"{len(lost)} of {workers} workers lost for good (worker {', '.join(map(str, lost))}"
            f": {'; '.join(sorted(str(r) for r in reasons))}); the "
            f"{summary['episodes']} episodes committed to {out} are kept"
        )


def route_ray_logging() -> None:
    """Sends the driver's Ray log records through the command's logging, as ``warning: ...``
    lines; Ray's INFO records only with ``--debug``. Ray's own stderr handler goes (it would
    print them raw), and ``ray.init`` leaves the level alone (emote's
    :func:`~emote_core.scale.ray_setup.connect` passes ``configure_logging=False``)."""
    debug = logging.getLogger("emote_cli").isEnabledFor(logging.DEBUG)
    ray_logger = logging.getLogger("ray")
    for handler in list(ray_logger.handlers):
        ray_logger.removeHandler(handler)
    ray_logger.propagate = True
    ray_logger.setLevel(logging.INFO if debug else logging.WARNING)


def describe_workers(summary: dict[str, Any]) -> str:
    """The human-readable summary: totals, one line per worker run, every death and restart
    (shard names and reasons escaped)."""
    from emote_cli.collect import describe

    lines = [describe(summary)]
    for entry in summary["workers"]:
        rate = entry["env_steps_per_second"]
        steps = f"{entry['policy_training_steps']}" if "policy_training_steps" in entry else ""
        lines.append(
            f"  worker {entry['worker']} shard {entry['shard']}: {entry['status']}, "
            f"{entry['episodes']} episodes, {entry['env_steps']} env steps"
            + (f", {rate:.0f} env steps/s" if rate else "")
            + (f", policies of training steps {steps}" if steps else "")
        )
    for death in summary["deaths"]:
        after = (
            f"restarted on shard {death['restarted_as']}"
            if death["restarted_as"]
            else "not restarted"
        )
        lines.append(
            f"  worker {death['worker']} {death['status']} on shard {death['shard']} after "
            f"{death['after_seconds']:.1f} s ({death['reason']}); {after}"
        )
    return printable_lines("\n".join(lines))
