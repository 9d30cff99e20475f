"""SIGTERM and Ctrl-C during training, held until the step in flight is done.

Raised at once (as stages/_cli.py does everywhere else), the signal can land inside the optimizer
step, with some parameters updated and others not: a checkpoint written then would not be a
state any run passes through. Held, the trainer finishes the step (one step: short next to a
human's patience, even on the largest preset), writes a checkpoint there and then stops with the same exception. A
second signal while one is held stops at once: someone wants out now. `DeferredStop` is that
part of the loop (pipeline/train/parts.py).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator, Optional

from pipeline.core.errors import Terminated
from pipeline.train.parts import Step, TrainPart

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class DeferredStop(TrainPart):
    """`with DeferredStop() as stop:` ... `if stop.requested: ...; stop.raise_()`. As a part of the
    loop it holds the signals while the run runs; at the end of the step one arrived in, the run
    ends (its open window logged, a checkpoint written: Checkpointing.on_end) and stops."""

    def __init__(self):
        self.signum: Optional[int] = None
        self._saved: dict = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def __enter__(self) -> "DeferredStop":
        # Handlers can only be set from the main thread; elsewhere the signals act as before. An
        # ignored signal stays ignored: a shell starts background jobs with SIGINT ignored, and
        # Ctrl-C in that terminal is not meant for them.
        if threading.current_thread() is threading.main_thread():
            held = [s for s in SIGNALS if signal.getsignal(s) is not signal.SIG_IGN]
            self._saved = {s: signal.signal(s, self._hold) for s in held}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._saved.items():
            signal.signal(s, handler)
        self._saved = {}

    def _hold(self, signum: int, frame) -> None:
        if self.signum is not None:
            self._raise(signum)
        self.signum = signum

    @contextlib.contextmanager
    def running(self, tr) -> Iterator[None]:
        with self:
            try:
                yield
            except RuntimeError:
                # The ranks get a stop signal together but each sees it at the end of its own step:
                # a rank that stopped a step ahead leaves this one's collective without its peer
                # (gloo: "Connection closed by peer"). That is the stop this rank was asked for too.
                if self.requested and tr.place.enabled:
                    self.raise_()
                raise

    def on_step_end(self, tr, s: Step) -> None:
        if self.requested:
            tr.end("stop")
            self.raise_()

    def raise_(self) -> None:
        """Stop with the held signal's exception: Terminated for SIGTERM, KeyboardInterrupt for Ctrl-C."""
        self._raise(self.signum)

    @staticmethod
    def _raise(signum: int) -> None:
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Terminated(signum)
