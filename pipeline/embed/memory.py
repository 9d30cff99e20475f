"""What one embed process needs in memory, from the teacher's files alone (nothing is loaded):
the process as it stands, the teacher once loaded, and one batch of texts in its forward pass.

- teacher: its weight files on disk x TEACHER_FACTOR. Loading a sentence-transformers model
  holds the weights and brings in transformers' modules, the tokenizer and their tables, which
  are not in the weight files: the bundled teacher's 87 MB of safetensors raise a stage process's
  RSS by about 2.5 times that, so the factor is 3, rounded up.
- batch: embed.batch_size texts of up to the teacher's max_seq_length tokens. What grows with
  the batch is attention: each layer's (heads, tokens, tokens) scores and their softmax, alive
  together, fp32. At the bundled teacher's sizes that is 6.3 MB a text, above the peak's
  growth measured per text (between 3 and 7 MB a text for batches of 16 to 256 of 256 tokens).

A teacher given by hub name has no local files to size: its need is not estimated (it must be
in the local cache anyway, offline).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from pipeline.core.preflight import Need
from pipeline.embed.teacher import resolve_teacher

MB = 2**20
TEACHER_FACTOR = 3.0
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def teacher_need(e, baseline_mb: float) -> Optional[Need]:
    """One embed process's need for the embed config `e`, or None when the teacher has no local files."""
    path = Path(resolve_teacher(str(e.teacher)))
    if not path.is_dir():
        return None
    weights = [p for p in path.rglob("*") if p.is_file() and p.suffix in WEIGHT_SUFFIXES]
    # One format is loaded when several are shipped: the largest is what the process holds.
    disk = max((p.stat().st_size for p in weights), default=0)
    config = _json(path / "config.json")
    tokens = int(_json(path / "sentence_bert_config.json").get("max_seq_length") or 0) or int(
        config.get("max_position_embeddings", 512)
    )
    heads = int(config.get("num_attention_heads", 12))
    per_text = 2 * heads * tokens * tokens * 4
    teacher_mb = TEACHER_FACTOR * disk / MB
    batch_mb = int(e.batch_size) * per_text / MB
    parts = (
        f"this process {baseline_mb:,.0f} MB + teacher {teacher_mb:,.0f} MB ({disk / MB:,.0f} MB on disk x "
        f"{TEACHER_FACTOR:g}) + a batch of {int(e.batch_size):,} texts x {tokens} tokens {batch_mb:,.0f} MB"
    )
    return Need(baseline_mb + teacher_mb + batch_mb, parts, "embed.batch_size, or embed.nproc")
