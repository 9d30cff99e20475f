"""bench.gpu on a CPU: `--quick --device cpu` runs the real trainer on the smoke preset and reports
every figure a CPU can measure (step time, host syncs, ops, FLOPs against a matmul peak of the
same run) and every one it cannot (kernels, GPU busy share, TF32, bf16, CUDA graphs) as null with
a `why`. No timing is asserted beyond sanity: the benchmark reports, tests check its shape."""

import math

import pytest
import torch

from bench import gpu as bench
from tests.helpers.bench_runs import bench_json

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def quick():
    return bench_json("bench.gpu", "--quick", "--device", "cpu", timeout=300)


def test_quick_cpu_run_names_the_device_and_measures_what_a_cpu_can(quick):
    assert quick["device"] == "cpu" and quick["device_name"] == quick["cpu_model"] and quick["device_name"]
    assert quick["torch"] == torch.__version__
    assert quick["presets"] == ["smoke"] and quick["errors"] == []
    ran = [r for r in quick["runs"] if r["step_ms"] is not None]
    assert ran and {r["precision"] for r in ran} == {"fp32"}
    for r in ran:
        name = f"{r['preset']}/{r['precision']}/{r['label']}"
        assert r["step_ms"] > 0 and r["step_ms_mean"] > 0 and r["timed_steps"] == quick["timed_steps"], name
        assert r["host_syncs_per_step"] >= 1, name  # at least the trainer's health read-out
        assert r["ops_per_step"] > 100, name
        assert r["gflop_per_step"] > 0 and r["achieved_gflops"] > 0 and r["matmul_peak_gflops"] > 0, name
        assert r["fraction_of_matmul_peak"] == pytest.approx(r["achieved_gflops"] / r["matmul_peak_gflops"])
        assert r["flow_steps_per_batch"] >= 1
        assert r["ms_per_flow_step"] == pytest.approx(r["step_ms"] / r["flow_steps_per_batch"])
        assert (
            r["host_sync_sites"] and sum(r["host_sync_sites"].values()) == r["host_syncs_per_step"] * r["counted_steps"]
        )
        assert r["warmup_steps"] == quick["warmup_steps"] and r["counted_steps"] == r["log_every"]
        # The GPU's figures: none on a CPU, each said why.
        for key in bench.GPU_FIGURES:
            assert r[key] is None and "needs CUDA" in r[f"{key}_why"], key
    assert quick["matmul_peak"] and all(p["gflops"] > 0 for p in quick["matmul_peak"])


def test_quick_cpu_run_lists_what_needs_cuda_with_why(quick):
    for precision in ("tf32", "bf16"):
        runs = [r for r in quick["runs"] if r["precision"] == precision]
        assert runs, precision
        assert all(r["step_ms"] is None and "needs CUDA" in r["why"] for r in runs)
        assert quick[f"matmul_peak_{precision}"] is None and "needs CUDA" in quick[f"matmul_peak_{precision}_why"]
    # Every null figure of the whole object has a why: beside it, or the run's own.
    for r in quick["runs"]:
        for key in bench.FIGURES:
            if r[key] is None:
                assert r.get(f"{key}_why") or r.get("why"), (r["label"], r["precision"], key)
    for entry in quick["ratios"]:
        for key, value in entry.items():
            if key.endswith("_step_ms") and value is None:
                assert entry[f"{key}_why"], key


def test_the_compacting_and_masked_loops_run_side_by_side(quick):
    runs = {r["label"]: r for r in quick["runs"] if r["precision"] == "fp32"}
    compact, masked = runs["compact"], runs["masked"]
    assert (compact["flow_loop_ran"], masked["flow_loop_ran"]) == ("compact", "masked")
    # The compacting loop reads the live count once per flow step; the masked loop does not.
    assert compact["host_syncs_per_step"] > masked["host_syncs_per_step"] >= 1
    (fp32,) = [e for e in quick["ratios"] if e.get("precision") == "fp32"]
    assert fp32["masked_over_compact_step_ms"] == pytest.approx(masked["step_ms"] / compact["step_ms"])
    assert runs["masked+graph"]["step_ms"] is None and "needs CUDA" in runs["masked+graph"]["why"]
    assert fp32["graph_on_over_off_step_ms"] is None and "needs CUDA" in fp32["graph_on_over_off_step_ms_why"]


def test_plan_leaves_the_trainers_sampled_steps_alone_and_ends_with_the_flop_count():
    cpu = torch.device("cpu")
    kinds = bench.plan_steps(4, 3, 2, 0, cpu)
    assert kinds[-1] == "flops"
    assert [k for k in kinds if k not in ("trainer", "flops")] == ["warmup"] * 4 + ["timed"] * 3 + ["count"] * 2
    for step, kind in enumerate(kinds, 1):
        assert (kind == "trainer") == bench._sampled_by_trainer(step, cpu)


def test_variants_follow_the_device():
    run, skipped = bench.variants(torch.device("cuda"))
    assert [(v["flow_loop"], v["cuda_graph"]) for v in run] == [
        ("compact", "never"),
        ("masked", "never"),
        ("masked", "always"),
    ] and not skipped
    run, skipped = bench.variants(torch.device("cpu"))
    assert [v["label"] for v in run] == ["compact", "masked"]
    assert [v["label"] for v in skipped] == ["masked+graph"] and "needs CUDA" in skipped[0]["why"]


def test_matmul_mode_touches_nothing_off_cuda_and_a_peak_is_a_rate():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision()
    with bench.matmul_mode("tf32", torch.device("cpu")):
        assert (torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision()) == saved
    peak = bench.matmul_peak(torch.device("cpu"), "fp32", 128, threads=1, rounds=2)
    assert peak["gflops"] > 0 and math.isfinite(peak["gflops"]) and peak["threads"] == 1


def test_non_finite_figures_become_null_with_why():
    out = bench.finite({"a": math.nan, "b": 1.0, "c": [{"d": math.inf}], "e_why": "x", "e": math.nan})
    assert out["a"] is None and out["a_why"] and out["b"] == 1.0
    assert out["c"][0]["d"] is None and out["c"][0]["d_why"]
    assert out["e"] is None and out["e_why"] == "x"  # an existing why is kept


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_quick_cuda_run_fills_the_gpu_figures():
    res = bench_json("bench.gpu", "--quick", "--device", "cuda", timeout=600)
    ran = [r for r in res["runs"] if r["step_ms"] is not None]
    assert {r["precision"] for r in ran} == {"fp32", "tf32", "bf16"} and res["errors"] == []
    for r in ran:
        assert r["kernels_per_step"] > 0 and 0 < r["gpu_busy"] <= 1 and r["cuda_syncs_per_step"] >= 0
