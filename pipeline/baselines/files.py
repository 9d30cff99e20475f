"""The baseline stage's file, baselines/mlp.pt: every replicate's weights (one per seed), its
shape and history, written atomically and read with weights_only=True (tensors and plain
containers only, as the model file, pipeline/model/model_file.py)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from pipeline.baselines.mlp import MLPBaseline, MLPShape
from pipeline.core.atomic import atomic_path
from pipeline.core.errors import PipelineError
from pipeline.core.paths import check_readable_inside

FORMAT = 1
MLP_FILE = "baselines/mlp.pt"  # the baseline stage's output (dvc.yaml: baselines), relative to the project
_AGAIN = "it is written by the baseline stage: run it again (dvc repro baseline)"


@dataclass
class Replicate:
    seed: int
    module: MLPBaseline
    history: list[dict]


@dataclass
class MLPFile:
    shape: MLPShape
    model_params: int  # the energy-flow model's count it was sized to
    settings: dict  # the train keys it was trained with (lr, epochs, batch size, loss, schedule)
    data: str  # the digest of the shards it was trained on (pipeline/core/arm.py: data_digest)
    replicates: list[Replicate]

    @property
    def seeds(self) -> list[int]:
        return [r.seed for r in self.replicates]

    def digest(self) -> str:
        """The MLP's arm: what makes it (its shape, its training, the data's digest), not its seed:
        replicates of two model runs that trained the same MLP share it."""
        payload = json.dumps(
            {"shape": self.shape.as_dict(), "settings": self.settings, "data": self.data}, sort_keys=True
        )
        return "mlp-" + hashlib.sha256(payload.encode()).hexdigest()[:10]

    def describe(self) -> str:
        s = self.shape
        skip = " + linear skip" if s.skip else ""
        return (
            f"MLP {s.dim_in}-{s.hidden}-{s.dim_out}{skip}, {s.params:,} parameters (the model's {self.model_params:,})"
        )


def save_mlps(path: str | Path, found: MLPFile) -> None:
    payload = {
        "format": FORMAT,
        "kind": "mlp",
        "shape": found.shape.as_dict(),
        "model_params": int(found.model_params),
        "settings": found.settings,
        "data": found.data,
        "replicates": [
            {
                "seed": int(r.seed),
                "state_dict": {k: v.detach().cpu() for k, v in r.module.state_dict().items()},
                "history": r.history,
            }
            for r in found.replicates
        ],
    }
    with atomic_path(path) as tmp, open(tmp, "wb") as f:  # a file object: ENOSPC stays an OSError
        torch.save(payload, f)


def load_mlps(path: str | Path) -> MLPFile:
    """The replicates of `path`, or a PipelineError naming the file and what is wrong with it."""
    path = check_readable_inside(path, "the baseline stage's output")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise PipelineError(f"{path} not found; {_AGAIN}") from None
    except Exception as e:  # noqa: BLE001 - torch raises many kinds for a damaged file
        # (Only the kind: torch's text advises weights_only=False, which would run what the file holds.)
        raise PipelineError(
            f"{path}: not a readable baseline file (torch could not load it as weights only: {type(e).__name__}); "
            f"{_AGAIN}"
        ) from None
    try:
        if payload.get("format") != FORMAT or payload.get("kind") != "mlp":
            raise ValueError(f"format {payload.get('format')!r}, kind {payload.get('kind')!r}; expected {FORMAT}, mlp")
        shape = MLPShape(**payload["shape"])
        replicates = []
        for r in payload["replicates"]:
            module = MLPBaseline(shape)
            module.load_state_dict(r["state_dict"])
            module.eval()
            replicates.append(Replicate(int(r["seed"]), module, list(r["history"])))
        if not replicates:
            raise ValueError("no replicate in it")
        return MLPFile(shape, int(payload["model_params"]), dict(payload["settings"]), str(payload["data"]), replicates)
    except (AttributeError, KeyError, TypeError, ValueError, RuntimeError) as e:
        raise PipelineError(
            f"{path}: not a baseline file of this version ({type(e).__name__}: {e}); {_AGAIN}"
        ) from None
