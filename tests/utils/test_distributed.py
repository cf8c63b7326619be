"""Data-parallel pieces: who a process is under torchrun, per-rank seeds, and the collectives
run by two real gloo processes (``distributed_worker.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from emote_core.errors import ConfigurationError
from emote_core.utils import distributed
from emote_core.utils.distributed import DistributedContext, from_environment, rank_seed

WORKER = Path(__file__).with_name("distributed_worker.py")
ROOT = Path(__file__).parents[2]


def test_a_lone_process_is_not_distributed() -> None:
    assert from_environment({}) is None
    assert from_environment({"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"}) is None


def test_torchrun_variables_give_the_rank() -> None:
    context = from_environment({"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1"})
    assert context == DistributedContext(rank=3, world_size=4, local_rank=1)
    assert not context.is_main
    assert from_environment({"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}).is_main


@pytest.mark.parametrize(
    "environ",
    [
        {"WORLD_SIZE": "two", "RANK": "0"},
        {"WORLD_SIZE": "2", "RANK": "2", "LOCAL_RANK": "0"},
        {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "-1"},
    ],
)
def test_bad_torchrun_variables_are_refused(environ: dict[str, str]) -> None:
    with pytest.raises(ConfigurationError, match=r"RANK|WORLD_SIZE"):
        from_environment(environ)


def test_rank_zero_keeps_the_seed_and_other_ranks_get_their_own() -> None:
    assert rank_seed(7, 0) == 7
    seeds = {rank_seed(7, rank) for rank in range(1, 8)}
    assert len(seeds) == 7 and 7 not in seeds
    assert rank_seed(7, 1) == rank_seed(7, 1)  # reproducible
    assert rank_seed(7, 1, "table") != rank_seed(7, 1, "agent")


def test_the_cpu_stays_and_cuda_indices_are_refused() -> None:
    context = DistributedContext(rank=1, world_size=2, local_rank=1)
    assert distributed.rank_device(context, torch.device("cpu")) == torch.device("cpu")
    with pytest.raises(ConfigurationError, match="cuda:LOCAL_RANK"):
        distributed.rank_device(context, torch.device("cuda", 0))


def test_the_collective_timeout_comes_from_the_environment() -> None:
    assert distributed.timeout_seconds({}) == distributed.DEFAULT_TIMEOUT_S
    assert distributed.timeout_seconds({distributed.TIMEOUT_VARIABLE: "12.5"}) == 12.5
    with pytest.raises(ConfigurationError, match=distributed.TIMEOUT_VARIABLE):
        distributed.timeout_seconds({distributed.TIMEOUT_VARIABLE: "0"})


def test_two_ranks_average_gradients_and_take_rank_zeros_tensors(tmp_path: Path) -> None:
    init_file = tmp_path / "rendezvous"
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    workers = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(rank), str(init_file), str(tmp_path / f"{rank}.pt")],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    for worker in workers:
        _, stderr = worker.communicate(timeout=120)
        assert worker.returncode == 0, stderr
    results = [torch.load(tmp_path / f"{rank}.pt", weights_only=True) for rank in range(2)]
    for result in results:
        torch.testing.assert_close(result["weight"], torch.full((2, 2), 2.0))
        torch.testing.assert_close(result["bias"], torch.tensor([1.5, 3.0, 4.5]))
        assert result["unused"] is None
        # Rank 0 had no gradient: it counts as zero in the mean, and both ranks step with it.
        torch.testing.assert_close(result["only_rank_one"], torch.tensor([2.0, -1.0]))
        torch.testing.assert_close(result["broadcast"][0], torch.full((3,), 5.0))
        torch.testing.assert_close(result["broadcast"][1], torch.arange(4))
        assert "ranks stepped different optimisers together" in result["mismatch"]


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A stand-in process group: what ``joined`` asks of torch.distributed, in order."""
    import torch.distributed as dist

    made: list[str] = []
    monkeypatch.setattr(distributed, "start", lambda *a, **k: made.append("start"))
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "barrier", lambda: made.append("barrier"))
    monkeypatch.setattr(dist, "destroy_process_group", lambda: made.append("destroy"))
    return made


def test_a_block_that_ends_waits_for_the_other_ranks_before_leaving(calls: list[str]) -> None:
    context = DistributedContext(rank=0, world_size=2, local_rank=0)
    with distributed.joined(context, torch.device("cpu")):
        calls.append("train")
    assert calls == ["start", "train", "barrier", "destroy"]


def test_a_block_that_raises_leaves_at_once(calls: list[str]) -> None:
    context = DistributedContext(rank=1, world_size=2, local_rank=1)
    with pytest.raises(KeyboardInterrupt), distributed.joined(context, torch.device("cpu")):
        raise KeyboardInterrupt
    assert calls == ["start", "destroy"]  # no barrier: another rank may be gone


def test_a_barrier_a_gone_rank_breaks_still_leaves(
    calls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch.distributed as dist

    def broken() -> None:
        raise RuntimeError("Connection closed by peer")

    monkeypatch.setattr(dist, "barrier", broken)
    with distributed.joined(DistributedContext(0, 2, 0), torch.device("cpu")):
        pass
    assert calls == ["start", "destroy"]
