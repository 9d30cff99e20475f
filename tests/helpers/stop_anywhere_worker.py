"""Call stages/_cli.run_stage N times in this process, each with a SIGTERM sent to this process
at a random moment of the call (a timer thread), and a body that fails with a PipelineError
after a random pause: the stop lands before, during and after the body, while the error is
reported and while the stage ends, as it does for a rank that a launcher stops because another
rank failed first. A SIGTERM that arrives after run_stage returned reaches this worker's own
handler (run_stage puts it back) and is counted as late. Prints one JSON line: the exit codes
seen and the late count. Usage: python -m tests.helpers.stop_anywhere_worker N SEED"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time
from collections import Counter

from pipeline.core.errors import PipelineError
from stages._cli import run_stage

late = 0


def count_late(signum, frame):
    global late
    late += 1


def main(n: int, seed: int) -> int:
    rng = random.Random(seed)
    signal.signal(signal.SIGTERM, count_late)
    codes: Counter = Counter()
    # Once with no stop first: a stop inside an import would leave a half-imported module for
    # the next call of this loop, which a stage's one call per process never meets.
    run_stage("report", "a test stage", "run", lambda cfg: None, ["run.tracking=disabled"])
    # A warm call's duration, and the body's longest pause, span the moments the stops are drawn from.
    start = time.perf_counter()
    run_stage("report", "a test stage", "run", lambda cfg: None, ["run.tracking=disabled"])
    span = (time.perf_counter() - start) * 1.05 + 0.02
    for _ in range(n):
        pause = rng.uniform(0.0, 0.02)

        def body(cfg, pause=pause):
            time.sleep(pause)
            print("[report] some output before the failure", file=sys.stderr)
            raise PipelineError("an injected failure (as a bad dataset on every rank)")

        timer = threading.Timer(rng.uniform(0.0, span), os.kill, (os.getpid(), signal.SIGTERM))
        timer.start()
        codes[run_stage("report", "a test stage", "run", body, ["run.tracking=disabled"])] += 1
        timer.join()
        time.sleep(0.002)  # a signal sent just before join returned is handled here
    print(json.dumps({"codes": {str(k): v for k, v in codes.items()}, "late": late}))
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2])))
