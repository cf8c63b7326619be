"""Data-parallel training across processes started by ``torchrun``: who this process is, the
process group, per-rank seeds, and the two collectives a learner needs (weights from rank 0 at
the start, the mean of the gradients before every optimiser step).

``torchrun --nproc-per-node K -m emote_cli train ...`` sets ``RANK``, ``WORLD_SIZE`` and
``LOCAL_RANK`` in each process; :func:`from_environment` reads them. The group uses gloo on the CPU
and NCCL on CUDA (one device per rank: ``cuda:LOCAL_RANK``). Every collective here runs in the
same order on every rank, so every rank must step the same optimisers the same number of times:
:func:`average_gradients` checks that with a tag that travels in the same buffer and raises
:class:`DistributedError` when ranks disagree, instead of mixing two optimisers' gradients.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import logging
import os
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from emote_core.errors import ConfigurationError, EmoteError

log = logging.getLogger(__name__)

TIMEOUT_VARIABLE = "EMOTE_DDP_TIMEOUT_S"
"""Seconds a collective waits for the other ranks before it fails (default 1800): a rank that
died or stopped stepping ends the others' wait with an error instead of a hang."""

DEFAULT_TIMEOUT_S = 1800.0

_TAG_SLOTS = 2
"""Trailing slots of each gradient buffer: the optimiser's index and its step count modulo
:data:`_STEP_MODULUS`, summed over ranks and checked."""

_STEP_MODULUS = 100_000


class DistributedError(EmoteError):
    """The ranks of a data-parallel run disagree, or the process group cannot start."""


@dataclass(frozen=True)
class DistributedContext:
    """This process's place among the ranks of a data-parallel run.

    Attributes:
        rank: Global rank, 0 to ``world_size - 1``; rank 0 writes the run directory.
        world_size: Number of ranks.
        local_rank: Rank on this machine: the CUDA device index of this rank.
    """

    rank: int
    world_size: int
    local_rank: int

    @property
    def is_main(self) -> bool:
        """Whether this rank writes checkpoints, logs, exports and the run directory."""
        return self.rank == 0


def from_environment(environ: dict[str, str] | None = None) -> DistributedContext | None:
    """The rank of this process as ``torchrun`` describes it, or ``None`` for a lone process
    (no ``WORLD_SIZE``, or a world of one).

    Raises:
        ConfigurationError: If the variables are not integers or contradict each other.
    """
    env = os.environ if environ is None else environ
    if "WORLD_SIZE" not in env:
        return None
    try:
        world_size = int(env["WORLD_SIZE"])
        rank = int(env.get("RANK", "0"))
        local_rank = int(env.get("LOCAL_RANK", str(rank)))
    except ValueError as error:
        raise ConfigurationError(
            f"WORLD_SIZE={env.get('WORLD_SIZE')!r}, RANK={env.get('RANK')!r}, LOCAL_RANK="
            f"{env.get('LOCAL_RANK')!r}: torchrun's variables must be integers"
        ) from error
    if world_size <= 1:
        return None
    if not 0 <= rank < world_size or local_rank < 0:
        raise ConfigurationError(
            f"RANK={rank} with WORLD_SIZE={world_size} and LOCAL_RANK={local_rank}: a rank lies "
            "in 0..WORLD_SIZE-1 — start the processes with torchrun"
        )
    return DistributedContext(rank=rank, world_size=world_size, local_rank=local_rank)


def rank_device(context: DistributedContext, device: torch.device) -> torch.device:
    """The device of this rank: ``cuda`` becomes ``cuda:LOCAL_RANK``; the CPU stays.

    Raises:
        ConfigurationError: For a CUDA index (every rank takes its own) or too few devices.
    """
    if device.type != "cuda":
        return device
    if device.index is not None:
        raise ConfigurationError(
            f"`device='{device}'` under torchrun: each rank takes cuda:LOCAL_RANK; pass "
            "`device='cuda'` (or auto) and choose the GPUs with CUDA_VISIBLE_DEVICES"
        )
    if context.local_rank >= torch.cuda.device_count():
        raise ConfigurationError(
            f"rank {context.rank} has LOCAL_RANK={context.local_rank}, but only "
            f"{torch.cuda.device_count()} CUDA devices are visible; start at most that many "
            "processes per node"
        )
    return torch.device("cuda", context.local_rank)


