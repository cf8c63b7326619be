"""Writing ONNX policy files: checked, parity-tested, renamed into place when complete.

:func:`write_policy` traces a :class:`~emote_core.onnx.graph.PolicyGraph`, checks the opset and
``onnx.checker``, records the metadata and compares onnxruntime with torch at batch sizes 1, 7
and 256, removing the file on a mismatch; :func:`export_policy` renames it into place. Opsets up
to :data:`LEGACY_MAX_OPSET` go through the TorchScript exporter (the dynamo one raises them to
18), later ones through dynamo.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from emote_core.errors import ConfigurationError, ExportError, FormatError
from emote_core.onnx.format import BATCH_AXIS, MAX_POLICY_BYTES, PolicyMetadata
from emote_core.onnx.graph import PolicyGraph
from emote_core.utils.files import read_regular_file

log = logging.getLogger(__name__)

SUPPORTED_OPSETS = range(9, 24)
"""Default-domain opsets an export can be written in (9 to 23)."""
LEGACY_MAX_OPSET = 17
"""The highest opset written by the TorchScript exporter; higher ones use the dynamo exporter."""
DEFAULT_OPSET = 15
"""Loads in onnxruntime and in Unity's inference engine (which reads opsets up to 15)."""
PARITY_BATCH_SIZES = (1, 7, 256)
PARITY_ATOL = 1e-5
PARITY_RTOL = 1e-3
_PARITY_SEED = 0
_TRACE_BATCH = 2  # a batch of 1 would let the tracer specialise the batch axis


@dataclass(frozen=True)
class ExportReport:
    """What an export wrote.

    Attributes:
        out: The file.
        opset: Its default-domain opset.
        inputs: Input names, in order.
        outputs: Output names, in order.
        input_shapes: Each input's shape, ``"batch"`` first.
        max_abs_diff: The largest ``|onnxruntime - torch|`` over the parity batches.
        parity: The largest difference per batch size.
        seconds: How long the export took, parity included.
        metadata: The metadata props written.
    """

    out: str
    opset: int
    inputs: list[str]
    outputs: list[str]
    input_shapes: dict[str, list[int | str]]
    max_abs_diff: float
    parity: dict[int, float]
    seconds: float
    metadata: dict[str, str] = field(repr=False)

    def to_json(self) -> dict[str, Any]:
        """A JSON-compatible summary (the metadata props included)."""
        return {
            "out": self.out, "opset": self.opset, "inputs": self.inputs, "outputs": self.outputs,
            "input_shapes": self.input_shapes, "max_abs_diff": self.max_abs_diff,
            "parity": {str(batch): diff for batch, diff in self.parity.items()},
            "seconds": self.seconds, "metadata": self.metadata,
        }  # fmt: skip


def check_opset(opset: int) -> int:
    """Returns ``opset`` if it is in :data:`SUPPORTED_OPSETS`.

    Raises:
        ConfigurationError: Naming the supported range.
    """
    if isinstance(opset, bool) or not isinstance(opset, int) or opset not in SUPPORTED_OPSETS:
        raise ConfigurationError(
            f"opset {opset!r} is not supported; exports are written in opsets "
            f"{SUPPORTED_OPSETS.start} to {SUPPORTED_OPSETS.stop - 1} (default {DEFAULT_OPSET}, "
            "the highest Unity's inference engine loads)"
        )
    return opset


