"""Saving and loading a trained model: written atomically, read with weights_only=True (no pickle
of arbitrary objects: only tensors and plain containers)."""
from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import OmegaConf

from .atomic import atomic_path
from .errors import PipelineError
from .model import EnergyFlowModel


def save_model(path: str | Path, model: EnergyFlowModel, model_cfg, extra: dict | None = None) -> None:
    payload = {
        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "model_config": OmegaConf.to_container(model_cfg, resolve=True) if not isinstance(model_cfg, dict) else model_cfg,
        "dim": model.dim,
        "extra": extra or {},
    }
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)


def load_model(path: str | Path, device: torch.device | str = "cpu") -> tuple[EnergyFlowModel, dict]:
    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"{path} not found: run the train stage first (dvc repro train)")
    payload = torch.load(path, map_location=device, weights_only=True)
    model = EnergyFlowModel.from_config(payload["model_config"], payload["dim"]).to(device)
    try:
        model.load_state_dict(payload["state_dict"])
    except RuntimeError as e:
        raise PipelineError(f"{path} does not fit the model built from its own config: {e}") from None
    model.eval()
    return model, payload
