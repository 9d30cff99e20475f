"""The model's forward and backward for the trainer: eagerly, or captured once as CUDA graphs.

On a GPU the eager flow loop is launch-bound: a training step is thousands of tiny kernels, each
launched from Python, and the GPU idles between them. The masked flow loop (fixed shapes, the
stopping rule decided on the device, no host read) can be captured: `torch.cuda.
make_graphed_callables` records the forward and the backward once and replays each with one
launch. The optimizer, the loss and the gradient-health read-out stay eager (a few dozen
launches).

A graph replays exactly what it recorded, so it is captured per flow-step count and precision
(a change of the trainer's fixed flow-step count captures anew) for the first batch's shape; a
batch of another shape (a last short one) runs eagerly. Where capture does not apply (off CUDA,
the compacting loop, several processes, gradient accumulation, anomaly detection, activation
checkpointing) the forward is eager and `why_eager` says why. Each capture is checked
once against the eager forward on the same batch; a capture that fails or disagrees is dropped
with a warning (train.cuda_graph=auto) or stops the run (always).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Optional

import torch
from torch import nn

from pipeline.core.errors import PipelineError
from pipeline.model.energy_flow import EnergyFlowModel, FlowOutput

log = logging.getLogger(__name__)
CHECK_RTOL, CHECK_ATOL = 1e-4, 1e-5  # a capture against the eager forward (float sums reordered)


class _FixedFlow(nn.Module):
    """The model's forward as a module that returns tensors only (what capture needs). It always
    records the value ranges (a few reductions per flow step, nearly free inside a graph), so a
    log step, which reads them, replays the same graph as any other step."""

    def __init__(self, model: EnergyFlowModel):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor):
        asked, self.model.record_ranges = self.model.record_ranges, True
        try:
            out = self.model(x)
        finally:
            self.model.record_ranges = asked
        return out.pred, out.steps_used, out.flow_steps, out.stragglers, out.unfinished, out.ranges


def why_eager(
    model: EnergyFlowModel, device: torch.device, *, processes: int, grad_accum: int, anomaly: bool
) -> list[str]:
    """The reasons this run cannot capture its forward (none: it can)."""
    reasons = []
    if device.type != "cuda":
        reasons.append(f"the device is {device.type}, not CUDA")
    elif not model.uses_masked_loop(device):
        reasons.append("the flow loop is the compacting one (train.flow_loop=compact)")
    if processes > 1:
        reasons.append(f"{processes} processes (DDP's gradient hooks are not captured)")
    if grad_accum > 1:
        reasons.append("train.grad_accum > 1 (a replay overwrites the previous micro-batch's gradients)")
    if anomaly:
        reasons.append("anomaly detection is on (train.detect_anomaly_steps)")
    if model.checkpoint_steps:
        reasons.append("activation checkpointing is on (model.checkpoint_steps)")
    return reasons


class FlowRunner:
    """Calls the model's forward for one training micro-batch, through a captured graph when one
    applies."""

    def __init__(self, model: EnergyFlowModel, forward, device: torch.device, mode: str, reasons: list[str]):
        self.model, self.forward, self.device = model, forward, device
        if mode == "always" and reasons:
            raise PipelineError(
                "train.cuda_graph=always, but this run cannot capture its forward: "
                + "; ".join(reasons)
                + ". Use train.cuda_graph=auto to run eagerly where capture does not apply."
            )
        self.mode = mode
        self.enabled = mode != "never" and not reasons
        self.why_not = "train.cuda_graph=never" if mode == "never" else "; ".join(reasons)
        self._graphs: dict[tuple, nn.Module] = {}
        self._shape: Optional[tuple] = None  # the batch shape graphs are captured for
        if device.type == "cuda" and not self.enabled:
            log.info("the flow loop runs without CUDA graphs: %s", self.why_not)

    def autocast_cache(self) -> bool:
        """Autocast's weight-cast cache must be off while graphs are captured and replayed."""
        return not self.enabled

    def __call__(self, x: torch.Tensor, amp_dtype: Optional[torch.dtype]) -> FlowOutput:
        if not self.enabled:
            return self.forward(x)
        if self._shape is not None and tuple(x.shape) != self._shape:
            return self.forward(x)  # a last short batch: not worth a graph of its own
        key = (tuple(x.shape), x.dtype, self.model.fixed_steps, amp_dtype)
        graphed = self._graphs.get(key)
        if graphed is None:
            graphed = self._capture(x, key)
            if graphed is None:
                return self.forward(x)
        pred, steps_used, flow_steps, stragglers, unfinished, ranges = graphed(x)
        spawned = x.shape[0] * self.model.flows_per_sample(x.shape[0])
        ranges = ranges if self.model.record_ranges else None
        return FlowOutput(pred, None, steps_used, flow_steps, spawned, stragglers, ranges, unfinished)

    def _capture(self, x: torch.Tensor, key: tuple) -> Optional[nn.Module]:
        # A new flow-step count or shape replaces the old graphs: keep one set of static buffers.
        self._graphs.clear()
        try:
            module = _FixedFlow(self.model)
            sample = x.detach().clone()
            torch.cuda.synchronize(self.device)
            graphed = torch.cuda.make_graphed_callables(module, (sample,), num_warmup_iters=3)
            with torch.no_grad():
                got = graphed(sample)[0].float()
                want = self.forward(sample).pred.float()
            if not torch.allclose(got, want, rtol=CHECK_RTOL, atol=CHECK_ATOL):  # once per capture
                diff = (got - want).abs().max().item()
                raise RuntimeError(f"the captured forward differs from the eager one by {diff:.3g}")
        except Exception as e:  # noqa: BLE001 - any capture failure: say so and run eagerly (auto)
            if self.mode == "always":
                raise PipelineError(
                    f"train.cuda_graph=always: capturing the flow loop failed: {e}. "
                    "Use train.cuda_graph=auto (eager where capture fails) or never."
                ) from e
            log.warning("CUDA graph capture failed (%s): training eagerly; set train.cuda_graph=never to skip it", e)
            self.enabled = False
            self.why_not = f"capture failed: {e}"
            return None
        self._shape = key[0]
        self._graphs[key] = graphed
        log.info("captured the flow loop as CUDA graphs (batch %s, %s flow steps)", key[0], key[2])
        return graphed


@contextlib.contextmanager
def tf32_matmuls(enabled: bool):
    """TF32 for matmuls and cuDNN inside (train.precision=tf32), as found outside."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    if enabled:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
