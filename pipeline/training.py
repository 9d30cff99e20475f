"""The training loop: AdamW, clipping, non-finite steps skipped and counted, telemetry per window.

Host syncs are rationed: loss and norms accumulate on the device and reach the host once per
`log_every` steps. The one per-step read is the skip decision (is the loss and the gradient norm
finite?); the model's flow loop already reads one integer per flow step, so this adds ~1 % of the
step's syncs. Nothing of a step survives it: the loss kept for logging is detached, and
`torch.cuda.empty_cache()` is never called (the seeds measured it as a 15-20 % slowdown).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import torch

from .data.loader import BatchLoader
from .errors import PipelineError
from .model import EnergyFlowModel, energy_flow_loss
from .telemetry import device_memory_mb, reset_peak, rss_mb


class TrainingDiverged(PipelineError):
    """Too many consecutive non-finite steps: the run stops instead of spinning. Carries the
    partial result so the stage can still write the telemetry that shows what happened."""

    def __init__(self, message: str, result: "TrainResult"):
        super().__init__(message)
        self.result = result


@dataclass
class TrainResult:
    model: EnergyFlowModel
    rows: list[dict] = field(default_factory=list)  # telemetry, one per log window
    events: list[dict] = field(default_factory=list)  # non-finite steps: step, kind, module, action
    summary: dict = field(default_factory=dict)  # metrics/train.json


def select_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise PipelineError(f"train.device = {name!r} but CUDA is not available here; use train.device=cpu or auto")
    return torch.device(name)


def lr_lambda(warmup: int, total: int) -> Callable[[int], float]:
    """Linear warm-up, then cosine decay to 10 % of the peak LR."""
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))
    return f


def nonfinite_modules(model: torch.nn.Module) -> list[str]:
    """Top-level modules holding a non-finite gradient, nearest the loss first (backward order)."""
    bad = []
    for name, module in reversed(list(model.named_children())):
        grads = [p.grad for p in module.parameters() if p.grad is not None]
        if grads and not all(torch.isfinite(g).all() for g in grads):
            bad.append(name)
    return bad


@torch.no_grad()
def evaluate_loss(model: EnergyFlowModel, inputs, targets, batch_size: int, cosine_weight: float,
                  device: torch.device) -> dict[str, float]:
    model.eval()
    loader = BatchLoader(inputs, targets, batch_size, shuffle=False)
    loss_sum = torch.zeros((), device=device)
    cos_sum = torch.zeros((), device=device)
    n = 0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        out = model(x)
        loss_sum += energy_flow_loss(out.pred, y, cosine_weight) * len(x)
        cos_sum += torch.nn.functional.cosine_similarity(out.pred, y, dim=1).sum()
        n += len(x)
    model.train()
    return {"loss": float(loss_sum) / max(n, 1), "cosine": float(cos_sum) / max(n, 1)}


def _new_window(device: torch.device) -> dict:
    """Accumulators of one log window. Loss and norms stay on the device (no host read until the
    window closes); the rest are host numbers the loop already has."""
    zero = lambda: torch.zeros((), device=device)  # noqa: E731
    return dict(loss=zero(), norm=zero(), clipped=zero(), n_ok=0, skipped=0, steps=0, flow_steps=0,
                steps_used=0, data_s=0.0, samples=0, t0=time.perf_counter())


def _close_window(win: dict, step: int, epoch: int, opt, device: torch.device) -> dict:
    """Read the window's device accumulators (the window's one host sync) into a telemetry row."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # so the wall time covers the work, not just its launch
    wall = time.perf_counter() - win["t0"]
    n_ok, steps = win["n_ok"], max(win["steps"], 1)
    alloc, peak = device_memory_mb(device)
    nan = float("nan")
    return {
        "step": step,
        "epoch": epoch,
        "train/loss": float(win["loss"]) / n_ok if n_ok else nan,
        "train/skipped": win["skipped"],
        "grad/global_norm": float(win["norm"]) / n_ok if n_ok else nan,
        "grad/clipped_norm": float(win["clipped"]) / n_ok if n_ok else nan,
        "train/lr": opt.param_groups[0]["lr"],
        "perf/step_ms": 1000 * wall / steps,
        "perf/data_ms": 1000 * win["data_s"] / steps,
        "perf/samples_per_s": win["samples"] / wall if wall > 0 else 0.0,
        "flow/steps_used": win["steps_used"] / steps,
        "flow/flow_steps": win["flow_steps"] / steps,
        "mem/rss_mb": rss_mb(),
        "mem/device_allocated_mb": alloc,
        "mem/device_peak_mb": peak,
    }


