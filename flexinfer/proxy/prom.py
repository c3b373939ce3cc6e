"""Prometheus metrics of the proxy process, without ``prometheus_client``.

Owns: the metric types the proxy defines (:class:`Counter`, :class:`Gauge`, :class:`Histogram`,
labelled or not), :class:`Registry` (collectors in registration order, each giving its samples as
plain rows: :data:`Family`), the text exposition (:class:`TextWriter`, :func:`generate_latest`: line
for line what ``prometheus_client.generate_latest`` writes for the same samples, format 0.0.4) and
:func:`float_to_go_string`.
Must not: import ``prometheus_client`` (its package imports its exposition, which imports
``urllib.request``, ``http.server``, ``email``, ``wsgiref``: 4.4 MB of the proxy's 41 MB resident
memory for a web server and a push client the proxy never uses; docs/benchmarks.md), start threads,
or lock: a metric is written by the one event-loop thread of its process (``--workers N`` share
through files: :mod:`flexinfer.proxy.workermetrics`).

What ``prometheus_client`` gives that this keeps: the names, labels, types and samples of each
series (``_total``, ``_created``, ``_bucket`` with ``le``, ``_count``, ``_sum``), its checks
(metric and label names, label counts, counters never decrease, ``le`` reserved) and errors
(``ValueError``), and a registry refusing a name twice. A collector written for
``prometheus_client`` (the serve runtime's) registers here too: any object whose ``collect()``
yields families with ``name``, ``type``, ``documentation``, ``unit`` and ``samples`` (each with
``name``, ``labels``, ``value``) is read by duck type. ``Registry.collect()`` gives such families
in turn, so ``prometheus_client.generate_latest`` renders a :class:`Registry` too (the tests check
both writers give the same bytes). Timestamps and exemplars are not carried (the proxy sets none).
"""

from __future__ import annotations

import re
import time
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

__all__ = ["Counter", "Family", "Gauge", "Histogram", "Labels", "Metric", "Registry", "RowCollector", "Sample",
           "SampleRow", "TextWriter", "collected_rows", "float_to_go_string", "generate_latest", "histogram_rows",
           "rows_of"]

Labels = tuple[tuple[str, str], ...]
#: (sample name, label pairs, value)
SampleRow = tuple[str, Labels, float]
#: (family name, type, help, unit, samples)
Family = tuple[str, str, str, str, list[SampleRow]]
#: (family name, type, help, ((sample name, labels), value)...): what :class:`TextWriter` writes
TextFamily = tuple[str, str, str, Iterable[tuple[tuple[str, Labels], float]]]

INF = float("inf")
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_METRIC_RUNE = re.compile(r"[^a-zA-Z0-9_:]")
_LABEL_RUNE = re.compile(r"[^a-zA-Z0-9_]")
#: the sample names each family type adds to its name (what a registry refuses twice)
_SUFFIXES = {"counter": ("", "_total", "_created"), "histogram": ("", "_bucket", "_count", "_sum", "_created"),
             "summary": ("", "_count", "_sum", "_created"), "gauge": ("",)}


def float_to_go_string(value: float) -> str:
    """A sample value or bound as Prometheus (Go) writes it: ``+Inf``, ``-Inf``, ``NaN``, Python's
    shortest repr, except that a positive number with more than six digits before the point is
    written with an exponent (``12345678.5`` -> ``1.23456785e+07``)."""
    d = float(value)
    if d == INF:
        return "+Inf"
    if d == -INF:
        return "-Inf"
    if d != d:
        return "NaN"
    text = repr(d)
    point = text.find(".")
    if d > 0 and point > 6:
        digits = (text[:point] + text[point + 1:]).rstrip("0")
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{mantissa}e+{point - 1:02d}"
    return text


def _value(v: float) -> str:
    if -1e6 < v < 1e6:  # repr has at most 6 digits before the point: float_to_go_string is repr then
        return repr(float(v))
    return float_to_go_string(v)


def _escaped(name: str, legal: re.Pattern[str], illegal: re.Pattern[str]) -> str:
    """A metric or label name as the 0.0.4 format writes it (prometheus_client's "underscores"
    escaping: every character outside the legacy set, and a leading digit, becomes ``_``)."""
    if not name or legal.match(name):
        return name
    out = illegal.sub("_", name)
    return "_" + out[1:] if name[0] in "0123456789" else out


