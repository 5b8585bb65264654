"""A strict parser of the Prometheus text exposition format 0.0.4, as prometheus_client's
``generate_latest`` writes it, for the simulator's /metrics tests (prometheus_client is not in
the project's venv). Anything it does not write is an AssertionError naming the line:

- a family is ``# HELP NAME DOC`` (optional) then ``# TYPE NAME TYPE``, then its samples; a
  counter's family name ends in ``_total``; no family twice;
- a sample is ``NAME{k="v",...} VALUE``: NAME the family's (a histogram's with ``_bucket``,
  ``_count`` or ``_sum``), label names valid and sorted, values escaped (``\\\\``, ``\\n``,
  ``\\"``), VALUE a float (``+Inf``, ``-Inf``, ``NaN``); no sample twice;
- a histogram's buckets, per label set: ``le`` ascending, ending at ``+Inf``, counts
  cumulative; ``_count`` equal to the ``+Inf`` bucket; ``_sum`` present.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\n"])*)"')
TYPES = ("counter", "gauge", "histogram", "summary", "untyped")
SUFFIXES = {"histogram": ("_bucket", "_count", "_sum"), "summary": ("", "_count", "_sum")}


@dataclass
class Sample:
    name: str
    labels: dict[str, str]
    value: float


@dataclass
class Family:
    name: str
    type: str
    help: str | None
    samples: list[Sample] = field(default_factory=list)

    def label_names(self) -> set[str]:
        """The label names of its samples (a bucket's ``le`` left out)."""
        return {k for s in self.samples for k in s.labels if k != "le"}

    def buckets(self) -> list[list[float]]:
        """Each label set's bucket bounds (without +Inf), in order."""
        out: dict[tuple[tuple[str, str], ...], list[float]] = {}
        for s in self.samples:
            if s.name == self.name + "_bucket":
                key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                out.setdefault(key, []).append(float(s.labels["le"]))
        return [b[:-1] for b in out.values()]

    def value(self, suffix: str = "", **labels: str) -> float:
        """The value of the sample ``NAME + suffix`` whose labels include ``labels``."""
        found = [s.value for s in self.samples
                 if s.name == self.name + suffix and labels.items() <= s.labels.items()]  # fmt: skip
        assert len(found) == 1, (self.name + suffix, labels, found)
        return found[0]


def _value(text: str, where: str) -> float:
    if text in ("+Inf", "-Inf", "NaN"):
        return float(text.replace("+", ""))
    assert re.fullmatch(r"-?\d+(\.\d+)?([eE][+-]?\d+)?", text), f"{where}: value {text!r}"
    return float(text)


def _labels(text: str, where: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    rest = text
    while rest:
        m = LABEL.match(rest)
        assert m, f"{where}: labels {text!r}"
        assert m.group(1) not in labels, f"{where}: label {m.group(1)} twice"
        labels[m.group(1)] = re.sub(r"\\(.)", lambda e: {"n": "\n"}.get(e[1], e[1]), m.group(2))
        rest = rest[m.end() :]
        if rest:
            assert rest.startswith(","), f"{where}: labels {text!r}"
            rest = rest[1:]
            assert rest, f"{where}: a trailing comma"
    assert list(labels) == sorted(labels), f"{where}: labels not sorted by name"
    return labels


def _sample(line: str, family: Family, where: str) -> Sample:
    m = re.fullmatch(r"([^\s{]+)(?:\{(.*)\})? (\S+)", line)
    assert m, f"{where}: not a sample: {line!r}"
    name, labels, value = m.group(1), _labels(m.group(2) or "", where), _value(m.group(3), where)
    assert NAME.fullmatch(name), f"{where}: name {name!r}"
    allowed = [family.name + s for s in SUFFIXES.get(family.type, ("",))]
    assert name in allowed, f"{where}: {name} in family {family.name} ({family.type})"
    assert ("le" in labels) == (name == family.name + "_bucket") or family.type != "histogram", (
        f"{where}: le on {name}"
    )
    return Sample(name, labels, value)


def _check_histogram(family: Family) -> None:
    series: dict[tuple[tuple[str, str], ...], dict[str, list[Sample]]] = {}
    for s in family.samples:
        key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
        series.setdefault(key, {}).setdefault(s.name[len(family.name) :], []).append(s)
    for key, parts in series.items():
        where = f"{family.name}{dict(key)}"
        buckets = parts.get("_bucket", [])
        assert buckets, f"{where}: no buckets"
        bounds = [float(b.labels["le"]) for b in buckets]
        assert bounds == sorted(bounds) and len(set(bounds)) == len(bounds), f"{where}: le order"
        assert bounds[-1] == math.inf, f"{where}: no +Inf bucket"
        counts = [b.value for b in buckets]
        assert counts == sorted(counts), f"{where}: buckets not cumulative"
        assert [c.value for c in parts.get("_count", [])] == [counts[-1]], f"{where}: _count"
        assert len(parts.get("_sum", [])) == 1, f"{where}: _sum"


def parse(text: str) -> dict[str, Family]:
    """The families of exposition ``text``, by name, checked as the module says."""
    assert text.endswith("\n"), "the exposition does not end with a newline"
    families: dict[str, Family] = {}
    help_of: tuple[str, str] | None = None
    family: Family | None = None
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for number, line in enumerate(text[:-1].split("\n"), 1):
        where = f"line {number}"
        if line.startswith("# HELP "):
            name, _, doc = line[7:].partition(" ")
            assert help_of is None, f"{where}: a HELP without its TYPE before it"
            help_of = (name, doc)
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            assert NAME.fullmatch(name) and kind in TYPES, f"{where}: {line!r}"
            assert help_of is None or help_of[0] == name, f"{where}: HELP of {help_of}"
            assert name not in families, f"{where}: family {name} twice"
            assert kind != "counter" or name.endswith("_total"), f"{where}: counter {name}"
            family = families[name] = Family(name, kind, help_of[1] if help_of else None)
            help_of = None
        else:
            assert family is not None and help_of is None, f"{where}: a sample outside a family"
            sample = _sample(line, family, where)
            key = (sample.name, tuple(sorted(sample.labels.items())))
            assert key not in seen, f"{where}: sample {key} twice"
            seen.add(key)
            family.samples.append(sample)
    assert help_of is None, "a HELP line at the end"
    for f in families.values():
        assert f.samples, f"family {f.name} has no sample"
        if f.type == "histogram":
            _check_histogram(f)
    return families
