"""Model benchmark: every figure measured in this one run, printed as one JSON object (last line).

- speedup_vs_reference: one training step (forward + backward) of the per-flow reference
  (bench/reference_model.py) over the vectorised model, same weights and inputs, `default`
  preset, in this process's CPU seconds (bench/clock.py; on a GPU, wall seconds). The reference
  is timed on a sub-batch and scaled by flow steps (said in the JSON); speedup_vs_reference_wall
  is the same in wall seconds (it moves with the machine's other load).
- mfu: FLOP/s of the vectorised training step (FLOPs counted by torch's FlopCounterMode over the
  matmuls and GRU cells it runs, forward and backward; its best of several steps) over the
  machine's fp32 matmul peak, the best of many reference probes (bench/probe.py) taken between
  those steps, at the `bench` preset (carrier hidden 1024). <= 1 by construction unless the
  probe is a poor reference (then mfu_probe_is_poor_reference); mfu_vs_burst_peak is the same
  against one burst of 2048x2048 matmuls, as this benchmark measured it before. mfu_cpu: the
  same in CPU seconds of this process (the best step's against the best probe's), the figure
  (on a GPU, mfu).
- adaptive_steps_mean / max_steps after a short training, and step time with adaptive stopping
  off over on (CPU seconds, the median of interleaved pairs).
- activation_bytes_per_flow_step with checkpointing off and on (bytes saved for backward).
- seed_preset_peak_rss_gb / seed_preset_step_s: one step of the `seed` preset in a fresh CPU
  process (the question is whether it fits this 2-core, 24 GiB machine).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from bench import clock, results
from bench.probe import Probe, machine
from pipeline.core.config import load_config
from pipeline.model import EnergyFlowModel, energy_flow_loss
from pipeline.train.loop import train_model

DIM = 384  # the bundled teacher's embedding size
CPU = torch.device("cpu")  # each measure's default device; --device picks another: nothing here requires a GPU


def randn(device: torch.device, *shape) -> torch.Tensor:
    return torch.randn(*shape, device=device)


def build(model_cfg, device: torch.device, **override) -> EnergyFlowModel:
    torch.manual_seed(0)
    return EnergyFlowModel.from_config({**model_cfg, **override}, DIM).to(device)


def train_step(model, x, y, forward=None):
    out = (forward or model)(x)
    pred = out.pred if hasattr(out, "pred") else out[0]
    energy_flow_loss(pred, y, 1.0).backward()
    model.zero_grad(set_to_none=True)
    return out


def seconds(span: clock.Span, device: torch.device) -> float:
    """This process's CPU seconds on a CPU (bench/clock.py), wall seconds on a GPU (the host waits
    while the GPU works)."""
    return span.wall if device.type == "cuda" else span.cpu


def matmul_peak_flops(device: torch.device, n: int = 2048, reps: int = 10) -> float:
    """One burst of `reps` large matmuls, the fastest taken: the peak as this benchmark measured
    it before bench/probe.py (kept for comparison: one burst is one moment of a shared machine)."""
    a, b = randn(device, n, n), randn(device, n, n)
    a @ b
    best = float("inf")
    for _ in range(reps):
        clock.sync(device)
        t0 = time.perf_counter()
        a @ b
        clock.sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def speedup_vs_reference(cfg, sub_batch: int, probe: Probe | None = None, device: torch.device = CPU) -> dict:
    """speedup_vs_reference_probe_normalised: each arm's time over the median of 3 probes taken
    just before it (bench/probe.py), so a busy moment during one arm only does not decide."""
    from bench.reference_model import reference_forward  # run from the repo root: python -m bench.model

    probe, done = probe or Probe(device), lambda: clock.sync(device)
    model = build(cfg.model, device)
    B = cfg.train.batch_size
    x, y = randn(device, B, DIM), randn(device, B, DIM)
    vec_probe = float(np.median(probe.take(3)))
    vec = clock.cpu_per_call(lambda: train_step(model, x, y), 5, done)
    vec_out = model(x)
    # The sub-batch must give each sample the full batch's flows, or it does different work.
    per_sample, cap = model.flows_per_sample(B), model.max_active_flows
    model.max_active_flows = per_sample * sub_batch
    xs, ys = x[:sub_batch], y[:sub_batch]
    ref_probe = float(np.median(probe.take(3)))
    ref_span, ref = clock.measure(
        lambda: train_step(model, xs, ys, forward=lambda v: reference_forward(model, v)), done
    )
    model.max_active_flows = cap
    ref_flow_steps = ref[3]
    scale = vec_out.flow_steps / ref_flow_steps  # to the full batch's flow steps
    ref_full_s = ref_span.wall * scale
    return {
        "speedup_vs_reference": seconds(ref_span, device) * scale / seconds(vec, device),
        "speedup_vs_reference_wall": ref_full_s / vec.wall,
        "speedup_vs_reference_probe_normalised": (ref_full_s / ref_probe) / (vec.wall / vec_probe),
        "vectorised_step_s": vec.wall,
        "reference_step_s_scaled": ref_full_s,
        "reference_timed_samples": sub_batch,
        "reference_timed_flow_steps": ref_flow_steps,
        "full_batch_flow_steps": vec_out.flow_steps,
        "reference_scaled_by_flow_steps": True,
    }


def mfu(
    cfg, rounds: int = 8, probes_per_round: int = 4, probe: Probe | None = None, device: torch.device = CPU
) -> dict:
    """The module docstring's mfu figures: `rounds` times, `probes_per_round` probes then one timed
    step. The step's time is its best too (like the peak, the fastest is the one the machine's
    other users left alone). mfu_median_paired: each step against the median of the probes of its
    own round, the median over rounds (both at the same moments)."""
    model = build(cfg.model, device)
    B = cfg.train.batch_size
    x, y = randn(device, B, DIM), randn(device, B, DIM)
    counter = FlopCounterMode(display=False)
    with counter:
        out = train_step(model, x, y)
    flops = counter.get_total_flops()
    probe = probe or Probe(device)
    burst = matmul_peak_flops(device)
    steps, steps_cpu, paired = [], [], []
    # (the counted step above was the warm-up: a bench-preset step on one thread is long)
    for _ in range(rounds):
        round_probes = probe.take(probes_per_round)
        span, _ = clock.measure(lambda: train_step(model, x, y), lambda: clock.sync(device))
        steps.append(span.wall)
        steps_cpu.append(span.cpu)
        paired.append((flops / steps[-1]) / (probe.flops / float(np.median(round_probes))))
    peak = probe.peak_flops()
    step_s = min(steps)
    result = flops / step_s / peak
    return {
        "mfu": result,
        "mfu_cpu": flops / min(steps_cpu) / probe.peak_flops_cpu(),
        "mfu_median_paired": float(np.median(paired)),
        "mfu_vs_burst_peak": flops / step_s / burst,
        "mfu_probe_is_poor_reference": result > 1,
        "matmul_peak_gflops": peak / 1e9,
        "matmul_burst_peak_gflops": burst / 1e9,
        "step_gflops": flops / 1e9,
        "achieved_gflops": flops / step_s / 1e9,
        "bench_step_s": step_s,
        "bench_step_s_median": float(np.median(steps)),
        "mfu_rounds": rounds,
        "bench_flow_steps": out.flow_steps,
        "bench_carrier_hidden": cfg.model.carrier_hidden,
    }


def adaptive(cfg, steps: int, device: torch.device = CPU) -> dict:
    """Train briefly on a learnable synthetic task so flows have learned to move, then compare."""
    rng = np.random.default_rng(0)
    n = cfg.train.batch_size * 8
    x = rng.normal(size=(n, DIM)).astype(np.float32)
    y = (x @ (rng.normal(size=(DIM, DIM)) / np.sqrt(DIM))).astype(np.float32)
    epochs = max(1, steps // 8)
    from omegaconf import OmegaConf

    tcfg = OmegaConf.merge(cfg, {"train": {"epochs": epochs, "log_every": 4, "device": str(device)}})
    res = train_model(tcfg, x, y, progress=False)
    model = res.model
    xb, yb = (torch.from_numpy(a[: cfg.train.batch_size]).to(device) for a in (x, y))
    with torch.no_grad():
        used = [
            model(torch.from_numpy(x[i : i + cfg.train.batch_size]).to(device)).steps_used
            for i in range(0, n, cfg.train.batch_size)
        ]

    def step(flag: bool):
        model.adaptive_stop = flag
        return train_step(model, xb, yb)

    # Interleaved pairs, the median of their ratios: off and on see the same machine noise.
    pair = clock.interleaved_ratio(lambda: step(False), lambda: step(True), 6, lambda: clock.sync(device))
    off_on = pair["ratio"] if device.type != "cuda" else pair["a_wall_s"] / pair["b_wall_s"]
    with torch.no_grad():
        off_steps = model(xb).steps_used
    model.adaptive_stop = True
    return {
        "adaptive_steps_mean": float(np.mean(used)),
        "max_steps": cfg.model.max_steps,
        # Steps of a loop that always runs max_steps (the prototype's before it added adaptive
        # stopping, docs/prototype.md) over ours: a step-count ratio (bench.adaptive_stop times it).
        "max_steps_over_adaptive_steps": cfg.model.max_steps / float(np.mean(used)),
        "steps_without_adaptive_stop": off_steps,
        "adaptive_off_over_on_step_time": off_on,
        "adaptive_off_over_on_step_time_wall": pair["a_wall_s"] / pair["b_wall_s"],
        "adaptive_trained_steps": res.summary["train/steps"],
    }


def activation_bytes(cfg, device: torch.device = CPU) -> dict:
    out = {}
    B = cfg.train.batch_size
    x, y = randn(device, B, DIM), randn(device, B, DIM)
    for ckpt in (False, True):
        model = build(cfg.model, device, checkpoint_steps=ckpt)
        seen: dict[tuple, int] = {}

        def pack(t):
            seen[(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            res = model(x)
            loss = energy_flow_loss(res.pred, y, 1.0)
        loss.backward()
        out[f"activation_bytes_per_flow_step_{'checkpointed' if ckpt else 'plain'}"] = (
            sum(seen.values()) / res.flow_steps
        )
    out["activation_memory_ratio_plain_over_checkpointed"] = (
        out["activation_bytes_per_flow_step_plain"] / out["activation_bytes_per_flow_step_checkpointed"]
    )
    return out


SEED_STEP = """
import json, resource, time, torch
from pipeline.core.config import load_config
from pipeline.model import EnergyFlowModel, energy_flow_loss
cfg = load_config(["preset=seed"])
torch.manual_seed(0)
m = EnergyFlowModel.from_config(cfg.model, {dim})
opt = torch.optim.AdamW(m.parameters(), 1e-3)
x, y = torch.randn(cfg.train.batch_size, {dim}), torch.randn(cfg.train.batch_size, {dim})
times = []
for _ in range(2):
    t = time.perf_counter()
    out = m(x); energy_flow_loss(out.pred, y, 1.0).backward(); opt.step(); opt.zero_grad(set_to_none=True)
    times.append(time.perf_counter() - t)
