"""The one duration grammar and the one quantity grammar (``flexinfer.units``) and their faces:
``settings.parse_duration`` (env: bare seconds too), ``api.common.parse_duration`` (CRDs: Go syntax only)."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest

from flexinfer import units
from flexinfer.api.common import SpecError
from flexinfer.api.common import parse_duration as spec_duration
from flexinfer.api.common import parse_quantity as spec_quantity
from flexinfer.scheduler.logic import parse_quantity_int, parse_vram_gi
from flexinfer.settings import SettingsError, from_env, parse_duration, setting

# ---- durations -----------------------------------------------------------------------------------

GO = [  # (text, seconds): accepted everywhere, CRDs included
    ("0", 0.0), ("0s", 0.0), ("30s", 30.0), ("500ms", 0.5), ("2h", 7200.0), ("1m30s", 90.0),
    ("1h2m3.5s", 3723.5), ("1.5h", 5400.0), ("100us", 1e-4), ("10ns", 1e-8), (" 5m ", 300.0),
    ("1s1s", 2.0), ("2562047h", 2562047 * 3600.0),
]
BARE = [  # (text, seconds): a bare number of seconds, env settings and flags only
    ("30", 30.0), ("0.5", 0.5), ("1.5", 1.5), ("0", 0.0), (".5", 0.5), ("5.", 5.0), ("+5", 5.0),
    ("1e3", 1000.0), (" 10 ", 10.0),
]
INVALID = ["", " ", "1x", "5 m", "5min", "1d", "m", "s1", "30S", "5M", ".5s", "1.s", "1e3s", "1h-5m", "µs",
           "1µs", "inf", "nan", "1_000", "٣", "--1s", "0x10"]
NEGATIVE = ["-1s", "-1", "-0.5", "-1h30m"]
OVERFLOW = ["2562048h", "9999999999h", "1e400", "10000000000", "1" + "0" * 400 + "s"]


@pytest.mark.parametrize(("text", "seconds"), GO + BARE)
def test_duration(text, seconds):
    assert units.parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(("text", "seconds"), GO)
def test_duration_go_only(text, seconds):
    assert units.parse_duration(text, bare_seconds=False) == pytest.approx(seconds)


@pytest.mark.parametrize("text", [t for t, _ in BARE if t.strip() != "0"])
def test_bare_seconds_are_not_go_syntax(text):
    with pytest.raises(ValueError, match=re.escape(f"invalid duration {text!r}: use Go-style like 1m30s")):
        units.parse_duration(text, bare_seconds=False)


@pytest.mark.parametrize("value", [*INVALID, True, False, None, [1], b"1s"])
def test_duration_invalid(value):
    with pytest.raises(ValueError, match=re.escape(
            f"invalid duration {value!r}: use Go-style like 1m30s or a number of seconds")):
        units.parse_duration(value)


def test_duration_message():
    with pytest.raises(ValueError) as e:
        units.parse_duration("1x")
    assert str(e.value) == "invalid duration '1x': use Go-style like 1m30s or a number of seconds"


@pytest.mark.parametrize("value", [*NEGATIVE, -1, -0.001])
def test_duration_negative(value):
    with pytest.raises(ValueError, match="must not be negative"):
        units.parse_duration(value)


@pytest.mark.parametrize("value", [*OVERFLOW, float("inf"), 1e300])
def test_duration_overflow(value):
    with pytest.raises(ValueError, match="over Go's limit"):
        units.parse_duration(value)


@pytest.mark.parametrize(("value", "seconds"), [(0, 0.0), (90, 90.0), (1.5, 1.5), (units.MAX_DURATION_S, 2**63 / 1e9)])
def test_duration_numbers_are_seconds(value, seconds):
    assert units.parse_duration(value) == pytest.approx(seconds)
    assert units.parse_duration(value, bare_seconds=False) == pytest.approx(seconds)


def test_duration_nan_number():
    with pytest.raises(ValueError, match="use Go-style"):
        units.parse_duration(float("nan"))


def test_duration_pattern_is_the_grammar():
    """Every Go-style string the parser reads is one the CRD pattern accepts, and the reverse."""
    pattern = re.compile(units.DURATION_PATTERN)
    for text, _ in GO:
        assert pattern.match(text.strip())
    for text in INVALID + NEGATIVE + [t for t, _ in BARE if t.strip() != "0"]:
        assert not pattern.match(text.strip()), text


@pytest.mark.parametrize(("seconds", "text"), [(0, "0"), (30, "30s"), (90, "1m30s"), (3723, "1h2m3s"), (0.5, "500ms")])
def test_format_duration_roundtrips(seconds, text):
    assert units.format_duration(seconds) == text
    assert units.parse_duration(text, bare_seconds=False) == pytest.approx(seconds)


def test_env_face():
    assert parse_duration("X", "30") == 30.0
    assert parse_duration("X", "0.5") == 0.5
    assert parse_duration("X", "1m30s") == 90.0
    with pytest.raises(SettingsError) as e:
        parse_duration("PROXY_QUEUE_TIMEOUT", "1x")
    assert str(e.value) == ("PROXY_QUEUE_TIMEOUT: invalid duration '1x': use Go-style like 1m30s "
                            "or a number of seconds")


def test_env_settings_accept_both():
    from flexinfer.operator.config import load_settings
    from flexinfer.settings import load_proxy_settings

    s = load_proxy_settings({"PROXY_QUEUE_TIMEOUT": "1m30s", "PROXY_HEADER_TIMEOUT": "2.5",
                             "PROXY_CONNECT_TIMEOUT": "500ms"})
    assert (s.queue_timeout, s.http.header_timeout, s.upstream.connect_timeout) == (90.0, 2.5, 0.5)
    op = load_settings({"FLEXINFER_OPERATOR_RESYNC": "2m", "FLEXINFER_LORA_TIMEOUT": "45"})
    assert (op.resync_s, op.lora_timeout_s) == (120.0, 45.0)
    with pytest.raises(SettingsError, match="FLEXINFER_OPERATOR_RESYNC: invalid duration '-1s'"):
        load_settings({"FLEXINFER_OPERATOR_RESYNC": "-1s"})


def test_crd_face():
    assert spec_duration("1m30s") == 90.0
    assert spec_duration(30) == 30.0
    with pytest.raises(SpecError) as e:
        spec_duration("30", path="spec.gpu.swapCooldown")
    assert e.value.reason == "InvalidSpec"
    assert e.value.message == "spec.gpu.swapCooldown: invalid duration '30': use Go-style like 1m30s"


# ---- quantities ----------------------------------------------------------------------------------

QUANTITIES = [
    ("1Ki", 1024), ("16Gi", 16 * 2**30), ("0.5Gi", 2**29), ("512Mi", 2**29), ("1.5Gi", 3 * 2**29),
    ("100m", Decimal("0.1")), ("500m", Decimal("0.5")), ("1.5G", 1_500_000_000), ("5k", 5000),
    ("2e3", 2000), ("1e3", 1000), ("1E3", 1000), ("1e-3", Decimal("0.001")), ("1E", 10**18), ("2", 2),
    ("0", 0), (" 8Gi ", 8 * 2**30), ("+1", 1), ("-1", -1), ("1.", 1), (".5", Decimal("0.5")),
    ("10n", Decimal("1e-8")), ("3u", Decimal("3e-6")), ("7Ei", 7 * 2**60),
    (3, 3), (2.5, Decimal("2.5")), (0, 0),
]
BAD_QUANTITIES = ["", " ", "Gi", "50GB", "1KB", "1ki", "1gi", "1Gib", "1.2.3", "-", "1 Gi", "1e", "1e1.5",
                  "1e3Gi", "inf", "nan", "0x10", "1_000"]


@pytest.mark.parametrize(("text", "value"), QUANTITIES)
def test_quantity(text, value):
    assert units.parse_quantity(text) == value


@pytest.mark.parametrize("value", [*BAD_QUANTITIES, True, None, [1], float("inf"), float("nan")])
def test_quantity_invalid(value):
    with pytest.raises(ValueError, match=re.escape(
            f"invalid quantity {value!r}: use a Kubernetes quantity like 500m, 16Gi, 1.5G or 2e3")):
        units.parse_quantity(value)


@pytest.mark.parametrize("value", ["8Ei", "9223372036854775808", "1e19", "-1e19", "1e999999999",
                                   "1e9999999999999999999", "1" + "0" * 2000 + "Ki", 1e30])
def test_quantity_out_of_range(value):
    with pytest.raises(ValueError, match="out of range"):
        units.parse_quantity(value)


def test_quantity_limit_itself():
    assert units.parse_quantity("9223372036854775807") == 2**63 - 1


def test_quantity_pattern_is_the_grammar():
    pattern = re.compile(units.QUANTITY_PATTERN)
    for text, _ in QUANTITIES:
        if isinstance(text, str):
            assert pattern.match(text.strip()), text
    for text in BAD_QUANTITIES:
        if text != "1e1.5":  # the pattern lets a fractional exponent through; Kubernetes does not parse it
            assert not pattern.match(text.strip()), text


def test_quantity_faces():
    assert spec_quantity("50Gi") == 50 * 2**30
    with pytest.raises(SpecError) as e:
        spec_quantity("50GB", path="spec.cache.size")
    assert e.value.reason == "InvalidSpec" and e.value.message.startswith("spec.cache.size: invalid quantity '50GB'")
    assert [parse_vram_gi(v) for v in ("24Gi", "24576Mi", "24", "1.5Gi", "-1Gi", "lots", None)] == [
        24.0, 24.0, 24.0, 1.5, None, None, None]
    assert [parse_quantity_int(v) for v in ("2", 2, 2.0, "1e1", "2.5", "-1", "x", True, None)] == [
        2, 2, 2, 10, None, None, None, None, None]


# ---- the settings field helper -------------------------------------------------------------------

def test_setting_field():
    from dataclasses import dataclass, fields

    @dataclass(frozen=True)
    class S:
        a: float = setting(1.0, "A_TIMEOUT", "A timeout.")
        b: int = setting(2)

    fa, fb = fields(S)
    assert (fa.default, dict(fa.metadata)) == (1.0, {"env": "A_TIMEOUT", "doc": "A timeout."})
    assert (fb.default, dict(fb.metadata)) == (2, {"env": None, "doc": ""})
    assert from_env(S, {"A_TIMEOUT": "1m"}) == S(a=60.0, b=2)
