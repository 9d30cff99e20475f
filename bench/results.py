"""A benchmark's result as a committed source of the figures that docs quote: `--save` writes it
to bench/results/<bench>.json (its format and how docs cite it: docs/benchmarks.md)."""

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


def child_json(args: list[str], what: str, timeout: float, **run) -> dict:
    """`python ARGS` run from the repository root (a part a bench measures in a fresh process;
    `run`: more subprocess.run arguments): the JSON object of its last stdout line; its failure is
    an error ending with its stderr's."""
    proc = subprocess.run(
        [sys.executable, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout, **run
    )
    if proc.returncode:
        raise RuntimeError(f"{what} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def parser(bench: str, doc: str) -> argparse.ArgumentParser:
    """`python -m bench.<bench>`'s parser: its module docstring is its --help, kept as written."""
    return argparse.ArgumentParser(
        prog=f"python -m bench.{bench}", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def add_save_flag(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--save",
        nargs="?",
        const="",
        metavar="PATH",
        help="also write the result, with its figures, the machine, the date, torch's version and "
        "this command, to bench/results/<bench>.json (or PATH): the source docs quote",
    )


def command(bench: str, argv: Optional[list[str]]) -> str:
    """The command that made the result, without --save (bench/agreement.py reruns it)."""
    args = list(sys.argv[1:] if argv is None else argv)
    kept = []
    while args:
        a = args.pop(0)
        if a == "--save":
            if args and not args[0].startswith("-"):  # its optional PATH, when not another option
                args.pop(0)
        elif not a.startswith("--save="):
            kept.append(a)
    return shlex.join(["python", "-m", f"bench.{bench}", *kept])


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
            "gpu_model": result.get("gpu_model"),  # the benches that can name their GPU
            "figures": result.get("figures", {}),
            "unreliable": result.get("unreliable", {}),
            "result": result,
        }
    )


def finish(bench: str, result: dict, save: Optional[str], argv: Optional[list[str]] = None) -> dict:
    """Prints the result as the bench's last stdout line and, with --save, writes its record."""
    print(json.dumps(result))
    if save is not None:
        path = Path(save) if save else RESULTS_DIR / f"{bench}.json"
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
