"""A benchmark's result as a committed source of the figures that docs quote.

Every bench prints one JSON object; with `--save` it also writes bench/results/<bench>.json:

    {"bench": "model", "command": "python -m bench.model", "date": "...", "torch": "...",
     "cpu_model": "...", "gpu_model": null, "figures": {...}, "unreliable": {...}, "result": {...}}

`figures` holds the bench's headline figures, each measured so that it holds on a busy machine
(bench/clock.py), or null when it cannot be (its reason then in `unreliable`); `result` is the
whole printed object. Docs cite a figure by path and key (bench/figures.py), and
bench/agreement.py compares two sets of saved results figure by figure.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import math
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Optional

from pipeline.core.numerics import cpu_model
from pipeline.core.paths import REPO_ROOT

RESULTS_DIR = REPO_ROOT / "bench" / "results"


def say(bench: str, msg: str) -> None:
    """A progress line on stderr: stdout's last line is the result."""
    print(f"[bench.{bench}] {msg}", file=sys.stderr, flush=True)


def child_json(args: list[str], what: str, timeout: float) -> dict:
    """`python ARGS` run from the repository root (a part a bench measures in a fresh process):
    the JSON object of its last stdout line; its failure is an error ending with its stderr's."""
    proc = subprocess.run([sys.executable, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)
    if proc.returncode:
        raise RuntimeError(f"{what} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def add_save_flag(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--save",
        nargs="?",
        const="",
        default=None,
        metavar="PATH",
        help="also write the result, with its figures, the machine, the date, torch's version and "
        "this command, to bench/results/<bench>.json (or PATH): the source docs quote",
    )


def default_path(bench: str) -> Path:
    return RESULTS_DIR / f"{bench}.json"


def command(bench: str, argv: Optional[list[str]]) -> str:
    """The command that made the result, without --save (bench/agreement.py reruns it)."""
    args = list(sys.argv[1:] if argv is None else argv)
    kept, skip = [], False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a == "--save":
            # Its optional PATH is the next argument when that is not another option.
            skip = i + 1 < len(args) and not args[i + 1].startswith("-")
            continue
        if a.startswith("--save="):
            continue
        kept.append(a)
    return shlex.join(["python", "-m", f"bench.{bench}", *kept])


def gpu_model(result: dict) -> Optional[str]:
    """The GPU the bench ran on, where it ran on one (the benches that can name it)."""
    return result.get("gpu_model")


def clean(value):
    """JSON without NaN or infinity (not valid JSON): those become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


def record(bench: str, result: dict, argv: Optional[list[str]] = None) -> dict:
    import torch

    return clean(
        {
            "bench": bench,
            "command": command(bench, argv),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "torch": torch.__version__,
            "cpu_model": cpu_model(),
            "gpu_model": gpu_model(result),
            "figures": result.get("figures", {}),
            "unreliable": result.get("unreliable", {}),
            "result": result,
        }
    )


def finish(bench: str, result: dict, save: Optional[str], argv: Optional[list[str]] = None) -> dict:
    """Prints the result as the bench's last stdout line and, with --save, writes its record."""
    print(json.dumps(result))
    if save is not None:
        path = Path(save) if save else default_path(bench)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record(bench, result, argv), indent=1, sort_keys=False) + "\n")
        print(f"[bench.{bench}] saved {path}", file=sys.stderr)
    return result


def figures(values: dict, unreliable: Optional[dict] = None) -> dict:
    """The `figures` and `unreliable` keys of a result: a figure with a reason in `unreliable` is
    null, whatever was measured."""
    unreliable = {k: v for k, v in (unreliable or {}).items() if v}
    out = copy.deepcopy(values)
    for key in unreliable:  # a dotted key names a figure inside a nested one (parts_share.model)
        *parents, last = key.split(".")
        node = out
        for part in parents:
            node = node[part]
        node[last] = None
    return {"figures": out, "unreliable": unreliable}
