"""Train-step cost of the default model on this machine, as ratios measured in one run.

- threads: wall ms/step with one intra-op thread over ms/step with torch's default threads. A
  ratio across thread counts is wall time against wall time: it holds on a quiet machine with
  the cores to itself only, so elsewhere the figure is null and `unreliable` says why
  (bench/clock.py).
- checkpointing: this process's CPU ms/step with activation checkpointing per flow step over
  without it, both on one thread (the compute that checkpointing trades for memory): steps of
  the two interleaved in --steps pairs, the median of the pairs' ratios (null, with the reason in
  `unreliable`, when that median's 95 % interval is wider than two runs are held to).
Prints one JSON object as its last line (--save: also bench/results/train_step.json).
"""

from __future__ import annotations

import argparse

import torch

from bench import clock, results
from bench.probe import Probe, machine
from pipeline.core.config import load_config
from pipeline.model import EnergyFlowModel, energy_flow_loss
from pipeline.train.telemetry import rss_mb


def train_step(model, x, y):
    """One AdamW training step of `model` on (x, y), as a call."""
    opt = torch.optim.AdamW(model.parameters(), 1e-3)

    def step():
        energy_flow_loss(model(x).pred, y, 1.0).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def ms_per_step(model, x, y, steps: int) -> clock.Span:
    """Median wall and CPU ms of an AdamW training step."""
    span = clock.cpu_per_call(train_step(model, x, y), steps)
    return clock.Span(1000 * span.wall, 1000 * span.cpu)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--steps", type=int, default=20, help="timed steps per variant, and pairs of the checkpointing A/B (default 20)"
    )
    ap.add_argument("overrides", nargs="*", help="config overrides, e.g. preset=smoke model.lattice_depth=4")
    results.add_save_flag(ap)
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
    one = ms_per_step(build(False), x, y, args.steps)
    probe.take(3)
    # Checkpointing against none, step by step (interleaved pairs, the median of their ratios).
    pairs = clock.interleaved_ratio(train_step(build(True), x, y), train_step(build(False), x, y), args.steps)
    ckpt = clock.Span(1000 * pairs["a_wall_s"], 1000 * pairs["a_cpu_s"])
    torch.set_num_threads(default_threads)
    probe.take(3)
    many = ms_per_step(build(False), x, y, args.steps)
    probe.take(3)
    res["ms_per_step_1_thread"] = one.wall
    res["cpu_ms_per_step_1_thread"] = one.cpu
    res["ms_per_step_default_threads"] = many.wall
    res["threads_speedup"] = one.wall / many.wall
    res["ms_per_step_checkpointed"] = ckpt.wall
    res["cpu_ms_per_step_checkpointed"] = ckpt.cpu
    res["checkpointing_cost_ratio"] = pairs["ratio"]
    res["checkpointing_cost_ratio_pairs"] = pairs["pair_ratios"]
    res["checkpointing_cost_ratio_half_width"] = clock.median_half_width(pairs["pair_ratios"])
    res["checkpointing_cost_ratio_wall"] = pairs["a_wall_s"] / pairs["b_wall_s"]
    res["rss_mb"] = rss_mb()
    res.update(machine(probe))
    res.update(
        results.figures(
            {"threads_speedup": res["threads_speedup"], "checkpointing_cost_ratio": res["checkpointing_cost_ratio"]},
            {
                "threads_speedup": clock.wall_ratio_unreliable(res.get("busy"), default_threads),
                "checkpointing_cost_ratio": clock.spread_unreliable(
                    res["checkpointing_cost_ratio"],
                    res["checkpointing_cost_ratio_half_width"],
                    "the pairs' median 95 % half-width",
                ),
            },
        )
    )
    return results.finish("train_step", res, args.save, argv)


if __name__ == "__main__":
    main()
