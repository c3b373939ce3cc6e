"""FlexInfer: one OpenAI-compatible endpoint in front of many models."""

from flexinfer import _compiled

__version__ = "0.1.0"

_compiled.install()  # before any module of the compiled request path is imported


def __getattr__(name: str) -> object:
    # Lazy, so importing flexinfer stays cheap: "c", "py" or "mixed" over the compiled primitives
    # (flexinfer._speedups) and the request path compiled from its own source (flexinfer._compiled).
    if name == "__speedups__":
        from flexinfer import _speedups

        kinds = {_speedups.IMPLEMENTATION, *_compiled.implementation().values()}
        return kinds.pop() if len(kinds) == 1 else "mixed"
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
