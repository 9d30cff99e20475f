"""What a clean run's stability report must say, exactly: every check passes or warns, so the
verdict is "stable". The one exception is the machine's own load: a wall-clock check
(pipeline.report.checks.WALL_CLOCK_CHECKS, the step-time ratio of a run whose steps take a few ms)
may fail on a busy shared machine, and then the verdict is "unstable" for that reason alone."""

from __future__ import annotations

from pipeline.report.checks import WALL_CLOCK_CHECKS


def _judge(failed: list[str], verdict: str) -> str:
    assert [f for f in failed if f not in WALL_CLOCK_CHECKS] == [], f"a clean run failed {failed}"
    assert verdict == ("unstable" if failed else "stable"), (verdict, failed)
    return verdict


def assert_clean_report(stability: dict) -> str:
    """metrics/stability.json (or the evidence file) of a clean run; returns its verdict."""
    failed = sorted(name for name, c in stability.items() if isinstance(c, dict) and c.get("status") == "fail")
    return _judge(failed, stability["verdict"])


def assert_clean_tags(tags: dict) -> str:
    """The model run's MLflow tags stability.verdict / stability.failed of a clean run. The tag
    tells a run with warnings from a clean one ("stable, with warnings": the smoke model is worse
    than the identity baseline, which the learning check warns about); returns the two-valued
    verdict."""
    failed = [] if tags["stability.failed"] == "none" else tags["stability.failed"].split(",")
    warned = tags["stability.warned"] != "none"
    expected = "unstable" if failed else ("stable, with warnings" if warned else "stable")
    assert tags["stability.verdict"] == expected, (tags["stability.verdict"], failed, warned)
    return _judge(failed, "unstable" if failed else "stable")
