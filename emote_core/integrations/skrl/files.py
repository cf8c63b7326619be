"""Loading the tensors of a skrl ``Memory.save`` export: ``.pt``, ``.npz`` or ``.csv``.

``.pt`` files are read with ``torch.load(weights_only=True)``, ``.npz`` members without
unpickling, ``.csv`` files by :mod:`~emote_core.integrations.skrl.csv_tensors` (which records
neither the env count nor dtypes and shapes).
"""

from __future__ import annotations

import io
import logging
import pickle
import zipfile
from dataclasses import dataclass

import numpy as np

from emote_core.errors import FormatError
from emote_core.integrations.skrl.csv_tensors import read_csv_tensors
from emote_core.stores.budget import AllocationBudget
from emote_core.stores.safe_pickle import read_npy
from emote_core.stores.stored import read_member

log = logging.getLogger(__name__)


@dataclass
class SkrlTensors:
    """A loaded export.

    Attributes:
        tensors: Name -> array. From ``.pt``/``.npz``: ``(memory_size, num_envs, ...)``; from
            ``.csv``: ``(rows, size)``, the written rows of the flattened view.
        kind: ``"pt"``, ``"npz"`` or ``"csv"``.
    """

    tensors: dict[str, np.ndarray]
    kind: str


def file_kind(data: bytes, suffix: str) -> str:
    """``"pt"``, ``"npz"`` or ``"csv"`` from the content (zip members), else the suffix."""
    if data.startswith(b"PK"):
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                names = archive.namelist()
        except (zipfile.BadZipFile, EOFError, ValueError):
            return suffix.lstrip(".").lower() or "zip"
        if names and all(name.endswith(".npy") for name in names):
            return "npz"
        if any(name.endswith("data.pkl") for name in names):
            return "pt"
        return "zip"
    if data[:1] == b"\x80":
        return "pt"  # torch.save's legacy (pre-zip) format starts with a pickle
    return "csv" if suffix.lower() != ".npz" else "npz"


def load_tensors(
    data: bytes,
    *,
    suffix: str,
    source: str,
    trust_pickle: bool,
    budget: AllocationBudget | None = None,
) -> SkrlTensors:
    """Loads an export's tensors; see the module doc for each kind.

    Every zip member's declared size, and every ``.pt`` tensor's size with its shape expanded
    (a tensor may repeat one stored value along stride-0 dimensions), is charged to ``budget``
    (by default that of ``len(data)`` bytes) before it is materialised.

    Raises:
        FormatError: If the file is damaged, of another kind, declares more than its budget,
            or (``.pt``) holds more than tensors, or is in torch's legacy format, while
            ``trust_pickle`` is off.
    """
    budget = budget or AllocationBudget(source, len(data))
    kind = file_kind(data, suffix)
    if kind == "npz":
        return SkrlTensors(_load_npz(data, source, budget), "npz")
    if kind == "pt":
        return SkrlTensors(_load_pt(data, source, trust_pickle, budget), "pt")
    if kind == "csv":
        return SkrlTensors(read_csv_tensors(data, source), "csv")
    raise FormatError(
        f"{source} is a zip archive but neither an .npz of arrays nor a torch.save file; a skrl "
        "memory export is .pt, .npz or .csv"
    )


def _load_npz(data: bytes, source: str, budget: AllocationBudget) -> dict[str, np.ndarray]:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, EOFError, ValueError) as error:
        raise FormatError(f"{source} is not a readable .npz archive ({error})") from error
    with archive:
        budget.charge_zip(archive, archive.namelist())
        tensors = {}
        for member in archive.namelist():
            raw = read_member(archive, member, source=source)
            try:
                tensors[member[: -len(".npy")]] = read_npy(raw, objects=False)
            except FormatError as error:
                raise FormatError(f"{source}: member '{member}': {error}") from error
    return tensors


def _charge_storages(
    data: bytes, source: str, trust_pickle: bool, budget: AllocationBudget
) -> None:
    """Charges a torch.save zip's members (the storages torch.load allocates) before loading.

    torch's legacy format allocates the storages its pickle declares before reading them, so
    it is loaded only when trusted.
    """
    if not data.startswith(b"PK"):
        if trust_pickle:
            return
        raise FormatError(
            f"{source} is in torch.save's legacy (pre-1.6) format, whose tensors cannot be sized "
            "before they are allocated; re-save it with torch >= 1.6 (as skrl does), or pass "
            "`trust_pickle=True` if you trust where it comes from"
        )
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            budget.charge_zip(archive, archive.namelist())
    except (zipfile.BadZipFile, EOFError, ValueError) as error:
        raise FormatError(f"{source} is not a readable torch.save file ({error})") from error


def _load_pt(
    data: bytes, source: str, trust_pickle: bool, budget: AllocationBudget
) -> dict[str, np.ndarray]:
    import torch

    _charge_storages(data, source, trust_pickle, budget)
    try:
        if trust_pickle:
            log.warning("loading %s unrestricted (--trust-pickle): it may run code", source)
        loaded = torch.load(io.BytesIO(data), map_location="cpu", weights_only=not trust_pickle)
    except pickle.UnpicklingError as error:
        if trust_pickle:
            raise FormatError(f"{source} is not a readable torch.save file ({error})") from error
        first = str(error).strip().splitlines()[0] if str(error).strip() else "refused"
        raise FormatError(
            f"{source} holds more than tensors, so torch.load(weights_only=True) refused it "
            f"({first}); if you trust where the file comes from, pass `trust_pickle=True`"
        ) from error
    except Exception as error:  # torch reports damage with many exception types
        raise FormatError(
            f"{source} is not a readable torch.save file ({type(error).__name__}: {error})"
        ) from error
    if not isinstance(loaded, dict) or not all(
        isinstance(name, str) and isinstance(value, torch.Tensor) for name, value in loaded.items()
    ):
        raise FormatError(
            f"{source} holds a {type(loaded).__name__}; a skrl memory export is a dict of "
            "tensor name -> tensor"
        )
    tensors = {}
    for name, tensor in loaded.items():
        itemsize = 4 if tensor.dtype == torch.bfloat16 else tensor.element_size()
        what = f"shape {tuple(tensor.shape)} of {tensor.dtype}, stride {tuple(tensor.stride())}"
        budget.charge(f"tensor '{name}'", tensor.numel() * itemsize, what)
        tensor = tensor.detach().cpu()
        if tensor.dtype == torch.bfloat16:
            tensor = tensor.float()
        tensors[name] = tensor.numpy()
    return tensors


__all__ = ["SkrlTensors", "file_kind", "load_tensors"]
