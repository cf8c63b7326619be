"""How many operations one eager SAC update launches, by callback: twin Q networks apart and
stacked (``sac.stacked_q``).

On a GPU a small network's update is bound by its kernel launches, not its arithmetic, so the
count of operations that launch work is the figure to cut. It is counted at torch's dispatcher
(views, allocations and the profiler's own markers excluded, each remaining operation being one
kernel or more on a GPU), for the update ``train_bench.py`` times (256x256 networks, batch 256,
fused Adam, no gradient clipping), after a few warm-up updates; matrix products are counted
apart. With ``--device cuda`` the CUDA kernels one update runs are counted too (torch's
profiler).

Run: ``python benchmarks/ops_bench.py`` (``--device cuda`` on a GPU machine).
"""

from __future__ import annotations

import argparse
import collections
import functools
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_bench import emote_sac, pendulum_episodes

from emote_core.callbacks.generic import BackPropStepsTerminator
from emote_core.trainer import Trainer

_FREE = {"empty", "empty_like", "empty_strided", "lift_fresh", "detach", "alias", "set_",
         "_record_function_enter_new", "_record_function_exit", "record_stream"}  # fmt: skip
_PRODUCTS = {"mm", "addmm", "bmm", "baddbmm", "matmul"}
_HOOKS = ("begin_batch", "backward", "end_batch")


class _Counter(TorchDispatchMode):
    """Counts the operations that launch work, under the name of the hook running them."""

    def __init__(self) -> None:
        super().__init__()
        self.where = "other"
        self.operations: collections.Counter[str] = collections.Counter()
        self.products: collections.Counter[str] = collections.Counter()
        self.host_reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.split("::")[-1]
        returns = func._schema.returns
        view = bool(returns) and returns[0].alias_info is not None
        view = view and not returns[0].alias_info.is_write
        if name == "_local_scalar_dense":
            self.host_reads += 1
        elif not view and name not in _FREE:
            self.operations[self.where] += 1
            if name in _PRODUCTS:
                self.products[self.where] += 1
        return func(*args, **(kwargs or {}))


def _labelled(counter: _Counter, where: str, hook):
    @functools.wraps(hook)
    def run(*args, **kwargs):
        outer, counter.where = counter.where, where
        try:
            return hook(*args, **kwargs)
        finally:
            counter.where = outer

    return run


def count(stacked_q: bool, device: torch.device) -> tuple[_Counter, int | None]:
    """The operations of one update after 3 warm-up ones, and the CUDA kernels (on CUDA)."""
    episodes, env = pendulum_episodes(5_000)
    callbacks, loader = emote_sac(episodes, env, device, fused_adam=True, stacked_q=stacked_q)
    Trainer([*callbacks, BackPropStepsTerminator(bp_steps=3)], loader).train()
    counter = _Counter()
    for callback in callbacks:
        for hook in _HOOKS:
            if callback.overrides(hook):
                wrapped = _labelled(counter, f"{callback.name}.{hook}", getattr(callback, hook))
                setattr(callback, hook, wrapped)
    with counter:
        Trainer([*callbacks, BackPropStepsTerminator(bp_steps=1)], loader).train()
    kernels = None
    if device.type == "cuda":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as profiled:
            Trainer([*callbacks, BackPropStepsTerminator(bp_steps=1)], loader).train()
            torch.cuda.synchronize()
        kernels = sum(1 for event in profiled.events() if event.device_type.name == "CUDA")
    return counter, kernels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(1)
    results = {layout: count(layout == "stacked", device) for layout in ("apart", "stacked")}
    print(f"ops_bench: operations one eager SAC update launches ({device.type}; 256x256, batch "
          "256, fused Adam), twin Q networks apart | stacked")  # fmt: skip
    for layout, (counter, kernels) in results.items():
        total, products = sum(counter.operations.values()), sum(counter.products.values())
        line = f"  {layout:<8} {total:4d} operations, {products:3d} of them matrix products"
        if kernels is not None:
            line += f", {kernels} CUDA kernels"
        print(line)
        for where, number in counter.operations.most_common():
            print(f"    {where:<24} {number:4d}  ({counter.products[where]} products)")
    apart, stacked = (sum(results[k][0].operations.values()) for k in ("apart", "stacked"))
    print(f"  stacked / apart: {stacked / apart:.2f} of the operations")


if __name__ == "__main__":
    main()