def timeout_seconds(environ: dict[str, str] | None = None) -> float:
    """How long a collective waits for the other ranks (:data:`TIMEOUT_VARIABLE`).

    Raises:
        ConfigurationError: If the variable is not a positive number.
    """
    env = os.environ if environ is None else environ
    text = env.get(TIMEOUT_VARIABLE)
    if text is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigurationError(f"{TIMEOUT_VARIABLE}={text!r}: give a positive number of seconds")
    return value


def start(
    context: DistributedContext,
    device: torch.device,
    *,
    init_method: str | None = None,
    timeout_s: float | None = None,
) -> None:
    """Joins the process group: gloo for the CPU, NCCL for CUDA (on this rank's device).

    Args:
        context: This rank.
        device: Where this rank trains (from :func:`rank_device`).
        init_method: Where ranks meet (``file://...`` in tests); ``env://`` (torchrun's
            ``MASTER_ADDR``/``MASTER_PORT``) when ``None``.
        timeout_s: Seconds a collective waits (:func:`timeout_seconds` when ``None``).

    Raises:
        DistributedError: If the group cannot be formed (a rank that never came, a port taken).
    """
    import torch.distributed as dist

    if dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=timeout_s if timeout_s is not None else timeout_seconds())
    if device.type == "cuda":
        torch.cuda.set_device(device)
    try:
        dist.init_process_group(
            backend=backend, init_method=init_method or "env://", rank=context.rank,
            world_size=context.world_size, timeout=timeout,
            device_id=device if device.type == "cuda" else None,
        )  # fmt: skip
    except (RuntimeError, ValueError) as error:
        raise DistributedError(
            f"rank {context.rank} of {context.world_size} could not join the {backend} process "
            f"group: {error}"
        ) from error
    log.info("rank %d of %d joined the %s group", context.rank, context.world_size, backend)


@contextlib.contextmanager
def joined(
    context: DistributedContext,
    device: torch.device,
    *,
    init_method: str | None = None,
    timeout_s: float | None = None,
) -> Iterator[None]:
    """The process group for the block (:func:`start`, with its arguments), left however the
    block ends: after a barrier when it ends normally (see :func:`stop`), at once when it
    raises (another rank may be gone)."""
    start(context, device, init_method=init_method, timeout_s=timeout_s)
    try:
        yield
    except BaseException:
        stop()
        raise
    stop(wait_for_others=True)


def stop(*, wait_for_others: bool = False) -> None:
    """Leaves the process group, if this process is in one, and collects the garbage at once.

    Collecting right after leaving frees whatever still holds the group's tensors while the
    interpreter is whole; freed in its teardown instead, gloo ranks sometimes abort at exit
    ("terminate called without an active exception").

    Args:
        wait_for_others: First wait until every rank is leaving too (a normal end); a rank
            that is gone makes the barrier fail, and this rank leaves anyway.
    """
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    if wait_for_others:
        try:
            dist.barrier()
        except (RuntimeError, ValueError) as error:  # a rank left early: leave anyway
            log.debug("leaving the process group without the others: %s", error)
    dist.destroy_process_group()
    gc.collect()  # what still holds the group's tensors goes now, not at interpreter exit


def barrier() -> None:
    """Waits until every rank got here (a no-op outside a process group)."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def broadcast_object(value: object, *, source: int = 0) -> object:
    """``value`` as rank ``source`` has it, on every rank (picklable values only)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return value
    holder = [value]
    dist.broadcast_object_list(holder, src=source)
    return holder[0]


