"""Arithmetic that gives the same bits on every CPU, where torch's own kernel does not.

ATen sends a CPU float tensor's sqrt to MKL's vector math. Under MKL_CBWR=COMPATIBLE (the
portable setting, pipeline/core/numerics.py) MKL's kernel for it, float and double alike, starts
from the RSQRTPS instruction and refines it: RSQRTPS's bits are the CPU vendor's own, and the
refined root is off by one unit in the last place for some inputs, so the same run gives other
numbers on an Intel and an AMD machine. (MKL's tanh, the other vector-math function a run calls,
is built from exact instructions only.) numpy's sqrt is the IEEE instruction, correctly rounded
on every x86 CPU. Torch is imported inside, as this package must not load it before `pin()`.
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
