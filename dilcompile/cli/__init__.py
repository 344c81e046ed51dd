"""The ``dilcompile`` command. Each subcommand lives in its own module with
``add_parser(subparsers)`` that sets ``func`` on its parser."""

from __future__ import annotations

import argparse
import sys

from . import demo

SUBCOMMANDS = [demo]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dilcompile", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for module in SUBCOMMANDS:
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
