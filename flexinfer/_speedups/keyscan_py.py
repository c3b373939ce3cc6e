"""The raw scan of a JSON request body for its ``model`` key: the reference twin of keyscan_c.

Owns: :func:`model_key_scan`, which returns how often the literal token ``"model"`` occurs, where
it first occurs, and whether ``\\u006`` occurs (the prefix of every ``\\u`` escape of the letters
m, o, d, e, l). The proxy reads these to decide, without a second JSON parser, that a body cannot
carry two ``model`` keys, and where to splice a new model name in. Must not: parse JSON or import
anything of ours.
"""

from __future__ import annotations

_MODEL_KEY = b'"model"'
_ESCAPED_LETTER = b"\\u006"


def model_key_scan(body: bytes) -> tuple[int, int, bool]:
    """(occurrences of ``"model"``, offset of the first or -1, whether ``\\u006`` occurs) in ``body``."""
    return body.count(_MODEL_KEY), body.find(_MODEL_KEY), _ESCAPED_LETTER in body
