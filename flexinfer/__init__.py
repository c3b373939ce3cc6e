"""FlexInfer: one OpenAI-compatible endpoint in front of many models."""

__version__ = "0.1.0"
