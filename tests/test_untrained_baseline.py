"""The "untrained" baseline: the saved model's starting point rebuilt from its config and seed
(checkpoint.untrained_model), and scored beside the trained model (evaluation.evaluate_split)."""

import numpy as np
import pytest
import torch

from pipeline.core.config import load_config
from pipeline.core.errors import PipelineError
from pipeline.data.shards import SplitShard
from pipeline.evaluate.retrieval import build_bank, evaluate_split, item_metrics, predictions, ridge_fit, score_items
from pipeline.model.model_file import load_model, save_model, untrained_model
from pipeline.train.loop import Trainer

pytestmark = pytest.mark.unit

DIM = 384
METRICS = ("cosine", "mse", "top1", "top5", "group_top1", "group_top5", "mrr")


@pytest.fixture(scope="module")
def cfg():
    return load_config(["preset=smoke", "train.checkpoint_every=0"])


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    return (rng.normal(size=(64, DIM)).astype(np.float32), rng.normal(size=(64, DIM)).astype(np.float32))


@pytest.fixture(scope="module")
def initial_state(cfg, data):
    """The Trainer's model right after construction, as CPU tensors."""
    trainer = Trainer(cfg, *data, progress=False)
    return trainer, {k: v.detach().cpu().clone() for k, v in trainer.model.state_dict().items()}


def trained_payload(trainer, cfg, tmp_path, seed):
    """Save the Trainer's model after 'training' (every parameter moved) and load the payload back the
    way evaluate does: the rebuilt model can only match the initial weights through the seed."""
    with torch.no_grad():
        for param in trainer.model.parameters():
            param.add_(0.5)
    try:
        save_model(tmp_path / "model.pt", trainer.model, cfg.model, extra={"seed": seed})
    finally:
        with torch.no_grad():
            for param in trainer.model.parameters():
                param.sub_(0.5)
    _, payload = load_model(tmp_path / "model.pt")
    return payload


def assert_same_tensors(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for key in a:
        assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
        assert torch.equal(a[key].cpu(), b[key].cpu()), key


def test_untrained_model_equals_the_trainers_initial_model(cfg, initial_state, tmp_path):
    trainer, initial = initial_state
    payload = trained_payload(trainer, cfg, tmp_path, seed=int(cfg.run.seed))
    saved = payload["state_dict"]
    assert not torch.equal(saved["input_mapper.proj.weight"], initial["input_mapper.proj.weight"])  # trained
    rebuilt = untrained_model(payload)
    assert_same_tensors(rebuilt.state_dict(), initial)
    assert rebuilt.training is False  # ready to predict
    assert rebuilt.dim == DIM


def test_untrained_model_uses_the_recorded_seed(cfg, data, initial_state, tmp_path):
    trainer, initial = initial_state
    other = untrained_model(trained_payload(trainer, cfg, tmp_path, seed=int(cfg.run.seed) + 7))
    assert not torch.equal(other.state_dict()["input_mapper.proj.weight"], initial["input_mapper.proj.weight"])
    seeded_cfg = load_config(["preset=smoke", "train.checkpoint_every=0", f"run.seed={int(cfg.run.seed) + 7}"])
    seeded = Trainer(seeded_cfg, *data, progress=False)
    assert_same_tensors(other.state_dict(), seeded.model.state_dict())


def test_untrained_model_leaves_the_global_rng_as_it_was(cfg, initial_state, tmp_path):
    trainer, _ = initial_state
    payload = trained_payload(trainer, cfg, tmp_path, seed=123)
    torch.manual_seed(2024)
    before = torch.get_rng_state()
    expected_next = torch.rand(5)
    torch.set_rng_state(before)
    untrained_model(payload)
    assert torch.equal(torch.get_rng_state(), before)
    assert torch.equal(torch.rand(5), expected_next)


@pytest.mark.parametrize("extra", [{}, {"run_id": "abc"}, None, {"seed": None}])
def test_missing_seed_says_to_rerun_train(cfg, initial_state, tmp_path, extra):
    trainer, _ = initial_state
    payload = trained_payload(trainer, cfg, tmp_path, seed=0)
    payload = {**payload, "extra": extra}
    with pytest.raises(PipelineError, match=r"no seed.*re-run the train stage"):
        untrained_model(payload)


# ---------------------------------------------------------------- evaluate_split


def make_shard(n: int = 40, dim: int = 16, seed: int = 0) -> SplitShard:
    """A split of n rows whose targets repeat 10 distinct texts (the retrieval bank)."""
    rng = np.random.default_rng(seed)
    bank = rng.normal(size=(10, dim)).astype(np.float32)
    which = np.arange(n) % 10
    texts = np.array([f"target {i}" for i in which], dtype=object)
    return SplitShard(
        split="test",
        ids=np.array([f"id{i}" for i in range(n)], dtype=object),
        input_texts=np.array([f"input {i}" for i in range(n)], dtype=object),
        target_texts=texts,
        groups=texts,
        inputs=(bank[which] + rng.normal(0, 0.5, size=(n, dim))).astype(np.float32),
        targets=bank[which],
        dim=dim,
        count=n,
    )


def test_evaluate_split_adds_untrained_keys_only_when_given():
    shard = make_shard()
    rng = np.random.default_rng(1)
    model_pred = (shard.targets + rng.normal(0, 0.1, size=shard.targets.shape)).astype(np.float32)
    w = ridge_fit(shard.inputs, shard.targets, alpha=1.0)
    untrained_pred = rng.normal(size=shard.targets.shape).astype(np.float32)
    bank = build_bank([shard])

    without, _, _ = evaluate_split("test", predictions(model_pred, shard, w), shard, bank)
    with_untrained, _, items = evaluate_split("test", predictions(model_pred, shard, w, untrained_pred), shard, bank)
    untrained_keys = {
        k for k in with_untrained if k.startswith(("eval/test/untrained/", "eval/test/model_vs_untrained/"))
    }
    assert {f"eval/test/untrained/{m}" for m in METRICS} <= untrained_keys
    assert not untrained_keys & set(without)
    assert set(with_untrained) == set(without) | untrained_keys
    assert {k: with_untrained[k] for k in without} == without  # the rest is unchanged (same resamples)
    expected = item_metrics(score_items(untrained_pred, shard, bank))
    assert {m: with_untrained[f"eval/test/untrained/{m}"] for m in METRICS} == {
        m: round(float(expected[m].mean()), 6) for m in METRICS
    }
    assert "untrained_rank" in items.columns
    assert with_untrained["eval/test/model/cosine"] > 0.9 > 0.3 > abs(with_untrained["eval/test/untrained/cosine"])


def test_evaluate_split_untrained_perfect_prediction_scores_perfectly():
    shard = make_shard(seed=2)
    w = ridge_fit(shard.inputs, shard.targets, alpha=1.0)
    out, _, _ = evaluate_split(
        "val",
        predictions(np.asarray(shard.inputs), shard, w, np.array(shard.targets)),
        shard,
        build_bank([shard]),
        with_ci=False,
    )
    assert out["eval/val/untrained/cosine"] == pytest.approx(1.0, abs=1e-6)
    assert out["eval/val/untrained/mse"] == pytest.approx(0.0, abs=1e-9)
    assert out["eval/val/untrained/top1"] == 1.0 and out["eval/val/untrained/top5"] == 1.0
    # The model predicted the inputs: it scores exactly like the identity baseline.
    assert all(out[f"eval/val/model/{m}"] == out[f"eval/val/identity/{m}"] for m in METRICS)
