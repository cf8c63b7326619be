"""ONNX export and inference: export time, and latency of onnxruntime against torch eager on CPU.

The policy is ``sac_pendulum``'s (a 256x256 ``GaussianMlpPolicy``, observation 3, action 1),
exported through the same path as ``emote export onnx`` (tracing, opset check, ``onnx.checker``,
metadata, parity at batch 1, 7 and 256), once with the TorchScript exporter (opset 15, the
default) and once with the dynamo exporter (opset 18).

Latency is one call on a batch of 1 (what a game does per agent and frame) and of 256, the median
over ``--calls`` calls after a warm-up: torch eager under ``no_grad`` in eval mode, and an
onnxruntime session (CPU provider), both with one thread and with all threads.

Run: ``python benchmarks/onnx_bench.py``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime
import torch

from emote_core.algorithms.sac import SoftActorCritic
from emote_core.nn import GaussianMlpPolicy
from emote_core.onnx.graph import policy_metadata
from emote_core.onnx.writer import export_policy
from emote_core.spaces import BoxSpace, DictSpace, MDPSpace

SPACES = MDPSpace(
    rewards=BoxSpace(np.float32, (1,)),
    actions=BoxSpace(np.float32, (1,), low=-1.0, high=1.0),
    state=DictSpace({"obs": BoxSpace(np.float32, (3,))}),
)


def median_seconds(call: Callable[[], object], calls: int) -> float:
    for _ in range(max(calls // 10, 10)):
        call()
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def session(path: Path, threads: int) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2_000, help="timed calls per figure")
    args = parser.parse_args()

    torch.manual_seed(0)
    policy = GaussianMlpPolicy(observation_dim=3, action_dim=1, hidden_dims=(256, 256)).eval()
    directory = Path(tempfile.mkdtemp())
    print("export (trace, check, metadata, parity at batch 1/7/256):")
    for opset, exporter in ((15, "TorchScript"), (18, "dynamo")):
        graph = SoftActorCritic().policy_graph(policy, SPACES)
        started = time.perf_counter()
        report = export_policy(
            graph, directory / f"policy_{opset}.onnx", opset=opset,
            metadata=policy_metadata(graph),
        )  # fmt: skip
        seconds = time.perf_counter() - started
        print(
            f"  opset {opset} ({exporter:>11}): {seconds:6.2f} s, "
            f"{os.path.getsize(report.out) / 1e3:6.1f} kB, max abs diff {report.max_abs_diff:.1e}"
        )

    cores = os.cpu_count() or 1
    rng = np.random.default_rng(0)
    print(f"\ninference latency, median of {args.calls} calls (µs; CPU, {cores} cores):")
    print(
        f"  {'batch':>5}  {'threads':>7}  {'torch eager':>11}  {'onnxruntime':>11}  {'speed-up':>8}"
    )
    for batch in (1, 256):
        obs = rng.standard_normal((batch, 3), dtype=np.float32)
        epsilon = np.zeros((batch, 1), np.float32)
        for threads in sorted({1, cores}):
            torch.set_num_threads(threads)
            obs_t, eps_t = torch.from_numpy(obs), torch.from_numpy(epsilon)

            def eager(obs_t=obs_t, eps_t=eps_t) -> object:
                with torch.no_grad():
                    return policy(obs_t, eps_t)

            ort = session(directory / "policy_15.onnx", threads)
            feed = {"obs": obs, "epsilon": epsilon}
            torch_s = median_seconds(eager, args.calls)
            ort_s = median_seconds(
                lambda ort=ort, feed=feed: ort.run(["actions"], feed), args.calls
            )
            print(
                f"  {batch:>5}  {threads:>7}  {torch_s * 1e6:>11.1f}  {ort_s * 1e6:>11.1f}  "
                f"{torch_s / ort_s:>7.1f}x"
            )


if __name__ == "__main__":
    main()