def _metric_name(name: str) -> str:
    return _escaped(name, _METRIC_NAME, _METRIC_RUNE)


def _label_name(name: str) -> str:
    return _escaped(name, _LABEL_NAME, _LABEL_RUNE)


def _label_value(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class Sample(NamedTuple):
    """One sample of a family, as ``collect()`` gives it (``prometheus_client``'s fields)."""

    name: str
    labels: dict[str, str]
    value: float
    timestamp: float | None = None
    exemplar: Any = None
    native_histogram: Any = None


class Metric:
    """One family as ``collect()`` gives it: name, type, help, unit and samples."""

    __slots__ = ("documentation", "name", "samples", "type", "unit")

    def __init__(self, name: str, documentation: str, typ: str, unit: str = "",
                 samples: list[Sample] | None = None) -> None:
        self.name = name
        self.documentation = documentation
        self.type = typ
        self.unit = unit
        self.samples = samples if samples is not None else []

    def __repr__(self) -> str:
        return f"Metric({self.name!r}, {self.type!r}, {len(self.samples)} samples)"


@runtime_checkable
class RowCollector(Protocol):
    """A collector that gives its samples as plain rows (no object per sample)."""

    def rows(self) -> list[Family]: ...


def collected_rows(collector: Any) -> list[Family]:
    """What ``collector.collect()`` gives (``prometheus_client`` families or :class:`Metric`), as rows."""
    return [(m.name, m.type, m.documentation, m.unit,
             [(s.name, tuple(s.labels.items()), s.value) for s in m.samples])
            for m in collector.collect()]


def rows_of(collector: Any) -> list[Family]:
    """The rows of a collector: its own ``rows()`` when it has one, else what ``collect()`` gives."""
    if isinstance(collector, RowCollector):
        return collector.rows()
    return collected_rows(collector)


def histogram_rows(out: list[SampleRow], name: str, labels: Labels, le_labels: Iterable[Labels],
                   counts: Iterable[int], total: float, created: float) -> None:
    """Append one label set's histogram samples to ``out``: cumulative ``_bucket`` rows (``le_labels``:
    ``labels`` plus each bound's ``le``, one per non-cumulative count), ``_count``, ``_sum``, ``_created``."""
    bucket = f"{name}_bucket"
    n = 0
    for le, c in zip(le_labels, counts, strict=True):
        n += c
        out.append((bucket, le, n))
    out.append((f"{name}_count", labels, n))
    out.append((f"{name}_sum", labels, total))
    out.append((f"{name}_created", labels, created))


# ---- the metric types ----------------------------------------------------------------------------


class _CounterValue:
    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.value += amount


class _GaugeValue:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount

    def set(self, value: float) -> None:
        self.value = float(value)


class _HistogramValue:
    __slots__ = ("bounds", "counts", "created", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)  # per bucket, not cumulative; the last bound is +Inf
        self.sum = 0.0
        self.created = time.time()

    def observe(self, amount: float) -> None:
        self.counts[bisect_left(self.bounds, amount)] += 1
        self.sum += amount


class _Family:
    """A metric family with its label names and one value object per label set (one only, made at
    once, when it has no labels)."""

    type = ""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (), *,
                 registry: Registry | None = None, unit: str = "") -> None:
        if not _METRIC_NAME.match(name):
            raise ValueError(f"Invalid metric name: {name!r}")
        for label in labelnames:
            if not _LABEL_NAME.match(label) or label.startswith("__"):
                raise ValueError(f"Invalid label metric name: {label!r}")
        self.name = name
        self.documentation = documentation
        self.unit = unit
        self.labelnames = tuple(labelnames)
        #: label values -> (label pairs, value object), in the order first used
        self._children: dict[tuple[str, ...], tuple[Labels, Any]] = {}
        if not self.labelnames:
            self._children[()] = ((), self._new())
        if registry is not None:
            registry.register(self)

    def _new(self) -> Any:
        raise NotImplementedError

    def labels(self, *values: object, **named: object) -> Any:
        """The value object of one label set (made on first use); values by position or by name."""
        if not self.labelnames:
            raise ValueError(f"No label names were set when constructing {self.name}")
        if values and named:
            raise ValueError("Can't pass both *args and **kwargs")
        if named:
            if set(named) != set(self.labelnames):
                raise ValueError("Incorrect label names")
            values = tuple(named[n] for n in self.labelnames)
        if len(values) != len(self.labelnames):
            raise ValueError("Incorrect label count")
        key = tuple(str(v) for v in values)
        got = self._children.get(key)
        if got is None:
            got = self._children[key] = (tuple(zip(self.labelnames, key, strict=True)), self._new())
        return got[1]

    def remove(self, *values: object) -> None:
        """Forget one label set's series."""
        if len(values) != len(self.labelnames):
            raise ValueError("Incorrect label count")
        self._children.pop(tuple(str(v) for v in values), None)

    def _only(self) -> Any:
        if self.labelnames:
            raise ValueError(f"{self.name} has labels: call labels() first")
        return self._children[()][1]

    def _samples(self) -> list[SampleRow]:
        raise NotImplementedError

    def rows(self) -> list[Family]:
        return [(self.name, self.type, self.documentation, self.unit, self._samples())]


