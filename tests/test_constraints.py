"""constraints.txt: the versions `make venv` installs (what `make test` last passed with).

Checked here: every line is a plain ``name==version`` pin; every requirement the package names for
the test venv (the dependencies, the ``test``, ``kube`` and ``dev`` extras and the build system's)
has a pin that satisfies its lower bound; and this venv has the pinned versions of those
requirements (a venv built before the file changed is refreshed by ``make``: the stamp depends on it).
"""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][A-Za-z0-9.+!_-]*)$")
EXTRAS = ("test", "kube", "dev")


def pins(text: str) -> dict[str, Version]:
    """name -> pinned version; ValueError naming the line for anything but a pin or a comment."""
    out: dict[str, Version] = {}
    for no, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = PIN.match(line)
        if m is None:
            raise ValueError(f"constraints.txt:{no}: not a name==version pin: {line!r}")
        name = canonicalize_name(m.group(1))
        if name in out:
            raise ValueError(f"constraints.txt:{no}: {m.group(1)} is pinned twice")
        out[name] = Version(m.group(2))
    return out


def requirements() -> list[Requirement]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    named = list(meta["project"]["dependencies"]) + list(meta["build-system"]["requires"])
    for extra in EXTRAS:
        named += meta["project"]["optional-dependencies"][extra]
    return [Requirement(r) for r in named]


PINS = pins((ROOT / "constraints.txt").read_text())
REQUIREMENTS = requirements()


def test_pins_parse_and_refuse_other_lines() -> None:
    assert pins("# c\nfoo==1.2\nBar_baz==3.0.post1\n") == {"foo": Version("1.2"), "bar-baz": Version("3.0.post1")}
    for bad in ("foo>=1.2", "foo @ file:///tmp/foo.whl", "foo", "-e .", "foo==1.2\nFOO==1.3"):
        with pytest.raises(ValueError, match=r"constraints.txt:\d+"):
            pins(bad)


@pytest.mark.parametrize("req", REQUIREMENTS, ids=str)
def test_every_requirement_is_pinned_within_its_bounds(req: Requirement) -> None:
    name = canonicalize_name(req.name)
    assert name in PINS, f"{req.name} has no pin in constraints.txt (run `make constraints`)"
    assert req.specifier.contains(PINS[name], prereleases=True), \
        f"constraints.txt pins {req.name}=={PINS[name]}, outside pyproject.toml's {req.specifier}"


@pytest.mark.parametrize("req", REQUIREMENTS, ids=str)
def test_the_venv_has_the_pinned_version(req: Requirement) -> None:
    try:
        installed = Version(importlib.metadata.version(req.name))
    except importlib.metadata.PackageNotFoundError:
        pytest.fail(f"{req.name} is not installed in this venv (run `make venv`)")
    pinned = PINS.get(canonicalize_name(req.name))
    assert installed == pinned, f"{req.name} {installed} is installed, constraints.txt pins {pinned} (run `make venv`)"
