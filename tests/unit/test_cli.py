"""`cos`: --help lists the commands; every bad argument is one line on stderr and exit status 2."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from commonos.cli.main import build_parser, command_modules, commands, main
from commonos.proto.errors import ConfigError, OperationalError
from commonos.runtime.args import CliError, Parser, run_command

COMMANDS = (
    "up",
    "demo",
    "chat",
    "loop",
    "approve",
    "deny",
    "profile",
    "journal-writer",
    "replay",
    "dlq",
    "billing",
    "report",
    "import",
    "schema",
    "streams",
    "security",
    "retention",
    "env",
    "status",
    "otlp",
    "console",
)


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for command in COMMANDS:
        assert f"    {command}" in out, command
    # and nothing is listed that does not exist
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert set(sub.choices) == set(COMMANDS)  # type: ignore[arg-type]


def test_each_command_is_found_in_the_module_that_registers_it() -> None:
    """`cos <command>` loads one module; the map it uses must say what the modules really register."""
    registered = {}
    for name in command_modules():
        parser = Parser(prog="cos")
        sub = parser.add_subparsers(dest="command", parser_class=Parser)
        importlib.import_module(name).register(sub)
        registered.update(dict.fromkeys(sub.choices, name))
    assert registered == commands()
    for command in COMMANDS:
        only = next(a for a in build_parser(command)._actions if isinstance(a, argparse._SubParsersAction))
        assert command in only.choices


LOADED_BY = """
import sys
from commonos.cli.main import main
try:
    main(["import", "claude", "--help"])
except SystemExit:
    pass
print(sorted(m for m in sys.modules if m.partition(".")[0] in ("nats", "asyncpg") or m.startswith("commonos.loop")))
"""


def test_cos_import_loads_neither_nats_nor_the_loop() -> None:
    done = subprocess.run([sys.executable, "-c", LOADED_BY], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout[-2000:]


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["bogus"], "invalid choice"),
        (["up", "--nope"], "unrecognized arguments"),
        (["report", "cost", "--group-by", "tag:"], "tag key"),
        (["report", "cost", "--since", "yesterdayish"], "is not a date"),
        (["report", "cost", "--format", "xml"], "invalid choice"),
        (["chat", "--tag", "Bad:x", "hi"], "upper case in the key"),
        (["approve", "not-a-uuid"], "is not a UUID"),
        (["replay", "--batch-size", "x"], "invalid int"),
        (["billing", "reprice"], "--since"),
        (["dlq", "replay"], "--all"),
        (["import", "claude", "/nonexistent/transcripts"], "not found: no Claude Code transcripts to import there"),
        (["import", "mystery"], "invalid choice"),
    ],
)
def test_bad_arguments_are_one_line(
    argv: list[str],
    fragment: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("COS_DATA_DIR", str(tmp_path))
    for name in ("COS_NATS_URL", "COS_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code  # type: ignore[assignment]
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("cos"), err
    assert fragment in err
    assert "Traceback" not in err


def test_bad_configuration_is_one_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COS_NATS_URL", "http://not-nats")
    assert main(["dlq", "list"]) == 2
    err = capsys.readouterr().err
    assert err == "cos: error: COS_NATS_URL='http://not-nats' is not a URL of the form nats://host:port\n"


@pytest.mark.parametrize(
    ("raised", "status", "said"),
    [
        (None, 0, ""),
        (CliError("no such thing\nat all"), 2, "prog: error: no such thing at all\n"),
        (ConfigError("COS_X is not a number"), 2, "prog: error: COS_X is not a number\n"),
        (OperationalError("nats://x:1 did not answer"), 1, "prog: error: nats://x:1 did not answer\n"),
        (KeyboardInterrupt(), 130, ""),
    ],
)
def test_every_entry_point_runs_its_command_one_way(
    raised: BaseException | None, status: int, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`cos`, `python -m commonos.loop` and `python -m commonos.importer` run their commands with
    `run_command`: the same statuses and one-line errors."""

    def handler(args: argparse.Namespace) -> None:
        if raised is not None:
            raise raised

    parser = Parser(prog="prog")
    parser.add_subparsers(dest="command", parser_class=Parser).add_parser("go").set_defaults(handler=handler)
    assert run_command(parser, ["go"]) == status
    assert capsys.readouterr().err == said
    assert run_command(parser, []) == 2
    assert "usage: prog" in capsys.readouterr().out


def every_parser(parser: argparse.ArgumentParser, path: str = "cos") -> list[tuple[str, argparse.ArgumentParser]]:
    """`parser` and every subcommand's parser under it, each with its command line (`cos console user add`)."""
    found = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found += every_parser(child, f"{path} {name}")
    return found


def summaries(parser: argparse.ArgumentParser, path: str = "cos") -> list[tuple[str, str]]:
    """Every subcommand's one-line summary, as `cos ... --help` lists it."""
    found: list[tuple[str, str]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                found.append((f"{path} {choice.dest}", choice.help or ""))
            for name, child in action.choices.items():
                found += summaries(child, f"{path} {name}")
    return found


#: Words a summary never ends with: one that does stops mid-sentence ("a conversation without"). Not "in" or
#: "on", which end a phrase too ("who may sign in").
DANGLING = frozenset(
    [
        "a",
        "an",
        "the",
        "of",
        "to",
        "with",
        "without",
        "and",
        "or",
        "but",
        "for",
        "from",
        "into",
        "onto",
        "by",
        "at",
        "as",
        "than",
        "its",
        "their",
        "his",
        "her",
        "your",
        "whose",
        "which",
        "that",
        "when",
        "while",
        "if",
        "unless",
        "then",
        "via",
        "per",
    ]
)


def test_no_summary_stops_mid_sentence() -> None:
    listed = summaries(build_parser())
    assert len(listed) > len(COMMANDS)  # the subcommands' too
    for command, summary in listed:
        assert summary.strip(), f"{command}: no summary"
        last = summary.rstrip(" .").split()[-1].strip("\"'`()").lower()
        assert last not in DANGLING, f"{command}: {summary!r} stops mid-sentence"
        assert summary.count("(") == summary.count(")"), f"{command}: {summary!r}"
        assert summary.count("`") % 2 == 0 and summary.count('"') % 2 == 0, f"{command}: {summary!r}"


def test_help_is_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    """Every `cos ... --help` as printed: no reStructuredText markup (``literal``, :role:`x`) shows."""
    for command, parser in every_parser(build_parser()):
        text = parser.format_help()
        assert "``" not in text, f"{command} --help:\n{text}"
        assert ":mod:`" not in text and ":func:`" not in text, f"{command} --help:\n{text}"
    with pytest.raises(SystemExit):
        main(["console", "--help"])
    out = capsys.readouterr().out
    assert "cos console serve" in out and "``" not in out
