"""The offline benchmarks' own logic: which policy offline_datasets.py makes "medium", what its
``--resume`` refuses, and how offline_bench.py judges a score difference against noise."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def datasets():
    return load("offline_datasets")


def test_a_score_difference_is_measured_in_standard_errors_of_the_difference():
    bench = load("offline_bench")
    # Means 2 and 0; standard error sqrt(1/3 + 1/3).
    assert bench.difference_z([1.0, 2.0, 3.0], [-1.0, 0.0, 1.0]) == pytest.approx(
        2 / (2 / 3) ** 0.5
    )
    assert bench.difference_z([1.0], [0.0, 1.0]) is None  # one seed: no spread to judge by
    assert bench.difference_z([1.0, 1.0], [0.0, 0.0]) is None


def test_medium_is_the_evaluation_nearest_a_third_of_the_way_before_the_expert_itself(datasets):
    updates, returns = [10, 20, 30, 40], [50.0, 300.0, 900.0, 333.0]
    # The last evaluation (a dip of the expert's own policy) would be nearest 33 of 0..1000.
    assert datasets.choose_medium(updates, returns, random=0.0, expert=1000.0).updates == 40
    chosen = datasets.choose_medium(updates, returns, random=0.0, expert=1000.0, before=40)
    assert (chosen.updates, chosen.mean_return) == (20, 300.0)
    assert chosen.normalised_score == pytest.approx(30.0)
    with pytest.raises(ValueError, match="no evaluation before update 10"):
        datasets.choose_medium(updates, returns, random=0.0, expert=1000.0, before=10)


def test_resume_refuses_a_folder_without_a_finished_expert_stage_or_with_a_medium_one(
    datasets, tmp_path: Path
):
    (tmp_path / "random.zarr").mkdir()
    with pytest.raises(SystemExit, match=r"lacks runs/expert, expert\.zarr"):
        datasets.check_expert_stage(tmp_path, 100)
    (tmp_path / "runs" / "expert").mkdir(parents=True)
    (tmp_path / "expert.zarr").mkdir()
    (tmp_path / "medium.zarr").mkdir()
    with pytest.raises(SystemExit, match=r"already holds medium\.zarr: its medium stage ran"):
        datasets.check_expert_stage(tmp_path, 100)


def test_resume_refuses_an_expert_run_that_stopped_short_of_the_budget(
    datasets, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    for name in ("random.zarr", "runs/expert", "expert.zarr"):
        (tmp_path / name).mkdir(parents=True)
    monkeypatch.setattr(datasets, "evaluations", lambda run: ([25, 50], [1.0, 2.0]))
    with pytest.raises(
        SystemExit, match="last evaluated at 50 updates, not at the expert budget 100"
    ):
        datasets.check_expert_stage(tmp_path, 100)
    datasets.check_expert_stage(tmp_path, 50)  # finished: nothing to say


def test_emote_runs_cql_without_its_warm_up_beside_d3rlpy_whose_cql_has_none():
    bench = load("offline_bench")
    assert "cql.bc_warmup_updates=0" in bench.emote_overrides("cql", {"bc_warmup_updates": 10}, 64)
    assert not any("warmup" in s for s in bench.emote_overrides("cql", {}, 64))
