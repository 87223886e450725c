"""argparse with one-line errors: a bad argument is a sentence, never a traceback or a usage dump."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from commonos.proto.errors import DataError


class CliError(DataError):
    """An error to print as one line and exit with status 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        one_line = " ".join(message.splitlines())
        sys.stderr.write(f"{self.prog}: error: {one_line} (see `{self.prog} --help`)\n")
        raise SystemExit(2)


def positive_int(text: str) -> int:
    """An argparse `type` for counts that must be 1 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value
