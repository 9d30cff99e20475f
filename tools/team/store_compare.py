"""Whether a copy of a store (tools/team/copy_store.py) holds what the source holds, field by
field: `./dev team copy-store --verify` and the tests call the same function. It finds each copy
by its tag (`energy_flow.copied_from`), on its own, and compares the experiment's tags, each run
(its info, params, tags, metric histories, dataset and model inputs, outputs, artifacts by
SHA-256) and each logged model. What the copy changes on purpose (tools/team/store_ids.py) is
mapped, not reported. What differs comes back as lines naming the run or model and the field.
"""

from __future__ import annotations

import hashlib
import math
import tempfile
from collections import Counter
from pathlib import Path
from typing import Iterable

from tools.team.copy_store import (
    client,
    existing_copies,
    models_by_run,
    paged,
    parents_first,
    quiet_mlflow,
    source_experiments,
)
from tools.team.store_ids import COPIED_FROM, MLMODEL, MODEL_VERSIONS, OURS, PARENT_RUN, id_swap


def store_differences(
    source_uri: str, dest_uri: str, experiments: Iterable[str] | None = None, artifacts: bool = True
) -> list[str]:
    """Every difference between `source_uri`'s active runs (of `experiments`, or all) and their
    copies in `dest_uri`; [] when the copy compares equal. `artifacts`: compare the files too
    (each is downloaded from both stores)."""
    src, dst = client(source_uri), client(dest_uri)
    found = []
    pairs = []  # (run, copy, source models of the experiment, copies' models)
    run_map: dict[str, str] = {}
    model_map: dict[str, str] = {}
    for experiment in source_experiments(src, experiments, source_uri):
        twin = dst.get_experiment_by_name(experiment.name)
        if twin is None:
            found.append(f"experiment {experiment.name!r}: not in {dest_uri}")
            continue
        for key, value in sorted(experiment.tags.items()):
            if twin.tags.get(key) != value:
                found.append(f"experiment {experiment.name!r}: tag {key}: {twin.tags.get(key)!r} != {value!r}")
        copies = existing_copies(dst, twin.experiment_id)
        src_models = models_by_run(src, experiment.experiment_id)
        dst_models = models_by_run(dst, twin.experiment_id)
        for model in (m for ms in dst_models.values() for m in ms):
            if COPIED_FROM in model.tags:
                model_map[model.tags[COPIED_FROM]] = model.model_id
        for run in parents_first(list(paged(src.search_runs, experiment_ids=[experiment.experiment_id]))):
            made = copies.get(run.info.run_id, [])
            if len(made) != 1:
                found.append(f"{label(run)}: {len(made)} copies in {dest_uri}; expected 1")
                continue
            run_map[run.info.run_id] = made[0].info.run_id
            pairs.append((run, made[0], src_models, dst_models))
    with tempfile.TemporaryDirectory(prefix="store-compare-") as tmp, quiet_mlflow():
        for run, copy, src_models, dst_models in pairs:
            found += run_differences(src, dst, run, copy, run_map, model_map, Path(tmp) if artifacts else None)
            mine = {m.model_id: m for m in dst_models.get(copy.info.run_id, [])}
            for model in src_models.get(run.info.run_id, []):
                twin = mine.get(model_map.get(model.model_id, ""))
                if twin is None:
                    found.append(f"{label(run)}: logged model {model.model_id} ({model.name!r}) not copied")
                    continue
                found += model_differences(model, twin, run_map, Path(tmp) if artifacts else None, source_uri, dest_uri)
    return found


def label(run) -> str:
    return f"run {run.info.run_id} ({run.info.run_name!r})"


def differ(where: str, field: str, source, copy) -> list[str]:
    if source == copy:
        return []
    if isinstance(source, dict) and isinstance(copy, dict):  # name the keys, not the whole mapping
        keys = sorted(k for k in source.keys() | copy.keys() if source.get(k, ...) != copy.get(k, ...))
        changed = {k: (copy.get(k, "(missing)"), source.get(k, "(missing)")) for k in keys}
        return [f"{where}: {field}: {shorten(changed)} (copy, source)"]
    return [f"{where}: {field}: copy {shorten(copy)} != source {shorten(source)}"]


