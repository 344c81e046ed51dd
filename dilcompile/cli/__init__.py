"""The ``dilcompile`` command. Each subcommand lives in its own module with
``add_parser(subparsers)`` that sets ``func`` on its parser."""

from __future__ import annotations

import argparse
import sys

from . import dashboard, maxlen, profile, query, runs

SUBCOMMANDS = [profile, query, runs, maxlen, dashboard]


class _Parser(argparse.ArgumentParser):
    """Usage errors are one line (no usage dump), exit code 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dilcompile", description=__doc__.splitlines()[0])
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
