"""The checks' result as metrics: the DVC metrics file (metrics/stability.json: no time or memory
figures, so two runs of the same settings give the same bytes) and the full evidence (MLflow,
reports/stability_evidence.json)."""

from __future__ import annotations

import math
from typing import Any, Mapping

from pipeline.report.checks.result import plain
from pipeline.report.checks.suite import CHECK_ORDER, MEASURED_CHECKS

# Of the measured checks, the judgements of wall-clock time, which the machine's load can decide:
# on a shared 2-core machine a neighbour busy during half of a smoke run (steps of a few ms) is
# enough to lift the steady/early median above step_time_max_ratio, in a run whose ratio is
# close to 1 on an idle machine; the GPU's busy share is a share of wall time, which a busy host
# (or a neighbour on the GPU) lowers. Whatever compares two runs' reports (the fault matrix, the
# kill test) must not read a difference here as a diagnosis unless it asked for it. The checks
# themselves are tested on synthetic telemetry (tests/test_report_checks.py,
# tests/test_device_check.py); real step time is measured by bench/trainer.py, against a probe.
WALL_CLOCK_CHECKS = ("step_time_degradation", "device_utilisation")
MEASURED_EVIDENCE = ("_mb", "_ms", "samples_per_s", "seconds")
# Of a measured check's evidence, the counts: the same on every run of the same settings (the
# host reads and ops of a sampled step; the synthetic flag, set by the fault and the device), so
# they stay in the DVC metrics file, where `dvc metrics diff` shows what a change did to them.
# Kernel counts are the profiler's and can change with the libraries' choice of kernels: left out.
COUNTED_EVIDENCE = {"device_utilisation": frozenset({"host_syncs_per_step", "ops_per_step", "synthetic"})}


def is_measured(check: str, key: str) -> bool:
    """Is this evidence figure a measurement of time or memory (kept out of the DVC metrics)?"""
    if any(part in key for part in MEASURED_EVIDENCE):
        return True
    return check in MEASURED_CHECKS and key not in COUNTED_EVIDENCE.get(check, ())


def stability_metrics(result: Mapping, measured: bool = False) -> dict:
    """Verdict plus, per check, pass/status and its numeric evidence (bools kept; non-finite
    floats become None so the JSON stays strict). Without `measured` (the DVC metrics file) the
    evidence that is a measurement of time or memory (MEASURED_CHECKS but for their counts,
    COUNTED_EVIDENCE; MEASURED_EVIDENCE) is left out; with it (MLflow,
    reports/stability_evidence.json) everything is in."""
    out: dict[str, Any] = {"verdict": result["verdict"]}
    names = [n for n in CHECK_ORDER if n in result["checks"]]
    names += [n for n in result["checks"] if n not in names]
    for name in names:
        check = result["checks"][name]
        m: dict[str, Any] = {"pass": bool(check["pass"]), "status": check["status"]}
        for key, value in check["evidence"].items():
            if not measured and is_measured(name, key):
                continue
            value = plain(value)
            if isinstance(value, bool) or isinstance(value, int):
                m[key] = value
            elif isinstance(value, float):
                m[key] = value if math.isfinite(value) else None
        out[name] = m
    return out
