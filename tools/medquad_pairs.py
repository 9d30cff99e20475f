"""Rebuild data/raw/medquad_pairs.csv, the second shipped dataset, from the MedQuAD collection
(github.com/abachaa/MedQuAD, CC BY 4.0; docs/data.md, "A second, real dataset").

    python -m tools.medquad_pairs MEDQUAD_DIR [--out data/raw/medquad_pairs.csv]

MEDQUAD_DIR is a checkout of that repository (the folder holding 1_CancerGov_QA/, 2_GARD_QA/, ...,
one XML <Document> per file). Each <QAPair> is a row: its question, its answer, and as its group
the answer text (compared lower-cased): questions that share an answer word for word are one
group. Rows are dropped when the question is empty or the answer shorter than MIN_ANSWER_CHARS
(the three MedlinePlus subsets ship without answers), when either text is longer than MAX_CHARS,
or when the pair repeats; a group keeps MAX_PER_GROUP rows (one boilerplate answer is shared by
348 questions), and whole groups are kept up to MAX_ROWS rows, in the order of their hash. No
random draw: the collection at commit 577bd37 gives the committed file byte for byte."""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd

MAX_CHARS = 1000  # a question or answer longer than this is dropped
MIN_ANSWER_CHARS = 20  # near-empty answers
MAX_ROWS = 6500  # whole groups, up to this many rows (the CSV stays under 4 MB)
MAX_PER_GROUP = 5
OUT = Path("data/raw/medquad_pairs.csv")
_SPACE = re.compile(r"\s+")


def _clean(text: str | None) -> str:
    return _SPACE.sub(" ", text or "").strip()


def _sha1(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def read_pairs(root: Path):
    """Every QAPair of the collection, folder by folder and file by file in sorted order."""
    for sub in sorted(p for p in root.iterdir() if p.is_dir()):
        for path in sorted(sub.glob("*.xml")):
            try:
                doc = ET.parse(path).getroot()
            except ET.ParseError as e:
                print(f"medquad_pairs: {path} left out: not well-formed XML ({e})", file=sys.stderr)
                continue
            for qa in doc.iter("QAPair"):
                q, a = qa.find("Question"), qa.find("Answer")
                if q is None or a is None:
                    continue
                yield {
                    "source": sub.name,
                    "doc": doc.get("id", ""),
                    "qid": q.get("qid", ""),
                    "question": _clean("".join(q.itertext())),
                    "answer": _clean("".join(a.itertext())),
                }


def build(root: Path) -> pd.DataFrame:
    df = pd.DataFrame(list(read_pairs(root)))
    if df.empty:
        raise SystemExit(f"medquad_pairs: {root} holds no QAPair in */*.xml: expected a checkout of abachaa/MedQuAD")
    df = df[(df.question != "") & (df.answer.str.len() >= MIN_ANSWER_CHARS)]
    df = df[(df.question.str.len() <= MAX_CHARS) & (df.answer.str.len() <= MAX_CHARS)]
    df = df.drop_duplicates(subset=["question", "answer"]).copy()
    df["gkey"] = df.answer.str.lower().map(_sha1)
    df["qhash"] = (df.source + "/" + df.qid + "/" + df.question).map(_sha1)
    df = df.sort_values(["gkey", "qhash"], kind="mergesort")
    df = df[df.groupby("gkey").cumcount() < MAX_PER_GROUP]
    if len(df) > MAX_ROWS:
        keep, total = set(), 0
        for group, n in df.groupby("gkey").size().sort_index().items():  # in the order of the hash
            if total + n <= MAX_ROWS:
                keep.add(group)
                total += n
        df = df[df.gkey.isin(keep)]
    df = df.sort_values(["source", "doc", "qid", "question"], kind="mergesort")
    first: dict[str, int] = {}
    for g in df.gkey:
        first.setdefault(g, len(first))
    return pd.DataFrame(
        {
            "id": [f"mq{i:05d}" for i in range(len(df))],
            "question": df.question.values,
            "answer": df.answer.values,
            "group": [f"g{first[g]:05d}" for g in df.gkey],
        }
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tools.medquad_pairs", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("medquad", type=Path, metavar="MEDQUAD_DIR", help="a checkout of github.com/abachaa/MedQuAD")
    ap.add_argument("--out", type=Path, default=OUT, help=f"where to write the CSV (default {OUT})")
    args = ap.parse_args(argv)
    if not args.medquad.is_dir():
        ap.error(f"{args.medquad}: not a directory (expected a checkout of abachaa/MedQuAD)")
    out = build(args.medquad)
    out.to_csv(args.out, index=False)
    print(f"medquad_pairs: {len(out)} rows, {out['group'].nunique()} groups -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
