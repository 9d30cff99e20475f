"""Training luck: how far a metric moves when only the training seed changes.

A runs x items table of one arm (pipeline/core/arm.py) read as x[s, i] = mu + a_i + u_s + e_si:
the item, the run's shift of every item (what no item bootstrap sees) and the items that flip
between seeds (which the paired item bootstrap carries already); decision.py adds the spread of
run means to the item bootstrap so that e counts once. One run per arm cannot estimate it: the
committed reference (reference/seed_variance/<preset>.json, `./dev seeds`) does, for a run whose
preset and data digest are the reference's. Why this estimate and not another: docs/decisions.md.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
from scipy import stats as sps

from pipeline.core.errors import PipelineError
from pipeline.core.paths import REPO_ROOT
from pipeline.stats.metrics import round6

REFERENCE_DIR = REPO_ROOT / "reference" / "seed_variance"
REFERENCE_FORMAT = 1
MIN_REFERENCE_SEEDS = 5
OUTLIER_Z = 3.5  # robust z beyond which a seed's run mean is "another mode" (Reference.outliers)


@dataclass(frozen=True)
class SeedVar:
    """One metric's training luck, from runs of one arm on the same items: run_var, the variance
    of a run's mean over `items` items (u and e/items above), with df degrees of freedom (runs -
    1, summed when pooled); interaction, the seed x item variance per item (e)."""

    run_var: float
    df: int
    interaction: float
    items: int

    def run_var_at(self, items: int) -> float:
        """The run-mean variance over `items` items instead (e averages over more or fewer)."""
        return max(0.0, self.run_var + self.interaction * (1.0 / items - 1.0 / self.items))

    @property
    def seed_var(self) -> float:
        """The whole-run shift alone, var(u) (floored at 0): for reading, not for intervals."""
        return max(0.0, self.run_var - self.interaction / self.items)

    @property
    def sd(self) -> float:
        return math.sqrt(self.seed_var)

    @property
    def run_sd(self) -> float:
        return math.sqrt(self.run_var)

    def as_dict(self) -> dict[str, float | int]:
        # The two SDs it is built from, to 6 significant digits; the seed's own SD (for reading)
        # from those, so that a reloaded reference says exactly what the file says.
        kept = SeedVar(_sig(self.run_sd) ** 2, self.df, _sig(math.sqrt(self.interaction)) ** 2, self.items)
        return {
            "sd_run_means": _sig(kept.run_sd),
            "df": self.df,
            "sd_seed": _sig(kept.sd),
            "sd_seed_x_item": _sig(math.sqrt(kept.interaction)),
            "items": self.items,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SeedVar:
        return cls(float(d["sd_run_means"]) ** 2, int(d["df"]), float(d["sd_seed_x_item"]) ** 2, int(d["items"]))


def components(x: np.ndarray) -> SeedVar:
    """The seed's luck from a runs x items table of one arm (at least 2 runs, 2 items)."""
    x = np.asarray(x, dtype=np.float64)
    runs, items = x.shape
    if runs < 2 or items < 2:
        raise ValueError(f"a runs x items table of at least 2 x 2 is needed; got {runs} x {items}")
    run_means, item_means, grand = x.mean(axis=1), x.mean(axis=0), x.mean()
    resid = x - run_means[:, None] - item_means[None, :] + grand
    interaction = float(np.sum(resid**2)) / ((runs - 1) * (items - 1))
    return SeedVar(float(np.var(run_means, ddof=1)), runs - 1, interaction, items)


def pool(parts: Iterable[SeedVar | None], items: int) -> SeedVar | None:
    """Estimates of one arm-independent seed luck pooled by their degrees of freedom, each taken
    over `items` items; None when there are none."""
    parts = [p for p in parts if p is not None and p.df > 0]
    if not parts:
        return None
    df = sum(p.df for p in parts)
    return SeedVar(
        sum(p.df * p.run_var_at(items) for p in parts) / df,
        df,
        sum(p.df * p.interaction for p in parts) / df,
        items,
    )


# --------------------------------------------------------------------------- the committed reference


