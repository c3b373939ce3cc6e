"""Units: the ONE duration grammar and the ONE Kubernetes quantity grammar of FlexInfer.

Owns: Go-style durations (``"1m30s"``, ``"500ms"``, ``"2h"``, the syntax the CRD schemas accept, see
:data:`DURATION_PATTERN`) for env settings, flags and CRDs, where a bare number is seconds unless the
caller asks for Go syntax only; Kubernetes quantities (``"500m"``, ``"16Gi"``, ``"1.5G"``, ``"2e3"``,
see :data:`QUANTITY_PATTERN`). Both raise a plain ``ValueError`` with a message that names the
value; callers prefix their own context (an env variable, a CRD path) and their own error type.

Must not: import anything of ours (settings, the API types and the scheduler all build on it).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, DecimalException

__all__ = [
    "DURATION_PATTERN",
    "MAX_DURATION_S",
    "QUANTITY_PATTERN",
    "format_duration",
    "parse_duration",
    "parse_quantity",
]

# ---- durations ---------------------------------------------------------------------------------

_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
#: the pattern the CRD schemas put on duration strings (Go's syntax, non-negative, no µ)
DURATION_PATTERN = r"^(0|([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+)$"
_DURATION_RE = re.compile(DURATION_PATTERN)
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ns|us|ms|s|m|h)")
#: a bare number of seconds: ``30``, ``0.5``, ``.5``, ``+5``, ``1e3`` (ASCII digits only, no inf/nan)
_SECONDS_RE = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
#: Go's time.Duration limit (int64 nanoseconds, about 292 years); longer durations are rejected
MAX_DURATION_S = (2**63 - 1) / 1e9
_GO_HINT = "use Go-style like 1m30s"
_HINT = f"{_GO_HINT} or a number of seconds"


def parse_duration(value: str | int | float, *, bare_seconds: bool = True) -> float:
    """Seconds in a duration: ``"1m30s"`` -> 90.0, ``"500ms"`` -> 0.5, ``"0"`` -> 0.0, ``90`` -> 90.0.

    A string is Go syntax (:data:`DURATION_PATTERN`, surrounding blanks ignored) or, when
    ``bare_seconds`` (the default, for env settings and flags), a bare number of seconds (``"30"``,
    ``"0.5"``). Numbers (int, float) are always seconds. Raises ``ValueError`` for anything else, a
    negative duration, or one over Go's limit (:data:`MAX_DURATION_S`).
    """
    hint = _HINT if bare_seconds else _GO_HINT
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"invalid duration {value!r}: {hint}")
    if isinstance(value, str):
        s = value.strip()
        if bare_seconds and _SECONDS_RE.fullmatch(s):
            seconds = float(s)
        elif _DURATION_RE.match(s):
            seconds = sum(float(n) * _DURATION_UNITS[u] for n, u in _DURATION_PART.findall(s))
        elif s.startswith("-") and _DURATION_RE.match(s[1:]):
            raise ValueError(f"invalid duration {value!r}: must not be negative")
        else:
            raise ValueError(f"invalid duration {value!r}: {hint}")
    elif math.isnan(value):
        raise ValueError(f"invalid duration {value!r}: {hint}")
    else:
        seconds = float(value)
    if seconds < 0:
        raise ValueError(f"invalid duration {value!r}: must not be negative")
    if seconds > MAX_DURATION_S:  # inf included
        raise ValueError(f"invalid duration {value!r}: over Go's limit of 2562047h")
    return seconds


def format_duration(seconds: float) -> str:
    """The shortest Go-style spelling of whole seconds: 300 -> ``"5m"``, 5400 -> ``"1h30m"``."""
    if seconds <= 0:
        return "0"
    if seconds != int(seconds):
        return f"{round(seconds * 1000)}ms"
    s = int(seconds)
    out = ""
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        if s >= size:
            out += f"{s // size}{unit}"
            s %= size
    return out


# ---- quantities ----------------------------------------------------------------------------------

#: the Kubernetes resource.Quantity pattern (as emitted by controller-gen)
QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
#: what :func:`parse_quantity` reads: QUANTITY_PATTERN with an integer exponent (as Kubernetes parses it)
_QUANTITY_RE = re.compile(r"(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
                          r"(?:(?P<suffix>[KMGTPE]i|[numkMGTPE])|[eE](?P<exp>[+-]?[0-9]+))?")
_SUFFIX: dict[str, Decimal] = {
    "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30), "Ti": Decimal(2**40),
    "Pi": Decimal(2**50), "Ei": Decimal(2**60),
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
    "k": Decimal(10**3), "M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12),
    "P": Decimal(10**15), "E": Decimal(10**18),
}
#: no Kubernetes quantity is larger in magnitude (2^63 - 1)
_MAX_QUANTITY = Decimal(2**63 - 1)
_QUANTITY_HINT = "use a Kubernetes quantity like 500m, 16Gi, 1.5G or 2e3"


def parse_quantity(value: str | int | float) -> Decimal:
    """The exact value of a Kubernetes quantity: ``"16Gi"`` -> 17179869184, ``"500m"`` -> 0.5,
    ``"1.5G"`` -> 1500000000, ``"2e3"`` -> 2000; numbers (int, float) as they are.

    A string is :data:`QUANTITY_PATTERN` with an integer exponent, surrounding blanks ignored.
    Raises ``ValueError`` for anything else, or a magnitude over 2^63 - 1 (Kubernetes' limit).
    """
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"invalid quantity {value!r}: {_QUANTITY_HINT}")
    if isinstance(value, str):
        m = _QUANTITY_RE.fullmatch(value.strip())
        if m is None:
            raise ValueError(f"invalid quantity {value!r}: {_QUANTITY_HINT}")
        num, suffix, exp = m.group("num", "suffix", "exp")
        try:
            out = Decimal(f"{num}e{exp}" if exp else num)  # exact: no context rounding
            if suffix:
                out *= _SUFFIX[suffix]
        except DecimalException:  # past Decimal's own exponent limits
            raise ValueError(f"invalid quantity {value!r}: out of range") from None
    elif math.isfinite(value):
        out = Decimal(str(value))
    else:
        raise ValueError(f"invalid quantity {value!r}: {_QUANTITY_HINT}")
    if not -_MAX_QUANTITY <= out <= _MAX_QUANTITY:  # a comparison, unlike abs(), never overflows
        raise ValueError(f"invalid quantity {value!r}: out of range")
    return out
