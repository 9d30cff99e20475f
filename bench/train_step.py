"""Train-step cost of the default model on this machine, as ratios measured in one run.

- threads: ms/step with torch's default intra-op threads over ms/step with one thread.
- checkpointing: ms/step with activation checkpointing per flow step over without it (the
  compute that checkpointing trades for memory).
Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import json

import torch

from bench.model import timed
from bench.probe import Probe, machine
from pipeline.core.config import load_config
from pipeline.model import EnergyFlowModel, energy_flow_loss
from pipeline.train.telemetry import rss_mb


def ms_per_step(model, x, y, steps: int) -> float:
    opt = torch.optim.AdamW(model.parameters(), 1e-3)

    def step():
        energy_flow_loss(model(x).pred, y, 1.0).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return 1000 * timed(step, steps)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per variant (default 20)")
    ap.add_argument("overrides", nargs="*", help="config overrides, e.g. preset=smoke model.lattice_depth=4")
    args = ap.parse_args(argv)
    cfg = load_config(args.overrides)
    torch.manual_seed(0)
    dim, batch = 384, cfg.train.batch_size
    x, y = torch.randn(batch, dim), torch.randn(batch, dim)
    default_threads = torch.get_num_threads()
    res = {"batch_size": batch, "default_threads": default_threads}

    def build(ckpt: bool):
        torch.manual_seed(0)
        return EnergyFlowModel.from_config({**cfg.model, "checkpoint_steps": ckpt}, dim)

    # Probes (bench/probe.py) at the default thread count before each variant and at the end:
    # their spread says how much the machine's speed moved between the variants.
    probe = Probe(threads=default_threads)
    probe.take(3)
    torch.set_num_threads(1)
    res["ms_per_step_1_thread"] = ms_per_step(build(False), x, y, args.steps)
    torch.set_num_threads(default_threads)
    probe.take(3)
    res["ms_per_step_default_threads"] = ms_per_step(build(False), x, y, args.steps)
    res["threads_speedup"] = res["ms_per_step_1_thread"] / res["ms_per_step_default_threads"]
    probe.take(3)
    res["ms_per_step_checkpointed"] = ms_per_step(build(True), x, y, args.steps)
    probe.take(3)
    res["checkpointing_cost_ratio"] = res["ms_per_step_checkpointed"] / res["ms_per_step_default_threads"]
    res["rss_mb"] = rss_mb()
    res.update(machine(probe))
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main()
