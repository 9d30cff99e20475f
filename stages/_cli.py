"""What every stage entry point shares: --help, config loading, and errors a user can act on."""

from __future__ import annotations

import logging
import signal
import sys
from typing import Callable

from omegaconf import OmegaConf

from pipeline.core import distributed, output_dirs, output_lock
from pipeline.core.config import describe, load_config
from pipeline.core.environment import check_environment
from pipeline.core.errors import ConfigError, PipelineError, Terminated
from pipeline.core.paths import reading_rule, repo_path
from pipeline.core.preflight import preflight
from pipeline.tracking import store as tracking
from stages.startup import end_startup

USAGE = """usage: python -m stages.{name} [OVERRIDE ...]

{doc}
Configuration comes from params.yaml at the repository root (what DVC tracks). Each OVERRIDE is
Hydra syntax, KEY=VALUE with a dotted key, e.g. train.lr=3e-4 or model.lattice_depth=4.
preset=NAME composes conf/ with conf/preset/NAME.yaml instead (as `dvc exp run -S preset=NAME`);
fault=NAME adds a deliberate fault from conf/fault/ (nan_loss, inf_grad, loss_spike, lr_spike, lr_jump,
leak, sync_bound).
This stage reads: {sections}. An unknown key, a wrong type or an impossible value stops the
stage before any work, naming the key.

Parameters: KEY = DEFAULT (TYPE; ALLOWED VALUES), then what it means. Defaults are conf/config.yaml's
(params.yaml may hold a preset's); type, range and meaning are declared in pipeline/core/config/schema.py.
{parameters}

Tracking:     MLflow at MLFLOW_TRACKING_URI (unset: mlflow.db in the project). A server that does not
              answer stops the stage at its start; run.tracking=optional goes on untracked, =disabled
              never asks.
Paths:        every path read or written stays in the project unless run.allow_external_paths=true.
              A stage writes only into a directory it made (marked .energy-flow-output.json), an
              empty one or a new one, never over the dataset, the code or another output; under
              DVC the outputs are data/shards and models, as dvc.yaml declares.

Through DVC:  dvc repro {name}            (runs what is out of date up to this stage)
              dvc exp run -S train.lr=3e-4 (an experiment with one parameter changed)
{distributed}"""
DISTRIBUTED = """
Distributed:  {key}=N runs N processes on this machine under torchrun (torch.distributed);
              or start them yourself, on one node or many:
              torchrun --nproc-per-node N [--nnodes M --rdzv-backend c10d --rdzv-endpoint HOST:PORT]
                       -m stages.{name} [OVERRIDE ...]
"""