def rank_seed(seed: int, rank: int, name: str = "") -> int:
    """A seed for ``rank``'s own draws: the seed itself on rank 0 (a one-rank run's draws), an
    independent stream of it elsewhere; ``name`` separates generators of the same rank."""
    if rank == 0 and not name:
        return seed
    entropy = [seed & 0xFFFFFFFF, rank, zlib.crc32(name.encode())]
    return int(np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint32)[0])


def broadcast_tensors(tensors: Iterable[torch.Tensor], *, source: int = 0) -> int:
    """Overwrites ``tensors`` with rank ``source``'s values, flattened into one collective per
    device and dtype.

    Returns:
        The number of tensors broadcast.
    """
    import torch.distributed as dist

    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for tensor in tensors:
        groups.setdefault((tensor.device, tensor.dtype), []).append(tensor)
    count = 0
    for members in groups.values():
        flat = torch.cat([t.detach().reshape(-1) for t in members])
        dist.broadcast(flat, src=source)
        offset = 0
        with torch.no_grad():
            for tensor in members:
                tensor.copy_(flat[offset : offset + tensor.numel()].view_as(tensor))
                offset += tensor.numel()
        count += len(members)
    return count


def average_gradients(parameters: Sequence[torch.Tensor], *, index: int, step: int) -> None:
    """Replaces every parameter's gradient with its mean over the ranks, in one collective.

    A rank without a gradient for a parameter counts as zero; a parameter no rank has a
    gradient for keeps none (as a one-process step would skip it).

    Args:
        parameters: One optimiser's parameters, in the same order on every rank.
        index: The optimiser's position among the run's optimisers (the same on every rank).
        step: How many times this optimiser stepped before (the same on every rank).

    Raises:
        DistributedError: If the ranks are not stepping the same optimiser at the same step.
    """
    import torch.distributed as dist

    if not parameters:
        return
    world = dist.get_world_size()
    reference = parameters[0]
    # float32 at least: the tags and presence counts must add up exactly
    dtype = torch.promote_types(reference.dtype, torch.float32)
    parts, present = [], []
    for parameter in parameters:
        grad = parameter.grad
        present.append(0.0 if grad is None else 1.0)
        parts.append(
            torch.zeros(parameter.numel(), device=reference.device, dtype=dtype)
            if grad is None
            else grad.detach().reshape(-1).to(dtype)
        )
    tag = [float(index), float(step % _STEP_MODULUS)]
    parts.append(torch.tensor(present + tag, device=reference.device, dtype=dtype))
    flat = torch.cat(parts)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    summed_tag = flat[-_TAG_SLOTS:].tolist()
    if summed_tag != [value * world for value in tag]:
        raise DistributedError(
            f"ranks stepped different optimisers together: this rank is at optimiser {index}, "
            f"step {step}, but the ranks' tags sum to {summed_tag} (expected "
            f"{[value * world for value in tag]}); every rank must step the same optimisers the "
            "same number of times (a loss that skips its step on some ranks breaks this)"
        )
    counts = flat[-_TAG_SLOTS - len(parameters) : -_TAG_SLOTS]
    flat = flat[: -_TAG_SLOTS - len(parameters)] / world
    offset = 0
    for parameter, count in zip(parameters, counts.tolist(), strict=True):
        size = parameter.numel()
        if count > 0:
            mean = flat[offset : offset + size].view_as(parameter).to(parameter.dtype)
            if parameter.grad is None:
                parameter.grad = mean.clone()
            else:
                parameter.grad.copy_(mean)
        offset += size


__all__ = [
    "DEFAULT_TIMEOUT_S",
    "TIMEOUT_VARIABLE",
    "DistributedContext",
    "DistributedError",
    "average_gradients",
    "barrier",
    "broadcast_object",
    "broadcast_tensors",
    "from_environment",
    "joined",
    "rank_device",
    "rank_seed",
    "start",
    "stop",
    "timeout_seconds",
]
