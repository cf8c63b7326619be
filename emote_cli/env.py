"""``emote env``: report the software and accelerators this environment gives emote.

Meant for bug reports and for checking a machine before a run: Python, the platform, emote,
torch with CUDA/cuDNN/MPS and the visible devices, onnxruntime's execution providers, the
versions of the packages emote builds on and of the optional ones (extras and peers). A package
that is missing or fails to import is reported as ``null``; it never makes the command fail.

``emote env`` is a group: run bare it prints that report; ``emote env check`` (in
:mod:`emote_cli.env_check`) checks a training environment.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import platform
import sys
from typing import Any

import typer

from emote_cli import env_check
from emote_cli._common import (
    DebugOption,
    JsonOption,
    QuietOption,
    emit_json,
    handle_errors,
    setup_logging,
    stdout_console,
)
from emote_cli._help import EmoteCommand, EmoteGroup
from emote_cli._text import printable

__all__ = ["app", "collect_environment", "env"]

# Display name -> (import name, distribution names that provide it, most common first).
_PACKAGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "numpy": ("numpy", ("numpy",)),
    "gymnasium": ("gymnasium", ("gymnasium",)),
    "typer": ("typer", ("typer", "typer-slim")),
    "rich": ("rich", ("rich",)),
    "zarr": ("zarr", ("zarr",)),
    "onnx": ("onnx", ("onnx",)),
    "onnxruntime": (
        "onnxruntime",
        ("onnxruntime", "onnxruntime-gpu", "onnxruntime-directml", "onnxruntime-openvino"),
    ),
    "onnxscript": ("onnxscript", ("onnxscript",)),
    "tensorboard": ("tensorboard", ("tensorboard",)),
    "psutil": ("psutil", ("psutil",)),
}

# Optional packages (display name -> distribution names), looked up in the installed metadata only:
# importing Ray or MuJoCo to learn a version would make `emote env` slow.
_OPTIONAL_PACKAGES: dict[str, tuple[str, ...]] = {
    "ray": ("ray",),
    "minari": ("minari",),
    "wandb": ("wandb",),
    "s3fs": ("s3fs",),
    "zarrs": ("zarrs",),
    "zlib-ng": ("zlib-ng", "zlib_ng"),
    "mujoco": ("mujoco",),
    "skrl": ("skrl",),
    "pettingzoo": ("pettingzoo",),
    "mpe2": ("mpe2",),
    "stable-baselines3": ("stable-baselines3",),
    "imageio-ffmpeg": ("imageio-ffmpeg",),
}


app = typer.Typer(
    cls=EmoteGroup,
    name="env",
    invoke_without_command=True,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_show_locals=False,
)


@app.callback(invoke_without_command=True)
def env(
    ctx: typer.Context,
    json_output: JsonOption = False,
    quiet: QuietOption = False,
    debug: DebugOption = False,
) -> None:
    """Show Python, platform, emote, torch/CUDA and package versions of this environment.

    Paste the output into bug reports; missing packages show as "not installed" (null in JSON).
    'emote env check ENV_OR_RECIPE' checks an environment before training on it.
    """
    if ctx.invoked_subcommand is not None:
        return
    setup_logging(quiet=quiet, debug=debug)
    with handle_errors(debug=debug, json_output=json_output):
        report = collect_environment()
        if json_output:
            emit_json(report)
        else:
            _print_report(report)


app.command("check", cls=EmoteCommand)(env_check.check)


def collect_environment() -> dict[str, Any]:
    """Gather the environment report that ``emote env`` prints.

    Returns:
        A JSON-compatible dict with the keys ``python``, ``platform``, ``emote``, ``torch``,
        ``packages`` (name -> version or ``None``), ``optional_packages`` (the same for the
        packages of emote's extras and the peers it works with, found without importing them),
        ``onnxruntime_providers`` (``None`` when
        onnxruntime cannot be imported) and ``plugins`` (the algorithms and add-ons recipes can
        name, those of installed packages' entry points included).
    """
    from emote_core import __version__ as emote_version

    return {
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "executable": sys.executable,
        },
        "platform": {
            "platform": platform.platform(),
            "system": platform.system(),
            "release": platform.release(),
            "machine": platform.machine(),
            "cpu_count": os.cpu_count(),
        },
        "emote": emote_version,
        "torch": _torch_report(),
        "packages": {name: _package_version(*spec) for name, spec in _PACKAGES.items()},
        "optional_packages": {
            name: _distribution_version(distributions)
            for name, distributions in _OPTIONAL_PACKAGES.items()
        },
        "onnxruntime_providers": _onnxruntime_providers(),
        "plugins": _plugins_report(),
    }


def _distribution_version(distributions: tuple[str, ...]) -> str | None:
    """The version in the installed metadata of the first of ``distributions`` found, or
    ``None``."""
    for distribution in distributions:
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _package_version(module: str, distributions: tuple[str, ...]) -> str | None:
    """The installed version of a package, or ``None`` when it is not installed.

    Distribution metadata is asked first (no import needed); a module found on ``sys.path``
    without metadata (a source checkout) falls back to its ``__version__``.
    """
    version = _distribution_version(distributions)
    if version is not None:
        return version
    try:
        if importlib.util.find_spec(module) is None:
            return None
        version = getattr(importlib.import_module(module), "__version__", None)
    except Exception:  # a broken install is reported as missing, never a crash of `emote env`
        return None
    return str(version) if version is not None else None


def _torch_report() -> dict[str, Any]:
    """torch's version and what it sees of CUDA, cuDNN, ROCm and MPS."""
    report: dict[str, Any] = {
        "version": None,
        "cuda_available": False,
        "cuda_version": None,
        "hip_version": None,
        "device_count": 0,
        "devices": [],
        "cudnn": None,
        "mps_available": False,
        "num_threads": None,
        "error": None,
    }
    try:
        import torch
    except Exception as exc:  # missing or broken (e.g. a CUDA library not found): report it
        report["error"] = f"{type(exc).__name__}: {exc}"
        return report

    report["version"] = str(torch.__version__)
    report["cuda_version"] = torch.version.cuda
    report["hip_version"] = getattr(torch.version, "hip", None)
    try:
        report["num_threads"] = torch.get_num_threads()
        report["cuda_available"] = torch.cuda.is_available()
        device_count = torch.cuda.device_count()
        report["device_count"] = device_count
        if report["cuda_available"]:
            report["devices"] = [_cuda_device(torch, index) for index in range(device_count)]
        if torch.backends.cudnn.is_available():
            report["cudnn"] = torch.backends.cudnn.version()
        report["mps_available"] = torch.backends.mps.is_available()
    except Exception as exc:  # a driver problem is exactly what this command should show
        report["error"] = f"{type(exc).__name__}: {exc}"
    return report


def _cuda_device(torch: Any, index: int) -> dict[str, Any]:
    properties = torch.cuda.get_device_properties(index)
    return {
        "index": index,
        "name": properties.name,
        "capability": f"{properties.major}.{properties.minor}",
        "memory_gib": round(properties.total_memory / 2**30, 1),
    }


def _onnxruntime_providers() -> list[str] | None:
    try:
        import onnxruntime
    except Exception:  # missing or broken: no providers to list
        return None
    return list(onnxruntime.get_available_providers())


def _plugins_report() -> dict[str, Any]:
    """The registered algorithms and add-ons (an import error is reported, not raised)."""
    try:
        from emote_core.algorithms.registry import addon_names, algorithm_names, discover

        discover()
    except Exception as exc:  # torch missing or a plug-in broken: say so, as for torch itself
        return {"algorithms": [], "addons": [], "error": f"{type(exc).__name__}: {exc}"}
    return {"algorithms": algorithm_names(), "addons": addon_names(), "error": None}


def _print_report(report: dict[str, Any]) -> None:
    """Print the report as a two-column Rich table on stdout (versions, paths and plug-in
    names come from installed packages' files: escaped)."""
    from rich.table import Table
    from rich.text import Text

    def text(value: str, style: str = "") -> Text:
        return Text(printable(value), style=style)

    def show(value: Any) -> Text:
        if value is None:
            return text("not installed", style="dim")
        if isinstance(value, bool):
            return text("yes" if value else "no", style="green" if value else "yellow")
        return text(str(value))

    def absent(value: Any) -> Text:
        return text("-", style="dim") if value is None else text(str(value))

    table = Table(title="emote environment", show_header=False, title_justify="left")
    table.add_column("item", style="bold")
    table.add_column("value", overflow="fold")

    python = report["python"]
    table.add_row("emote", show(report["emote"]))
    table.add_row("python", text(f"{python['version']} ({python['implementation']})"))
    table.add_row("executable", text(python["executable"]))
    table.add_row("platform", text(report["platform"]["platform"]))
    table.add_row("cpu count", absent(report["platform"]["cpu_count"]))

    torch = report["torch"]
    table.add_section()
    table.add_row("torch", show(torch["version"]))
    if torch["error"]:
        table.add_row("torch error", text(torch["error"], style="red"))
    table.add_row("CUDA available", show(torch["cuda_available"]))
    table.add_row("CUDA version", absent(torch["cuda_version"]))
    if torch["hip_version"]:
        table.add_row("ROCm/HIP version", text(str(torch["hip_version"])))
    table.add_row("cuDNN", absent(torch["cudnn"]))
    table.add_row("CUDA devices", text(str(torch["device_count"])))
    for device in torch["devices"]:
        table.add_row(
            f"  cuda:{device['index']}",
            text(f"{device['name']} (compute {device['capability']}, {device['memory_gib']} GiB)"),
        )
    table.add_row("MPS available", show(torch["mps_available"]))
    table.add_row("torch threads", absent(torch["num_threads"]))

    table.add_section()
    for name, version in report["packages"].items():
        table.add_row(name, show(version))
    providers = report["onnxruntime_providers"]
    table.add_row(
        "onnxruntime providers",
        text(", ".join(providers)) if providers else text("-", style="dim"),
    )
    table.add_section()
    for name, version in report["optional_packages"].items():
        table.add_row(f"{name} (optional)", show(version))

    plugins = report["plugins"]
    table.add_section()
    table.add_row("algorithms", text(", ".join(plugins["algorithms"]) or "-"))
    table.add_row("add-ons", text(", ".join(plugins["addons"]) or "-"))
    if plugins["error"]:
        table.add_row("plug-in error", text(plugins["error"], style="red"))

    stdout_console().print(table)
