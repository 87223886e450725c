"""argparse with one-line errors: a bad argument is a sentence, never a traceback or a usage dump."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from commonos.proto.errors import ConfigError, DataError, OperationalError


class CliError(DataError):
    """An error to print as one line and exit with status 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        one_line = " ".join(message.splitlines())
        sys.stderr.write(f"{self.prog}: error: {one_line} (see `{self.prog} --help`)\n")
        raise SystemExit(2)


def command_group(
    sub: Any,
    name: str,
    help: str,
    description: str | None = None,
    *,
    metavar: str = "SUBCOMMAND",
    required: bool = True,
) -> Any:
    """`<name> <subcommand> ...`: a command of `sub` whose work is done by its subcommands; returns where to add
    them. Its `description` (a module's docstring, often) is shown as written; its subcommand is `args.<name>_command`
    and must be given unless `required` is False (the command alone then prints its help)."""
    group = sub.add_parser(
        name, help=help, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    if not required:
        group.set_defaults(handler=lambda _args: group.print_help() or 2)
    return group.add_subparsers(dest=f"{name}_command", metavar=metavar, required=required)


def positive_int(text: str) -> int:
    """An argparse `type` for counts that must be 1 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def run_command(parser: argparse.ArgumentParser, argv: Sequence[str], show: Callable[[str], str] = str) -> int:
    """Parse `argv` and run the chosen command's `handler`: its status (0 for None). No command: the help, 2. An
    error of the arguments, the files or the settings (`CliError`, `ConfigError`): one line, 2; a server that
    cannot be reached or started (`OperationalError`): one line, 1; Ctrl-C: 130. `show` makes the line safe to
    print (`cos` escapes markup in it)."""
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return int(args.handler(args) or 0)
    except (CliError, ConfigError, OperationalError) as exc:
        print(f"{parser.prog}: error: " + show(" ".join(str(exc).splitlines())), file=sys.stderr)
        return 1 if isinstance(exc, OperationalError) else 2
    except KeyboardInterrupt:
        return 130
