"""Serving benchmark: what answering questions costs with the answer model (pipeline/serve/), in
this process and through the REST server, against the teacher's own encoding of the same
questions. The last stdout line is one JSON object; progress lines go to stderr.

Arms, interleaved round by round (each round runs every arm once, in this order, with a reference
probe, bench/probe.py, before each arm and after the last):
- in_process_single / in_process_batch: the pyfunc's predict (mlflow.pyfunc.load_model) on one
  question at a time (each request a different question) and on a batch of `--batch` questions;
- teacher_encode: the teacher's own `encode` of the same batch (embed.batch_size batches), the
  floor any text-in model pays: a question has to be embedded before anything else happens;
- rest_single / rest_batch: the same two requests as JSON through `mlflow models serve
  --env-manager local` (uvicorn + FastAPI, one worker) on a loopback port, dataframe_split with
  params k.

Measured: latency p50 and p99 of one question (ms; and in probes: the latency over the median
probe), the batch's throughput (questions per second; each round's span, median over rounds),
the teacher's encode of one question, and parts_ms, one in-process batch split into its parts
(timed apart, once per round, median): encode (the teacher, as the embed stage calls it), model
(the energy-flow model in batches of train.batch_size), topk (cosines to the bank and
torch.topk). Headline figures are ratios within the same round, taken per round and their
median: in_process_batch_over_teacher_encode (goal <= 1.5),
in_process_single_over_teacher_encode_single, parts_share (each part over the three parts'
sum) and rest_batch_over_in_process_batch; absolute times are context (`context`, `cpu`).

Every in-process span is also taken in this process's CPU seconds, on the train stage's thread
count by default (--threads; bench/clock.py): `cpu` holds them, and the in-process ratios are
taken from those. A REST batch request's work is mostly the server's, another process: its CPU
seconds are the server's process tree's (psutil) plus this client's, over the in-process batch's
of the same round; its ratio is null in `figures` when the rounds spread wider than two runs may
differ (`unreliable` says so). Its wall ratio is context. --save also writes bench/results/serve.json.

The model: --model URI (any MLflow model URI or local directory; a runs:/ URI is looked up in
MLFLOW_TRACKING_URI or the project's store), by default the workspace's trained model
(models/model.pt and the shards in embed.out_dir, with params.yaml's batch sizes) saved as an
answer model into a temporary directory. Questions: the shipped dataset's (data/raw/qa_pairs.csv),
distinct, in file order. No GPU needed. A missed goal is reported in goals_met, not as an exit
status; an error exits non-zero. Never writes to the project's mlflow.db.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from bench import clock, results
from bench.model_server import invoke, questions_payload, served_model, tree_cpu_s
from bench.probe import Probe, machine
from pipeline.core.paths import REPO_ROOT
from pipeline.train.telemetry import rss_mb

GOALS = {"in_process_batch_over_teacher_encode": 1.5}
QUESTIONS_CSV = REPO_ROOT / "data" / "raw" / "qa_pairs.csv"
ARMS = ("in_process_single", "teacher_encode_single", "in_process_batch", "teacher_encode", "rest_single", "rest_batch")
PARTS = ("encode", "model", "topk")


say = functools.partial(results.say, "serve")


def shipped_questions(n: int) -> list[str]:
    questions = pd.read_csv(QUESTIONS_CSV)["question"].astype(str).drop_duplicates().tolist()
    if len(questions) < n:
        raise SystemExit(f"{QUESTIONS_CSV}: {len(questions)} distinct questions; --batch {n} needs that many")
    return questions[:n]


def workspace_model(dest: Path) -> str:
    """The workspace's trained model saved as an answer model under `dest`."""
    from omegaconf import OmegaConf

    from pipeline.core.paths import repo_path
    from pipeline.serve.log import save_answer_model

    params = OmegaConf.load(REPO_ROOT / "params.yaml")
    model = repo_path(params.train.out_dir) / "model.pt"
    if not model.is_file():
        raise SystemExit(f"{model} not found: run ./dev repro first, or pass --model URI")
    path = dest / "answer-model"
    save_answer_model(path, model, repo_path(params.embed.out_dir), params.train.batch_size, params.embed.batch_size)
    return str(path)


def percentiles_ms(seconds: list[float]) -> dict:
    ms = np.asarray(seconds) * 1000
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)), "count": int(ms.size)}


