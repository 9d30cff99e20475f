"""The shipped demo dataset: question -> answer sentence pairs over tables of facts (data/demo_facts/).

Columns: id, fact, question, answer, topic. Every pair states one true fact from the tables
in data/demo_facts/; `fact` names it (the group id, e.g. `capital-france`; a row's id is
`<fact>-q<n>`). Each fact is asked several ways (4-7 question templates per relation, some of them reverse questions:
"Paris is the capital of which country?", "Which element has atomic number 29?") and answered in
a few ways (2-3 answer templates); each question is paired with exactly one answer phrasing,
chosen by a hash of the question text (no random state), so the output is byte-identical on every
run and machine. Evaluation is group-aware: a retrieved answer is right when it is any answer
text of the row's fact; no answer text belongs to two facts.

The data is built to discriminate, not to be matched by word overlap with the question:
- answers also mention a second true fact about the same subject, in the wording of the other
  questions about it (a capital answer names the country's currency and official language, a
  currency or language answer names the capital; an element's symbol answer names its atomic
  number and vice versa; a book's answer names another book by the same author), so the
  question's own embedding often lands on the answer to a sibling fact, while a map fitted on
  the training pairs learns which answer form each question takes;
- confusable facts that differ only in a number, year or season: all 118 elements (neighbouring
  atomic numbers; the lanthanides and heavy elements, whose names all end in -ium), the 47 US
  presidents by number, FIFA World Cup hosts and winners by year, Summer and Winter Olympic host
  cities by year (1924-1992 have both), countries sharing a currency (the euro, the CFA francs,
  the US dollar) or a continent, planets by order from the Sun. These are the items that tell
  models apart: a model must hold the fact, since the question's wording does not give it away.

No network, no external data: all facts are written out in data/demo_facts/ (a CSV per table,
the phrasings in templates.yaml). Where a fact is disputed, depends on a convention, or is about
to change (shared capitals, transcontinental countries, several co-official languages, currencies
in transition, a host city due to host again), the field is left out (empty) or the question is
not asked, rather than guessed.

    python -m tools.demo_data [--out data/raw/qa_pairs.csv]
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import re
import unicodedata
from pathlib import Path
from typing import Iterator

import yaml

from pipeline.core.atomic import atomic_open

DEFAULT_OUT = "data/raw/qa_pairs.csv"
COLUMNS = ("id", "fact", "question", "answer", "topic")

# The fact tables and phrasings are data (data/demo_facts/, its README says what each column
# means); they are read once, at import, as tuples in the tables' row order (the output order).
FACTS_DIR = Path(__file__).resolve().parent.parent / "data" / "demo_facts"


def _table(name: str, *ints: str) -> tuple[tuple, ...]:
    """The rows of data/demo_facts/<name>.csv as tuples: an empty field is None (a fact left out
    on purpose), the columns named in `ints` are ints."""
    with open(FACTS_DIR / f"{name}.csv", encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    return tuple(tuple(int(v) if k in ints else v or None for k, v in row.items()) for row in rows)


COUNTRIES = _table("countries")  # (name, capital, currency, continent, official language)
ELEMENTS = _table("elements", "number", "period")  # (atomic number, symbol, name, period)
OLYMPICS = _table("olympics", "year")  # (year, season, host city, present-day country)
PRESIDENTS = _table("presidents", "number", "year")  # (number, name, year the term began)
WORLD_CUPS = _table("world_cups", "year")  # (year, host, winner, host asked: yes/no)
PLANETS = _table("planets")  # (planet, ordinal, number word), in order from the Sun
PLANET_FEATURES = _table("planet_features")  # (planet, predicate, two answer sentences)
ANIMAL_YOUNG = _table("animal_young")  # (animal, young)
ANIMAL_GROUPS = _table("animal_groups")  # (animals, collective noun)
ANIMAL_SOUNDS = _table("animal_sounds")  # (animal, verb, noun for the sound)
BOOKS = _table("books")  # (title, author)
INVENTIONS = _table("inventions")  # (invention, inventor)
with open(FACTS_DIR / "templates.yaml", encoding="utf-8") as _f:
    _PHRASINGS = yaml.safe_load(_f)
# Per relation: (question templates, answer templates).
TEMPLATES = {k: (tuple(v["questions"]), tuple(v["answers"])) for k, v in _PHRASINGS["templates"].items()}
OLYMPICS_NO_REVERSE = frozenset(tuple(pair) for pair in _PHRASINGS["olympics_no_reverse"])
WORLD_CUP_REVERSE = frozenset(_PHRASINGS["world_cup_reverse"])


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def _art(word: str) -> str:
    """'a'/'an' + word, by the first letter (enough for the words in these tables)."""
    return ("an " if word[:1].lower() in "aeiou" else "a ") + word


def _pos(name: str) -> str:
    """Possessive: plural-form names ("the Netherlands") take a bare apostrophe, others "'s"."""
    return name + ("'" if name.startswith("the ") and name.endswith("s") else "'s")


def _slug(s: str) -> str:
    s = unicodedata.normalize("NFKD", s).encode("ascii", "ignore").decode("ascii").lower()
    return re.sub(r"[^a-z0-9]+", "-", s).strip("-")


def _with_caps(fields: dict[str, str]) -> dict[str, str]:
    """Add a capitalized variant under the key with its first letter upper-cased."""
    return {**fields, **{_cap(k): _cap(v) for k, v in fields.items()}}


def _finish(text: str) -> str:
    # A value that ends in a period ("Washington, D.C.", "Jr.") must not end the sentence twice.
    return text[:-1] if text.endswith("..") else text


def _choose(question: str, n: int) -> int:
    """Deterministic answer-template index for a question: a hash of its text, no random state."""
    digest = hashlib.sha256(question.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % n


def _also(currency: str | None, language: str | None) -> str:
    """The capital answers' tail: the country's currency and official language, where known."""
    parts = [f"its currency is {currency}"] if currency else []
    parts += [f"its official language is {language}"] if language else []
    return ", and " + " and ".join(parts) if parts else ""


def _ordinal(number: int) -> str:
    """16 -> '16th', 22 -> '22nd', 11 -> '11th'."""
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"


# Each fact: (topic, subject slug, fields for the templates). A question template that names a
# field the fact lacks is skipped for that fact (the Olympics' reverse questions: {rcity}).
def _facts() -> Iterator[tuple[str, str, dict[str, str]]]:
    for name, capital, currency, continent, language in COUNTRIES:
        # The continent is context in the answers (", a country in Europe"), never asked: an
        # answer must not state the fact of another group.
        base = {
            "c": name,
            "c_pos": _pos(name),
            "cont_mid": f", a country in {continent}," if continent else "",
            "cont_end": f", a country in {continent}" if continent else "",
            "cap_mid": f", whose capital is {capital}," if capital else "",
            "cap_end": f", whose capital is {capital}" if capital else "",
            "cur_end": f", and its currency is {currency}" if currency else "",
            "also": _also(currency, language),
        }
        slug = _slug(name.removeprefix("the "))
        if capital:
            yield "capital", slug, {**base, "cap": capital}
        if currency:
            yield "currency", slug, {**base, "cur": currency}
        if language:
            yield "official_language", slug, {**base, "lang": language}
    elements = [
        (_slug(name), {"el": name, "sym": symbol, "n": str(n), "per": str(period)})
        for n, symbol, name, period in ELEMENTS
    ]
    for slug, fields in elements:
        yield "element_symbol", slug, fields
    for slug, fields in elements:
        yield "atomic_number", slug, {**fields, "protons": "proton" if fields["n"] == "1" else "protons"}
    for (number, _, name, _), (number2, _, name2, _) in zip(ELEMENTS, ELEMENTS[1:]):
        fields = {"el": name, "n": str(number), "el2": name2, "n2": str(number2)}
        yield "element_next", _slug(name), fields
    for planet, ordinal, number_word in PLANETS:
        yield "planet_order", _slug(planet), {"p": planet, "ord": ordinal, "num": number_word}
    for planet, pred, ans1, ans2 in PLANET_FEATURES:
        yield "planet_feature", _slug(f"{planet} {pred}"), {"pred": pred, "ans1": ans1, "ans2": ans2}
    for animal, young in ANIMAL_YOUNG:
        yield "animal_young", _slug(animal), {"a": animal, "a_art": _art(animal), "y_art": _art(young)}
    for plural, group in ANIMAL_GROUPS:
        yield "animal_group", _slug(plural), {"pl": plural, "g_art": _art(group)}
    for animal, verb, noun in ANIMAL_SOUNDS:
        yield "animal_sound", _slug(animal), {"a_art": _art(animal), "verb": verb, "noun_art": _art(noun)}
    for i, (title, author) in enumerate(BOOKS):
        # Another book of the same author in the table (the next one, cyclically), if any.
        same = [t for t, a in BOOKS[i + 1 :] + BOOKS[:i] if a == author]
        yield (
            "book_author",
            _slug(title),
            {
                "t": title,
                "au": author,
                "also": f", who also wrote {same[0]}" if same else "",
                "also_mid": f", who also wrote {same[0]}," if same else "",
            },
        )
    for invention, inventor in INVENTIONS:
        yield "inventor", _slug(invention.removeprefix("the ")), {"inv": invention, "who": inventor}
    twice = {name for _, name, _ in PRESIDENTS if sum(n == name for _, n, _ in PRESIDENTS) > 1}
    for number, name, year in PRESIDENTS:
        fields = {"n": str(number), "nth": _ordinal(number), "name": name, "year": str(year)}
        if name not in twice:
            fields["rname"] = name
        yield "president_order", str(number), fields
    for year, host, winner, host_asked in WORLD_CUPS:
        fields = {"y": str(year), "host": host, "winner": winner}
        if host in WORLD_CUP_REVERSE:
            fields["rhost"] = host
        if host_asked == "yes":
            yield "world_cup_host", str(year), fields
        yield "world_cup_winner", str(year), fields
    hosted: dict[tuple[str, str], int] = {}
    for _, season, city, _ in OLYMPICS:
        hosted[city, season] = hosted.get((city, season), 0) + 1
    for year, season, city, country in OLYMPICS:
        fields = {"y": str(year), "s": season, "city": city, "where": f"{city}, {country}" if country else city}
        if hosted[city, season] == 1 and (city, season) not in OLYMPICS_NO_REVERSE:
            fields["rcity"] = city
        yield "olympics", f"{year}-{season.lower()}", fields


def fact_id(topic: str, slug: str) -> str:
    """The group id of a fact: every row asking it shares it (ids are `<fact>-q<n>`)."""
    return f"{topic.replace('_', '-')}-{slug}"


def generate() -> list[dict]:
    """All pairs, in a stable order: dicts with keys id, fact, question, answer, topic.

    Exact duplicate (question, answer) pairs are dropped (the first is kept)."""
    rows: list[dict] = []
    seen_pairs: set[tuple[str, str]] = set()
    seen_ids: set[str] = set()
    for topic, slug, raw in _facts():
        fields = _with_caps(raw)
        fact = fact_id(topic, slug)
        questions, answers = TEMPLATES[topic]
        for qi, qt in enumerate(questions, start=1):
            try:
                question = _finish(qt.format(**fields))
            except KeyError:  # a template this fact does not take (see _facts)
                continue
            answer = _finish(answers[_choose(question, len(answers))].format(**fields))
            if (question, answer) in seen_pairs:
                continue
            row_id = f"{fact}-q{qi}"
            if row_id in seen_ids:  # a table bug (two subjects with one slug), not user input
                raise ValueError(f"duplicate id {row_id!r} in the demo fact tables")
            seen_pairs.add((question, answer))
            seen_ids.add(row_id)
            rows.append({"id": row_id, "fact": fact, "question": question, "answer": answer, "topic": topic})
    return rows


def write_csv(path: str | Path) -> int:
    """Write the pairs to `path` (UTF-8, '\\n' line ends, minimal quoting), atomically.

    Returns the number of pairs written."""
    rows = generate()
    with atomic_open(path, "w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n", quoting=csv.QUOTE_MINIMAL)
        writer.writeheader()
        writer.writerows(rows)
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    from pipeline.core.paths import repo_path

    parser = argparse.ArgumentParser(
        prog="python -m tools.demo_data",
        description=(
            "Write the shipped demo dataset: a CSV of question -> answer sentence pairs "
            "(columns id,fact,question,answer,topic; `fact` is the group id of the fact a row "
            "states) generated deterministically from the tables of true facts in data/demo_facts/ (country "
            "capitals, currencies and official languages; chemical element symbols, atomic "
            "numbers and neighbours; planets; animal young, groups and sounds; book authors; inventors; "
            "Olympic host cities; US presidents by number; FIFA World Cup hosts and winners), "
            "each fact asked in several phrasings. No network access; "
            "the output is byte-identical on every run."
        ),
    )
    parser.add_argument(
        "--out",
        default=DEFAULT_OUT,
        help=f"CSV file to write; a relative path is taken from the repository root "
        f"(default: {DEFAULT_OUT}). Parent directories are created; the file is replaced "
        f"atomically.",
    )
    args = parser.parse_args(argv)
    out = repo_path(args.out)
    n = write_csv(out)
    print(f"wrote {n} question-answer pairs to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
