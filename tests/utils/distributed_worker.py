"""One rank of the two-rank checks in ``test_distributed.py`` (run as a script, two at once).

Usage: ``python distributed_worker.py RANK INIT_FILE OUT.pt``. Joins a gloo group through the
file, then records what the collectives gave this rank in ``OUT.pt``.
"""

from __future__ import annotations

import sys

import torch

from emote_core.utils import distributed


def main(rank: int, init_file: str, out: str) -> None:
    context = distributed.DistributedContext(rank=rank, world_size=2, local_rank=rank)
    result: dict[str, object] = {}
    init = f"file://{init_file}"
    with distributed.joined(context, torch.device("cpu"), init_method=init, timeout_s=60):
        # Different gradients on each rank: both end with the mean.
        weight = torch.nn.Parameter(torch.zeros(2, 2))
        bias = torch.nn.Parameter(torch.zeros(3))
        unused = torch.nn.Parameter(torch.zeros(1))  # no gradient on any rank: keeps none
        only_rank_one = torch.nn.Parameter(torch.zeros(2))  # a gradient on rank 1 alone
        weight.grad = torch.full((2, 2), float(1 + 2 * rank))  # 1 on rank 0, 3 on rank 1
        bias.grad = torch.tensor([1.0, 2.0, 3.0]) * (rank + 1)
        if rank == 1:
            only_rank_one.grad = torch.tensor([4.0, -2.0])
        distributed.average_gradients([weight, bias, unused, only_rank_one], index=0, step=0)
        result["weight"] = weight.grad
        result["bias"] = bias.grad
        result["unused"] = unused.grad
        result["only_rank_one"] = only_rank_one.grad

        # Rank 0's tensors everywhere.
        tensors = [torch.full((3,), float(rank + 5)), torch.arange(4) * (rank + 1)]
        distributed.broadcast_tensors(tensors)
        result["broadcast"] = tensors

        # Ranks that step different optimisers are told so, not mixed.
        other = torch.nn.Parameter(torch.zeros(2))
        other.grad = torch.ones(2)
        try:
            distributed.average_gradients([other], index=rank, step=1)
        except distributed.DistributedError as error:
            result["mismatch"] = str(error)
    torch.save(result, out)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3])
