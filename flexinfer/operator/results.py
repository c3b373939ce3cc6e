"""Small value types the pure rules return and the shells act on: ``Result`` and ``Event``.

Pure data; no client, no kopf.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Result:
    """What a reconcile tells its queue: when to look again, and whether the spec is unusable."""

    requeue_after: float | None = None
    permanent: str | None = None  # "Reason: message" of a spec that cannot work as written


@dataclass(frozen=True, slots=True)
class Event:
    """A Kubernetes Event to post about an object."""

    type: str  # Normal | Warning
    reason: str
    message: str