def shorten(value, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


def number(value: float) -> str:
    """A metric value as text, NaN equal to NaN (the stores keep NaN as a flag)."""
    return "nan" if math.isnan(value) else repr(float(value))


def run_differences(src, dst, run, copy, run_map: dict, model_map: dict, scratch: Path | None) -> list[str]:
    where = label(run)
    info, twin = run.info, copy.info
    found = []
    for field in ("run_name", "start_time", "end_time", "status"):
        found += differ(where, field.replace("_", " "), getattr(info, field), getattr(twin, field))
    found += differ(where, "params", run.data.params, copy.data.params)
    tags = {k: v for k, v in run.data.tags.items() if k not in OURS}
    if PARENT_RUN in tags:
        tags[PARENT_RUN] = run_map.get(tags[PARENT_RUN], f"(no copy of {tags[PARENT_RUN]})")
    found += differ(where, "tags", tags, {k: v for k, v in copy.data.tags.items() if k not in OURS})
    found += differ(where, "metric keys", sorted(run.data.metrics), sorted(copy.data.metrics))
    for key in sorted(set(run.data.metrics) & set(copy.data.metrics)):
        found += differ(
            where, f"history of metric {key!r}", history(src, info.run_id, key), history(dst, twin.run_id, key)
        )
    found += differ(where, "dataset inputs", datasets(run), datasets(copy))
    found += differ(where, "model outputs", links(run, "outputs", model_map), links(copy, "outputs", None))
    found += differ(where, "model inputs", links(run, "inputs", model_map), links(copy, "inputs", None))
    if scratch is not None:
        source_files = run_files(src, info.run_id, scratch / "src" / info.run_id)
        found += differ(
            where, "artifacts (path: sha256)", source_files, run_files(dst, twin.run_id, scratch / "dst" / twin.run_id)
        )
    return found


def history(mlflow_client, run_id: str, key: str) -> list[tuple]:
    """A metric's values as (step, timestamp, value), sorted: the stores promise no order."""
    return sorted((m.step, m.timestamp, number(m.value)) for m in mlflow_client.get_metric_history(run_id, key))


def datasets(run) -> list[tuple]:
    inputs = run.inputs.dataset_inputs if run.inputs else []
    return sorted(
        (
            d.dataset.name,
            d.dataset.digest,
            d.dataset.source_type,
            d.dataset.source,
            d.dataset.schema or "",
            d.dataset.profile or "",
            tuple(sorted((t.key, t.value) for t in d.tags)),
        )
        for d in inputs
    )


def links(run, side: str, model_map: dict | None) -> list[tuple]:
    """The run's model inputs or outputs as (model id, step), a source's mapped to its copies'."""
    holder = getattr(run, side, None)
    items = (holder.model_outputs if side == "outputs" else holder.model_inputs) if holder else []
    rename = (lambda i: model_map.get(i, f"(no copy of {i})")) if model_map is not None else (lambda i: i)
    return sorted((rename(i.model_id), getattr(i, "step", None)) for i in items)


def model_differences(model, twin, run_map: dict, scratch: Path | None, source_uri: str, dest_uri: str) -> list[str]:
    where = f"logged model {model.model_id} ({model.name!r}) of run {model.source_run_id}"
    found = differ(where, "name", model.name, twin.name)
    # (no type and an empty one are one value to a server: its REST answer has no "none" for it)
    found += differ(where, "model type", model.model_type or "", twin.model_type or "")
    found += differ(where, "status", str(model.status), str(twin.status))
    found += differ(where, "params", model.params, twin.params)
    tags = {k: v for k, v in model.tags.items() if k != MODEL_VERSIONS and k not in OURS}
    found += differ(where, "tags", tags, {k: v for k, v in twin.tags.items() if k not in OURS})
    found += differ(where, "source run", run_map.get(model.source_run_id), twin.source_run_id)

    def values(m, runs: dict | None) -> Counter:
        return Counter(
            (
                x.key,
                x.step,
                x.timestamp,
                number(x.value),
                x.dataset_name,
                x.dataset_digest,
                runs.get(x.run_id, x.run_id) if runs is not None else x.run_id,
            )
            for x in m.metrics or []
        )

    found += differ(where, "metrics", sorted(values(model, run_map).items()), sorted(values(twin, None).items()))
    if scratch is not None:
        source_files = model_files(model.artifact_location, source_uri, scratch / "src" / model.model_id)
        copy_files = model_files(
            twin.artifact_location,
            dest_uri,
            scratch / "dst" / twin.model_id,
            # the copy's MLmodel names its own ids and location: read back with the source's
            {
                twin.artifact_location: model.artifact_location,
                twin.model_id: model.model_id,
                twin.source_run_id or "": model.source_run_id or "",
            },
        )
        found += differ(where, "artifacts (path: sha256)", source_files, copy_files)
    return found


def run_files(mlflow_client, run_id: str, into: Path) -> dict[str, str]:
    if not mlflow_client.list_artifacts(run_id):
        return {}
    into.mkdir(parents=True, exist_ok=True)
    return digests(Path(mlflow_client.download_artifacts(run_id, "", str(into))))


def model_files(location: str, tracking_uri: str, into: Path, swap: dict | None = None) -> dict[str, str]:
    import mlflow

    into.mkdir(parents=True, exist_ok=True)
    root = Path(
        mlflow.artifacts.download_artifacts(artifact_uri=location, dst_path=str(into), tracking_uri=tracking_uri)
    )
    mlmodel = root / MLMODEL
    if swap and mlmodel.is_file():
        mlmodel.write_text(id_swap(mlmodel.read_text(), {k: v for k, v in swap.items() if k}))
    return digests(root)


def digests(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }
