"""The MLP baseline (pipeline/baselines/): sized to the model's parameter count from the model's
config, trained as the model is (the trainer's loss, AdamW, schedule and batch order for a seed),
the same bits for the same seed, and its file read back or refused with a message naming it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from pipeline.baselines.files import MLPFile, Replicate, load_mlps, save_mlps
from pipeline.baselines.fit import fit_mlp, val_loss
from pipeline.baselines.mlp import MIN_HIDDEN, MLPBaseline, mlp_shape, model_params
from pipeline.core.config import load_config
from pipeline.core.errors import PipelineError
from pipeline.data.loader import BatchLoader

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["preset=smoke"],
        ["model.lattice_width=12", "model.lattice_height=12"],
        ["model.carrier_hidden=128", "model.output_hidden=512"],
    ],
)
def test_the_mlp_has_the_models_parameter_count_within_one_per_cent(overrides):
    cfg = load_config(overrides)
    budget = model_params(cfg.model, 384)
    shape = mlp_shape(budget, 384, 384)
    assert abs(shape.params / budget - 1) < 0.01, (shape, budget)
    assert sum(p.numel() for p in MLPBaseline(shape).parameters()) == shape.params


def test_a_model_too_small_for_the_skip_path_gets_an_mlp_without_one():
    small = mlp_shape(20_000, 384, 384)  # the skip path alone would be 147,840 parameters
    assert not small.skip and abs(small.params / 20_000 - 1) < 0.05
    big = mlp_shape(350_000, 384, 384)
    assert big.skip and big.hidden > MIN_HIDDEN
    assert mlp_shape(10, 384, 384).hidden == MIN_HIDDEN  # never below a real hidden layer


def _data(n=96, dim=8, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, dim)).astype(np.float32)
    w = rng.normal(size=(dim, dim)).astype(np.float32)
    return x, np.tanh(x @ w).astype(np.float32)


TRAIN = OmegaConf.create(
    {
        "epochs": 4,
        "batch_size": 16,
        "lr": 3e-3,
        "warmup_steps": 2,
        "weight_decay": 0.01,
        "grad_clip": 1.0,
        "cosine_weight": 1.0,
        "nce_weight": 0.1,
        "nce_temperature": 0.05,
    }
)


def test_one_seed_gives_the_same_bits_and_another_seed_another_mlp(one_intra_op_thread):
    x, y = _data()
    shape = mlp_shape(2_000, 8, 8)
    a, hist_a = fit_mlp(shape, x, y, TRAIN, TRAIN.lr, seed=3)
    b, _ = fit_mlp(shape, x, y, TRAIN, TRAIN.lr, seed=3)
    c, _ = fit_mlp(shape, x, y, TRAIN, TRAIN.lr, seed=4)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    assert [r["epoch"] for r in hist_a] == [1, 2, 3, 4]
    assert hist_a[-1]["train/loss"] < hist_a[0]["train/loss"]  # it learns


def test_the_mlp_sees_the_trainers_batches_in_the_trainers_order(monkeypatch):
    """The same BatchLoader, seeded with the run's seed as the trainer seeds it: each epoch's
    batches are the ones the model trains on."""
    x, y = _data(64)
    seen = []
    original = BatchLoader.__iter__

    def spy(self):
        for bx, by in original(self):
            seen.append(bx.clone())
            yield bx, by

    monkeypatch.setattr(BatchLoader, "__iter__", spy)
    fit_mlp(mlp_shape(2_000, 8, 8), x, y, TRAIN, TRAIN.lr, seed=5)
    monkeypatch.setattr(BatchLoader, "__iter__", original)
    trainer = BatchLoader(x, y, TRAIN.batch_size, shuffle=True, seed=5, drop_last=True)
    expected = []
    for epoch in range(TRAIN.epochs):
        trainer.set_epoch(epoch)
        expected += [bx for bx, _ in trainer]
    assert len(seen) == len(expected) and all(torch.equal(s, e) for s, e in zip(seen, expected))


def test_val_loss_is_the_trainers_loss_and_cosine():
    x, y = _data(40)
    module = MLPBaseline(mlp_shape(2_000, 8, 8))
    out = val_loss(module, x, y, TRAIN)
    with torch.no_grad():
        pred = module(torch.from_numpy(x))
        cos = torch.nn.functional.cosine_similarity(pred, torch.from_numpy(y), dim=1).mean().item()
    assert out["val/cosine"] == pytest.approx(cos, rel=1e-5) and out["val/loss"] > 0


def test_the_file_round_trips_and_a_damaged_one_is_named(tmp_path):
    x, y = _data()
    shape = mlp_shape(2_000, 8, 8)
    reps = [Replicate(s, *fit_mlp(shape, x, y, TRAIN, TRAIN.lr, seed=s)) for s in (0, 1)]
    path = tmp_path / "mlp.pt"
    save_mlps(path, MLPFile(shape, 2_000, dict(TRAIN), "abc", reps))
    back = load_mlps(path)
    assert back.seeds == [0, 1] and back.shape == shape and back.data == "abc"
    loaded = back.replicates[0].module.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in reps[0].module.state_dict().items())
    assert back.digest() == MLPFile(shape, 2_000, dict(TRAIN), "abc", reps[:1]).digest()  # not the seeds
    assert back.digest() != MLPFile(shape, 2_000, dict(TRAIN), "xyz", reps).digest()  # the data
    path.write_bytes(b"not a torch file")
    with pytest.raises(PipelineError, match=r"mlp\.pt: not a readable baseline file.*dvc repro baseline"):
        load_mlps(path)
    with pytest.raises(PipelineError, match=r"not found.*dvc repro baseline"):
        load_mlps(tmp_path / "missing.pt")
    torch.save({"format": 1, "kind": "ridge"}, path)
    with pytest.raises(PipelineError, match="not a baseline file of this version"):
        load_mlps(path)
