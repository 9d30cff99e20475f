"""The numbers the checks judge by, as one flat mapping: report.*, the trainer's own thresholds
(train.grad_*, train.spike_*: the trainer flags with them, and the report must judge by the same
numbers) and what the train stage measured about the run and the model (RunFacts).

Every default is conf/config.yaml's (beside the reason for each value) and every type the
schema's (ReportConfig and TrainConfig in pipeline/core/config/schema.py), or RunFacts' for the
run's facts: nothing here keeps a second copy.
"""

from __future__ import annotations

import typing
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

from pipeline.core.config import ReportConfig, TrainConfig, default_values
from pipeline.core.errors import ConfigError

TRAIN_KEYS = ("grad_warning", "grad_critical", "spike_k", "spike_window")


@dataclass(frozen=True)
class RunFacts:
    """From the train stage's metrics: the planned optimizer steps, the step a resumed run went on
    from, and the model's flow-step bounds (its cap; the fewest steps in which a flow can arrive).
    None: not known, and the checks that would use it say less."""

    planned_steps: int | None = None
    resumed_from_step: int = 0
    step_cap: int | None = None
    min_steps_to_arrive: int | None = None

    @classmethod
    def from_train_metrics(cls, train_metrics: Mapping, n_rows: int) -> RunFacts:
        """From metrics/train.json (and the perf totals); the planned steps fall back on the steps
        run, then on the telemetry's row count."""
        planned = train_metrics.get("train/planned_steps", train_metrics.get("train/steps", n_rows))
        return cls(
            planned_steps=int(planned) if planned else None,
            resumed_from_step=int(train_metrics.get("train/resumed_from_step", 0)),
            step_cap=train_metrics.get("flow/step_cap"),
            min_steps_to_arrive=train_metrics.get("flow/min_steps_to_arrive"),
        )


def _number_type(cls: type, name: str) -> type:
    """int for a field typed int (or int | None), else float."""
    hint = typing.get_type_hints(cls)[name]
    return int if hint is int or int in typing.get_args(hint) else float


def schema() -> dict[str, tuple[Any, type]]:
    """{key: (default, int or float)}: report.*, then TRAIN_KEYS, then the run's facts."""
    defaults, facts = default_values(), RunFacts()
    out = {f.name: (defaults.report[f.name], _number_type(ReportConfig, f.name)) for f in fields(ReportConfig)}
    out.update({k: (defaults.train[k], _number_type(TrainConfig, k)) for k in TRAIN_KEYS})
    out.update({f.name: (getattr(facts, f.name), _number_type(RunFacts, f.name)) for f in fields(RunFacts)})
    return out


def resolve_params(params: Mapping | None) -> dict[str, Any]:
    """Read every key the checks use (params["key"], so a DictConfig works), take the schema's
    default for a missing one and convert each to its schema type. Ranges are not checked here:
    the config schema refuses an impossible value when the config is loaded, before any stage
    runs, so the report stage and a diverged run's report get values already checked."""
    out: dict[str, Any] = {}
    for key, (default, number) in schema().items():
        try:
            value = params[key] if params is not None else None
        except (KeyError, AttributeError, TypeError):
            value = None
        if value is None:
            out[key] = default
            continue
        try:
            out[key] = number(value)
        except (TypeError, ValueError):
            raise ConfigError(f"report param {key}={value!r}: expected a number") from None
    return out


def run_params(cfg, train_metrics: Mapping, n_rows: int) -> dict[str, Any]:
    """The checks' parameters of a run: the validated config's report.* and TRAIN_KEYS of
    train.*, and the run's facts from the train stage's metrics."""
    facts = RunFacts.from_train_metrics(train_metrics, n_rows)
    return {**dict(cfg.report), **{k: cfg.train[k] for k in TRAIN_KEYS}, **asdict(facts)}
