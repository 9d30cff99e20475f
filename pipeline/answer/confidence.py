"""When the answer model is confident: a rule calibrated on the validation split by the evaluate
stage (pipeline/evaluate/abstention.py) and stored with the logged model, so that every answer
says whether its top answer can be trusted.

Two signals of the k distinct facts (pipeline/answer/ranking.py) decide it, and confident means
both hold: the best fact's cosine is at least the score floor (a question under it is unlike the
questions the bank answers), and its margin over the second best fact at least the margin
threshold (a clear winner is right far more often than a close call). A rule with no margin
threshold (None) is never confident. Why these signals: docs/serving.md ("When it is confident").

The rule travels with the model as an artifact of its own (RULE_FILE, JSON), and in its metadata
under CONFIG_KEY with the calibration's figures; not in its model_config, which MLflow also logs
as run params: a calibrated figure differs in every run, and would then lead the compare page's
parallel-coordinates plot. A model logged before answers carried a confidence has none, and its
answers say confidence unknown (None) rather than guess."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from pipeline.core.errors import PipelineError

CONFIG_KEY = "confidence"  # the key in the model's metadata
ARTIFACT = "confidence"  # the artifact's name in the model
RULE_FILE = "confidence.json"


@dataclass(frozen=True)
class ConfidenceRule:
    score_floor: float  # the best fact's cosine must be at least this
    margin_threshold: float | None  # its margin over the second best fact's; None: never confident
    target_precision: float  # what the calibration aimed at on val (for the reader)

    def confident(self, top: np.ndarray, margin: np.ndarray) -> np.ndarray:
        top, margin = np.asarray(top, dtype=np.float64), np.asarray(margin, dtype=np.float64)
        if self.margin_threshold is None:
            return np.zeros(top.shape, dtype=bool)
        return (top >= self.score_floor) & (margin >= self.margin_threshold)

    def why_not(self, top: float, margin: float) -> str:
        """Why an answer with these signals is not confident, in words (for ./dev ask)."""
        if self.margin_threshold is None:
            return f"the model reached no threshold with {self.target_precision:.0%} precision on validation"
        if top < self.score_floor:
            return f"best {top:.3f} < score floor {self.score_floor:.3f}"
        return f"margin {margin:.3f} over the next fact < threshold {self.margin_threshold:.3f}"

    def to_config(self) -> dict:
        return {
            "score_floor": float(self.score_floor),
            "margin_threshold": None if self.margin_threshold is None else float(self.margin_threshold),
            "target_precision": float(self.target_precision),
        }

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "ConfidenceRule | None":
        """The rule a model's config records, or None for a model logged without one."""
        raw = config.get(CONFIG_KEY)
        if raw is None:
            return None
        try:
            floor, target = float(raw["score_floor"]), float(raw["target_precision"])
            threshold = raw["margin_threshold"]
            threshold = None if threshold is None else float(threshold)
        except (TypeError, KeyError, ValueError) as e:
            raise PipelineError(
                f"the model config's {CONFIG_KEY!r} is {raw!r} ({e}); expected a mapping of score_floor, "
                "margin_threshold (a number, or null: never confident) and target_precision"
            ) from None
        if not math.isfinite(floor) or (threshold is not None and not math.isfinite(threshold)):
            raise PipelineError(f"the model config's {CONFIG_KEY!r} is {raw!r}; expected finite numbers")
        return cls(floor, threshold, target)


def write_rule(rule: ConfidenceRule, path: Path) -> Path:
    """`rule` as the JSON file the model carries (the ARTIFACT)."""
    path.write_text(json.dumps(rule.to_config(), indent=2) + "\n", encoding="utf-8")
    return path


def read_rule(path: str | Path | None) -> ConfidenceRule | None:
    """The rule in the model's ARTIFACT file, or None for a model logged without one (`path` None)."""
    if path is None:
        return None
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise PipelineError(f"{path}: cannot be read as the model's confidence rule ({e}); expected JSON") from None
    return ConfidenceRule.from_config({CONFIG_KEY: raw})
