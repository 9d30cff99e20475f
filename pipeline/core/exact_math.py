"""Arithmetic that gives the same bits on every CPU, where torch's own kernel does not.

ATen sends a CPU float tensor's sqrt to MKL's vector math, whose kernel under the portable
setting starts from the RSQRTPS instruction, whose bits are the CPU vendor's own
(docs/evaluation.md); numpy's sqrt is the IEEE instruction, correctly rounded on every x86 CPU.
Torch is imported inside, as this package must not load it before `pin()`.
"""

from __future__ import annotations

_NUMPY_DTYPES = ("float16", "float32", "float64")


def exact_sqrt(t):
    """The correctly rounded square root of `t`, a tensor that does not require grad. On the CPU it is
    numpy's; elsewhere torch's (CUDA's sqrt is the correctly rounded IEEE one already)."""
    import numpy as np
    import torch

    if t.device.type != "cpu" or str(t.dtype).removeprefix("torch.") not in _NUMPY_DTYPES:
        return t.sqrt()
    # Hidden from torch-function modes: on the host this reads no device, and on a GPU the
    # branch above runs, so the step counters (pipeline/train/step_counters.py) must not count it
    # as a host read. (Nor is it an aten op: a CPU step counts one op fewer per root than a GPU's.)
    with torch._C.DisableTorchFunction():
        a = t.numpy()
    return torch.from_numpy(np.sqrt(a, out=np.empty_like(a)))  # out=: a 0-d input stays an array
