"""Data-path benchmark: embedding, the embedding cache, the loader's memory and the trainer's
wait for data, all measured in this one run. The last stdout line is one JSON object; progress
lines go to stderr.

- embed_speedup_vs_sentence_transformers (goal >= 1.0): what the embed stage's path adds to a
  plain `SentenceTransformer.encode`, measured: the rows' texts per CPU second of our path over
  those of sentence-transformers encoding the same rows plainly, same bundled teacher, same batch
  size (embed.batch_size, the config's default), same process. The rows: questions and answers of
  data/raw/qa_pairs.csv, a seeded sample. Our path is the embed stage's per-shard path,
  pipeline.embed.embedding.embed_texts_once(encode, questions, answers, cache=None) with encode =
  pipeline.embed.teacher.encode_texts: it embeds the distinct union of the rows' texts once.
  The plain path encodes the questions, then the answers (`model.encode(texts, batch_size=...)`).
  The only difference is what our code does beyond encode (deduplication: the rows hold
  2 x embed_rows texts, embed_distinct_texts of them distinct), so the figure is about
  embed_texts_over_distinct when the encoding dominates; a figure below it is our path's own cost.
  Arms alternate ABBA (ours, theirs, theirs, ours, ...) and are timed in this process's CPU
  seconds (bench/clock.py); the figure is the median of the per-round ratios
  (embed_speedup_vs_sentence_transformers_wall: the same in wall seconds).
  embed_max_abs_diff (goal <= 2e-7): the largest |difference| between the two arms' vectors for
  the same texts (a text batched with other texts is padded differently, never changed beyond that).
- incremental_fraction (goal <= 0.05): through the content-addressed cache
  (pipeline.embed.cache.EmbeddingCache / embed_distinct) in a fresh temporary directory, the time
  to embed the texts plus 1 % new ones with the warm cache (a new EmbeddingCache object, which
  reads the index from disk as a re-run would; only the new texts are encoded) over the time to
  embed the texts into the empty cache (the warm run repeated on fresh copies of the cache, its
  median taken), both in this process's CPU seconds. incremental_embedded is how many texts the
  second run encoded (must equal incremental_new_texts); incremental_encode_s is the part of it
  spent encoding them.
- loader_rss_growth_mb (goal < 64): growth of anonymous resident memory (RssAnon of
  /proc/self/status) while iterating one shuffled epoch of pipeline.data.loader.BatchLoader
  (batch 256) over a split of 1,000,000 synthetic 384-d float32 rows written with
  pipeline.data.shard_writer.write_shards and opened with open_split, minus the same over 10,000 rows
  (what any epoch costs: the first batches, torch's allocator), each also reported by row count
  (loader_rss_anon_growth_mb_1m, _10k) and as _big / _small. Shards of 131,072 rows (write_shards'
  rows_per_shard); the loader's default prefetch, the trainer's (--prefetch
  sets another). A shuffled epoch holds its permutation, 8 bytes a row: ~7.6 MiB at 1M rows, so
  ~8 MB is the floor of this design. Each epoch runs in a fresh child
  process (python -m bench.data --loader-child DIR), measured from after open_split and the
  loader's construction (the split's text columns are loaded by then, and glibc's free heap is
  handed back with malloc_trim so the epoch cannot hide in it) to the epoch's end, as the peak of
  a reading taken after every batch. File-backed pages of the memory map (RssFile) are
  page cache the kernel can drop; they are reported for context, not counted.
- data_wait_fraction (goal <= 0.02): sum(perf/data_ms) / sum(perf/step_ms) over the telemetry rows
  of one epoch of pipeline.train.loop.Trainer on the `default` preset (train.epochs=1,
  train.checkpoint_every=0), on the train split of data/shards when it opens (else synthetic
  (2000, 384) arrays), its first --wait-rows rows: the median over 6 consecutive stretches of
  the rows (data_wait_fraction_windows; the whole epoch's in data_wait_fraction_overall). A
  fraction near 0 moves with every stray delay: when the windows spread wider than two runs are
  held to, the figure is null and `unreliable` gives the spread (goals_met still judges it).

A missed goal is reported in goals_met, not as an exit status (the machine is shared and noisy);
an error exits non-zero. --quick shrinks every part (fewer texts and rounds, 200,000 rows in
place of 1,000,000, fewer train steps) to run in well under a minute. --save also writes the
result with its `figures` to bench/results/data.json.
"""

