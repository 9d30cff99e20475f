"""One rank of the distributed training tests, started by torchrun:

    torchrun --standalone --nproc_per_node 2 -m tests.helpers.distributed_worker OUT_DIR CASES_JSON

CASES_JSON maps a case name to its config overrides (on the smoke preset). Each case trains on the
same small synthetic task in this process group, one after the other (one launch for all cases:
starting the ranks costs more than training), and every rank saves its final weights, events and
summary to OUT_DIR/<case>-rank<r>.pt for the test to compare.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import numpy as np
import torch

from pipeline.core import distributed
from pipeline.core.config import load_config
from pipeline.train.loop import train_model
from pipeline.train.result import TrainingDiverged
from tests.helpers.synthetic import linear_task

ROWS, VAL_ROWS, DIM = 256, 64, 16


def synthetic_task(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and a smooth nonlinear target of them: the same arrays on every rank."""
    return linear_task(ROWS + VAL_ROWS, DIM, seed, squash=True)


def train_case(overrides: list[str], place) -> dict:
    cfg = load_config(["preset=smoke", *overrides])
    x, y = synthetic_task()
    try:
        result = train_model(cfg, x[:ROWS], y[:ROWS], x[ROWS:], y[ROWS:], progress=False, place=place)
    except TrainingDiverged as e:
        result = e.result
    return {"model": result.model.state_dict(), "events": result.events, "summary": result.summary}


def main(out_dir: str, cases_json: str) -> int:
    logging.basicConfig(level=logging.INFO, format="[worker] %(message)s")
    distributed.configure_rank_output("worker", distributed.from_env())
    cases = json.loads(cases_json)
    with distributed.process_group(torch.device("cpu")) as place:
        for name, overrides in cases.items():
            torch.save(train_case(overrides, place), Path(out_dir) / f"{name}-rank{place.rank}.pt")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
