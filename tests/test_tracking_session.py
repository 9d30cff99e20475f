"""The tracking session: the state of one stage's tracking (on or off, its sweep, the run it adds
to, the runs it ended KILLED) is an object the stage owns, not module state a stage must reset."""

import pytest

from pipeline.tracking import store as tracking
from stages._cli import run_stage

pytestmark = pytest.mark.unit


def test_a_session_is_active_only_inside_its_block_and_the_one_before_comes_back():
    outer = tracking.session()
    inner = tracking.TrackingSession(enabled=False, sweep="lr")
    with tracking.active(inner) as got:
        assert got is inner and tracking.session() is inner
        assert not tracking.enabled() and tracking.sweep_tags() == {"sweep.lr": "workspace", "sweep": "lr"}
    assert tracking.session() is outer and tracking.enabled() and tracking.sweep_tags() == {}


def test_configure_and_set_sweep_change_the_active_session_only():
    mine = tracking.TrackingSession()
    with tracking.active(mine):
        tracking.configure("disabled")
        tracking.set_sweep("s1")
    assert (mine.enabled, mine.sweep) == (False, "s1")
    assert tracking.enabled() and tracking.session().sweep == ""


def test_a_stage_leaves_no_tracking_state_behind_for_the_next(monkeypatch):
    """A stage run in-process with tracking off and a sweep set (as the tests run several stages in
    one process): what it switched ends with it, without anyone resetting anything."""
    seen = []

    def body(cfg):
        seen.append((tracking.enabled(), tracking.session().sweep))

    argv = ["run.tracking=disabled", "run.sweep=lr"]
    assert run_stage("report", "a test stage", "", body, argv=argv) == 0
    assert seen == [(False, "lr")]
    assert tracking.enabled() and tracking.session().sweep == "" and tracking.session().killed_runs == []


def test_without_an_opened_session_code_gets_a_default_one_for_its_context():
    import contextvars

    def fresh():
        first = tracking.session()
        return first is tracking.session(), first.enabled, first.sweep, first.adding_to

    assert contextvars.Context().run(fresh) == (True, True, "", "")
