"""Numerics benchmark: do the trained weights and the teacher's vectors depend on the machine, and
what does the portable setting (pipeline/core/numerics.py) cost? The last stdout line is one JSON
object; progress lines go to stderr. Every run is a fresh subprocess, as MKL and ATen read their
settings once, at their first use.

- agreement: the smoke preset trained (train.threads=0, as the default preset: the count is the
  machine's) under each emulation of another machine, natively and with the portable setting;
  per variant: whether the final weights are bitwise identical to that mode's reference
  (`native`) and the val cosine. The emulations (EMULATIONS) stand in for machines we do not
  have: `mkl_intel` preloads a two-function shim that tells MKL it runs on an Intel CPU
  (mkl_serv_intel_cpu_true, which MKL's dispatcher asks: on any other vendor it never takes its
  AVX-512 code), so it takes the kernels it takes on an AVX-512 Xeon; `mkl_cbwr_avx512`
  (MKL_CBWR=AVX512, MKL's own switch for choosing a code branch) would be the direct way, but on
  a non-Intel CPU MKL falls back to its AUTO branch (this bench's MKL_VERBOSE lines say
  "CNR:AUTO"); `aten_avx2` caps ATen's kernels at AVX2
  (an AMD Zen 3 or an older Xeon); `avx2_cpu` caps MKL, ATen and oneDNN at AVX2; `intel_avx2`
  is avx2_cpu with the shim (a Haswell/Broadwell Xeon); `cores_1` runs on one core (a
  machine with other core count: train.threads=0 is the machine's core count).
  The portable rows combine each emulation with the portable setting: the keys the setting pins
  (MKL_CBWR, ATEN_CPU_CAPABILITY, ...) are its own there, the rest of the emulation applies.
- encode: the bundled teacher's vectors of the smoke texts under the same variants (identical or
  the largest difference from native).
- cost: the portable setting over native, as ratios of medians in this one run: ms per training
  step of the `default` preset (synthetic data, the real trainer with its thread rule) and
  seconds per teacher encode of the same texts. Arms alternate (ABBA) in fresh processes, and
  each process also times a fixed reference probe (a pure-Python loop that no numerics setting
  touches) around its work: `*_ratio_probe_normalised` divides each run's time by its probe's,
  so a load that comes and goes on this shared machine cancels out. The portable setting also
  pins the thread count, so those wall-time ratios hold on a quiet machine only: in `figures`
  they are null when the probes saw a busy one (`unreliable` says why). `*_cpu_ratio`: each
  worker's own CPU seconds (bench/clock.py), i.e. the work the portable setting's kernels add;
  it holds on a busy machine, but only where both arms run on the same thread count (a machine
  of one core, or OMP_NUM_THREADS set), else it is null too: idle threads spin, and that counts.
  --save also writes bench/results/numerics.json.

--quick: fewer variants, steps and rounds (for the tests). --shards DIR reuses smoke-preset
shards (else the embed stage builds them into a temporary directory). No GPU needed.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import clock, results
from pipeline.core import numerics
from pipeline.core.paths import REPO_ROOT

# The shim: MKL's dispatcher asks these whether the CPU is an Intel one.
SHIM_SOURCE = "int mkl_serv_intel_cpu_true(void) { return 1; }\nint mkl_serv_intel_cpu(void) { return 1; }\n"
SHIM = "@shim"  # placeholder in EMULATIONS for the shim's path

AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
# name -> (environment, what it stands for)
EMULATIONS: dict[str, tuple[dict, str]] = {
    "native": ({}, "this machine as it is"),
    "mkl_cbwr_avx512": ({"MKL_CBWR": "AVX512"}, "MKL's documented AVX-512 branch (AUTO on a non-Intel CPU)"),
    "mkl_intel": ({"LD_PRELOAD": SHIM}, "MKL on an Intel AVX-512 CPU (Xeon Skylake-SP and later)"),
    "aten_avx2": ({"ATEN_CPU_CAPABILITY": "avx2"}, "ATen on an AVX2-only CPU (AMD Zen 3, Xeon Haswell/Broadwell)"),
    "avx2_cpu": (AVX2, "an AVX2-only AMD CPU (Zen 2/3)"),
    "intel_avx2": ({"LD_PRELOAD": SHIM, **AVX2}, "an AVX2-only Intel CPU (Xeon Haswell/Broadwell)"),
    "cores_1": ({"@cores": "1"}, "a machine with another core count (here 1 core; train.threads=0)"),
}
QUICK = ("native", "mkl_intel", "aten_avx2", "cores_1")
NATIVE_OFF = {numerics.MODE_VAR: "native"}


say = functools.partial(results.say, "numerics")


def build_shim(where: Path) -> str | None:
    """Compile the shim with the system C compiler; None if there is none."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        return None
    src, lib = where / "fakeintel.c", where / "libfakeintel.so"
    src.write_text(SHIM_SOURCE)
    proc = subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(lib), str(src)], capture_output=True, text=True)
    return str(lib) if proc.returncode == 0 else None