class Counter(_Family):
    """A counter (``<name>_total`` and ``<name>_created`` per label set; a trailing ``_total`` in
    the name given is dropped, as prometheus_client does)."""

    type = "counter"

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (), *,
                 registry: Registry | None = None, unit: str = "") -> None:
        super().__init__(name.removesuffix("_total"), documentation, labelnames, registry=registry, unit=unit)

    def _new(self) -> _CounterValue:
        return _CounterValue()

    def inc(self, amount: float = 1.0) -> None:
        self._only().inc(amount)

    def _samples(self) -> list[SampleRow]:
        total, created = f"{self.name}_total", f"{self.name}_created"
        out: list[SampleRow] = []
        for labels, v in self._children.values():
            out.append((total, labels, v.value))
            out.append((created, labels, v.created))
        return out


class Gauge(_Family):
    """A gauge: one sample per label set."""

    type = "gauge"

    def _new(self) -> _GaugeValue:
        return _GaugeValue()

    def set(self, value: float) -> None:
        self._only().set(value)

    def inc(self, amount: float = 1.0) -> None:
        self._only().inc(amount)

    def dec(self, amount: float = 1.0) -> None:
        self._only().dec(amount)

    def _samples(self) -> list[SampleRow]:
        return [(self.name, labels, v.value) for labels, v in self._children.values()]


class Histogram(_Family):
    """A histogram with the given upper bounds (+Inf added): cumulative ``_bucket`` samples with
    ``le``, then ``_count``, ``_sum`` and ``_created`` per label set."""

    type = "histogram"
    DEFAULT_BUCKETS = (.005, .01, .025, .05, .075, .1, .25, .5, .75, 1.0, 2.5, 5.0, 7.5, 10.0)

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (), *,
                 buckets: Sequence[float] = DEFAULT_BUCKETS, registry: Registry | None = None,
                 unit: str = "") -> None:
        if "le" in labelnames:
            raise ValueError("Invalid label name: le")
        bounds = [float(b) for b in buckets]
        if bounds and bounds[-1] != INF:
            bounds.append(INF)
        if len(bounds) < 2 or bounds != sorted(bounds):
            raise ValueError("Buckets must be sorted and hold at least one bound besides +Inf")
        self.bounds = tuple(bounds)
        self._le = tuple(float_to_go_string(b) for b in bounds)
        super().__init__(name, documentation, labelnames, registry=registry, unit=unit)

    def _new(self) -> _HistogramValue:
        return _HistogramValue(self.bounds)

    def observe(self, amount: float) -> None:
        self._only().observe(amount)

    def _samples(self) -> list[SampleRow]:
        out: list[SampleRow] = []
        for labels, v in self._children.values():
            histogram_rows(out, self.name, labels, [(*labels, ("le", le)) for le in self._le], v.counts, v.sum,
                           v.created)
        return out


# ---- the registry and the text exposition --------------------------------------------------------


