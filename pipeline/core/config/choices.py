"""The parameters' choices: one StrEnum per choice, its members the values the YAML may write.

OmegaConf maps a YAML string to a member by its name, and a StrEnum member compares, prints,
formats and JSON-encodes as that string, so `cfg.train.precision == "fp16"`, an MLflow param
("fp16", not "Precision.fp16") and the digests of settings_digest / fingerprint are what they were
when these fields were plain strings. A value that is no member is refused by the merge onto the
schema, which names the key, the value and the members (pipeline/core/config/messages.py).
"""

from enum import StrEnum


class Tracking(StrEnum):
    required = "required"
    optional = "optional"
    disabled = "disabled"


class DataFormat(StrEnum):
    auto = "auto"  # from the file's extension
    csv = "csv"
    tsv = "tsv"
    jsonl = "jsonl"
    json = "json"
    parquet = "parquet"


class SplitKey(StrEnum):
    pair = "pair"
    input = "input"
    target = "target"


class EmptyText(StrEnum):
    fail = "fail"
    skip = "skip"


class ShardDtype(StrEnum):
    float32 = "float32"
    float16 = "float16"


class Precision(StrEnum):
    auto = "auto"
    fp32 = "fp32"
    # fp32 with TF32 matmuls on CUDA (Ampere and later: 10-bit mantissa inside matmuls, fp32
    # range); the same as fp32 elsewhere. Never picked by auto: its effect on the eval has not
    # been measured against the seed spread yet.
    tf32 = "tf32"
    bf16 = "bf16"
    fp16 = "fp16"


class FlowLoop(StrEnum):
    auto = "auto"  # masked on CUDA, compact elsewhere (pipeline/model/energy_flow.py says why)
    compact = "compact"  # finished flows leave the tensors: less work, one host read per flow step
    masked = "masked"  # every flow to the end, finished ones masked: fixed shapes, no host read


class CudaGraph(StrEnum):
    auto = "auto"  # capture where it applies (CUDA, masked loop, one process); eager if capture fails
    always = "always"  # capture, and stop with an error where it cannot
    never = "never"  # launch every kernel from Python


class ScalerRecovery(StrEnum):
    standard = "standard"  # GradScaler's own back-off: scale * backoff_factor on an overflow
    prototype = "prototype"  # the prototype's recovery (docs/prototype.md): scale = max(scale * 0.1, 1)


class Residual(StrEnum):
    none = "none"  # prediction = output mapper(surface): the flows carry everything
    identity = "identity"  # prediction = input + output mapper(surface)
    linear = "linear"  # prediction = a learned linear map of the input (starts as the identity) + mapper(surface)


class FaultKind(StrEnum):
    none = "none"
    nan_loss = "nan_loss"
    inf_grad = "inf_grad"
    loss_spike = "loss_spike"
    lr_spike = "lr_spike"
    lr_jump = "lr_jump"  # lr_spike's multiplier held for longer at a lower factor: a loss regression
    leak = "leak"
    sync_bound = "sync_bound"  # host reads added to every step: a GPU left waiting on the host
