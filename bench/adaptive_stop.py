"""Adaptive stopping on the seed preset: flow steps and forward + backward time per batch, three ways.

- on: the model as it trains (model.adaptive_stop true: the loop ends once
  model.convergence_threshold of the flows have finished for model.patience steps in a row).
- off: model.adaptive_stop false: the loop still ends as soon as every flow has finished (arrived
  or died), since finished flows are compacted out and nothing is left to move.
- fixed: a loop of exactly model.max_steps (50) flow steps that keeps every flow in its tensors,
  finished or not (their results masked out): what the prototype paid before it added adaptive
  stopping (docs/prototype.md). Same weights and inputs; its prediction equals the off arm's.

Each arm runs on the same `--batches` synthetic batches (fresh random inputs and targets), in an
order rotated per batch. Each timed span is divided by the median of the 6 reference probes taken
just before and after it (bench/probe.py): `*_probe_normalised` ratios compare arms at the
machine's speed of their own moments, `*_raw` ones do not; a span of minutes outlasts any probe,
so `*_cpu_time`, the ratio of this process's CPU seconds on the train stage's thread count
(bench/clock.py), is the figure: other processes' load does not add to it. It is the median of
the per-batch ratios (each batch runs every arm, rotated, so each pair ran side by side; the
pairs in `*_cpu_time_pairs`), and null with fewer than 3 batches or when the pairs spread wider
than two runs are held to (`unreliable` says which).
steps_used is FlowOutput.steps_used; flow_steps the flows moved summed over steps (the work
done). Prints one JSON object as its last line, with the CPU model and the probes' spread.

The fixed arm keeps max_steps steps of activations for every flow of the seed preset
(pipeline/train/activations.flow_step_bytes a flow step: peak_rss_gb says what it took) and
moves finished flows again and again: it is by far the slowest and largest arm, so the default
run is a few batches of one preset. `--save` also writes bench/results/adaptive_stop.json.
`--train-steps N` first trains the model N AdamW steps on a learnable synthetic task; 0 (the
default) measures the untrained model the seed preset's training starts from.
"""

from __future__ import annotations

import argparse
import resource
import time
from typing import Optional

import numpy as np
import torch

from bench import clock, results
from bench.probe import Probe, machine
from pipeline.core.config import load_config
from pipeline.model import EnergyFlowModel, energy_flow_loss

DIM = 384  # the bundled teacher's embedding size
ARMS = ("on", "off", "fixed")
FIGURES = (
    "fixed_over_on_cpu_time",
    "off_over_on_cpu_time",
    "fixed_over_on_flow_steps",
    "fixed_over_on_steps",
    "on_steps_used_mean",
    "peak_rss_gb",
)