class Registry:
    """The collectors of one proxy, in registration order. Each gives its families as rows (its
    own ``rows()``, or converted from ``collect()``); a family name registered twice is refused."""

    def __init__(self) -> None:
        self._collectors: list[Any] = []
        self._names: dict[str, Any] = {}  # sample name -> the collector that gives it

    def register(self, collector: Any) -> None:
        names = {name + suffix for name, typ, _doc, _unit, _samples in rows_of(collector)
                 for suffix in _SUFFIXES.get(typ, ("",))}
        taken = sorted(n for n in names if n in self._names)
        if taken:
            raise ValueError(f"Duplicated timeseries in Registry: {taken}")
        self._collectors.append(collector)
        for n in names:
            self._names[n] = collector

    def unregister(self, collector: Any) -> None:
        self._collectors.remove(collector)
        for n in [n for n, c in self._names.items() if c is collector]:
            del self._names[n]

    def rows(self) -> list[Family]:
        out: list[Family] = []
        for collector in list(self._collectors):
            out.extend(rows_of(collector))
        return out

    def collect(self) -> Iterator[Metric]:
        """The families as objects (what ``prometheus_client.generate_latest`` reads)."""
        for name, typ, doc, unit, samples in self.rows():
            yield Metric(name, doc, typ, unit, [Sample(s, dict(labels), v) for s, labels, v in samples])

    def get_sample_value(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        """The value of one sample (None when there is none); for tests."""
        want = labels or {}
        for _family, _typ, _doc, _unit, samples in self.rows():
            for s, got, v in samples:
                if s == name and dict(got) == want:
                    return v
        return None


_OM_SUFFIXES = ("_created", "_gsum", "_gcount")
_TYPE_RENAME = {"info": "gauge", "stateset": "gauge", "gaugehistogram": "histogram", "unknown": "untyped"}


class TextWriter:
    """The Prometheus text format (0.0.4) of rows, line for line what ``generate_latest`` writes
    for the same samples; keeps each series' name-and-labels prefix (series are few and live long)."""

    def __init__(self) -> None:
        self._prefixes: dict[tuple[str, Labels], str] = {}

    def _prefix(self, key: tuple[str, Labels]) -> str:
        sname, labels = key
        name = _metric_name(sname)
        if not labels:
            p = f"{name} "
        else:
            inner = ",".join(f'{_label_name(k)}="{_label_value(v)}"' for k, v in sorted(labels))
            p = f"{name}{{{inner}}} "
        self._prefixes[key] = p
        return p

    def write(self, families: Iterable[TextFamily]) -> bytes:
        """The text of ``(name, type, help, ((sample name, labels), value)...)`` families."""
        prefixes = self._prefixes
        out: list[str] = []
        for name, typ, doc, samples in families:
            mname = name + "_total" if typ == "counter" else name + "_info" if typ == "info" else name
            doc = doc.replace("\\", r"\\").replace("\n", r"\n")
            ename = _metric_name(mname)
            out.append(f"# HELP {ename} {doc}\n# TYPE {ename} {_TYPE_RENAME.get(typ, typ)}\n")
            om: dict[str, list[str]] | None = None
            for key, v in samples:
                p = prefixes.get(key) or self._prefix(key)
                sname = key[0]
                if sname.startswith(name) and sname[len(name):] in _OM_SUFFIXES:
                    if om is None:
                        om = {}
                    om.setdefault(sname[len(name):], []).append(f"{p}{_value(v)}\n")
                else:
                    out.append(f"{p}{_value(v)}\n")
            if om:
                for suffix, lines in sorted(om.items()):
                    e = _metric_name(name + suffix)
                    out.append(f"# HELP {e} {doc}\n# TYPE {e} gauge\n")
                    out.extend(lines)
        return "".join(out).encode("utf-8")

    def write_rows(self, families: Iterable[Family]) -> bytes:
        """The text of rows as a registry gives them."""
        return self.write((name, typ, doc, (((s, labels), v) for s, labels, v in samples))
                          for name, typ, doc, _unit, samples in families)


def generate_latest(registry: Any) -> bytes:
    """The text exposition of a :class:`Registry` (or of any collector)."""
    return TextWriter().write_rows(rows_of(registry))
