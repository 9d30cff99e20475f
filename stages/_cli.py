"""What every stage entry point shares: --help, config loading, and errors a user can act on."""
from __future__ import annotations

import logging
import signal
import sys
from typing import Callable

from pipeline.config import load_config
from pipeline.errors import ConfigError, PipelineError, Terminated

USAGE = """usage: python -m stages.{name} [OVERRIDE ...]

{doc}
Configuration comes from params.yaml at the repository root (what DVC tracks). Each OVERRIDE is
Hydra syntax, KEY=VALUE with a dotted key, e.g. train.lr=3e-4 or model.lattice_depth=4.
preset=NAME composes conf/ with conf/preset/NAME.yaml instead (as `dvc exp run -S preset=NAME`);
fault=NAME adds a deliberate fault from conf/fault/ (nan_loss, inf_grad, loss_spike, lr_spike, leak).
This stage reads: {sections}. An unknown key, a wrong type or an impossible value stops the
stage before any work, naming the key.

Through DVC:  dvc repro {name}            (runs what is out of date up to this stage)
              dvc exp run -S train.lr=3e-4 (an experiment with one parameter changed)
"""


def run_stage(name: str, doc: str, sections: str, body: Callable, argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in args):
        print(USAGE.format(name=name, doc=doc.strip(), sections=sections))
        return 0
    logging.basicConfig(level=logging.INFO, format=f"[{name}] %(message)s")
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        cfg = load_config(args)
        body(cfg)
    except ConfigError as e:
        print(f"[{name}] config error: {e}", file=sys.stderr)
        return 2
    except PipelineError as e:
        print(f"[{name}] error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: everything is flushed, the run is KILLED
        signum = e.signum if isinstance(e, Terminated) else signal.SIGINT
        print(f"[{name}] stopped by {signal.Signals(signum).name}: buffered metrics were sent and the MLflow "
              "run ended KILLED (train resumes from its last checkpoint when run again)", file=sys.stderr)
        return 128 + signum
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


def _raise_terminated(signum, frame):
    raise Terminated(signum)
