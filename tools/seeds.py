"""Measure an arm's training luck: train it under several seeds and see how far each metric moves.

    ./dev seeds [--preset default] [-S KEY=VALUE ...] [--seeds 8] [--first-seed 0] [-j 1]
                [--write | --no-write] [--tables DIR] [--json]

Queues one DVC experiment per seed (`rep-<arm>-s<seed>`, pipeline/stats/replicates.py: through
`dvc exp run --queue` and `dvc queue start -j N`; an experiment of that name already made from this
commit is read back, not trained again), waits with a progress bar, then prints per headline metric the
seeds' mean, the SD of the run means, and its split into the seed's own shift (what a comparison
of single runs must add to the items' luck) and the items that flip between seeds
(pipeline/stats/seed_variance.py).

For a preset run as it is (no -S), the result is the preset's seed-variance reference,
reference/seed_variance/<preset>.json (written unless --no-write; commit it): `./dev compare`,
`./dev decide` and the evaluate stage widen single-seed intervals with it wherever the preset and
the data match. --tables DIR keeps each seed's item table there (seed-<k>.parquet).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pipeline.core.errors import PipelineError
from pipeline.core.paths import REPO_ROOT
from pipeline.stats.item_tables import write_items
from pipeline.stats.metrics import METRICS
from pipeline.stats.replicates import measure_arm, plan, run_replicates
from pipeline.stats.seed_variance import MIN_REFERENCE_SEEDS, reference_path, write_reference
from tools.options import add_overrides


def render(ref) -> str:
    lines = [
        f"Arm {ref.arm['name']} [{ref.arm['digest']}] on data {ref.data}: {len(ref.seeds)} seeds "
        f"({', '.join(map(str, ref.seeds))}), {ref.items} test items.",
        "run SD: the spread of the seeds' run means. seed SD: the part that shifts a whole run (what a "
        "comparison of single runs must add to the items' luck); seed x item SD: items flipping between seeds.",
        "",
        f"{'metric':<12} {'mean':>9} {'run SD':>9} {'seed SD':>9} {'seed x item':>12}   per seed",
    ]
    for m in METRICS:
        v, per = ref.metrics[m], ref.per_seed[m]
        digits = 6 if m == "mse" else 4
        lines.append(
            f"{m:<12} {sum(per) / len(per):>9.{digits}f} {v.run_sd:>9.{digits}f} {v.sd:>9.{digits}f} "
            f"{v.interaction**0.5:>12.{digits}f}   " + " ".join(f"{x:.{digits}f}" for x in per)
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="./dev seeds", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--preset", default="default", help="the preset to measure (conf/preset/; default: default)")
    add_overrides(
        ap, "-S", "--set", dest="sets", help="an override of the arm (Hydra syntax, as dvc exp run -S); repeatable"
    )
    ap.add_argument("--seeds", type=int, default=8, help="how many seeds (default 8; a reference needs at least 5)")
    ap.add_argument("--first-seed", type=int, default=0, help="the first seed; the others follow it (default 0)")
    ap.add_argument("-j", "--jobs", type=int, default=1, help="DVC queue workers (default 1; each holds a run)")
    ap.add_argument(
        "--write",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="write reference/seed_variance/<preset>.json (default: yes for a preset without -S)",
    )
    ap.add_argument("--tables", type=Path, metavar="DIR", help="keep each seed's item table in DIR")
    ap.add_argument("--json", action="store_true", help="print the result as one JSON object")
    args = ap.parse_args(argv)
    if args.seeds < 2:
        ap.error(f"--seeds {args.seeds}: expected at least 2 (one seed has no spread)")
    if args.jobs < 1:
        ap.error(f"--jobs {args.jobs}: expected at least 1")
    write = (not args.sets) if args.write is None else args.write
    if write and args.seeds < MIN_REFERENCE_SEEDS:
        ap.error(f"--seeds {args.seeds}: a reference needs at least {MIN_REFERENCE_SEEDS} (or --no-write)")
    if write and args.sets:
        ap.error("a reference is a preset's as it is: --write goes without -S (see --tables, --json)")
    command = "./dev seeds " + " ".join(sys.argv[1:] if argv is None else argv)
    try:
        overrides = [f"preset={args.preset}", *args.sets]
        reps = plan("rep", args.preset, overrides, range(args.first_seed, args.first_seed + args.seeds))
        results = run_replicates(reps, args.jobs)
        ref = measure_arm(results, args.preset, command.strip())
    except (PipelineError, KeyboardInterrupt) as e:
        print(f"seeds: {e if str(e) else 'interrupted'}", file=sys.stderr)
        return 2 if isinstance(e, PipelineError) else 130
    if args.tables:
        args.tables.mkdir(parents=True, exist_ok=True)
        for r in results:
            write_items(r.items, args.tables / f"seed-{r.replicate.seed}.parquet", r.meta)
    if write:
        path = reference_path(args.preset)
        write_reference(ref, path)
        print(f"[seeds] wrote {path.relative_to(REPO_ROOT)}: commit it", file=sys.stderr)
    print(json.dumps(ref.as_dict(), indent=2) if args.json else render(ref))
    return 0


if __name__ == "__main__":
    sys.exit(main())
