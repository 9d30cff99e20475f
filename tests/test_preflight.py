"""What a config costs, refused or warned about before any work (pipeline/core/preflight.py and the
stages' own estimates: pipeline/train/plan.py, pipeline/embed/memory.py, stages/evaluate.py)."""

from __future__ import annotations

import logging

import pytest

from pipeline.core import preflight, resources
from pipeline.core.config import load_config
from pipeline.core.errors import ConfigError, ResourceError
from pipeline.embed.memory import teacher_need
from pipeline.stats import bootstrap
from pipeline.train import plan
from stages import embed as embed_stage
from stages import evaluate as evaluate_stage
from tests.helpers.shards import fake_shards

pytestmark = pytest.mark.unit

TWO = resources.Cores(2, "CPU affinity (sched_getaffinity)")
GiB = 2**30


def small(free_mb: float, per_process=None) -> resources.Memory:
    return resources.Memory(
        int(free_mb * 2**20), "cgroup headroom (/sys/fs/cgroup/x/memory.max limit 3,072 MB)", per_process
    )


@pytest.mark.parametrize("stage, key", [("train", "train.nproc"), ("embed", "embed.nproc")])
def test_processes_above_usable_cores_are_refused(stage, key):
    cfg = load_config([f"{key}=64"])
    with pytest.raises(ConfigError) as e:
        preflight.check_cores(cfg, stage, 64, "cpu", TWO)
    msg = str(e.value)
    assert f"parameter '{key}' = 64" in msg and "may use 2 core(s) (CPU affinity" in msg
    assert f"expected {key} <= 2" in msg and "Nothing was started" in msg
    preflight.check_cores(load_config([f"{key}=2"]), stage, 2, "cpu", TWO)  # as many as the cores: fine


def test_processes_above_the_gpu_count_are_refused():
    import torch

    gpus = torch.cuda.device_count()
    n = max(2, gpus + 1)
    with pytest.raises(ConfigError, match=rf"has {gpus} CUDA device\(s\) and each process needs its own"):
        preflight.check_cores(load_config([f"train.nproc={n}"]), "train", n, "cuda", TWO)


def test_threads_above_usable_cores_are_refused():
    with pytest.raises(ConfigError) as e:
        preflight.check_cores(load_config(["train.threads=100000"]), "train", 1, "cpu", TWO)
    assert "parameter 'train.threads' = 100000" in str(e.value) and "expected train.threads <= 2" in str(e.value)
    preflight.check_cores(load_config(["train.threads=2"]), "train", 1, "cpu", TWO)


def test_threads_times_processes_above_cores_warns(caplog):
    with caplog.at_level(logging.WARNING):
        preflight.check_cores(load_config(["train.threads=2", "train.nproc=2"]), "train", 2, "cpu", TWO)
    assert "2 threads x 2 processes = 4 threads on 2 usable core(s)" in caplog.text


def test_memory_of_all_processes_against_the_cgroup_limit():
    need = preflight.Need(1200.0, "teacher 260 MB + a batch 940 MB", "embed.batch_size, or embed.nproc")
    preflight.check_memory(need, 2, small(2500))
    with pytest.raises(ResourceError) as e:
        preflight.check_memory(need, 3, small(2500))
    msg = str(e.value)
    assert "needs about 1,200 MB per process (teacher 260 MB + a batch 940 MB) x 3 processes = 3,600 MB" in msg
    assert "2,500 MB is available (2,500 MB from cgroup headroom (/sys/fs/cgroup/x/memory.max limit 3,072 MB))" in msg
    assert "lower embed.batch_size, or embed.nproc" in msg


def test_memory_of_one_process_against_its_rlimit():
    cap = resources.MemoryLimit(100 * 2**20, GiB, "RLIMIT_AS 1,024 MB (ulimit/prlimit)", per_process=True)
    need = preflight.Need(500.0, "parts", "embed.batch_size")
    with pytest.raises(ResourceError, match=r"RLIMIT_AS 1,024 MB \(ulimit/prlimit\) leaves each process 100 MB"):
        preflight.check_memory(need, 1, small(10_000, cap), held_mb=300.0)
    preflight.check_memory(need, 1, small(10_000, cap), held_mb=450.0)  # 50 MB more: fits


def test_warn_duration_past_a_day(caplog):
    with caplog.at_level(logging.WARNING):
        assert not preflight.warn_duration("train", 3600, "plan", "train.epochs")
        assert preflight.warn_duration("train", 3 * 86_400, "9 epochs x 10 steps", "train.epochs")
    assert caplog.text.count("will take") == 1
    assert "train will take about 3.0 days (9 epochs x 10 steps); lower train.epochs" in caplog.text


