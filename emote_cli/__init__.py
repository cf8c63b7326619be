"""The ``emote`` command line: thin Typer commands over :mod:`emote_core`.

Each command lives in its own module (groups in subpackages) and is registered in
:mod:`emote_cli.app`. Command modules import only the standard library, Typer and Rich at module
level; torch, numpy, gymnasium, zarr, onnx and friends are imported inside command bodies so that
``emote --help`` starts fast.
"""

from __future__ import annotations