def variant_env(emulation: dict, portable: bool, shim: str | None) -> tuple[dict, int | None] | None:
    """The environment of one run, and the cores it may use (None: all). None if it cannot run
    here (the shim could not be built)."""
    env = {k: v for k, v in os.environ.items() if k not in numerics.PORTABLE and k != numerics.MODE_VAR}
    env.pop("LD_PRELOAD", None)
    cores = None
    for k, v in emulation.items():
        if k == "@cores":
            cores = int(v)
        elif v == SHIM:
            if shim is None:
                return None
            env[k] = shim
        else:
            env[k] = v
    if portable:
        env.update(numerics.PORTABLE)  # the setting's keys are its own; the rest of the emulation stays
    env[numerics.MODE_VAR] = "portable" if portable else "native"
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONHASHSEED": "0"})
    return env, cores


def run_worker(kind: str, env: dict, cores: int | None, *args: str, timeout: int = 900) -> dict:
    pre = None
    if cores:
        pre = lambda: os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:cores])  # noqa: E731
    args = ["-m", "bench.numerics", "--worker", kind, *args]
    return results.child_json(args, f"worker {kind}", timeout, env=env, preexec_fn=pre)


# ---------------------------------------------------------------------------- workers (subprocesses)
def probe_s() -> float:
    """A fixed pure-Python workload: no MKL, ATen or thread setting touches it."""
    t0 = time.perf_counter()
    acc = 0
    for i in range(400_000):
        acc = (acc * 31 + i) % 1_000_003
    return time.perf_counter() - t0


def _digest(model) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def worker_train(shards: str, out: str, overrides: list[str]) -> dict:
    import torch

    from pipeline.core.config import load_config
    from pipeline.data.shards import open_split
    from pipeline.train.loop import train_model

    cfg = load_config(["preset=smoke", "train.device=cpu", "train.checkpoint_every=0", *overrides])
    train, val = open_split(shards, "train"), open_split(shards, "val")
    seen = set()  # the intra-op threads while training (the trainer restores them after)
    result = train_model(
        cfg,
        train.inputs,
        train.targets,
        val.inputs,
        val.targets,
        progress=False,
        on_log=lambda row, step: seen.add(torch.get_num_threads()),
    )
    if out:
        import numpy as np

        np.savez(out, **{k: v.detach().cpu().numpy() for k, v in result.model.state_dict().items()})
    return {
        "weights": _digest(result.model),
        "val_cosine": result.summary["val/cosine"],
        "threads": sorted(seen),
        **numerics.numerics_info(),
    }


def worker_encode(shards: str, out: str, n: int) -> dict:
    import numpy as np
    import pandas as pd

    from pipeline.embed.teacher import encode_texts, load_teacher

    frame = pd.read_parquet(Path(shards) / "train.parquet")
    texts = list(dict.fromkeys([*frame.input_text, *frame.target_text]))[:n]
    teacher = load_teacher("bundled", "cpu")
    import torch

    threads = numerics.threads(0)  # what the embed stage uses
    if threads:
        torch.set_num_threads(threads)
    encode_texts(teacher, texts[:64], 64, progress=False)  # warm-up
    p0 = probe_s()
    t0, c0 = time.perf_counter(), time.process_time()
    vecs = encode_texts(teacher, texts, 64, progress=False)
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    p1 = probe_s()
    if out:
        np.save(out, vecs)
    return {
        "digest": hashlib.sha256(vecs.tobytes()).hexdigest(),
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "probe_s": (p0 + p1) / 2,
        "texts": len(texts),
        "threads": torch.get_num_threads(),
        **numerics.numerics_info(),
    }


