"""Fuzz target of `cos` command lines.

Every argv is parsed by the real parser. A bad one must end in `SystemExit(2)` with a one-line
message on stderr, `--help` in `SystemExit(0)`; a good one yields the namespace its handler gets.
`main(argv)` itself runs only for argvs that never reach a handler (parse errors, help, no command):
handlers start services, read stdin or write files, which is not what this target is about.
"""

from __future__ import annotations

import argparse
import contextlib
import io
from typing import Final

import pytest
from hypothesis import event, given

from commonos.cli.main import build_parser, main
from tests.fuzz import strategies as fz

COMMANDS: Final = fz.commands(build_parser())


def run(call: object, argv: list[str]) -> tuple[object, str]:
    """The result or SystemExit of `call(argv)`, and what it wrote to stderr."""
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            result: object = call(argv)  # type: ignore[operator]
        except SystemExit as exc:
            result = exc
    return result, err.getvalue()


@given(fz.argv_lists(COMMANDS))
def test_cos_argv_parses_or_exits_with_a_one_line_error(argv: list[str]) -> None:
    parsed, err = run(build_parser().parse_args, argv)
    if isinstance(parsed, SystemExit):
        assert parsed.code in (0, 2)
        if parsed.code == 2:
            assert err.endswith("\n") and len(err.splitlines()) == 1, f"not one line: {err!r}"
            assert err.startswith("cos") and ": error: " in err
            event("usage error")
        else:
            event("help")
        again, again_err = run(main, argv)
        assert isinstance(again, SystemExit) and again.code == parsed.code and again_err == err
        return
    assert isinstance(parsed, argparse.Namespace)
    if getattr(parsed, "handler", None) is None:
        event("no command")
        assert run(main, argv)[0] == 2
        return
    event(f"parsed: {parsed.command}")


@pytest.mark.parametrize("argv", [[], ["--help"], ["no-such-command"], ["billing"], ["report", "cost", "--since"]])
def test_cos_fixed_argvs(argv: list[str]) -> None:
    result, _ = run(main, argv)
    code = result.code if isinstance(result, SystemExit) else result
    assert code in (0, 2)