@dataclass
class Reference:
    """A preset's seed variance on one dataset, measured over its seeds (`./dev seeds`)."""

    preset: str
    data: str  # arm.data_digest of the shards it was measured on
    arm: dict[str, str]  # digest and name of the arm measured
    seeds: list[int]
    items: int
    metrics: dict[str, SeedVar]
    per_seed: dict[str, list[float]]  # each metric's run mean, in the order of seeds
    measured: dict[str, Any] = field(default_factory=dict)  # commit, command, date, machine, experiments
    path: Path | None = None

    def outliers(self, metric: str) -> list[tuple[int, float, float]]:
        """Seeds whose run mean lies more than OUTLIER_Z robust SDs (1.4826 x the median absolute
        deviation) from the median: (seed, run mean, robust z). Seeds of a preset can split into
        modes (reference/seed_variance/smoke.json: two seeds far below the rest on cosine); a
        single run may then fall in the other mode, which a spread measured as a variance does not
        foresee."""
        values = np.asarray(self.per_seed.get(metric, []), dtype=float)
        if len(values) < MIN_REFERENCE_SEEDS:
            return []
        med = float(np.median(values))
        mad = 1.4826 * float(np.median(np.abs(values - med)))
        if mad <= 0:
            return []
        return [(s, float(v), abs(v - med) / mad) for s, v in zip(self.seeds, values) if abs(v - med) / mad > OUTLIER_Z]

    @property
    def shown_path(self) -> str:
        """Where the reference is, relative to the project when it is inside it."""
        if self.path is not None and self.path.is_relative_to(REPO_ROOT):
            return str(self.path.relative_to(REPO_ROOT))
        return str(self.path)

    def describe(self) -> str:
        return f"the {self.preset} preset's seed-variance reference ({len(self.seeds)} seeds, {self.shown_path})"

    def as_dict(self) -> dict[str, Any]:
        return {
            "format": REFERENCE_FORMAT,
            "preset": self.preset,
            "data": self.data,
            "arm": self.arm,
            "seeds": self.seeds,
            "items": self.items,
            "metrics": {
                m: {**v.as_dict(), "mean": round6(float(np.mean(self.per_seed[m]))), "per_seed": self.per_seed[m]}
                for m, v in self.metrics.items()
            },
            "measured": self.measured,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], path: Path | None = None) -> Reference:
        return cls(
            str(d["preset"]),
            str(d["data"]),
            dict(d["arm"]),
            [int(s) for s in d["seeds"]],
            int(d["items"]),
            {m: SeedVar.from_dict(v) for m, v in d["metrics"].items()},
            {m: [float(x) for x in v["per_seed"]] for m, v in d["metrics"].items()},
            dict(d.get("measured", {})),
            path,
        )


def measure(
    preset: str, data: str, arm: Mapping[str, str], seeds: Sequence[int], values: Mapping[str, np.ndarray], measured
) -> Reference:
    """A reference from replicates: `values[metric]` is the runs x items table, runs in `seeds` order."""
    if len(seeds) < 2:
        raise ValueError(f"the seed variance needs at least 2 seeds; got {len(seeds)}")
    items = next(iter(values.values())).shape[1]
    return Reference(
        preset,
        data,
        dict(arm),
        [int(s) for s in seeds],
        items,
        {m: components(x) for m, x in values.items()},
        {m: [round6(v) for v in np.asarray(x).mean(axis=1)] for m, x in values.items()},
        dict(measured),
    )


def reference_path(preset: str, directory: Path | None = None) -> Path:
    return Path(directory or REFERENCE_DIR) / f"{preset}.json"


def write_reference(ref: Reference, path: Path) -> None:
    from pipeline.core.atomic import write_json

    write_json(path, ref.as_dict())
    ref.path = Path(path)


def load_references(directory: Path | None = None) -> list[Reference]:
    """Every committed reference; a file that cannot be read is an error naming it (it is ours)."""
    out = []
    for path in sorted(Path(directory or REFERENCE_DIR).glob("*.json")):
        try:
            out.append(Reference.from_dict(json.loads(path.read_text()), path))
        except (ValueError, KeyError, TypeError) as e:
            raise PipelineError(
                f"{path}: not a seed-variance reference ({type(e).__name__}: {e}); expected the file "
                "`./dev seeds --preset NAME` writes: re-measure it, or remove it"
            ) from None
    return out


def find_reference(preset: str, data: str, directory: Path | None = None) -> Reference | None:
    """The reference measured for `preset` on the data of digest `data`, if there is one."""
    return next((r for r in load_references(directory) if r.preset == preset and r.data == data), None)


def matching_references(metas: Iterable) -> list[Reference]:
    """The references that match item tables' metadata (item_tables.TableMeta; None skipped), each
    once: what a comparison of those tables pools its seed spread with."""
    found: dict[tuple[str, str], Reference] = {}
    for m in metas:
        if m is not None and (m.preset, m.data) not in found:
            ref = find_reference(m.preset, m.data)
            if ref is not None:
                found[(m.preset, m.data)] = ref
    return list(found.values())


def _sig(x: float) -> float:
    return float(f"{float(x):.6g}")


def t_draws(df: int, n: int, seed: int) -> np.ndarray:
    """n stratified t-distribution quantiles in a fixed shuffled order (the same on every machine)."""
    q = sps.t.ppf((np.arange(n) + 0.5) / n, df)
    return q[np.random.Generator(np.random.PCG64(seed)).permutation(n)]


def with_seed_luck(
    item_draws: np.ndarray, centre: float, items: int, var: SeedVar | None, weight: float, seed: int
) -> np.ndarray:
    """Item-bootstrap draws of a mean (or difference) centred on `centre`, with the seed luck of
    runs worth `weight` (sum of 1 / runs of the trained sides) added: the item draws shrunk by the
    seed x item part they share with run_var, plus a stratified t-distribution draw of the run spread."""
    if var is None or weight == 0:
        return item_draws
    out = item_draws
    spread = float(np.var(out))
    if spread > 0:
        twice = var.interaction * weight / items  # the flips' share of the item draws' variance
        out = centre + (out - centre) * math.sqrt(max(0.0, spread - twice) / spread)
    return out + math.sqrt(var.run_var_at(items) * weight) * t_draws(var.df, len(out), seed + 1)
