"""``python -m commonos.importer <vendor> [PATH] [options]``: the same as ``cos import``."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from commonos.importer.cli import register
from commonos.runtime.args import CliError, Parser
from commonos.runtime.settings import ConfigError


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(prog="python -m commonos.importer")
    register(parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=Parser))
    args = parser.parse_args(["import", *(sys.argv[1:] if argv is None else argv)])
    try:
        return int(args.handler(args) or 0)
    except (CliError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