def write_policy(
    graph: PolicyGraph, path: str | Path, *, opset: int, metadata: PolicyMetadata
) -> ExportReport:
    """Exports ``graph`` to exactly ``path``, checks it and proves parity with onnxruntime.

    Nothing is left at ``path`` when this raises.

    Raises:
        ConfigurationError: If the opset is not supported.
        ExportError: If tracing fails, the file holds another opset, the checker rejects it, or
            onnxruntime's outputs differ from torch's.
    """
    import onnx

    check_opset(opset)
    path = Path(path)
    started = time.perf_counter()
    try:
        _trace(graph, path, opset)
        model = onnx.load(str(path))
        written = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
        if written != [opset]:
            raise ExportError(
                f"asked for opset {opset}, but the exporter wrote opset {written}; choose another "
                f"`opset` in {SUPPORTED_OPSETS.start}-{SUPPORTED_OPSETS.stop - 1}"
            )
        _pin_shapes(model, graph)
        props = replace(metadata, opset=opset).to_props()
        del model.metadata_props[:]
        for key, value in props.items():
            model.metadata_props.add(key=key, value=value)
        try:
            onnx.checker.check_model(model, full_check=True)
        except onnx.checker.ValidationError as error:
            raise ExportError(f"onnx.checker rejected the export: {_first_line(error)}") from error
        onnx.save(model, str(path))
        parity = _parity(graph, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        raise
    shapes = {name: [BATCH_AXIS, *shape] for name, shape in graph.input_shapes.items()}
    return ExportReport(
        out=str(path), opset=opset, inputs=list(graph.input_names),
        outputs=list(graph.output_names), input_shapes=shapes,
        max_abs_diff=max(parity.values()), parity=parity,
        seconds=time.perf_counter() - started, metadata=props,
    )  # fmt: skip


def export_policy(
    graph: PolicyGraph,
    destination: str | Path,
    *,
    opset: int = DEFAULT_OPSET,
    metadata: PolicyMetadata,
    force: bool = False,
) -> ExportReport:
    """Exports ``graph`` to a temporary file next to ``destination``, then renames it into place.

    Raises:
        ExportError: If ``destination`` exists (without ``force``) or its directory cannot be
            written, or as :func:`write_policy`.
    """
    destination = Path(destination)
    check_opset(opset)
    check_destination(destination, force=force)
    directory = destination.parent
    if not directory.is_dir() or not os.access(directory, os.W_OK | os.X_OK):
        reason = "is not writable" if directory.is_dir() else "is not an existing directory"
        raise ExportError(f"cannot write '{destination}': '{directory}' {reason}")
    temporary = directory / f".{destination.name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        temporary.touch(exist_ok=False)  # fails early, and plainly, where files cannot be made
    except OSError as error:
        raise ExportError(f"cannot write '{destination}': {error.strerror or error}") from error
    try:
        report = write_policy(graph, temporary, opset=opset, metadata=metadata)
        os.replace(temporary, destination)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
    return replace(report, out=str(destination))


def check_destination(destination: Path, *, force: bool) -> None:
    """An export writes a new file, or (with ``force``) replaces an ONNX model, nothing else.

    Raises:
        ExportError: If ``destination`` exists without ``force``, or is a directory, a link, a
            named pipe, a device or a file that is not an ONNX model (read only up to
            :data:`~emote_core.onnx.format.MAX_POLICY_BYTES`).
    """
    if destination.is_dir():
        raise ExportError(f"'{destination}' is a directory; `out` names the .onnx file to write")
    if not (destination.exists() or destination.is_symlink()):
        return
    if not force:
        raise ExportError(f"'{destination}' already exists; pass `force=True` to replace it")
    if destination.is_symlink():
        raise ExportError(f"'{destination}' is a symbolic link; `force=True` replaces no links")
    import onnx

    rule = "`force=True` replaces only an ONNX file — choose another `out`"
    try:  # a named pipe or a device is refused unread (opening a pipe would wait for ever)
        data = read_regular_file(destination, limit=MAX_POLICY_BYTES, rule=rule)
    except FormatError as error:
        raise ExportError(str(error)) from None
    try:
        onnx.load_model_from_string(data)
    except Exception:  # onnx raises protobuf's own errors for files of other kinds
        raise ExportError(
            f"'{destination}' is not an ONNX model; `force=True` replaces only an ONNX file — "
            "choose another `out`"
        ) from None


def _trace(graph: PolicyGraph, path: Path, opset: int) -> None:
    import torch

    rng = np.random.default_rng(_PARITY_SEED)
    example = graph.sample_inputs(_TRACE_BATCH, rng)
    args = tuple(torch.from_numpy(example[name]) for name in graph.input_names)
    names = {"input_names": list(graph.input_names), "output_names": list(graph.output_names)}
    if opset <= LEGACY_MAX_OPSET:
        batched = [n for n in graph.output_names if n not in graph.constant_outputs]
        axes = {name: {0: BATCH_AXIS} for name in (*graph.input_names, *batched)}
        options: dict[str, Any] = {"dynamo": False, "dynamic_axes": axes}
    else:
        batch = torch.export.Dim(BATCH_AXIS)
        options = {
            "dynamo": True, "external_data": False, "verbose": False,
            # One entry for the module's *varargs, holding one spec per input.
            "dynamic_shapes": (tuple({0: batch} for _ in graph.input_names),),
        }  # fmt: skip
    try:
        with _quiet_exporter():
            torch.onnx.export(
                graph.module, args, str(path), opset_version=opset, **names, **options
            )
    except Exception as error:
        raise ExportError(
            f"torch could not export the {graph.algorithm} network to opset {opset}: "
            f"{_first_line(error)}"
        ) from error
    finally:
        graph.module.eval()  # the exporters restore the mode the wrapper had, children included


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """Keeps the exporters' prints off stdout and their warnings and logs at debug level.

    The parity check, not the exporter's warnings, decides whether an export is right.
    """
    torch_onnx = logging.getLogger("torch.onnx")
    level = torch_onnx.level
    torch_onnx.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(sys.stderr):
            warnings.simplefilter("always")
            yield
    finally:
        torch_onnx.setLevel(level)
    for warning in caught:
        log.debug("exporter warning: %s", _first_line(warning.message))


def _pin_shapes(model: Any, graph: PolicyGraph) -> None:
    """Names axis 0 ``batch`` and writes every other axis as a number, for engines that need it
    (constant outputs have no batch axis: every axis a number).

    The TorchScript exporter leaves some output axes symbolic even when they are fixed.
    """
    rows = graph.run(graph.sample_inputs(1, np.random.default_rng(_PARITY_SEED)))
    shapes = dict(graph.input_shapes)
    shapes.update({name: tuple(value.shape[1:]) for name, value in rows.items()})
    shapes.update({name: tuple(rows[name].shape) for name in graph.constant_outputs})
    for value in (*model.graph.input, *model.graph.output):
        if value.name not in shapes:
            continue
        dims = value.type.tensor_type.shape.dim
        del dims[:]
        if value.name not in graph.constant_outputs:
            dims.add().dim_param = BATCH_AXIS
        for size in shapes[value.name]:
            dims.add().dim_value = int(size)
    found = [v.name for v in model.graph.input], [v.name for v in model.graph.output]
    if found != (list(graph.input_names), list(graph.output_names)):
        raise ExportError(
            f"the exported graph has inputs {found[0]} and outputs {found[1]}; expected "
            f"{list(graph.input_names)} and {list(graph.output_names)}"
        )


def _parity(graph: PolicyGraph, path: Path) -> dict[int, float]:
    """Largest ``|onnxruntime - torch|`` per batch size.

    Raises:
        ExportError: If any output differs beyond ``PARITY_ATOL + PARITY_RTOL * |torch|``.
    """
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(_PARITY_SEED)
    differences: dict[int, float] = {}
    for batch in PARITY_BATCH_SIZES:
        inputs = graph.sample_inputs(batch, rng)
        expected = graph.run(inputs)
        got = dict(
            zip(graph.output_names, session.run(list(graph.output_names), inputs), strict=True)
        )
        worst = 0.0
        for name, reference in expected.items():
            actual = np.asarray(got[name])
            if actual.shape != reference.shape:
                raise ExportError(
                    f"onnxruntime gives '{name}' of shape {actual.shape} at batch {batch}; torch "
                    f"gives {reference.shape}"
                )
            difference = np.abs(actual.astype(np.float64) - reference.astype(np.float64))
            worst = max(worst, float(difference.max(initial=0.0)))
            allowed = PARITY_ATOL + PARITY_RTOL * np.abs(reference.astype(np.float64))
            if np.any(difference > allowed):
                raise ExportError(
                    f"the export's '{name}' differs from the torch policy at batch {batch}: max "
                    f"abs diff {worst:.3g} beyond atol {PARITY_ATOL:g} / rtol {PARITY_RTOL:g}; "
                    "nothing was written — try another `opset`, or report it with the traceback"
                )
        differences[batch] = worst
    return differences


def _first_line(error: object) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


__all__ = [
    "DEFAULT_OPSET",
    "LEGACY_MAX_OPSET",
    "PARITY_ATOL",
    "PARITY_BATCH_SIZES",
    "PARITY_RTOL",
    "SUPPORTED_OPSETS",
    "ExportReport",
    "check_destination",
    "check_opset",
    "export_policy",
    "write_policy",
]