def train_model(cfg, train_inputs, train_targets, val_inputs=None, val_targets=None, *,
                on_log: Optional[Callable[[dict, int], None]] = None, progress: bool = True) -> TrainResult:
    """Train the energy-flow model on (memory-mapped) embedding arrays; return model and telemetry.

    `on_log(metrics, step)` receives each telemetry row and each epoch's validation metrics
    (the stage points it at MLflow; tests leave it out)."""
    from tqdm.auto import tqdm

    t_cfg, m_cfg = cfg.train, cfg.model
    if t_cfg.threads:
        torch.set_num_threads(t_cfg.threads)
    torch.manual_seed(cfg.run.seed)
    device = select_device(t_cfg.device)
    dim = int(train_inputs.shape[1])
    model = EnergyFlowModel.from_config(m_cfg, dim).to(device)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=t_cfg.lr, weight_decay=t_cfg.weight_decay)
    loader = BatchLoader(train_inputs, train_targets, t_cfg.batch_size, shuffle=True, seed=cfg.run.seed,
                         drop_last=len(train_inputs) > t_cfg.batch_size, pin_memory=device.type == "cuda")
    total_steps = t_cfg.epochs * len(loader)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(t_cfg.warmup_steps, total_steps))
    result = TrainResult(model)

    win = _new_window(device)
    step, consecutive_skips, skipped_total, samples_total = 0, 0, 0, 0
    t_start = time.perf_counter()
    bar = tqdm(total=total_steps, desc="train", unit="step", disable=not progress, mininterval=1.0)
    reset_peak(device)
    for epoch in range(t_cfg.epochs):
        loader.set_epoch(epoch)
        it = iter(loader)
        while True:
            t_data = time.perf_counter()
            batch = next(it, None)
            if batch is None:
                break
            x, y = (t.to(device, non_blocking=True) for t in batch)
            win["data_s"] += time.perf_counter() - t_data
            step += 1

            out = model(x)
            loss = energy_flow_loss(out.pred, y, t_cfg.cosine_weight)
            loss.backward()
            # clip_grad_norm_ returns the pre-clip total norm; a non-finite norm leaves the
            # gradients unusable, and we skip below rather than step on them.
            norm = torch.nn.utils.clip_grad_norm_(params, t_cfg.grad_clip)
            loss_d = loss.detach()
            ok = bool(torch.isfinite(loss_d) & torch.isfinite(norm))  # the step's one host read
            if ok:
                opt.step()
                sched.step()
                consecutive_skips = 0
                win["loss"] += loss_d
                win["norm"] += norm
                win["clipped"] += norm.clamp(max=t_cfg.grad_clip)
                win["n_ok"] += 1
            else:
                consecutive_skips += 1
                skipped_total += 1
                win["skipped"] += 1
                lval, nval = float(loss_d), float(norm)
                kind = ("nan" if math.isnan(lval) else "inf") + "_loss" if not math.isfinite(lval) else \
                       ("nan" if math.isnan(nval) else "inf") + "_grad"
                bad = nonfinite_modules(model)
                result.events.append({"step": step, "kind": kind, "module": bad[0] if bad else None,
                                      "modules": bad, "action": "skipped"})
                if consecutive_skips >= t_cfg.max_consecutive_skips:
                    raise TrainingDiverged(
                        f"{consecutive_skips} consecutive non-finite steps (last at step {step}, {kind} in "
                        f"{bad[0] if bad else 'the loss'}): stopping instead of spinning. Lower train.lr, "
                        f"lower train.grad_clip, or check the input embeddings for NaN/Inf.", result)
            opt.zero_grad(set_to_none=True)
            win["flow_steps"] += out.flow_steps  # python ints: known on the host already
            win["steps_used"] += out.steps_used
            del out, loss  # nothing of this step's graph outlives it
            win["steps"] += 1
            win["samples"] += len(x)
            samples_total += len(x)
            bar.update(1)

            if step % t_cfg.log_every == 0 or step == total_steps:
                row = _close_window(win, step, epoch, opt, device)
                result.rows.append(row)
                bar.set_postfix(loss=f"{row['train/loss']:.4f}", refresh=False)
                if on_log:
                    on_log(row, step)
                win = _new_window(device)
                reset_peak(device)
        if val_inputs is not None and len(val_inputs):
            val = evaluate_loss(model, val_inputs, val_targets, t_cfg.batch_size, t_cfg.cosine_weight, device)
            val_row = {"val/loss": val["loss"], "val/cosine": val["cosine"], "epoch": epoch}
            result.summary.update({k: v for k, v in val_row.items() if k != "epoch"})
            if on_log:
                on_log(val_row, step)
    bar.close()
    wall = time.perf_counter() - t_start
    step_ms = [r["perf/step_ms"] for r in result.rows]
    finite_losses = [r["train/loss"] for r in result.rows if math.isfinite(r["train/loss"])]
    result.summary.update({
        "train/loss": finite_losses[-1] if finite_losses else float("nan"),
        "train/steps": step,
        "train/skipped_steps": skipped_total,
        "train/seconds": wall,
        "perf/samples_per_s": samples_total / wall if wall > 0 else 0.0,
        "perf/step_ms": float(np.median(step_ms)) if step_ms else 0.0,
        "flow/steps_used": float(np.mean([r["flow/steps_used"] for r in result.rows])) if result.rows else 0.0,
        "mem/rss_peak_mb": max((r["mem/rss_mb"] for r in result.rows), default=rss_mb()),
    })
    return result