from __future__ import annotations

import functools
import json
import math
import operator
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from bench import clock, results
from bench.loader_memory import DIM, LOADER_BATCH, loader_child, loader_memory
from pipeline.core.paths import REPO_ROOT

GOALS = {
    "embed_speedup_vs_sentence_transformers": 1.0,
    "embed_max_abs_diff": 2e-7,
    "incremental_fraction": 0.05,
    "loader_rss_growth_mb": 64.0,
    "data_wait_fraction": 0.02,
}


say = functools.partial(results.say, "data")


# ---------------------------------------------------------------------------- texts
def sample_texts(n_distinct: int, new_fraction: float = 0.01, seed: int = 0):
    """Rows of the shipped pairs in a seeded order (the file is grouped by topic), taken until
    their questions and answers hold `n_distinct` distinct texts. Returns (questions, answers,
    distinct union in embed_texts_once's order, new texts): the new ones are round(1 % of the
    union) (at least 1) distinct texts of the rows that follow, none in the union."""
    import pandas as pd

    from pipeline.core.config import default_values
    from pipeline.core.paths import repo_path

    df = pd.read_csv(repo_path(default_values().embed.dataset))
    order = np.random.default_rng(seed).permutation(len(df))
    q_all, a_all = df["question"].astype(str).to_numpy(), df["answer"].astype(str).to_numpy()
    seen: dict[str, None] = {}
    questions, answers = [], []
    i = 0
    while len(seen) < n_distinct and i < len(order):
        q, a = q_all[order[i]], a_all[order[i]]
        questions.append(q)
        answers.append(a)
        seen.setdefault(q)
        seen.setdefault(a)
        i += 1
    distinct = list(dict.fromkeys([*questions, *answers]))
    want_new = max(1, round(new_fraction * len(distinct)))
    new: dict[str, None] = {}
    for j in order[i:]:
        for t in (q_all[j], a_all[j]):
            if t not in seen and len(new) < want_new:
                new.setdefault(t)
        if len(new) >= want_new:
            break
    if len(new) < want_new:
        raise ValueError(
            f"{len(distinct)} texts leave {len(new)} unseen ones in the dataset; "
            f"expected {want_new}: ask for fewer texts"
        )
    return questions, answers, distinct, list(new)


# ---------------------------------------------------------------------------- embedding
def embed_speed(model, batch_size: int, questions, answers, distinct, rounds: int) -> dict:
    """ABBA rounds of our path and a plain sentence-transformers encode of the same rows."""
    from pipeline.embed.embedding import embed_texts_once
    from pipeline.embed.teacher import encode_texts

    encode = lambda t: encode_texts(model, t, batch_size, progress=False)  # noqa: E731

    def ours():
        a, b, n, _ = embed_texts_once(encode, questions, answers, cache=None)
        if n != len(distinct):
            raise RuntimeError(f"embed_texts_once embedded {n} distinct texts; expected {len(distinct)}")
        return a, b

    def theirs():
        plain = lambda texts: model.encode(texts, batch_size=batch_size, show_progress_bar=False)  # noqa: E731
        return plain(questions), plain(answers)

    # Untimed warm-up of both arms (thread pool, tokenizer caches, allocator).
    encode(distinct[:64])
    model.encode(distinct[:64], batch_size=batch_size, show_progress_bar=False)
    spans: dict[str, list[clock.Span]] = {"ours": [], "theirs": []}
    ratios, wall_ratios, diff = [], [], 0.0
    for r in range(rounds):
        order = ("ours", "theirs") if r % 2 == 0 else ("theirs", "ours")
        got = {}
        for arm in order:
            span, got[arm] = clock.measure(ours if arm == "ours" else theirs)
            spans[arm].append(span)
        (a, b), (qa, qb) = got["ours"], got["theirs"]
        diff = max(diff, float(np.abs(a - qa).max()), float(np.abs(b - qb).max()))
        # The same rows both ways: (rows / ours_s) / (rows / theirs_s).
        ratios.append(spans["theirs"][-1].cpu / spans["ours"][-1].cpu)
        wall_ratios.append(spans["theirs"][-1].wall / spans["ours"][-1].wall)
        say(
            f"embed round {r + 1}/{rounds} ({'/'.join(order)}): ratio {ratios[-1]:.3f} (CPU s), "
            f"{wall_ratios[-1]:.3f} (wall)"
        )
    texts = len(questions) + len(answers)
    cpu_s = {arm: float(np.median([s.cpu for s in spans[arm]])) for arm in spans}
    return {
        "embed_speedup_vs_sentence_transformers": float(np.median(ratios)),
        "embed_speedup_vs_sentence_transformers_wall": float(np.median(wall_ratios)),
        "embed_texts_over_distinct": texts / len(distinct),
        "embed_texts_per_s_ours": texts / cpu_s["ours"],
        "embed_texts_per_s_sentence_transformers": texts / cpu_s["theirs"],
        "embed_texts_per_s_are": "the rows' texts per CPU second of this process",
        "embed_round_ratios": ratios,
        "embed_rounds": rounds,
        "embed_distinct_texts": len(distinct),
        "embed_rows": len(questions),
        "embed_batch_size_ours": batch_size,
        "embed_batch_size_sentence_transformers": batch_size,
        "embed_max_abs_diff": diff,
    }


