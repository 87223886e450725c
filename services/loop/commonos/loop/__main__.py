"""`python -m commonos.loop serve` (what `cos up` runs), and the loop's `cos` commands."""

from __future__ import annotations

import sys

from commonos.loop.cli import register, serve_command
from commonos.runtime.args import Parser, run_command


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m commonos.loop", description="CommonOS agent loop")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    serve = sub.add_parser("serve", help="answer chat requests on NATS until SIGTERM")
    serve.set_defaults(handler=serve_command)
    register(sub)
    return run_command(parser, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    raise SystemExit(main())
