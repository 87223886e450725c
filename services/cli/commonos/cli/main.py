"""Entry point of `cos`. Each service contributes its own sub-commands.

`cos <command> ...` imports only the module that registers `<command>` (so `cos import` does not load
NATS, asyncpg or the loop); `cos`, `cos --help` and an unknown command load them all.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from commonos.cli.args import CliError, Parser
from commonos.runtime.settings import ConfigError

#: Modules with a `register(subparsers)` function, in the order `cos --help` lists them.
COMMAND_MODULES = (
    "commonos.cli.up",
    "commonos.cli.demo",
    "commonos.loop.cli",
    "commonos.loop.profile_cli",
    "commonos.journal_writer.cli",
    "commonos.billing.cli",
    "commonos.importer.cli",
    "commonos.cli.schema",
    "commonos.cli.streams",
    "commonos.cli.security",
)

#: The top-level commands each module registers (tests/unit/test_cli.py checks this against `register`).
COMMANDS = {
    "up": "commonos.cli.up",
    "demo": "commonos.cli.demo",
    "chat": "commonos.loop.cli",
    "loop": "commonos.loop.cli",
    "approve": "commonos.loop.cli",
    "deny": "commonos.loop.cli",
    "profile": "commonos.loop.profile_cli",
    "journal-writer": "commonos.journal_writer.cli",
    "replay": "commonos.journal_writer.cli",
    "dlq": "commonos.journal_writer.cli",
    "billing": "commonos.billing.cli",
    "report": "commonos.billing.cli",
    "import": "commonos.importer.cli",
    "schema": "commonos.cli.schema",
    "streams": "commonos.cli.streams",
    "security": "commonos.cli.security",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The `cos` parser with every command, or with `command`'s alone when it is a known command."""
    parser = Parser(
        prog="cos",
        description="CommonOS events: an event-sourced backend for AI agents on NATS JetStream and PostgreSQL.",
        epilog="Configuration comes from COS_* environment variables (COS_NATS_URL, COS_DATABASE_URL, "
        "COS_DATA_DIR, ...); with no URLs, commands use the embedded system that `cos up` started.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name in (COMMANDS[command],) if command in COMMANDS else COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv[0] if argv else None)
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return int(args.handler(args) or 0)
    except (CliError, ConfigError) as exc:
        print("cos: error: " + " ".join(str(exc).splitlines()), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