def timed(fn, cpu: list[float] | None = None) -> float:
    """Wall seconds of `fn`; its CPU seconds appended to `cpu` when given."""
    span, _ = clock.measure(fn)
    if cpu is not None:
        cpu.append(span.cpu)
    return span.wall


def parts(answerer, questions: list[str]) -> dict[str, float]:
    """One batch's parts, timed apart: what predict does, step by step."""
    import torch.nn.functional as F

    from pipeline.answer.prediction import predict
    from pipeline.embed.teacher import encode_texts

    teacher, embed_bs = answerer.teacher, answerer.embed_batch_size
    encode, x = clock.measure(lambda: encode_texts(teacher, questions, embed_bs, progress=False))
    model, pred = clock.measure(lambda: torch.from_numpy(predict(answerer.model, x, answerer.train_batch_size)))
    topk, _ = clock.measure(lambda: torch.topk(F.normalize(pred, dim=1) @ answerer.bank_vectors.T, 5, dim=1))
    spans = {"encode": encode, "model": model, "topk": topk}
    return {k: 1000 * v.wall for k, v in spans.items()} | {f"{k}_cpu": 1000 * v.cpu for k, v in spans.items()}


def measure(model_uri: str, batch: int, singles: int, rounds: int, k: int, probe: Probe, rest: bool = True) -> dict:
    import mlflow

    questions = shipped_questions(max(batch, singles))
    batch_q, frame = questions[:batch], pd.DataFrame({"question": questions[:batch]})
    t0 = time.perf_counter()
    load, model = clock.measure(lambda: mlflow.pyfunc.load_model(model_uri))
    load_s = load.wall
    answerer = model.unwrap_python_model()
    teacher, embed_bs = answerer.teacher, answerer.embed_batch_size
    params = {"k": k}
    spans: dict[str, list[float]] = {a: [] for a in ARMS}
    cpu: dict[str, list[float]] = {a: [] for a in ARMS if not a.startswith("rest")}
    rest_client: list[float] = []  # this process's CPU seconds of each REST batch request
    cpu_rest_batch: list[float] = []
    probes: list[float] = []
    part_ms: list[dict] = []
    single_over_encode: list[float] = []
    per_round = max(1, singles // rounds)

    def one(q: str) -> None:
        model.predict(pd.DataFrame({"question": [q]}), params=params)

    def encode(texts: list[str] | None = None) -> None:
        with torch.inference_mode():
            texts = batch_q if texts is None else texts
            teacher.encode(texts, batch_size=embed_bs, show_progress_bar=False, convert_to_numpy=True)

    # Untimed warm-up: torch's threads and allocator, the tokenizer's caches.
    model.predict(frame, params=params)
    encode()
    with served_model(model_uri) if rest else contextlib.nullcontext(("", None)) as (url, server):
        if rest:  # its first request imports and warms the server's side
            invoke(url, questions_payload(batch_q, k))
        start_s = time.perf_counter() - t0 - load_s
        for r in range(rounds):
            say(f"round {r + 1}/{rounds}")
            singles_now = questions[r * per_round : (r + 1) * per_round] or questions[:per_round]
            probes.append(probe())
            spans["in_process_single"] += [timed(lambda q=q: one(q), cpu["in_process_single"]) for q in singles_now]
            spans["teacher_encode_single"] += [
                timed(lambda q=q: encode([q]), cpu["teacher_encode_single"]) for q in singles_now
            ]
            single_over_encode.append(
                float(np.median(cpu["in_process_single"][-len(singles_now) :]))
                / float(np.median(cpu["teacher_encode_single"][-len(singles_now) :]))
            )
            probes.append(probe())
            spans["in_process_batch"].append(
                timed(lambda: model.predict(frame, params=params), cpu["in_process_batch"])
            )
            probes.append(probe())
            spans["teacher_encode"].append(timed(encode, cpu["teacher_encode"]))
            probes.append(probe())
            part_ms.append(parts(answerer, batch_q))
            if rest:
                probes.append(probe())
                spans["rest_single"] += [
                    timed(lambda q=q: _ok(invoke(url, questions_payload([q], k)))) for q in singles_now
                ]
                probes.append(probe())
                server_before = tree_cpu_s(server)
                spans["rest_batch"].append(timed(lambda: _ok(invoke(url, questions_payload(batch_q, k))), rest_client))
                # The request's CPU seconds: the server's (its process tree's) and this client's.
                cpu_rest_batch.append(tree_cpu_s(server) - server_before + rest_client[-1])
            probes.append(probe())
    probe_ms = float(np.median(probes)) * 1000
    out: dict = {"model": model_uri, "load_s": load_s, "server_start_and_warm_up_s": start_s if rest else None}

    def batches(b: list[float]) -> dict:
        return {
            "batch_s_median": float(np.median(b)),
            "batch_questions_per_s": float(batch / np.median(b)),
            "batch_s_rounds": b,
        }

    for mode in ("in_process", "rest") if rest else ("in_process",):
        single = percentiles_ms(spans[f"{mode}_single"])
        single.update(p50_probes=single["p50_ms"] / probe_ms, p99_probes=single["p99_ms"] / probe_ms)
        out[mode] = {"single": single, **batches(spans[f"{mode}_batch"])}
    enc = spans["teacher_encode"]
    out["teacher_encode"] = batches(enc)
    # Each round's batch over the same round's encode, in CPU seconds: the median of the pairs.
    ratios = [a / b for a, b in zip(cpu["in_process_batch"], cpu["teacher_encode"])]
    out["in_process_batch_over_teacher_encode"] = float(np.median(ratios))
    out["in_process_batch_over_teacher_encode_rounds"] = ratios
    out["in_process_batch_over_teacher_encode_wall"] = clock.median_ratio(spans["in_process_batch"], enc)
    # Each round's one-question latency over the teacher's encode of one question, CPU seconds.
    out["in_process_single_over_teacher_encode_single"] = float(np.median(single_over_encode))
    out["in_process_single_over_teacher_encode_single_rounds"] = single_over_encode
    out["cpu"] = {
        "load_s": load.cpu,
        "in_process_single": percentiles_ms(cpu["in_process_single"]),
        "teacher_encode_single": percentiles_ms(cpu["teacher_encode_single"]),
        "in_process_batch_s_median": float(np.median(cpu["in_process_batch"])),
        "teacher_encode_batch_s_median": float(np.median(cpu["teacher_encode"])),
        "parts_ms": {p: float(np.median([d[f"{p}_cpu"] for d in part_ms])) for p in PARTS},
    }
    # Each part's share of its round's batch (the three parts' sum), CPU seconds, median over rounds;
    # the rounds' spread says whether another run would agree (a small part's share moves most).
    shares = {p: [d[f"{p}_cpu"] / sum(d[f"{q}_cpu"] for q in PARTS) for d in part_ms] for p in PARTS}
    out["parts_share"] = {p: float(np.median(v)) for p, v in shares.items()}
    out["parts_share_spread"] = {p: float(max(v) - min(v)) if len(v) >= 3 else None for p, v in shares.items()}
    if rest:
        # CPU seconds on both sides (the server's process tree and this client) over the in-process
        # batch's, round by round: wall seconds across two processes moved with other load.
        rest_ratios = [a / b for a, b in zip(cpu_rest_batch, cpu["in_process_batch"])]
        out["rest_batch_over_in_process_batch"] = float(np.median(rest_ratios))
        out["rest_batch_over_in_process_batch_rounds"] = rest_ratios
        wall = clock.median_ratio(spans["rest_batch"], spans["in_process_batch"])
        out["rest_batch_over_in_process_batch_wall"] = wall
        # The rounds' own spread says whether another run would agree.
        out["rest_ratio_spread"] = float(max(rest_ratios) - min(rest_ratios)) if len(rest_ratios) >= 3 else None
        out["cpu"]["rest_batch_s_median"] = float(np.median(cpu_rest_batch))
    out["parts_ms"] = {p: float(np.median([d[p] for d in part_ms])) for p in PARTS}
    # Resident memory of this process, which has loaded the model and answered every request.
    out["rss_mb"] = rss_mb()
    out["embed_batch_size"], out["train_batch_size"] = embed_bs, answerer.train_batch_size
    out["bank_size"] = len(answerer.texts)
    return out


def _ok(result: tuple[int, dict]) -> None:
    status, body = result
    if status != 200:
        raise RuntimeError(f"the model server answered {status}: {body}")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", metavar="URI", help="the answer model (default: the workspace's, saved to a temp dir)")
    ap.add_argument("--batch", type=int, default=256, help="questions in the batch request (default 256)")
    ap.add_argument("--singles", type=int, default=200, help="one-question requests per arm, all rounds (default 200)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of every arm (default 5)")
    ap.add_argument("-k", type=int, default=5, help="answers per question (default 5)")
    ap.add_argument("--no-rest", action="store_true", help="in process only (no server)")
    ap.add_argument("--quick", action="store_true", help="a fast check of the benchmark: batch 8, 6 singles, 2 rounds")
    ap.add_argument("--threads", type=int, help="intra-op threads (default: the train stage's; 0: torch's)")
    results.add_save_flag(ap)
    args = ap.parse_args(argv)
    if args.quick:
        args.batch, args.singles, args.rounds = 8, 6, 2
    clock.pin_threads(args.threads)
    t0 = time.perf_counter()
    probe = Probe()
    res = {"device": f"cpu ({torch.get_num_threads()} threads)", "torch": torch.__version__}
    res.update(batch=args.batch, singles=args.singles, rounds=args.rounds, k=args.k, questions=str(QUESTIONS_CSV))
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        uri = args.model or workspace_model(Path(tmp))
        say(f"model {uri}")
        res.update(measure(uri, args.batch, args.singles, args.rounds, args.k, probe, rest=not args.no_rest))
    res["goals"] = GOALS
    res["goals_met"] = {
        "in_process_batch_over_teacher_encode": res["in_process_batch_over_teacher_encode"]
        <= GOALS["in_process_batch_over_teacher_encode"]
    }
    res.update(machine(probe))
    res["bench_seconds"] = time.perf_counter() - t0
    say(f"{res['bench_seconds']:.1f} s")
    res["context"] = context(res)
    res.update(headline(res))
    return results.finish("serve", res, args.save, argv)


def context(res: dict) -> dict:
    """The absolute times, in process (CPU seconds) and over REST (wall): kept for reading, but
    no figures, since they move with the machine and its neighbours where a ratio of two arms of
    the same round does not."""
    cpu, batch = res["cpu"], res["batch"]
    out = {
        "in_process_single_p50_ms": cpu["in_process_single"]["p50_ms"],
        "in_process_single_p99_ms": cpu["in_process_single"]["p99_ms"],
        "in_process_batch_s": cpu["in_process_batch_s_median"],
        "in_process_questions_per_s": batch / cpu["in_process_batch_s_median"],
        "teacher_encode_batch_s": cpu["teacher_encode_batch_s_median"],
        "teacher_encode_questions_per_s": batch / cpu["teacher_encode_batch_s_median"],
        "teacher_encode_single_p50_ms": cpu["teacher_encode_single"]["p50_ms"],
        "parts_ms": cpu["parts_ms"],
        "load_s": cpu["load_s"],
    }
    if "rest" in res:
        out |= {
            "rest_single_p50_ms": res["rest"]["single"]["p50_ms"],
            "rest_single_p99_ms": res["rest"]["single"]["p99_ms"],
            "rest_questions_per_s": res["rest"]["batch_questions_per_s"],
        }
    return out


def headline(res: dict) -> dict:
    """Ratios of CPU seconds taken in the same round (the REST one counts the server's process
    tree and the client), the REST one null when its rounds spread."""
    values = {
        "in_process_batch_over_teacher_encode": res["in_process_batch_over_teacher_encode"],
        "in_process_single_over_teacher_encode_single": res["in_process_single_over_teacher_encode_single"],
        "parts_share": res["parts_share"],
        "rss_mb": res["rss_mb"],
    }
    unreliable = {
        f"parts_share.{p}": clock.spread_unreliable(
            share, res.get("parts_share_spread", {}).get(p), "the rounds' max - min"
        )
        for p, share in res["parts_share"].items()
    }
    if "rest" in res:
        values["rest_batch_over_in_process_batch"] = res["rest_batch_over_in_process_batch"]
        why = clock.spread_unreliable(
            res["rest_batch_over_in_process_batch"], res.get("rest_ratio_spread"), "the rounds' max - min"
        )
        unreliable["rest_batch_over_in_process_batch"] = why
    return results.figures(values, unreliable)


if __name__ == "__main__":
    main()
