"""Distributed training on torch.distributed (CPU, gloo, 2 processes on this machine).

One torchrun launch (the real `torchrun` command line) trains every case of tests/helpers/distributed_worker.py
in one process group; each rank saves its weights and events, and the tests compare them with each
other and with one process trained here on the same global batches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline.core import distributed, numerics
from pipeline.core.config import load_config
from pipeline.data.loader import BatchLoader
from pipeline.train.loop import train_model
from tests.helpers.distributed_worker import ROWS, synthetic_task

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
BASE = ["train.device=cpu", "train.batch_size=16", "train.epochs=2", "train.checkpoint_every=0", "train.threads=1"]
FAULT_STEP = 5
CASES = {
    # 2 ranks x 16 rows = the global batch of 1 process with grad_accum 2 (8 steps an epoch).
    "ddp": [*BASE, "train.grad_accum=1"],
    # Accumulation under DDP (no_sync on the first micro-batch): 1 process with grad_accum 4.
    "ddp_accum": [*BASE, "train.grad_accum=2"],
    # A NaN loss on rank 1 only (all-reduced into both ranks' loss).
    "nan_rank1": [*BASE, "fault=nan_loss", f"fault.step={FAULT_STEP}", "fault.rank=1"],
    # An inf written into rank 1's gradient after DDP's all-reduce: only the agreed skip flags
    # make rank 0 skip too.
    "inf_rank1": [*BASE, "fault=inf_grad", f"fault.step={FAULT_STEP}", "fault.module=neuron", "fault.rank=1"],
    # The same under fp16: rank 1's GradScaler backs off, and rank 0's must follow it.
    "inf_rank1_fp16": [
        *BASE,
        "train.precision=fp16",
        "fault=inf_grad",
        f"fault.step={FAULT_STEP}",
        "fault.module=neuron",
        "fault.rank=1",
    ],
}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    torchrun = Path(sys.executable).parent / "torchrun"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            str(torchrun),
            "--standalone",
            "--nproc_per_node",
            "2",
            "-m",
            "tests.helpers.distributed_worker",
            str(out),
            json.dumps(CASES),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    load = lambda name, rank: torch.load(out / f"{name}-rank{rank}.pt", weights_only=True)  # noqa: E731
    return {name: (load(name, 0), load(name, 1)) for name in CASES}, proc.stdout + proc.stderr


def one_process(grad_accum: int, *extra: str):
    x, y = synthetic_task()
    cfg = load_config(["preset=smoke", *BASE, f"train.grad_accum={grad_accum}", *extra])
    return train_model(cfg, x[:ROWS], y[:ROWS], x[ROWS:], y[ROWS:], progress=False)


def max_weight_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def assert_ranks_identical(rank0: dict, rank1: dict) -> None:
    for k in rank0["model"]:
        assert torch.equal(rank0["model"][k], rank1["model"][k]), k


@pytest.mark.parametrize("case, accum", [("ddp", 2), ("ddp_accum", 4)])
def test_two_processes_train_what_one_process_trains_on_the_same_global_batch(two_ranks, case, accum):
    (rank0, rank1), _ = two_ranks[0][case], None
    single = one_process(accum)
    assert_ranks_identical(rank0, rank1)  # DDP keeps the replicas equal
    assert rank0["summary"]["train/steps"] == single.summary["train/steps"] == 2 * ROWS // (16 * accum)
    assert rank0["summary"]["train/effective_batch"] == single.summary["train/effective_batch"] == 16 * accum
    assert rank0["summary"]["train/processes"] == 2
    assert max_weight_diff(rank0["model"], single.model.state_dict()) < 1e-5
    # The logged loss is the global batch's and validation covers every row, split over the ranks.
    for key in ("train/loss", "val/loss", "val/cosine"):
        assert rank0["summary"][key] == pytest.approx(single.summary[key], rel=1e-5), key


@pytest.mark.parametrize("case, kind", [("nan_rank1", "nan_loss"), ("inf_rank1", "inf_grad")])
def test_a_nonfinite_step_on_one_rank_is_skipped_by_both(two_ranks, case, kind):
    rank0, rank1 = two_ranks[0][case]
    for rank in (rank0, rank1):
        [event] = rank["events"]
        assert (event["step"], event["kind"], event["action"]) == (FAULT_STEP, kind, "skipped")
        assert rank["summary"]["train/skipped_steps"] == 1
        assert all(torch.isfinite(v).all() for v in rank["model"].values())
    assert_ranks_identical(rank0, rank1)
    if kind == "inf_grad":
        assert rank0["events"][0]["module"] == "neuron"  # rank 0's own gradient was finite: the flags told it
    # Skipping is the same decision one process makes for the same batch.
    single = one_process(2, "fault=nan_loss", f"fault.step={FAULT_STEP}")
    assert max_weight_diff(rank0["model"], single.model.state_dict()) < 1e-5


def test_only_rank_0_prints_each_epoch_summary_once(two_ranks):
    _, output = two_ranks
    for epoch in (1, 2):
        # One line per case and epoch: rank 1's info lines are not printed.
        assert output.count(f"[worker] epoch {epoch}/2 ") == len(CASES), output[-3000:]
    assert "[worker rank 1] epoch" not in output


def test_rank_slices_are_disjoint_and_together_are_one_process_batches():
    x, y = synthetic_task()
    one = BatchLoader(x, y, 16, seed=3)
    ranks = [BatchLoader(x, y, 16, seed=3, rank=r, world_size=2) for r in range(2)]
    for loader in (one, *ranks):
        loader.set_epoch(1)
    single = list(one.batch_indices())
    per_rank = [list(r.batch_indices()) for r in ranks]
    assert len(per_rank[0]) == len(per_rank[1]) == len(single) // 2
    # Step s of the two ranks together is micro-batches 2s and 2s+1 of one process.
    for s, (a, b) in enumerate(zip(*per_rank)):
        assert (a == single[2 * s]).all() and (b == single[2 * s + 1]).all()
        assert not set(a) & set(b)
    # Training drops the batch left over when the ranks cannot all have one; evaluation keeps it.
    odd = [BatchLoader(x[:48], y[:48], 16, rank=r, world_size=2, shuffle=False) for r in range(2)]
    assert [len(o) for o in odd] == [1, 1]
    uneven = [BatchLoader(x[:48], y[:48], 16, rank=r, world_size=2, shuffle=False, even=False) for r in range(2)]
    assert [len(u) for u in uneven] == [2, 1]


def test_cpu_uses_gloo_and_cuda_nccl_and_threads_are_shared_out():
    assert distributed.backend_for(torch.device("cpu")) == "gloo"
    assert distributed.backend_for(torch.device("cuda", 0)) == "nccl"
    two_on_one_node = distributed.Dist(rank=1, world_size=2, local_rank=1, local_world_size=2)
    cores = len(os.sched_getaffinity(0))
    # (the portable numerics fix the count when this process pinned them: pipeline/core/numerics.threads)
    assert distributed.threads_per_process(0, two_on_one_node) == (numerics.threads(0) or max(1, cores // 2))
    assert distributed.threads_per_process(3, two_on_one_node) == 3


def test_under_fp16_both_grad_scalers_back_off_together(two_ranks):
    rank0, rank1 = two_ranks[0]["inf_rank1_fp16"]
    for rank in (rank0, rank1):
        [event] = rank["events"]
        assert (event["step"], event["kind"], event["action"]) == (FAULT_STEP, "inf_grad", "skipped; scaler backed off")
        assert event["scale"] == 1024.0 * 0.5  # the smoke preset's init_scale, backed off once
    assert rank0["summary"]["amp/scale"] == rank1["summary"]["amp/scale"]
    assert_ranks_identical(rank0, rank1)