def test_evaluate_bootstrap_needs_are_refused(tmp_path, monkeypatch):
    """The bootstrap's (resamples, metrics) arrays: refused past the limit, naming the key."""
    shards = tmp_path / "shards"
    fake_shards(shards, rows=(40, 8, 599))
    monkeypatch.setattr(resources, "available_memory", lambda *a, **k: small(2500))
    cfg = load_config(
        ["run.allow_external_paths=true", f"embed.out_dir={shards}", "evaluate.bootstrap_resamples=10000000"]
    )
    with pytest.raises(ResourceError) as e:
        evaluate_stage.costs(cfg, 1)
    msg = str(e.value)
    # 7 metrics x (the model, four baselines, the model minus each baseline)
    assert "10,000,000 resamples x 63 metrics x 8 bytes, twice, over 599 test items" in msg
    assert "lower evaluate.bootstrap_resamples" in msg and "/sys/fs/cgroup/x/memory.max" in msg
    evaluate_stage.costs(
        load_config(["run.allow_external_paths=true", f"embed.out_dir={shards}"]), 1
    )  # the default: a few MB


def test_bootstrap_bytes_follow_the_arrays():
    # 1e9 resamples x 49 columns x 8 bytes is the means alone: 365 GiB
    assert bootstrap.resample_bytes(10**9, 599, 49) >= 2 * 49 * 8 * 10**9
    assert bootstrap.resample_bytes(2000, 599, 49) < 64 * 2**20


def test_embed_need_from_the_teacher_files(monkeypatch):
    cfg = load_config(["embed.batch_size=100000"])
    need = teacher_need(cfg.embed, 300.0)
    assert need is not None and need.per_process_mb > 100_000 and "(87 MB on disk x 3)" in need.parts
    assert "a batch of 100,000 texts x 256 tokens" in need.parts
    monkeypatch.setattr(resources, "available_memory", lambda *a, **k: small(2500))
    with pytest.raises(ResourceError, match="lower embed.batch_size, or embed.nproc"):
        embed_stage.costs(cfg, 1)
    assert teacher_need(load_config(["embed.teacher=some/hub-name"]).embed, 300.0) is None


def test_train_time_estimate_warns_past_a_day(tmp_path, caplog):
    shards = tmp_path / "shards"
    fake_shards(shards, dim=384, rows=(640, 16, 16))
    cfg = load_config(
        [
            "run.allow_external_paths=true",
            f"embed.out_dir={shards}",
            "train.device=cpu",
            "train.batch_size=64",
            "train.epochs=1000000000",
        ]
    )
    assert plan.planned_steps(cfg, {"splits": {"train": {"count": 640}}}, 1) == (10, 10**10)
    assert plan.planned_steps(cfg, {"splits": {"train": {"count": 640}}}, 2) == (5, 5 * 10**9)
    with caplog.at_level(logging.WARNING):
        plan.costs(cfg, 1)
    assert (
        "train will take about" in caplog.text
        and "115.7 days (1,000,000,000 epochs x 10 steps x at least 1.0 ms a step, a lower bound)" in caplog.text
    )
    assert "lower train.epochs" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        plan.costs(
            load_config(
                ["run.allow_external_paths=true", f"embed.out_dir={shards}", "train.device=cpu", "train.batch_size=64"]
            ),
            1,
        )
    assert "will take" not in caplog.text


def test_train_memory_of_n_processes_is_checked_before_launch(tmp_path, monkeypatch):
    """train.nproc=N: N x one process's peak against what is free, before torchrun starts them."""
    shards = tmp_path / "shards"
    fake_shards(shards, dim=384, rows=(640, 16, 16))
    cfg = load_config(
        ["run.allow_external_paths=true", f"embed.out_dir={shards}", "train.device=cpu", "train.checkpoint_every=0"]
    )
    monkeypatch.setattr(resources, "available_memory", lambda *a, **k: small(resources.rss_mb() * 1.5))
    plan.costs(cfg, 1)  # this process holds most of one: one fits
    with pytest.raises(ResourceError, match=r"per process x 2 processes on this node"):
        plan.costs(cfg, 2)


def test_duration_watch_warns_once_from_the_measured_pace(monkeypatch, caplog):
    now = [0.0]
    monkeypatch.setattr(plan.time, "perf_counter", lambda: now[0])
    watch = plan.DurationWatch(total_steps=200_000, start_step=0, report=True)
    with caplog.at_level(logging.WARNING):
        for step in range(1, 40):
            now[0] = float(step)  # one second a step
            watch.tick(step)
    assert caplog.text.count("will take") == 1 and "train will take about 2.3 days" in caplog.text
    assert "measured over 20 steps" in caplog.text
    caplog.clear()
    quiet = plan.DurationWatch(total_steps=200_000, start_step=0, report=False)  # not rank 0
    with caplog.at_level(logging.WARNING):
        for step in range(1, 40):
            now[0] = float(step)
            quiet.tick(step)
    assert "will take" not in caplog.text
