"""Signals held until the training step in flight is done (pipeline/train/stop_signals.py)."""

import os
import signal

import pytest

from pipeline.core.errors import Terminated
from pipeline.train.stop_signals import DeferredStop

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def foreground_signals():
    """As in a foreground process: pytest run in the background (`cmd &`) inherits SIGINT ignored."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def test_a_signal_is_held_and_raised_when_asked_and_the_handlers_come_back():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    with DeferredStop() as stop:
        assert not stop.requested
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested and stop.signum == signal.SIGTERM  # held: nothing raised yet
        with pytest.raises(Terminated) as e:
            stop.raise_()
        assert e.value.signum == signal.SIGTERM
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_second_signal_stops_at_once_and_ctrl_c_is_a_keyboard_interrupt():
    with DeferredStop() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)  # the impatient second Ctrl-C
        with pytest.raises(KeyboardInterrupt) as e:
            stop.raise_()
        assert not isinstance(e.value, Terminated)


def test_an_ignored_signal_stays_ignored():
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a background job's Ctrl-C
    with DeferredStop() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert not stop.requested
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
