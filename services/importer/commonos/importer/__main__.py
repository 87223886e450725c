"""``python -m commonos.importer <vendor> [PATH] [options]``: the same as ``cos import``."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from commonos.importer.cli import register
from commonos.runtime.args import Parser, run_command


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(prog="python -m commonos.importer")
    register(parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=Parser))
    return run_command(parser, ["import", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
