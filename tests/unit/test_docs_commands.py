"""The commands that README.md and docs/*.md tell a user to type still exist, as written.

* Every `cos ...` line of a shell block (```sh, ```console after `$ `, `$(cos ...)` inside a line) is parsed by
  the real `cos` parser (`commonos.cli.main.build_parser`) without being run: it must name a command that has
  a handler, and leave no argument unknown. A synopsis is read as its first form: `[--x V]` as `--x V`,
  `a|b` as `a`.
* Every inline `cos ...` span of the prose names an existing command, and each `--flag` in it is one of that
  command's options.
* Every `make <target>`, in a block or inline, names a target of the Makefile.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from collections.abc import Callable
from functools import cache
from typing import Any

import pytest

from commonos.cli.main import build_parser
from tests.unit.markdown_docs import ROOT, inline_code, pages, shell_lines

SEPARATORS = frozenset({"&&", "||", ";", "|", "&"})
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


#: A synopsis's placeholder (`P`, `ID`, `SEQ…`): taken as a value of any type, as the reader fills it in.
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*…?$")


def _placeholder_or(convert: Callable[[str], Any]) -> Callable[[str], Any]:
    def converted(text: str) -> Any:
        return text if PLACEHOLDER.match(text) else convert(text)

    return converted


@cache
def _parser() -> argparse.ArgumentParser:
    """`cos`'s parser with every command, each option's type letting a placeholder through."""
    parser = build_parser()
    pending = [parser]
    while pending:
        current = pending.pop()
        for action in current._actions:
            if callable(action.type):
                action.type = _placeholder_or(action.type)
        pending.extend(_subcommands(current).values())
    return parser


@cache
def make_targets() -> frozenset[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return frozenset(m.group(1) for m in re.finditer(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, re.MULTILINE))


def commands(line: str) -> list[list[str]]:
    """The simple commands of a shell line, each as argv, environment assignments before it left out."""
    found = [match.group(1) for match in re.finditer(r"\$\(([^()]*)\)", line)]
    outer = re.sub(r"\$\(([^()]*)\)", "SUBSTITUTION", line)
    try:
        tokens = shlex.split(outer, comments=True)
    except ValueError as exc:
        raise AssertionError(f"not a shell line ({exc}): {line}") from None
    argvs: list[list[str]] = [[]]
    for token in tokens:
        if token in SEPARATORS:
            argvs.append([])
        elif argvs[-1] or not _ASSIGNMENT.match(token):
            argvs[-1].append(token)
    for inner in found:
        argvs.extend(commands(inner))
    return [argv for argv in argvs if argv]


def _is_cos(word: str) -> bool:
    return word == "cos" or word.endswith("/cos")


def synopsis_form(args: list[str]) -> list[str]:
    """A synopsis's first form: brackets dropped, the first of `a|b` alternatives."""
    out = []
    for arg in args:
        form = arg.replace("[", "").replace("]", "").split("|")[0]
        if form:
            out.append(form)
    return out


def cos_problem(args: list[str]) -> str | None:
    """Why `cos <args>` would not parse, or None; nothing is run."""
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
            namespace, unknown = _parser().parse_known_args(args)
    except SystemExit:
        return errors.getvalue().strip() or "argparse exited"
    if unknown:
        return f"unknown arguments {unknown}"
    if not getattr(namespace, "handler", None):
        return "not a whole command (no handler)"
    return None


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def inline_problem(span: str) -> str | None:
    """Why an inline `cos ...` span does not name a command and its flags, or None."""
    words = [w for w in re.split(r"\s+", span.replace("[", " ").replace("]", " ")) if w][1:]
    parser, path = _parser(), ["cos"]
    while words and (choices := _subcommands(parser)):
        name = words[0].split("|")[0]
        if name.startswith("-") or name not in choices:
            break
        parser, path = choices[name], [*path, name]
        words = words[1:]
    if len(path) == 1:
        return f"no command {words[0] if words else ''!r}"
    options, below = dict(parser._option_string_actions), list(_subcommands(parser).values())
    while below:  # `cos import --dry-run`: an option of one of the commands under it
        options.update(below[-1]._option_string_actions)
        below.extend(_subcommands(below.pop()).values())
    for word in words:
        for flag in re.findall(r"(?:^|\|)(--?[A-Za-z][\w-]*)", word):
            if flag not in options:
                return f"`{' '.join(path)}` has no option {flag}"
    return None


def _block_lines() -> list[tuple[str, str]]:
    return [(f"{page.relative_to(ROOT)}:{number}", line) for page in pages() for number, line in shell_lines(page)]


def _inline_spans() -> list[tuple[str, str]]:
    return [(f"{page.relative_to(ROOT)}:{number}", span) for page in pages() for number, span in inline_code(page)]


def test_every_cos_line_of_a_shell_block_parses() -> None:
    checked, problems = 0, []
    for where, line in _block_lines():
        for argv in commands(line):
            if _is_cos(argv[0]):
                checked += 1
                if problem := cos_problem(synopsis_form(argv[1:])):
                    problems.append(f"{where}: {line}\n    {problem}")
    assert checked >= 10, "the pages' shell blocks were not found"
    assert problems == [], "\n".join(problems)


def test_every_inline_cos_command_exists() -> None:
    checked, problems = 0, []
    for where, span in _inline_spans():
        if re.match(r"(?:\S*/)?cos\s+[a-z]", span):
            checked += 1
            if problem := inline_problem(span):
                problems.append(f"{where}: `{span}`: {problem}")
    assert checked >= 50, "the pages' inline commands were not found"
    assert problems == [], "\n".join(problems)


def test_every_make_target_named_exists() -> None:
    named: list[tuple[str, str]] = []
    for where, line in _block_lines():
        named += [(where, argv[1]) for argv in commands(line) if argv[0] == "make" and len(argv) > 1]
    for where, span in _inline_spans():
        if match := re.match(r"make\s+([a-z][\w-]*)", span):
            named.append((where, match.group(1)))
    assert {"demo", "test"} <= {target for _, target in named}
    assert [f"{where}: make {target}" for where, target in named if target not in make_targets()] == []


@pytest.mark.parametrize(
    "line",
    [
        "cos report cost --no-such-flag",
        "cos no-such-command",
        "cos otlp token",
        "cos import claude --jobs many",
    ],
)
def test_a_broken_command_line_is_found(line: str) -> None:
    [argv] = commands(line)
    assert cos_problem(synopsis_form(argv[1:])) is not None


def test_a_synopsis_is_read_as_its_first_form() -> None:
    [argv] = commands("cos import claude [~/.claude] [--profile P] [--format table|json]   # a comment")
    assert synopsis_form(argv[1:]) == ["import", "claude", "~/.claude", "--profile", "P", "--format", "table"]
    assert cos_problem(synopsis_form(argv[1:])) is None
    assert [a[0] for a in commands('eval "$(cos env --user subscriber)" && FOO=1 make test')] == ["eval", "make", "cos"]


def test_an_inline_command_with_a_wrong_flag_or_name_is_found() -> None:
    assert inline_problem('cos chat --profile P [--session ID] "text"') is None
    assert inline_problem("cos dlq replay SEQ…|--all") is None
    assert inline_problem("cos chat --no-such-flag") == "`cos chat` has no option --no-such-flag"
    assert inline_problem("cos frobnicate") == "no command 'frobnicate'"
    assert inline_problem("cos import --dry-run") is None  # an option of `cos import claude` and `codex`
