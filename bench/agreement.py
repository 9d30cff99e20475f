"""Do two runs of the benchmarks agree? Compares the `figures` of two sets of saved results
(bench/results.py) figure by figure, or first reruns every saved bench's command into a new set.

    python -m bench.agreement --rerun /tmp/run2            # rerun bench/results/*.json's commands
    python -m bench.agreement bench/results /tmp/run2      # compare two saved sets
    python -m bench.agreement --rerun /tmp/run2 model serve  # only these benches

Prints one line per figure (B over A, and whether it is within --tolerance of 1) and, as its last
line, one JSON object with every ratio and the count of figures outside the tolerance. A figure
that is null in either set (a bench that could not measure it there) is listed with its reason
and not counted. Exits 1 when a compared figure is outside the tolerance, 2 on a failed rerun.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Iterator, Optional

from bench.clock import AGREEMENT
from bench.results import RESULTS_DIR, parser
from pipeline.core.paths import REPO_ROOT

BENCH_DIR = Path(__file__).resolve().parent


def flat(figures: dict, prefix: str = "") -> Iterator[tuple[str, object]]:
    """(dotted key, value) of every figure, nested objects stepped into."""
    for k, v in figures.items():
        if isinstance(v, dict):
            yield from flat(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def load(directory: Path, benches: Optional[list[str]] = None) -> dict[str, dict]:
    found = {p.stem: json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))}
    return {b: r for b, r in found.items() if not benches or b in benches}


def rerun(records: dict[str, dict], out: Path) -> None:
    """Each saved bench's recorded command again, saving into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    for bench, rec in records.items():
        cmd = [sys.executable if a == "python" else a for a in shlex.split(rec["command"])]
        cmd += ["--save", str(out / f"{bench}.json")]
        print(f"[bench.agreement] {shlex.join(cmd)}", file=sys.stderr, flush=True)
        proc = subprocess.run(cmd, cwd=REPO_ROOT, stdout=subprocess.DEVNULL)
        if proc.returncode != 0 and not (out / f"{bench}.json").exists():
            raise SystemExit(2)


def compare(a: dict[str, dict], b: dict[str, dict], tolerance: float) -> dict:
    rows, outside = [], 0
    for bench in sorted(set(a) & set(b)):
        fa, fb = dict(flat(a[bench]["figures"])), dict(flat(b[bench]["figures"]))
        why = {**a[bench].get("unreliable", {}), **b[bench].get("unreliable", {})}
        for key in sorted(set(fa) & set(fb)):
            va, vb = fa[key], fb[key]
            row: dict = {"bench": bench, "figure": key, "a": va, "b": vb}
            numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (va, vb))
            if not numbers:
                row["skipped"] = why.get(key) or why.get(key.split(".")[0]) or "not a number in both sets"
            elif va == 0:
                row["ratio"], row["agrees"] = None, vb == 0
            else:
                row["ratio"] = vb / va
                row["agrees"] = abs(row["ratio"] - 1) <= tolerance
            outside += row.get("agrees") is False
            rows.append(row)
    return {
        "tolerance": tolerance,
        "compared": sum("agrees" in r for r in rows),
        "outside_tolerance": outside,
        "only_in_a": sorted(set(a) - set(b)),
        "only_in_b": sorted(set(b) - set(a)),
        "machines": {
            side: {k: {f: r.get(f) for f in ("cpu_model", "gpu_model", "date", "torch")} for k, r in recs.items()}
            for side, recs in (("a", a), ("b", b))
        },
        "figures": rows,
    }


def main(argv=None) -> dict:
    ap = parser("agreement", __doc__)
    ap.add_argument("dirs", nargs="*", help="A_DIR [B_DIR], then bench names to keep (default A_DIR bench/results)")
    ap.add_argument("--rerun", metavar="OUT_DIR", help="rerun A_DIR's commands into OUT_DIR, then compare")
    ap.add_argument(
        "--tolerance", type=float, default=AGREEMENT, help=f"largest |B/A - 1| that agrees (default {AGREEMENT:g})"
    )
    args = ap.parse_intermixed_args(argv)  # --rerun OUT may come before or after the names
    # A bench's name is its module's (bench/data.py): checked first, since a bench can share its
    # name with a directory of the project (data/).
    benches = [d for d in args.dirs if "/" not in d and (BENCH_DIR / f"{d}.py").is_file()]
    dirs = [d for d in args.dirs if d not in benches]
    missing = [d for d in dirs if not Path(d).is_dir()]
    if missing:
        ap.error(f"{', '.join(missing)}: neither a result directory nor a bench (bench/NAME.py)")
    a_dir = Path(dirs[0]) if dirs else RESULTS_DIR
    a = load(a_dir, benches)
    if args.rerun:
        rerun(a, Path(args.rerun))
        b_dir = Path(args.rerun)
    elif len(dirs) == 2:
        b_dir = Path(dirs[1])
    else:
        ap.error("give two result directories, or --rerun OUT_DIR")
    res = compare(a, load(b_dir, benches), args.tolerance)
    res["a"], res["b"] = str(a_dir), str(b_dir)
    for r in res["figures"]:
        if "skipped" in r:
            print(f"{r['bench']:<16} {r['figure']:<58} skipped: {r['skipped']}", file=sys.stderr)
        elif r["ratio"] is not None:
            mark = "ok" if r["agrees"] else "OUTSIDE"
            print(f"{r['bench']:<16} {r['figure']:<58} {r['ratio']:8.3f}  {mark}", file=sys.stderr)
    print(json.dumps(res))
    if res["outside_tolerance"]:
        sys.exit(1)
    return res


if __name__ == "__main__":
    main()