def run_stage(
    name: str,
    doc: str,
    sections: str,
    body: Callable,
    argv: list[str] | None = None,
    nproc_key: str | None = None,
    costs: Callable | None = None,
) -> int:
    """Parse, validate and run `body(cfg)`. With the config's `nproc_key` (train.nproc) > 1 and no
    torchrun around this process yet, start that many copies of the stage under torchrun instead
    (after validating, so a bad key fails once, before any process starts). `costs(cfg, processes)`:
    the stage's own estimate of what its config needs (pipeline/core/preflight.py), run with the
    cores check before any work, in the process that starts it (a rank under torchrun only checks
    its cores: the launcher, or the user's torchrun, started it)."""
    end_startup(name)  # a Ctrl-C held while the stage imported ends it here
    args = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in args):
        extra = DISTRIBUTED.format(key=nproc_key, name=name) if nproc_key else ""
        params = describe(sections)
        print(USAGE.format(name=name, doc=doc.strip(), sections=sections, parameters=params, distributed=extra))
        return 0
    try:
        check_environment()  # before distributed.from_env() reads the rank variables
    except ConfigError as e:
        print(f"[{name}] config error: {e}", file=sys.stderr)
        return 2
    module, place, stage = f"stages.{name}", distributed.from_env(), name
    logging.basicConfig(level=logging.INFO, format=f"[{name}] %(message)s")
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    name = distributed.configure_rank_output(name, place)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, _raise_terminated)
        return _run(name, stage, module, place, args, body, nproc_key, costs)
    except BaseException as e:
        # A SIGTERM outside the body's own handling (while the stage reported an error, or
        # ended: a rank the launcher stops because another rank failed first gets one there), or
        # one that a library's cleanup turned into an error of its own (Hydra's config reader
        # closes a file it never opened). The stage's own message, if any, is out; the stop
        # says nothing more.
        stop = _terminated_in(e)
        if stop is None:
            raise
        return 128 + stop.signum
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(name, stage, module, place, args, body, nproc_key, costs) -> int:
    cfg = None
    session = tracking.TrackingSession()  # this stage's own: nothing carries over to the next stage
    with tracking.active(session):
        try:
            cfg = load_config(args)
            session.sweep = cfg.run.sweep or ""  # tags every MLflow run this stage starts or adds to
            # Before any work, and before torchrun starts ranks: where the stages write (pipeline/core/output_dirs.py).
            output_dirs.check_outputs(cfg, stage)
            processes = OmegaConf.select(cfg, nproc_key) if nproc_key else 1
            ranked = distributed.under_launcher()
            launching = processes > 1 and not ranked
            # The tracking store next: a typo in its URI or a server that does not answer is named
            # whatever the inputs are, before anything reads them. A launcher only checks (rank 0
            # tracks, once, before any rank starts); the other ranks never probe the server.
            if not launching:
                tracking.configure(cfg.run.tracking if place.is_main else "disabled")
            elif cfg.run.tracking == "required":
                tracking.configure("required")
            # What the config costs, before any work and before any rank starts.
            preflight(cfg, stage, place.local_world_size if ranked else processes, None if ranked else costs)
            # One writer per output: a second stage writing the same outputs fails here, naming the first.
            with output_lock.writing(output_lock.stage_outputs(cfg, stage) if place.is_main else []):
                if launching:
                    with output_lock.held_for_ranks():
                        return distributed.launch(processes, module, args, name)
                with reading_rule(cfg.run.allow_external_paths):  # what every reader checks (pipeline/core/paths.py)
                    body(cfg)
        except ConfigError as e:
            print(f"[{name}] config error: {e}", file=sys.stderr)
            return 2
        except PipelineError as e:
            print(f"[{name}] error: {e}", file=sys.stderr)
            return 1
        except OSError as e:
            # The file system said no (permissions, a read-only disk, a path that vanished): the file and
            # the reason, not a traceback.
            where = f"{e.filename}: " if e.filename else ""
            reason = f"{where}{e.strerror or e} (errno {e.errno})"
            print(f"[{name}] error: {reason}; the stage stopped there", file=sys.stderr)
            return 1
        except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: whatever was started is flushed and ended
            signum = e.signum if isinstance(e, Terminated) else signal.SIGINT
            # Rank 0 owns the run and the checkpoints.
            what = _stopped_what(stage, cfg, session) if place.is_main else ""
            print(f"[{name}] stopped by {signal.Signals(signum).name}{what}", file=sys.stderr)
            return 128 + signum
        except Exception as e:
            if not _from_mlflow(e):
                raise
            # The tracking store refused a request the checks before the work could not foresee
            # (a run deleted meanwhile, a permission): what it said, in one line.
            from pipeline.tracking.redact import redact_text

            said = (str(e).strip().splitlines() or [type(e).__name__])[0]
            print(
                f"[{name}] error: the MLflow tracking store {redact_text(tracking.tracking_uri())} refused: "
                f"{redact_text(said)[:500]} ({type(e).__name__}); the stage stopped there",
                file=sys.stderr,
            )
            return 1
        return 0


def _terminated_in(e: BaseException | None) -> Terminated | None:
    """The SIGTERM behind `e`: `e` itself, or the exception it was raised while handling."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, Terminated):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def _from_mlflow(e: BaseException) -> bool:
    """An error MLflow raised (mlflow.exceptions.MlflowException and its kinds, RestException),
    told apart without importing MLflow into every stage's start."""
    return any(c.__module__.split(".")[0] == "mlflow" for c in type(e).__mro__)


def _stopped_what(stage: str, cfg, session: tracking.TrackingSession) -> str:
    """What a stop left, as it is: only what did happen (a run ended KILLED, a checkpoint kept)."""
    if cfg is None:
        return " while reading its configuration: nothing was done"
    parts = []
    if session.killed_runs:
        parts.append(f"its metrics so far were sent and MLflow run {session.killed_runs[-1]} ended KILLED")
    elif cfg.run.tracking == "disabled" or not session.enabled:
        parts.append("tracking is off (run.tracking), so nothing was sent to MLflow")
    else:
        parts.append("before its MLflow run started")
    if stage == "train":
        ckpt = repo_path(cfg.train.checkpoint_dir) / output_dirs.CHECKPOINTS.files[0]
        if ckpt.is_file():
            parts.append(f"train resumes from its checkpoint {ckpt} when run again")
    return ": " + "; ".join(parts)


def _raise_terminated(signum, frame):
    # One stop is enough: further SIGTERMs (a launcher stopping every rank, then again) are
    # ignored while the stage flushes and ends its run and prints one line; run_stage puts the
    # previous handler back when it returns. SIGINT and SIGKILL still end it at once.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated(signum)
