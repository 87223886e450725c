"""`python -m commonos.loop serve` (what `cos up` runs), and the loop's `cos` commands."""

from __future__ import annotations

import sys

from commonos.loop.cli import register, serve_command
from commonos.runtime.args import CliError, Parser
from commonos.runtime.settings import ConfigError


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m commonos.loop", description="CommonOS agent loop")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    serve = sub.add_parser("serve", help="answer chat requests on NATS until SIGTERM")
    serve.set_defaults(handler=serve_command)
    register(sub)
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return int(args.handler(args) or 0)
    except (CliError, ConfigError) as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
