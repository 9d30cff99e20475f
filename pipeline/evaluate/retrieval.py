"""Evaluation: per-item scores of the model and of three baselines on the same items, their
means with paired-bootstrap 95 % confidence intervals, and the model's paired difference from each
baseline (docs/evaluation.md).

Retrieval is over a realistic bank: every distinct target text of the dataset, all splits (not
only the split's own, which made top-5 trivial). A hit is exact when the row's own target text is
among the k nearest bank texts (top1, top5), and by group when any target text of the row's group
is (group_top1, group_top5, mrr = mean 1/rank of the group's best text): a group (embed.group_field)
holds the rows whose targets are one answer in other words. Without a group field each text is its
own group. Ranks count the bank texts scoring strictly higher (a tie counts for the prediction),
for blocks of items with one matrix product each, never a per-item loop.

Baselines, computed in the same stage so the comparison is like for like: identity (the input
embedding itself), ridge (a linear map fitted on train in closed form, W = (X'X + alpha I)^-1 X'Y,
with a bias) and nearest (the target of the training row whose input is nearest by cosine: what
memorising the training pairs alone achieves), none with any training luck; and mlp, the learned
baseline of the model's size (pipeline/baselines/), trained once per seed by the baseline stage:
its per-item values are the means over its replicates, and its intervals cover its seeds' luck,
measured from them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from pipeline.answer.bank import Bank
from pipeline.stats.bootstrap import Estimate, intervals, p_value, resample_means
from pipeline.stats.item_tables import replicate_predictor
from pipeline.stats.metrics import METRICS, SCORE_COLUMNS, item_metrics
from pipeline.stats.seed_variance import SeedVar, components, with_seed_luck

PREDICTORS = ("model", "identity", "ridge", "nearest")
UNTRAINED = PREDICTORS[1:]  # the same for every seed
TRAINED = ("mlp",)  # replicated: one per seed (the baseline stage)
BASELINES = UNTRAINED + TRAINED
TOP_K = 5  # bank ids kept per item in the item table
_SCORE_CELLS = 8_000_000  # items x bank scores held at once: 32 MB of float32


def score_items(pred: np.ndarray, shard, bank: Bank) -> dict[str, np.ndarray]:
    """Per-item arrays: cosine, mse, rank (of the row's own text), group_rank (of its group's best
    text), top (the TOP_K nearest bank positions)."""
    n = len(pred)
    targets = np.asarray(shard.targets, dtype=np.float32)
    p, t = torch.from_numpy(np.asarray(pred, dtype=np.float32)), torch.from_numpy(targets)
    out = {
        "cosine": F.cosine_similarity(p, t, dim=1).double().numpy(),
        "mse": ((p - t) ** 2).mean(dim=1).double().numpy(),
    }
    own = np.fromiter((bank.index[x] for x in shard.target_texts), dtype=np.int64, count=n)
    groups = [str(g) for g in shard.groups]
    width = max(len(bank.group_members[g]) for g in set(groups)) if n else 1
    padded = np.full((n, width), -1, dtype=np.int64)  # each item's group's bank positions
    for i, g in enumerate(groups):
        m = bank.group_members[g]
        padded[i, : len(m)] = m
    rank, group_rank = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    top = np.empty((n, min(TOP_K, bank.size)), dtype=np.int64)
    block = max(1, _SCORE_CELLS // bank.size)
    for s in range(0, n, block):
        e = min(n, s + block)
        sims = F.normalize(p[s:e], dim=1) @ bank.vectors.T  # (block, bank)
        mine = sims.gather(1, torch.from_numpy(own[s:e])[:, None])
        rank[s:e] = 1 + (sims > mine).sum(dim=1).numpy()
        pos = torch.from_numpy(padded[s:e])
        best = sims.gather(1, pos.clamp(min=0)).masked_fill(pos < 0, -float("inf")).max(dim=1, keepdim=True).values
        group_rank[s:e] = 1 + (sims > best).sum(dim=1).numpy()
        top[s:e] = sims.topk(top.shape[1], dim=1).indices.numpy()
    out.update(rank=rank, group_rank=group_rank, top=top)
    return out


def metric_key(split: str, who: str, metric: str, part: str = "") -> str:
    """eval/<split>/<predictor or model_vs_<baseline>>/<metric>[/ci95_low|ci95_high|p_value]:
    keys train never writes (it logs val/cosine while training), so each has one writer."""
    return f"eval/{split}/{who}/{metric}" + (f"/{part}" if part else "")


def summarise(
    split: str,
    per_item: dict[str, dict[str, np.ndarray]],
    resamples: int,
    seed: int,
    with_ci: bool = True,
    seed_luck: dict | None = None,
    replicated: dict[str, dict[str, np.ndarray]] | None = None,
) -> tuple[dict[str, float], dict[str, Estimate]]:
    """Means with 95 % CIs for every predictor and metric, and model - baseline paired differences
    with CI and p-value, all from one set of bootstrap resamples of the items (so all are paired).
    Returns (flat metrics for eval.json and MLflow, {who/metric: Estimate}). with_ci=False: the
    means alone (val: the split training was guided by, not the one decisions rest on).

    seed_luck (metric -> seed_variance.SeedVar, from the preset's committed reference): the
    model's intervals (its mean, and its differences from the baselines) then cover the training
    seed's luck too, added to the item draws as pipeline/stats/decision.py does. The flat metrics
    say which: eval/<split>/ci_covers_seeds is 1 or 0.
    replicated (a trained baseline -> metric -> its replicates x items values): its per_item
    entry is their mean over replicates, and its intervals carry its seed spread measured from
    them (weight 1 / replicates); its difference from the model carries both models' seed luck
    when seed_luck is given (eval/<split>/model_vs_<name>/ci_covers_seeds 1), else its own only."""
    replicated = replicated or {}
    if not with_ci:
        flat = {
            metric_key(split, who, m): round(float(np.mean(vals[m])), 6)
            for who, vals in per_item.items()
            for m in METRICS
        }
        return {**flat, f"eval/{split}/items": len(next(iter(per_item.values()))["cosine"])}, {}
    columns, names = [], []
    for who, vals in per_item.items():
        for m in METRICS:
            columns.append(vals[m])
            names.append((who, m))
    for b in per_item:
        if b == "model":
            continue
        for m in METRICS:
            columns.append(per_item["model"][m] - per_item[b][m])
            names.append((f"model_vs_{b}", m))
    values = np.stack(columns, axis=1)
    means = resample_means(values, resamples, seed)
    for j, (who, m) in enumerate(names):
        luck = _luck(who, m, seed_luck or {}, replicated, len(values))
        if luck is not None:
            centre = float(values[:, j].mean())
            means[:, j] = with_seed_luck(means[:, j], centre, len(values), luck[0], luck[1], seed)
    lows, highs = intervals(means)
    flat, estimates = {}, {}
    for j, (who, m) in enumerate(names):
        p = p_value(values[:, j], means[:, j]) if who.startswith("model_vs_") else None
        est = Estimate(float(values[:, j].mean()), float(lows[j]), float(highs[j]), p)
        estimates[f"{who}/{m}"] = est
        for part, v in est.as_dict().items():
            flat[metric_key(split, who, m, "" if part == "value" else part)] = round(v, 6)
    flat[f"eval/{split}/items"] = len(values)
    flat[f"eval/{split}/ci_covers_seeds"] = int(bool(seed_luck))
    for name, vals in replicated.items():
        flat[f"eval/{split}/{name}/replicates"] = len(next(iter(vals.values())))
        flat[f"eval/{split}/model_vs_{name}/ci_covers_seeds"] = int(bool(seed_luck))
    return flat, estimates


def _luck(who: str, metric: str, model: dict, replicated: dict, items: int) -> tuple[SeedVar, float] | None:
    """(seed spread, weight) a column's draws carry, or None: the model's from its reference
    (weight 1, one run), a trained baseline's from its replicates (1 / replicates), a difference
    the sum of its sides' (pipeline/stats/decision.py: combine)."""
    from pipeline.stats.decision import combine

    def trained(name: str) -> tuple[SeedVar, float] | None:
        x = replicated.get(name, {}).get(metric)
        return (components(x), 1.0 / len(x)) if x is not None and len(x) >= 2 else None

    if who == "model":
        return (model[metric], 1.0) if metric in model else None
    if not who.startswith("model_vs_"):
        return trained(who)
    parts = [p for p in (((model[metric], 1.0) if metric in model else None), trained(who[len("model_vs_") :])) if p]
    if not parts:
        return None
    return combine(parts, items), sum(w for _, w in parts)


def item_table(
    shard, bank: Bank, scores: dict[str, dict[str, np.ndarray]], replicates: dict[str, list] | None = None
) -> pd.DataFrame:
    """One row per item: its id, group and texts; the model's rank, group rank, cosine, mse and
    top bank ids; each baseline's rank, group rank, cosine and mse (columns <baseline>_...), a
    trained baseline's per replicate (<name>.<seed>_...: item_tables.replicate_predictor)."""
    model = scores["model"]
    bank_ids = np.asarray(bank.ids, dtype=object)
    table = {
        "id": [str(x) for x in shard.ids],
        "group": [str(g) for g in shard.groups],
        "input": [str(x) for x in shard.input_texts],
        "target": [str(x) for x in shard.target_texts],
        "rank": model["rank"],
        "group_rank": model["group_rank"],
        "cosine": model["cosine"],
        "mse": model["mse"],
        "top5": [list(bank_ids[row]) for row in model["top"]],
    }
    for b, sc in scores.items():
        if b != "model":
            for c in SCORE_COLUMNS:
                table[f"{b}_{c}"] = sc[c]
    for name, reps in (replicates or {}).items():
        for seed, sc in reps:
            for c in SCORE_COLUMNS:
                table[f"{replicate_predictor(name, seed)}_{c}"] = sc[c]
    return pd.DataFrame(table)


RIDGE_CHUNK = 65536  # rows per block of X'X: 65536 x 385 float64 = 190 MiB at most, whatever the split's size


def ridge_fit(x: np.ndarray, y: np.ndarray, alpha: float) -> np.ndarray:
    """Closed-form ridge with an unpenalised bias: returns W of shape (dim + 1, out).

    X'X and X'Y are summed over blocks of rows, so a memory-mapped train split of any size is
    read once, block by block, and never held whole in memory."""
    n, dim = len(x), x.shape[1]
    xtx = np.zeros((dim + 1, dim + 1))
    xty = np.zeros((dim + 1, y.shape[1]))
    for start in range(0, n, RIDGE_CHUNK):
        xb = np.asarray(x[start : start + RIDGE_CHUNK], dtype=np.float64)
        xb = np.hstack([xb, np.ones((len(xb), 1))])
        xtx += xb.T @ xb
        xty += xb.T @ np.asarray(y[start : start + RIDGE_CHUNK], dtype=np.float64)
    reg = alpha * np.eye(dim + 1)
    reg[-1, -1] = 0.0
    return np.linalg.solve(xtx + reg, xty)


def ridge_predict(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    return (np.hstack([np.asarray(x, dtype=np.float64), np.ones((len(x), 1))]) @ w).astype(np.float32)


NEAREST_BLOCK = 4096  # query rows x training rows scored at once: 4096 x 4096 float32 = 64 MiB


def nearest_predict(train_inputs: np.ndarray, train_targets: np.ndarray, inputs: np.ndarray) -> np.ndarray:
    """For each input, the target of the training row whose input is nearest by cosine (the first
    of equals). Blocks of queries against blocks of the (memory-mapped) training rows, keeping the
    best so far, so a training split of any size is never held whole in memory."""
    n = len(inputs)
    best = np.full(n, -np.inf, dtype=np.float32)
    where = np.zeros(n, dtype=np.int64)
    queries = F.normalize(torch.from_numpy(np.asarray(inputs, dtype=np.float32)), dim=1)
    for t0 in range(0, len(train_inputs), NEAREST_BLOCK):
        keys = F.normalize(torch.from_numpy(np.asarray(train_inputs[t0 : t0 + NEAREST_BLOCK], dtype=np.float32)), dim=1)
        for q0 in range(0, n, NEAREST_BLOCK):
            top = (queries[q0 : q0 + NEAREST_BLOCK] @ keys.T).max(dim=1)
            score, idx = top.values.numpy(), top.indices.numpy()
            better = score > best[q0 : q0 + NEAREST_BLOCK]  # strictly: an earlier block wins ties
            best[q0 : q0 + NEAREST_BLOCK][better] = score[better]
            where[q0 : q0 + NEAREST_BLOCK][better] = idx[better] + t0
    return np.asarray(train_targets[where], dtype=np.float32)


def predictions(model_pred: np.ndarray, shard, ridge_w: np.ndarray, train=None) -> dict[str, np.ndarray]:
    """Each predictor's outputs for the split's rows, model first; `train` (the train split) adds
    the nearest-training-row baseline."""
    inputs = np.asarray(shard.inputs)
    preds = {"model": model_pred, "identity": inputs, "ridge": ridge_predict(ridge_w, inputs)}
    if train is not None:
        preds["nearest"] = nearest_predict(train.inputs, train.targets, inputs)
    return preds


def evaluate_split(
    name: str,
    preds: dict[str, np.ndarray],
    shard,
    bank: Bank,
    resamples: int,
    seed: int,
    with_ci: bool = True,
    seed_luck: dict | None = None,
    replicates: dict[str, list[tuple[int, np.ndarray]]] | None = None,
) -> tuple[dict[str, float], dict[str, Estimate], pd.DataFrame]:
    """(flat metrics with CIs, estimates by who/metric, item table) for one split. `replicates`:
    a trained baseline's outputs per seed, [(seed, outputs)], scored as one predictor (summarise)."""
    scores = {who: score_items(pred, shard, bank) for who, pred in preds.items()}
    per_item = {who: item_metrics(sc) for who, sc in scores.items()}
    rep_scores = {b: [(s, score_items(p, shard, bank)) for s, p in reps] for b, reps in (replicates or {}).items()}
    replicated = {}
    for b, reps in rep_scores.items():
        values = [item_metrics(sc) for _, sc in reps]
        replicated[b] = {m: np.stack([v[m] for v in values]) for m in METRICS}
        per_item[b] = {m: x.mean(axis=0) for m, x in replicated[b].items()}
    flat, estimates = summarise(name, per_item, resamples, seed, with_ci, seed_luck, replicated)
    return flat, estimates, item_table(shard, bank, scores, rep_scores)


def sample_table(items: pd.DataFrame, bank: Bank, n: int) -> list[dict]:
    """The first n items with the model's nearest bank text (for a quick read)."""
    rows = []
    for r in items.head(n).itertuples():
        decoded = bank.texts[bank.ids.index(r.top5[0])] if len(r.top5) else ""
        rows.append(
            {
                "id": r.id,
                "input": r.input,
                "target": r.target,
                "decoded": decoded,
                "correct": bool(r.rank == 1),
                "group_correct": bool(r.group_rank == 1),
            }
        )
    return rows
