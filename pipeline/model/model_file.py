"""Saving and loading a trained model: written atomically, read with weights_only=True (no pickle
of arbitrary objects: only tensors and plain containers).

A file that does not fit is an error naming what does not fit, never a RuntimeError from deep
inside torch: weights of another model config or of another version of the code (the tensors
that differ), a model_config with keys the model does not take, or an embedding dim other than
the shards' (check_input_dim)."""

from __future__ import annotations

import inspect
import re
import warnings
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from pipeline.core.atomic import atomic_path
from pipeline.core.errors import PipelineError
from pipeline.core.paths import check_readable_inside
from pipeline.model import EnergyFlowModel

_RETRAIN = "re-run the train stage (dvc repro train)"
_SHOWN = 5  # tensors named per kind of difference: a whole mismatching model would be ~30 lines


def save_model(path: str | Path, model: EnergyFlowModel, model_cfg, extra: dict | None = None) -> None:
    if not isinstance(model_cfg, dict):
        # Enum values (model.residual) as their strings: weights_only loading takes plain types only.
        model_cfg = OmegaConf.to_container(model_cfg, resolve=True, enum_to_str=True)
    payload = {
        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "model_config": model_cfg,
        "dim": model.dim,
        "extra": extra or {},
    }
    # Into a Python file object, not a path: on a full disk torch then fails with the OSError(ENOSPC)
    # as its cause; given a path it says only "iostream error" (pipeline/core/atomic.py).
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        torch.save(payload, f)


def model_shapes(model_cfg, dim: int) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor of the model `model_cfg` builds for `dim`-d embeddings. Built
    on the meta device: no memory and no random draw (a resumed run's RNG state must not move)."""
    with torch.device("meta"):
        model = EnergyFlowModel.from_config(model_cfg, int(dim))
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def tensor_mismatch(found: dict, expected: dict[str, tuple[int, ...]]) -> str:
    """'' when the state dict `found` has exactly the tensors `expected` (name -> shape), else
    what differs: tensors of another shape (both shapes), missing and unexpected ones."""

    def names(items: list[str]) -> str:
        more = f" and {len(items) - _SHOWN} more" if len(items) > _SHOWN else ""
        return ", ".join(items[:_SHOWN]) + more

    shape = {k: tuple(getattr(found[k], "shape", ())) for k in expected if k in found}
    wrong = [k for k in expected if k in shape and shape[k] != tuple(expected[k])]
    missing = [k for k in expected if k not in found]
    unexpected = sorted(k for k in found if k not in expected)
    parts = []
    if wrong:
        parts.append(
            f"{len(wrong)} tensor(s) of another shape: "
            + names([f"{k} (file {shape[k]}, model {tuple(expected[k])})" for k in wrong])
        )
    if missing:
        parts.append(f"{len(missing)} missing from the file: {names(missing)}")
    if unexpected:
        parts.append(f"{len(unexpected)} not in the model: {names(unexpected)}")
    return "; ".join(parts)


def _describe(model_cfg: dict, dim: int) -> str:
    get = model_cfg.get
    return (
        f"{dim}-d embeddings, lattice {get('lattice_width')}x{get('lattice_height')}x{get('lattice_depth')}, "
        f"carrier {get('carrier_layers')}x{get('carrier_hidden')}"
    )


def _check_config_keys(path: Path, model_cfg) -> None:
    """Keys the model's constructor does not take (or lacks) would be a TypeError: name them."""
    params = inspect.signature(EnergyFlowModel.__init__).parameters
    takes = {n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    required = {n for n in takes if params[n].default is inspect.Parameter.empty}
    if not isinstance(model_cfg, dict):
        raise PipelineError(
            f"{path}: model_config is {type(model_cfg).__name__}, expected a mapping of the model "
            f"section's keys; {_RETRAIN}"
        )
    unknown, lacking = sorted(set(model_cfg) - takes), sorted(required - set(model_cfg))
    if unknown or lacking:
        what = "; ".join(
            ([f"keys the model does not take: {unknown}"] if unknown else [])
            + ([f"lacks required keys: {lacking}"] if lacking else [])
        )
        raise PipelineError(
            f"{path}: its model_config does not fit this version's model ({what}); expected the "
            f"keys of the model section ({', '.join(sorted(takes))}): it was written by another "
            f"version of the code; {_RETRAIN}"
        )


def read_tensor_file(path: Path, device: torch.device | str, expected: str, again: str) -> Any:
    """torch.load(weights_only=True) of `path`, every failure one PipelineError naming the file:
    never torch's own advice to retry with weights_only=False, which would run whatever code the
    file holds. `expected`: what the file should be; `again`: how to write it again."""
    try:
        with warnings.catch_warnings():  # torch warns about pickle protocols before refusing them
            warnings.simplefilter("ignore")
            return torch.load(path, map_location=device, weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch raises RuntimeError, UnpicklingError, EOFError... for a bad file
        raise _unreadable(path, e, expected, again) from None


def _unreadable(path: Path, e: Exception, expected: str, again: str) -> PipelineError:
    # Told apart by name: this module does not import pickle (tests/test_security.py).
    if type(e).__name__ == "UnpicklingError":
        found = re.search(r"GLOBAL (\S+)", str(e))
        held = (
            f"it holds pickled code or objects ({found.group(1)}), refused for safety"
            if found
            else "not in the format torch.save writes: a plain pickle or other data, refused for safety"
        )
        return PipelineError(
            f"{path}: not a model file this project wrote ({held}: it is only ever read as tensors, "
            f"never run); expected {expected}; {again}"
        )
    # The first sentence only: torch's later ones advise on loading it some other way.
    first = re.split(r"(?<=[.!?])\s", " ".join(str(e).split()), maxsplit=1)[0] or type(e).__name__
    return PipelineError(
        f"{path}: not a readable model file ({type(e).__name__}: {first[:200]}); expected {expected}; {again}"
    )


def first_nonfinite_tensor(tensors: Any) -> str:
    """'' when every floating tensor of the mapping `tensors` (a state dict, nested dicts and lists
    of them) holds finite values, else the first that does not, with the index and the value."""
    stack: list[tuple[str, Any]] = [("", tensors)]
    while stack:
        name, value = stack.pop(0)
        if isinstance(value, dict):
            stack[:0] = [(f"{name}.{k}" if name else str(k), v) for k, v in value.items()]
        elif isinstance(value, (list, tuple)):
            stack[:0] = [(f"{name}[{i}]", v) for i, v in enumerate(value)]
        elif isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel():
            finite = torch.isfinite(value)
            if not bool(finite.all()):
                flat = int(torch.argmin(finite.reshape(-1).to(torch.uint8)))
                index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), value.shape))
                v = float(value.reshape(-1)[flat])
                shown = "NaN" if v != v else ("inf" if v > 0 else "-inf")
                return f"{name}{list(index)} = {shown}"
    return ""


