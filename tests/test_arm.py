"""A parameter's role (pipeline/core/config/schema.py) decides what counts as one arm and what a
resumed run may change: the digests of the committed presets are pinned, so a role declared wrongly
(or a key added without one) shows here, not as runs silently pooled or split."""

import pytest

from pipeline.core.arm import arm_digest, in_arm
from pipeline.core.config import flatten, load_config
from pipeline.core.run_label import LABEL_KEYS
from pipeline.train.resume_state import fingerprint

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "overrides, arm, resume",
    [([], "f900278429", "9138290528949bda"), (["preset=smoke", "fault=nan_loss"], "1a236dc461", "cf0b3f0cfca0fe44")],
)
def test_the_arm_and_resume_fingerprint_of_a_preset_are_pinned(overrides, arm, resume):
    cfg = load_config(overrides)
    assert (arm_digest(flatten(cfg), "d"), fingerprint(cfg, "d")) == (arm, resume)
    assert fingerprint(load_config([*overrides, "train.log_every=1", "train.checkpoint_every=0"]), "d") == resume


def test_labels_the_seed_and_the_report_are_out_of_the_arm():
    assert LABEL_KEYS == {"run.preset", "run.experiment", "run.sweep", "run.tracking"}
    assert not any(in_arm(k) for k in [*LABEL_KEYS, "run.seed", "report.warmup_steps", "report.not_declared"])
    assert all(in_arm(k) for k in ("train.lr", "train.nproc", "embed.splits.train", "fault.kind"))