def incremental(model, identity: dict, batch_size: int, distinct, new, scratch: Path, repeats: int = 3) -> dict:
    """The module docstring's incremental_fraction: the warm run `repeats` times, each on a fresh
    copy of the cache as the full embed left it (copied outside the timed span), as the re-run is
    short: one burst of another process's work could double it, where the full embed is long
    enough to average such bursts out."""
    from pipeline.embed.cache import EmbeddingCache, embed_distinct
    from pipeline.embed.teacher import encode_texts

    encoded, encode_s = [0], [0.0]

    def encode(texts):
        t0 = time.process_time()
        encoded[0] += len(texts)
        out = encode_texts(model, texts, batch_size, progress=False)
        encode_s[0] += time.process_time() - t0
        return out

    work = Path(tempfile.mkdtemp(prefix="bench-data-cache-", dir=scratch))
    incr_s, enc_s, counts, identical = [], [], [], []
    try:
        t0 = time.process_time()
        full, s_full = embed_distinct(distinct, encode, EmbeddingCache(work / "full", identity))
        full_s = time.process_time() - t0
        for r in range(repeats):
            shutil.copytree(work / "full", work / f"warm-{r}")
            before, encode_s[0] = encoded[0], 0.0
            t0 = time.process_time()
            more, stats = embed_distinct(distinct + new, encode, EmbeddingCache(work / f"warm-{r}", identity))
            incr_s.append(time.process_time() - t0)
            enc_s.append(encode_s[0])
            counts.append((stats["embedded"], stats["cached"], encoded[0] - before))
            # The warm run must hand back the first run's vectors bit for bit.
            identical.append(bool(np.array_equal(more[: len(distinct)], full)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if len(set(counts)) != 1:
        raise RuntimeError(f"the warm runs embedded different counts: {counts}")
    embedded, cached, encoder_texts = counts[0]
    med = float(np.median(incr_s))
    say(
        f"incremental: full {full_s:.2f} s ({s_full['embedded']} texts), +{len(new)} new "
        f"{', '.join(f'{t:.3f}' for t in incr_s)} s ({embedded} embedded, {cached} cached)"
    )
    return {
        "incremental_fraction": med / full_s,
        "incremental_full_s": full_s,
        "incremental_s": med,
        "incremental_s_runs": incr_s,
        "incremental_encode_s": float(np.median(enc_s)),
        "incremental_full_embedded": s_full["embedded"],
        "incremental_embedded": embedded,
        "incremental_cached": cached,
        "incremental_new_texts": len(new),
        "incremental_encoder_texts": encoder_texts,
        "incremental_cached_vectors_identical": all(identical),
    }


# ---------------------------------------------------------------------------- data wait
WAIT_WINDOWS = 6  # consecutive stretches of the epoch's telemetry rows, each its own fraction


def wait_windows(rows: list[dict]) -> list[float]:
    """The data-wait fraction of each of WAIT_WINDOWS consecutive stretches of `rows` (none when
    there are fewer rows than stretches): their median and spread say what one reading cannot."""
    if len(rows) < WAIT_WINDOWS:
        return []
    out = []
    for chunk in np.array_split(np.arange(len(rows)), WAIT_WINDOWS):
        data = sum(rows[i]["perf/data_ms"] for i in chunk)
        step = sum(rows[i]["perf/step_ms"] for i in chunk)
        out.append(data / step)
    return out


def data_wait(rows: int) -> dict:
    """One epoch of the default preset's Trainer over the first `rows` train rows."""
    import torch

    from pipeline.core.config import load_config
    from pipeline.core.errors import PipelineError, ShardError
    from pipeline.data.shards import open_split
    from pipeline.train.loop import Trainer

    try:
        split = open_split(REPO_ROOT / "data/shards", "train", verify=False)
        x, y, source = split.inputs, split.targets, "data/shards"
    except (ShardError, PipelineError, OSError, ValueError) as e:
        say(f"data/shards unusable ({e}); synthetic (2000, {DIM}) arrays instead")
        rng = np.random.default_rng(0)
        x, y = (rng.standard_normal((2000, DIM), dtype=np.float32) for _ in range(2))
        source = "synthetic"
    n = min(rows, len(x)) if rows else len(x)
    cfg = load_config(["preset=default", "train.epochs=1", "train.checkpoint_every=0"])
    t0 = time.perf_counter()
    trainer = Trainer(cfg, x[:n], y[:n], progress=False)
    res = trainer.run()
    wall = time.perf_counter() - t0
    data_ms = sum(r["perf/data_ms"] for r in res.rows)
    step_ms = sum(r["perf/step_ms"] for r in res.rows)
    windows = wait_windows(res.rows)
    say(
        f"data wait: {len(res.rows)} rows, {res.rows[-1]['step'] if res.rows else 0} steps in {wall:.1f} s, "
        f"data {data_ms / max(len(res.rows), 1):.3f} of {step_ms / max(len(res.rows), 1):.1f} ms/step (mean over rows)"
    )
    return {
        "data_wait_fraction": float(np.median(windows)) if windows else data_ms / step_ms,
        "data_wait_fraction_overall": data_ms / step_ms,
        "data_wait_fraction_windows": windows,
        "data_wait_fraction_half_width": clock.median_half_width(windows),
        "data_wait_source": source,
        "data_wait_rows": n,
        "data_wait_steps": res.rows[-1]["step"] if res.rows else 0,
        "data_wait_telemetry_rows": len(res.rows),
        "data_wait_data_ms_per_step": float(np.median([r["perf/data_ms"] for r in res.rows])),
        "data_wait_step_ms": float(np.median([r["perf/step_ms"] for r in res.rows])),
        "data_wait_device": str(trainer.device),
        "data_wait_loader_prefetch": getattr(trainer.loader, "prefetch", 0),
        "data_wait_batch_size": cfg.train.batch_size,
        "data_wait_threads": torch.get_num_threads(),
    }


# ---------------------------------------------------------------------------- main
def main(argv=None) -> dict:
    ap = results.parser("data", __doc__)
    ap.add_argument(
        "--quick",
        action="store_true",
        help="the test's mode: 200 texts, 2 rounds, 200,000 vs 10,000 loader rows, 640 train rows",
    )
    ap.add_argument("--texts", type=int, help="distinct texts embedded per arm and round (default 3000; --quick 200)")
    ap.add_argument(
        "--rounds",
        type=int,
        help="ABBA rounds of the embed comparison, one run of each arm a round (default 4; --quick 2)",
    )
    ap.add_argument(
        "--incremental-repeats",
        type=int,
        default=3,
        help="warm-cache re-runs, each on a fresh copy of the cache; the median is used (default 3)",
    )
    ap.add_argument(
        "--loader-rows", type=int, help="rows of the large synthetic split (default 1000000; --quick 200000)"
    )
    ap.add_argument("--loader-small-rows", type=int, default=10_000, help="rows of the small one (default 10000)")
    ap.add_argument(
        "--wait-rows",
        type=int,
        help="train rows of the data-wait epoch (default: the whole split; --quick 640 = 20 steps of 32)",
    )
    ap.add_argument(
        "--prefetch",
        type=int,
        help="BatchLoader(prefetch=...) for the loader epochs, if the loader takes it "
        "(default: the loader's own default)",
    )
    ap.add_argument(
        "--scratch",
        help="directory for the temporary cache and shards (default: the system temp dir; "
        "the 1M-row split needs several GB while written)",
    )
    ap.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=["embed", "incremental", "loader", "wait"],
        help="leave a part out (repeatable)",
    )
    ap.add_argument(
        "--loader-child",
        metavar="DIR",
        help="internal: iterate one epoch over DIR's train split in this process and print its "
        "RssAnon figures as JSON (what the loader part runs in a fresh process)",
    )
    ap.add_argument("--threads", type=int, help="intra-op threads (default: the train stage's; 0: torch's)")
    results.add_save_flag(ap)
    args = ap.parse_args(argv)
    if args.loader_child:
        res = loader_child(args.loader_child, LOADER_BATCH, args.prefetch)
        print(json.dumps(res))
        return res

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    clock.pin_threads(args.threads)

    texts = args.texts or (200 if args.quick else 3000)
    rounds = args.rounds or (2 if args.quick else 4)
    big_rows = args.loader_rows or (200_000 if args.quick else 1_000_000)
    wait_rows = args.wait_rows if args.wait_rows is not None else (640 if args.quick else 0)
    scratch = Path(args.scratch or tempfile.gettempdir())
    scratch.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    res: dict = {"threads": torch.get_num_threads(), "torch": torch.__version__, "quick": args.quick, "goals": GOALS}
    model: dict = {}

    def teacher():
        if not model:
            from pipeline.core.config import default_values
            from pipeline.embed.teacher import load_teacher, teacher_identity

            model["m"] = load_teacher("bundled")
            model["id"] = teacher_identity("bundled", model["m"])
            model["batch"] = default_values().embed.batch_size
            model["texts"] = sample_texts(texts)
        return model

    def warm_cache() -> dict:
        t = teacher()
        return incremental(t["m"], t["id"], t["batch"], *t["texts"][2:], scratch, args.incremental_repeats)

    parts = [
        ("embed", lambda: embed_speed(teacher()["m"], teacher()["batch"], *teacher()["texts"][:3], rounds)),
        ("incremental", warm_cache),
        ("wait", lambda: data_wait(wait_rows)),
        ("loader", lambda: loader_memory(big_rows, args.loader_small_rows, scratch, args.prefetch)),
    ]
    from bench.probe import Probe, machine

    probe = Probe()  # the machine's speed between the parts (bench/probe.py): its spread says how busy it was
    for name, fn in parts:
        if name in args.skip:
            continue
        probe.take(3)
        t = time.perf_counter()
        res.update(fn())
        say(f"{name}: {time.perf_counter() - t:.1f} s")
    probe.take(3)
    res.update(machine(probe))
    meets = {"embed_speedup_vs_sentence_transformers": operator.ge, "loader_rss_growth_mb": operator.lt}
    res["goals_met"] = {k: meets.get(k, operator.le)(res[k], goal) for k, goal in GOALS.items() if k in res}
    res["load_avg_end"] = os.getloadavg()[0]
    res["bench_seconds"] = time.perf_counter() - t0
    if not all(math.isfinite(v) for v in res.values() if isinstance(v, float)):  # (top-level figures)
        raise RuntimeError(f"a figure is not finite: {res}")
    # The goals' figures, and beside the speed-up the share of it deduplication accounts for.
    keys = ("embed_speedup_vs_sentence_transformers", "embed_texts_over_distinct", *list(GOALS)[1:])
    why = {}
    if "data_wait_fraction" in res:
        why["data_wait_fraction"] = clock.spread_unreliable(
            res["data_wait_fraction"], res["data_wait_fraction_half_width"], "the windows' median 95 % half-width"
        )
    if "incremental_fraction" in res:
        runs = res["incremental_s_runs"]  # the warm re-embeds, each over the one full embed
        spread = (max(runs) - min(runs)) / res["incremental_full_s"] if len(runs) >= 3 else None
        how = "the warm runs' max - min"
        why["incremental_fraction"] = clock.spread_unreliable(res["incremental_fraction"], spread, how)
    res.update(results.figures({k: res[k] for k in keys if k in res}, why))
    return results.finish("data", res, args.save, argv)


if __name__ == "__main__":
    main()
