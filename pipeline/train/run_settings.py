"""The process-wide torch settings a training run needs: set for the run, left as found after it;
and anomaly detection for a step."""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch

from pipeline.core import numerics
from pipeline.core.distributed import Dist, threads_per_process
from pipeline.core.errors import PipelineError
from pipeline.train.cuda_graph import tf32_matmuls


@contextlib.contextmanager
def run_settings(t, place: Dist, device: torch.device, amp_dtype: Optional[torch.dtype]) -> Iterator[None]:
    """Intra-op threads, deterministic algorithms, TF32 matmuls and oneDNN, from train.* (`t`)."""
    threads = torch.get_num_threads()
    deterministic = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    mkldnn = torch.backends.mkldnn.enabled
    # The configured count; else the portable numerics' fixed one (pipeline/core/numerics.threads);
    # else, natively, one process keeps torch's default and a rank gets its share of the cores.
    if t.threads or place.enabled or numerics.threads():
        torch.set_num_threads(threads_per_process(t.threads, place))
    if t.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    tf32 = tf32_matmuls(t.precision == "tf32" and device.type == "cuda")
    if amp_dtype is not None and device.type == "cpu":
        # fp16/bf16 matmuls on CPU go through oneDNN, whose kernel caches keep an entry per matmul
        # shape; live flows change the shapes every step, so the process's memory climbed through
        # a run and the report rightly called it a leak. Without oneDNN it stays flat, at a small
        # cost in fp16 step time. Plain assignment: the flags() context manager warns about TF32
        # on this build. (fp32 never uses these kernels.)
        torch.backends.mkldnn.enabled = False
    try:
        with tf32:
            yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
        torch.backends.mkldnn.enabled = mkldnn


@contextlib.contextmanager
def anomaly_detection(step: int, t) -> Iterator[None]:
    """torch's anomaly detection over the first train.detect_anomaly_steps steps; an error it
    raises stops the run, naming the setting."""
    anomaly = step <= t.detect_anomaly_steps
    with torch.autograd.set_detect_anomaly(anomaly, check_nan=True):
        try:
            yield
        except RuntimeError as e:
            if not anomaly:
                raise
            raise PipelineError(
                f"step {step}: anomaly detection (train.detect_anomaly_steps={t.detect_anomaly_steps}) stopped "
                f"the run: {e}. The traceback printed above it shows the forward operation that produced the value."
            ) from None