print(json.dumps({{"seed_preset_step_s": times[-1], "seed_preset_first_step_s": times[0],
                  "seed_preset_peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                  "seed_preset_flow_steps": out.flow_steps, "seed_preset_steps_used": out.steps_used}}))
"""


def seed_preset() -> dict:
    """In a fresh process, so its peak RSS is the seed model's alone."""
    return results.child_json(["-c", SEED_STEP.format(dim=DIM)], "seed preset step", 600)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reference-samples", type=int, default=2, help="samples the reference is timed on")
    ap.add_argument("--train-steps", type=int, default=96, help="short training before the adaptive figures")
    ap.add_argument("--skip-seed", action="store_true", help="leave out the seed-preset step (a fresh process)")
    ap.add_argument("--device", default="auto", help="auto (CUDA when present, else CPU), cpu, cuda, cuda:N")
    ap.add_argument(
        "--mfu-rounds",
        type=int,
        default=3,
        help="timed steps of the MFU figure, each after 4 probes (default 3: a step's CPU seconds hardly move "
        "with the machine's load, and a bench-preset step on one thread is long)",
    )
    ap.add_argument(
        "--threads",
        type=int,
        help="intra-op threads on a CPU (default: the train stage's, as under the portable numerics; 0: torch's)",
    )
    results.add_save_flag(ap)
    ap.add_argument(
        "--quick",
        action="store_true",
        help="a fast check of the benchmark itself: no seed step, 16 training steps, 2 MFU rounds",
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.skip_seed, args.train_steps, args.mfu_rounds = True, 16, 2
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    if device.type == "cpu":
        clock.pin_threads(args.threads)
    t0 = time.perf_counter()
    default, bench = load_config(["preset=default"]), load_config(["preset=bench"])
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    res = {"device": name, "torch": torch.__version__}
    probe = Probe(device)
    steps = [
        ("reference", lambda: speedup_vs_reference(default, args.reference_samples, probe, device)),
        ("mfu", lambda: mfu(bench, args.mfu_rounds, probe=probe, device=device)),
        ("adaptive", lambda: adaptive(default, args.train_steps, device)),
        ("activations", lambda: activation_bytes(default, device)),
    ]
    if not args.skip_seed:
        steps.append(("seed", seed_preset))
    for part, fn in steps:
        t = time.perf_counter()
        res.update(fn())
        results.say("model", f"{part}: {time.perf_counter() - t:.1f} s")
    res.update(machine(probe))
    if device.type == "cuda":
        res["gpu_model"] = name
    res["bench_seconds"] = time.perf_counter() - t0
    res.update(headline(res))
    return results.finish("model", res, args.save, argv)


def headline(res: dict) -> dict:
    """The figures docs may quote: CPU-second ratios on a CPU, wall-second ones on a GPU."""
    on_gpu = "gpu_model" in res
    return results.figures(
        {
            "speedup_vs_reference": res["speedup_vs_reference"],
            "mfu": res["mfu"] if on_gpu else res["mfu_cpu"],
            "adaptive_off_over_on_step_time": res["adaptive_off_over_on_step_time"],
            "max_steps_over_adaptive_steps": res["max_steps_over_adaptive_steps"],
            "activation_memory_ratio_plain_over_checkpointed": res["activation_memory_ratio_plain_over_checkpointed"],
            "seed_preset_peak_rss_gb": res.get("seed_preset_peak_rss_gb"),
        }
    )


if __name__ == "__main__":
    main()
