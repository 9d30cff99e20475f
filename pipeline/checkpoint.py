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


def untrained_model(payload: dict, device: torch.device | str = "cpu") -> EnergyFlowModel:
    """The saved model's starting point: its config built under its seed, exactly as the Trainer
    does (torch.manual_seed(run.seed), then EnergyFlowModel.from_config). The global RNG is left
    as it was."""
    seed = (payload.get("extra") or {}).get("seed")
    if seed is None:
        raise PipelineError("the model file records no seed, so its untrained starting point cannot be rebuilt: "
                            "re-run the train stage (dvc repro train)")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        model = EnergyFlowModel.from_config(payload["model_config"], payload["dim"])
    return model.to(device).eval()
