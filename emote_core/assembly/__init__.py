"""Assembly: from a recipe or a run directory to running parts, through the plug-in registry.

- :mod:`.builders`: environments, networks, agents and callbacks of a recipe's algorithm and
  add-ons; rebuilding a trained agent from a run or checkpoint.
- :mod:`.training`: a whole training run (table, collector, losses, logs, checkpoints, exports).
- :mod:`.evaluation`: returns of an agent over whole episodes.
- :mod:`.export`: a checkpoint's acting network to ONNX, and a recipe back from an export.

This is the top of the library: it may import every other package, and none imports it. It asks
:mod:`emote_core.algorithms.registry` for everything algorithm-specific.
"""