def load_model(path: str | Path, device: torch.device | str = "cpu") -> tuple[EnergyFlowModel, dict]:
    path = check_readable_inside(path, "the model file (train.out_dir)")
    if not path.is_file():
        raise PipelineError(f"{path} not found: run the train stage first (dvc repro train)")
    payload = read_tensor_file(path, device, "the model.pt the train stage writes", _RETRAIN)
    lacks = [k for k in ("state_dict", "model_config", "dim") if not isinstance(payload, dict) or k not in payload]
    if lacks:
        raise PipelineError(
            f"{path}: the model file lacks {lacks}; expected the model.pt the train stage writes; {_RETRAIN}"
        )
    _check_config_keys(path, payload["model_config"])
    dim = int(payload["dim"])
    mismatch = tensor_mismatch(payload["state_dict"], model_shapes(payload["model_config"], dim))
    if mismatch:
        raise PipelineError(
            f"{path}: its weights do not fit the model its own model_config builds "
            f"({_describe(payload['model_config'], dim)}): {mismatch}; expected the weights of "
            f"that config (these come from another model config or another version of the code); "
            f"{_RETRAIN}"
        )
    bad = first_nonfinite_tensor(payload["state_dict"])
    if bad:
        raise PipelineError(
            f"{path}: parameter {bad} is not finite; expected finite weights (a model whose training "
            f"diverged is not saved, so this file was damaged or written elsewhere); {_RETRAIN}"
        )
    model = EnergyFlowModel.from_config(payload["model_config"], dim).to(device)
    model.load_state_dict(payload["state_dict"])
    model.eval()
    return model, payload


def check_input_dim(path: str | Path, payload: dict, manifest: dict, shard_dir: str | Path) -> None:
    """The model at `path` maps `payload["dim"]`-d embeddings: the shards must hold that dim."""
    want, found = int(payload["dim"]), int(manifest["dim"])
    if want != found:
        teacher = (manifest.get("teacher") or {}).get("name", "?")
        raise PipelineError(
            f"{path}: the model takes {want}-d embeddings but the shards in {shard_dir} hold {found}-d ones "
            f"(teacher {teacher}); expected the shards it was trained on: re-run train on these shards "
            f"(dvc repro train), or point embed.out_dir at shards of the model's teacher"
        )