def fixed_steps_forward(model: EnergyFlowModel, x_in: torch.Tensor, steps: int) -> tuple[torch.Tensor, ...]:
    """`steps` flow steps over every flow, with no stopping rule and no compaction: the model's own
    spawn, step (`_advance`) and deposit (`_deposit`), as EnergyFlowModel.forward runs them, but a
    finished flow stays in the tensors and is moved again each step (its result masked out: it
    deposits once, where it arrived). Returns (pred, surface, steps_used, flow_steps): the surface
    is the model's own when every flow finishes within `steps` (the pred, through the output
    mapper alone, is its cost)."""
    B = x_in.shape[0]
    energies0 = model.input_mapper(x_in)
    per_sample = model.flows_per_sample(B)
    top = energies0.abs().topk(per_sample, dim=1).indices
    energy = energies0.gather(1, top).reshape(-1)
    cells = top.reshape(-1)
    x = (cells % model.W).to(x_in.dtype) + 0.5
    y = (cells // model.W).to(x_in.dtype) + 0.5
    z = torch.zeros_like(x)
    n = B * per_sample
    sample = torch.arange(B, device=x_in.device).repeat_interleave(per_sample)
    hidden = tuple(x_in.new_zeros(n, model.carrier_hidden) for _ in range(model.carrier_layers))
    surface = x_in.new_zeros(B * model.n_cells)
    done = torch.zeros(n, dtype=torch.bool, device=x_in.device)
    for _ in range(steps):
        x, y, z, energy, *hidden = model._advance(x, y, z, energy, *hidden)
        arrived = (z >= model.D) & ~done
        dead = (energy.abs() < model.energy_min) & ~arrived & ~done
        surface = model._deposit(surface, sample, x, y, energy * arrived.to(energy.dtype))
        done = done | arrived | dead
    # Flows still travelling deposit where they are, weighted by how far they got (as forward does).
    surface = model._deposit(surface, sample, x, y, energy * (z / model.D).clamp(max=1) * (~done).to(energy.dtype))
    surface = surface.view(B, model.n_cells)
    return model.output_mapper(surface), surface, steps, steps * n


def run_arm(model: EnergyFlowModel, arm: str, x: torch.Tensor, y: torch.Tensor, fixed_steps: int) -> dict:
    """One forward + backward of `arm`, timed; its steps_used and flow_steps."""
    model.zero_grad(set_to_none=True)
    t0, c0 = time.perf_counter(), time.process_time()
    if arm == "fixed":
        pred, _, steps_used, flow_steps = fixed_steps_forward(model, x, fixed_steps)
    else:
        model.adaptive_stop = arm == "on"
        out = model(x)
        pred, steps_used, flow_steps = out.pred, out.steps_used, out.flow_steps
    energy_flow_loss(pred, y, 1.0).backward()
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    model.zero_grad(set_to_none=True)
    model.adaptive_stop = True
    return {"s": seconds, "cpu_s": cpu_seconds, "steps_used": steps_used, "flow_steps": flow_steps}


def train_briefly(model: EnergyFlowModel, steps: int, batch: int, lr: float) -> None:
    """`steps` AdamW steps on y = x @ W (W normal / sqrt(dim)): a learnable task, so the carrier's
    forward moves can drift from where initialisation put them."""
    rng = np.random.default_rng(0)
    w = torch.from_numpy((rng.normal(size=(DIM, DIM)) / np.sqrt(DIM)).astype(np.float32))
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    for _ in range(steps):
        x = torch.from_numpy(rng.normal(size=(batch, DIM)).astype(np.float32))
        energy_flow_loss(model(x).pred, x @ w, 1.0).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def measure(cfg, batches: int, batch_size: int, fixed_steps: int, train_steps: int = 0, probe=None) -> dict:
    probe = probe or Probe()
    torch.manual_seed(0)
    model = EnergyFlowModel.from_config(cfg.model, DIM)
    train_briefly(model, train_steps, batch_size, float(cfg.train.lr))
    gen = torch.Generator().manual_seed(1)
    data = [
        (torch.randn(batch_size, DIM, generator=gen), torch.randn(batch_size, DIM, generator=gen))
        for _ in range(batches)
    ]
    run_arm(model, "on", *data[0], fixed_steps)  # warm-up: allocator and thread pool, untimed
    runs = {arm: [] for arm in ARMS}
    for b, (x, y) in enumerate(data):
        for arm in ARMS[b % len(ARMS) :] + ARMS[: b % len(ARMS)]:  # rotated: no arm always goes first
            before = probe.take(3)
            r = run_arm(model, arm, x, y, fixed_steps)
            r["s_per_probe"] = r["s"] / float(np.median(before + probe.take(3)))
            runs[arm].append(r)
    res = {
        "preset": cfg.run.preset,
        "batch_size": batch_size,
        "batches": batches,
        "flows_per_batch": batch_size * model.flows_per_sample(batch_size),
        "lattice_depth": model.D,
        "min_forward": model.carrier.min_forward,
        "max_forward": model.carrier.max_forward,
        **{k: getattr(model, k) for k in ("min_steps_to_arrive", "step_bound", "max_steps", "convergence_threshold")},
        "patience": model.patience,
        "fixed_steps": fixed_steps,
        "train_steps_before": train_steps,
    }
    for arm, rs in runs.items():
        res[f"{arm}_steps_used"] = [r["steps_used"] for r in rs]
        res[f"{arm}_steps_used_mean"] = float(np.mean(res[f"{arm}_steps_used"]))
        res[f"{arm}_flow_steps_mean"] = float(np.mean([r["flow_steps"] for r in rs]))
        res[f"{arm}_s_per_batch"] = [r["s"] for r in rs]
        res[f"{arm}_s_per_batch_median"] = float(np.median(res[f"{arm}_s_per_batch"]))
        res[f"{arm}_s_per_probe_median"] = float(np.median([r["s_per_probe"] for r in rs]))
        res[f"{arm}_cpu_s_per_batch_median"] = float(np.median([r["cpu_s"] for r in rs]))
    for slow in ("off", "fixed"):
        res[f"{slow}_over_on_steps"] = res[f"{slow}_steps_used_mean"] / res["on_steps_used_mean"]
        res[f"{slow}_over_on_flow_steps"] = res[f"{slow}_flow_steps_mean"] / res["on_flow_steps_mean"]
        res[f"{slow}_over_on_time_raw"] = res[f"{slow}_s_per_batch_median"] / res["on_s_per_batch_median"]
        res[f"{slow}_over_on_time_probe_normalised"] = res[f"{slow}_s_per_probe_median"] / res["on_s_per_probe_median"]
        # Each batch's arms ran side by side: the median of the per-batch ratios.
        res[f"{slow}_over_on_cpu_time_pairs"] = [a["cpu_s"] / b["cpu_s"] for a, b in zip(runs[slow], runs["on"])]
        res[f"{slow}_over_on_cpu_time"] = float(np.median(res[f"{slow}_over_on_cpu_time_pairs"]))
    return res


MIN_PAIRS = 3  # fewer per-batch ratios have no median that a single slow moment cannot move


def pairs_unreliable(res: dict, slow: str) -> Optional[str]:
    """Why `slow`'s CPU-time ratio to on cannot be reported (None: it can): too few batches, or
    per-batch ratios that spread wider than two runs are held to."""
    if res["batches"] < MIN_PAIRS:
        return f"a median of {res['batches']} per-batch pairs; it takes at least {MIN_PAIRS} (--batches)"
    pairs = res[f"{slow}_over_on_cpu_time_pairs"]
    return clock.spread_unreliable(res[f"{slow}_over_on_cpu_time"], float(np.ptp(pairs)), "the pairs' max - min")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="seed", help="the preset whose model is measured (default seed)")
    ap.add_argument("--batches", type=int, default=3, help="batches each arm runs (default 3)")
    ap.add_argument("--batch-size", type=int, default=0, help="rows per batch (default: the preset's)")
    ap.add_argument("--fixed-steps", type=int, default=0, help="the fixed arm's flow steps (default: model.max_steps)")
    ap.add_argument("--train-steps", type=int, default=0, help="AdamW steps on a synthetic task first (default 0)")
    ap.add_argument("--quick", action="store_true", help="a fast check of the benchmark: smoke preset, 2 batches")
    ap.add_argument("--threads", type=int, help="intra-op threads (default: the train stage's; 0: torch's)")
    results.add_save_flag(ap)
    args = ap.parse_args(argv)
    if args.quick:
        args.preset, args.batches = "smoke", 2
    clock.pin_threads(args.threads)
    t0 = time.perf_counter()
    cfg = load_config([f"preset={args.preset}"])
    probe = Probe()
    res = {"device": f"cpu ({torch.get_num_threads()} threads)", "torch": torch.__version__}
    batch_size = args.batch_size or int(cfg.train.batch_size)
    fixed_steps = args.fixed_steps or int(cfg.model.max_steps)
    res.update(measure(cfg, args.batches, batch_size, fixed_steps, args.train_steps, probe))
    res["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # the fixed arm's, mostly
    res.update(machine(probe))
    res["bench_seconds"] = time.perf_counter() - t0
    results.say("adaptive_stop", f"{res['bench_seconds']:.1f} s")
    why = {f"{slow}_over_on_cpu_time": pairs_unreliable(res, slow) for slow in ("fixed", "off")}
    res.update(results.figures({k: res[k] for k in FIGURES}, why))
    return results.finish("adaptive_stop", res, args.save, argv)


if __name__ == "__main__":
    main()
