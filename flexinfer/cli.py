"""The ``flexinfer`` console script: one entry point, one subcommand per component.

Each subcommand lives in its own module, imported only when chosen, which exposes
``configure(parser: argparse.ArgumentParser) -> None`` and ``run(args: argparse.Namespace) -> int``.
This module owns only the dispatch; it must not import heavy dependencies (kopf, kubernetes).
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, help)
COMMANDS: dict[str, tuple[str, str]] = {
    "proxy": ("flexinfer.cmd.proxy", "run the OpenAI-compatible proxy (static or Kubernetes inventory)"),
    "serve": ("flexinfer.cmd.serve", "run the proxy and the local runtime in one process"),
    "operator": ("flexinfer.operator.main", "run the Kubernetes operator (kopf)"),
    "extender": ("flexinfer.scheduler.main", "run the kube-scheduler extender"),
    "agent": ("flexinfer.agent.main", "run the GPU node agent"),
    "bench": ("flexinfer.tps.command", "measure tokens/s of a model through any OpenAI endpoint"),
    "flash-load": ("flexinfer.flashloader.command", "copy model files into tmpfs in parallel"),
    "crds": ("flexinfer.api.generate", "write the CustomResourceDefinitions to crds/"),
}


def version() -> str:
    """``flexinfer 0.1.0 (speedups: c)``: the release and which speedups import (c, py or mixed)."""
    root = importlib.import_module("flexinfer")  # by name, like the commands (R4: cli imports nothing of ours)
    return f"flexinfer {root.__version__} (speedups: {root.__speedups__})"


class _Version(argparse.Action):
    """``--version``, computed only when asked (it imports the speedups)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: object) -> None:
        super().__init__(option_strings, dest=dest, nargs=0, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        print(version())
        parser.exit()


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flexinfer", description="FlexInfer: LLM inference platform.")
    parser.add_argument("--version", action=_Version)
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--log-format", default="text", choices=["text", "json"],
                        help="text lines, or one JSON object per line (time, level, logger, message); "
                             "both redact secrets and escape control characters (docs/logging.md)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    common = argparse.ArgumentParser(add_help=False)  # options also accepted after the subcommand
    common.add_argument("--log-level", default=argparse.SUPPRESS, choices=["debug", "info", "warning", "error"])
    chosen = next((a for a in argv if a in COMMANDS), None)
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, parents=[common])
        if name == chosen:  # import only the chosen component
            mod = importlib.import_module(module)
            mod.configure(p)
            p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    importlib.import_module("flexinfer.logs").configure(args.log_level, args.log_format)  # by name (R4)
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
