"""Options the statistics tools share. --resamples and --seed of the tools that compare evaluated
models (`./dev compare`, its --sweep, `./dev decide`): by default the evaluate config's own
(evaluate.bootstrap_resamples and evaluate.bootstrap_seed, as params.yaml holds them), so that a
tool draws the same resamples of the test items as the evaluate stage did. The config is read only
when a value was not given, so a command that names both never needs it. -S KEY=VALUE: Hydra
overrides of an arm (`./dev seeds`, `./dev decide`).
"""

from __future__ import annotations

import argparse

from pipeline.core.config import MIN_BOOTSTRAP_RESAMPLES

MIN_RESAMPLES = MIN_BOOTSTRAP_RESAMPLES  # the least the tools take: the config's own minimum
RESAMPLES_PARAM = "evaluate.bootstrap_resamples"
SEED_PARAM = "evaluate.bootstrap_seed"


def _resamples(text: str) -> int:
    n = int(text)
    if n < MIN_RESAMPLES:
        raise argparse.ArgumentTypeError(f"{n}: expected at least {MIN_RESAMPLES}")
    return n


def add_bootstrap_options(ap: argparse.ArgumentParser) -> None:
    """--resamples N (at least MIN_RESAMPLES) and --seed S, both None until
    fill_bootstrap_defaults when not given."""
    ap.add_argument(
        "--resamples",
        type=_resamples,
        help=f"bootstrap resamples, at least {MIN_RESAMPLES} (default: {RESAMPLES_PARAM} of the project's config, "
        "params.yaml: as many as the evaluate stage draws)",
    )
    ap.add_argument(
        "--seed",
        type=int,
        help=f"bootstrap seed (default: {SEED_PARAM} of the project's config, params.yaml: the evaluate stage's)",
    )


def fill_bootstrap_defaults(args: argparse.Namespace) -> None:
    """Set args.resamples and args.seed that were not given to the project's config. Raises
    ConfigError (a PipelineError, which the tools print as one line) when params.yaml is missing
    or invalid."""
    if args.resamples is not None and args.seed is not None:
        return
    from pipeline.core.config import load_config

    evaluate = load_config().evaluate
    if args.resamples is None:
        args.resamples = int(evaluate.bootstrap_resamples)
    if args.seed is None:
        args.seed = int(evaluate.bootstrap_seed)


def add_overrides(ap: argparse.ArgumentParser, *flags: str, dest: str, help: str) -> None:
    """A repeatable KEY=VALUE option of Hydra overrides (as `dvc exp run -S` takes them)."""
    ap.add_argument(*flags, dest=dest, action="append", default=[], metavar="KEY=VALUE", help=help)