def worker_steps(steps: int) -> dict:
    import torch

    from bench.workloads import config, synthetic
    from pipeline.train.loop import train_model

    cfg, rows = config("default", steps, "train.log_every=20", "train.warmup_steps=2")
    x, y = synthetic(rows)
    seen = set()
    p0 = probe_s()
    t0, c0 = time.perf_counter(), time.process_time()
    result = train_model(cfg, x, y, progress=False, on_log=lambda row, step: seen.add(torch.get_num_threads()))
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    p1 = probe_s()
    n = int(result.summary["train/steps"])
    return {
        "ms_per_step": 1000 * seconds / n,
        "cpu_ms_per_step": 1000 * cpu_seconds / n,
        "steps": n,
        "probe_s": (p0 + p1) / 2,
        "threads": sorted(seen),
        **numerics.numerics_info(),
    }


# ---------------------------------------------------------------------------- the parent
def make_shards(where: Path) -> str:
    out = where / "smoke"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    args = [
        sys.executable,
        "-m",
        "stages.embed",
        "preset=smoke",
        f"embed.out_dir={out}",
        "embed.cache_dir=",
        "run.allow_external_paths=true",
        "run.tracking=disabled",
    ]
    proc = subprocess.run(args, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode:
        raise RuntimeError(f"embed stage failed:\n{proc.stderr[-3000:]}")
    return str(out)


def agreement(
    names, shards: str, shim: str | None, overrides: list[str], tmp: Path, encode_n: int, modes=("native", "portable")
) -> dict:
    import numpy as np

    table: dict = {}
    for mode in modes:
        ref_w = ref_e = ref_weights = ref_vec = None
        for name in names:
            spec = variant_env(EMULATIONS[name][0], mode == "portable", shim)
            key = f"{mode}/{name}"
            if spec is None:
                table[key] = {"skipped": "no C compiler for the MKL shim"}
                continue
            env, cores = spec
            t0 = time.perf_counter()
            wfile = tmp / f"{mode}-{name}.npz"
            tr = run_worker("train", env, cores, "--shards", shards, "--out", str(wfile), *overrides)
            row = {
                "val_cosine": tr["val_cosine"],
                "weights": tr["weights"][:16],
                "cpu_capability": tr["numerics.cpu_capability"],
                "threads": tr["threads"],
            }
            with np.load(wfile) as w:
                weights = {k: w[k] for k in w.files}
            if ref_w is None:
                ref_w, ref_weights = tr["weights"], weights
            row["weights_max_abs_diff"] = max(float(np.abs(weights[k] - ref_weights[k]).max()) for k in weights)
            if encode_n:
                npy = str(tmp / f"{mode}-{name}.npy")
                en = run_worker("encode", env, cores, "--shards", shards, "--out", npy, "--texts", str(encode_n))
                vec = np.load(npy)
                if ref_vec is None:
                    ref_vec, ref_e = vec, en["digest"]
                row["encode_identical"] = en["digest"] == ref_e
                row["encode_max_abs_diff"] = float(np.abs(vec - ref_vec).max())
            row["weights_identical"] = tr["weights"] == ref_w
            table[key] = row
            say(f"{key}: {row} ({time.perf_counter() - t0:.1f} s)")
    return table


def cost(rounds: int, steps: int, encode_n: int, shards: str) -> dict:
    arms = {"native": variant_env({}, False, None)[0], "portable": variant_env({}, True, None)[0]}
    runs: dict = {("steps", a): [] for a in arms} | {("encode", a): [] for a in arms}
    for r in range(rounds):
        order = ("native", "portable") if r % 2 == 0 else ("portable", "native")  # ABBA
        for arm in order:
            s = run_worker("steps", arms[arm], None, "--steps", str(steps))
            runs[("steps", arm)].append((s["ms_per_step"], s["probe_s"], s["threads"], s["cpu_ms_per_step"]))
            if encode_n:
                e = run_worker("encode", arms[arm], None, "--shards", shards, "--out", "", "--texts", str(encode_n))
                runs[("encode", arm)].append((e["seconds"], e["probe_s"], e["threads"], e["cpu_seconds"]))
            say(
                f"cost round {r + 1}/{rounds} {arm}: {runs[('steps', arm)][-1]}"
                + (f" encode {runs[('encode', arm)][-1]}" if encode_n else "")
            )
    res: dict = {"cost_rounds": rounds, "cost_train_steps": steps, "cost_encode_texts": encode_n}
    for what, label, unit in (("steps", "train_step", "ms"), ("encode", "encode", "s")):
        if not runs[(what, "native")]:
            continue
        med = {a: statistics.median(r[0] for r in runs[(what, a)]) for a in arms}
        norm = {a: statistics.median(r[0] / r[1] for r in runs[(what, a)]) for a in arms}
        cpu = {a: statistics.median(r[3] for r in runs[(what, a)]) for a in arms}
        res |= {f"{label}_{unit}_{a}": med[a] for a in arms}
        res |= {f"{label}_threads_{a}": runs[(what, a)][0][2] for a in arms}
        res[f"{label}_ratio"] = med["portable"] / med["native"]
        res[f"{label}_ratio_probe_normalised"] = norm["portable"] / norm["native"]
        res[f"{label}_cpu_ratio"] = cpu["portable"] / cpu["native"]
    return res


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="4 variants, no encode table, 1 cost round of few steps")
    ap.add_argument("--shards", default="", help="smoke-preset shard directory to reuse")
    ap.add_argument("--rounds", type=int, default=0, help="ABBA cost rounds (default 4; --quick 2)")
    ap.add_argument("--steps", type=int, default=0, help="default-preset training steps per cost run (default 60)")
    ap.add_argument("--texts", type=int, default=-1, help="texts per teacher encode (default 256; --quick 0: none)")
    ap.add_argument(
        "--variants", default="", help="comma-separated emulations (default: all; --quick: " + ",".join(QUICK) + ")"
    )
    results.add_save_flag(ap)
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", help="config overrides for the agreement runs")
    args = ap.parse_args(argv)
    if args.worker:
        res = {
            "train": lambda: worker_train(args.shards, args.out, args.overrides),
            "encode": lambda: worker_encode(args.shards, args.out, args.texts),
            "steps": lambda: worker_steps(args.steps),
        }[args.worker]()
        print(json.dumps(res))
        return res
    t_start = time.perf_counter()
    names = args.variants.split(",") if args.variants else list(QUICK if args.quick else EMULATIONS)
    unknown = [n for n in names if n not in EMULATIONS]
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {sorted(EMULATIONS)}")
    rounds = args.rounds or (2 if args.quick else 4)
    steps = args.steps or (8 if args.quick else 60)
    texts = args.texts if args.texts >= 0 else (0 if args.quick else 256)
    overrides = ["train.threads=0", *args.overrides]
    res: dict = {
        "machine": numerics.numerics_info(),
        "portable_setting": numerics.PORTABLE,
        "portable_threads": numerics.PORTABLE_THREADS,
    }
    from bench.probe import Probe, machine

    # The shared matmul probe (bench/probe.py), in this process between the parts: how busy the
    # machine was. The cost figures have their own probe, in each worker (see cost()).
    probe = Probe()
    with tempfile.TemporaryDirectory(prefix="bench-numerics-") as tmp:
        tmp = Path(tmp)
        shim = build_shim(tmp)
        shards = args.shards or make_shards(tmp)
        res["mkl_shim"] = bool(shim)
        probe.take(3)
        res["agreement"] = agreement(names, shards, shim, overrides, tmp, texts)
        probe.take(3)
        res.update(cost(rounds, steps, texts, shards))
        probe.take(3)
    res.update(machine(probe))
    table = res["agreement"]
    for mode in ("native", "portable"):
        rows = [r for k, r in table.items() if k.startswith(mode + "/") and "skipped" not in r]
        res[f"{mode}_all_identical"] = all(r["weights_identical"] for r in rows)
        res[f"{mode}_val_cosine_spread"] = max(r["val_cosine"] for r in rows) - min(r["val_cosine"] for r in rows)
    res["bench_seconds"] = time.perf_counter() - t_start
    keys = ("train_step_ratio", "train_step_cpu_ratio", "encode_ratio", "encode_cpu_ratio")
    values = {k: res[k] for k in keys if k in res}
    unreliable = {}
    for label in ("train_step", "encode"):
        if f"{label}_ratio" not in res:
            continue
        native, portable = res[f"{label}_threads_native"], res[f"{label}_threads_portable"]
        most = max(native or [1]) if isinstance(native, list) else native  # (the trainer's: a list)
        unreliable[f"{label}_ratio"] = clock.wall_ratio_unreliable(res.get("busy"), most)
        if native != portable:
            # Idle threads of the arm with more of them spin at every parallel region, and that
            # counts as CPU time: CPU seconds compare arms on the same thread count only.
            unreliable[f"{label}_cpu_ratio"] = (
                f"the arms ran on different thread counts ({native} native, {portable} portable): CPU "
                "seconds count the waiting of the arm with more threads"
            )
    res.update(results.figures(values, unreliable))
    return results.finish("numerics", res, args.save, argv)


if __name__ == "__main__":
    main()
