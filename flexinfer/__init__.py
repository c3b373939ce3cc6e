"""FlexInfer: one OpenAI-compatible endpoint in front of many models."""

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # Lazy, so importing flexinfer stays cheap: "c", "py" or "mixed" (see flexinfer._speedups).
    if name == "__speedups__":
        from flexinfer import _speedups

        return _speedups.IMPLEMENTATION
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
