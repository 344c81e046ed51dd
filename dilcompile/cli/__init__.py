"""The ``dilcompile`` command: ``build_parser`` assembles one subcommand per
module (``add_parser(subparsers)`` sets ``func`` on its parser); ``DESCRIPTION``
and ``EXAMPLES`` are what ``dilcompile --help`` shows."""

from __future__ import annotations

import argparse
import sys

from . import dashboard, maxlen, profile, query, runs

SUBCOMMANDS = [profile, query, runs, maxlen, dashboard]

DESCRIPTION = """\
Measure exact long-context attention (dense SDPA, LongNet dilated, block-sparse)
on this machine and look at the results. Every measurement (latency, memory,
compile cost, useful FLOP/s and η against dense attention, the environment)
becomes a row of a DuckDB run store (default runs/dilcompile.duckdb)."""

EXAMPLES = """\
examples:
  dilcompile profile --sweep quick          # the standard short sweep on this device
  dilcompile profile --variant sdpa --variant dilated --seq-len 8192 --segments 1024 2048 --rates 1 2
  dilcompile query "SELECT variant, seq_len, latency_ms, efficiency FROM runs"
  dilcompile dashboard                      # http://127.0.0.1:8501

'dilcompile COMMAND --help' gives each command's flags. The attention itself is
the Python API of the dilcompile package (LongNet: https://arxiv.org/abs/2307.02486)."""


class _Parser(argparse.ArgumentParser):
    """Usage errors are one line (no usage dump), exit code 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


class _Help(argparse.RawDescriptionHelpFormatter):
    """Description and examples as written; every command's help in one column
    (argparse sizes that column before it indents the commands, so the longest
    name, "dashboard", would wrap)."""

    def __init__(self, prog):
        super().__init__(prog)
        self._action_max_length = 2 + 4 + max(len(m.__name__.rpartition(".")[2]) for m in SUBCOMMANDS)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dilcompile", description=DESCRIPTION, epilog=EXAMPLES,
                     formatter_class=_Help)
    sub = parser.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")
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
