"""More bugs the fuzz targets found (after the first round of fixes), each kept as its smallest
failing example; all fixed now, so these are regressions like `test_regressions.py`.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest

from commonos.accounting.pricing import PriceFileError, parse_price_file
from commonos.billing.config import BillingConfigError, parse_billing_config
from commonos.cli.main import main
from commonos.importer.claude import claude_owner_session_file, read_claude_file
from commonos.importer.codex import read_codex_file
from commonos.importer.model import TranscriptError
from commonos.proto import graph as g

DEEP = b'{"a":' * 100_000 + b"1" + b"}" * 100_000


def test_deep_json_graph_raises_decode_error() -> None:
    with pytest.raises(msgspec.DecodeError):
        g.decode_graph(b'{"tool_uses": [' + DEEP + b"]}")


@pytest.mark.parametrize("vendor", ["claude", "codex"])
def test_deep_json_transcript_line_is_skipped_or_a_transcript_error(tmp_path: Path, vendor: str) -> None:
    good = b'{"type": "user", "uuid": "u1", "message": {"content": "hi"}}'
    path = tmp_path / ("s.jsonl" if vendor == "claude" else "rollout-x.jsonl")
    path.write_bytes(good + b"\n" + DEEP + b"\n")
    with pytest.raises(TranscriptError):
        if vendor == "claude":
            read_claude_file(path)
        else:
            read_codex_file(path)
        raise TranscriptError(path, "skipped, which is fine too")


@pytest.mark.parametrize("token", ["--no\rsuch", "--no\u2028such"], ids=["cr", "line-separator"])
def test_cli_error_with_a_line_break_is_one_line(token: str) -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_:
        main([token])
    assert exit_.value.code == 2
    assert len(err.getvalue().splitlines()) == 1, err.getvalue()


@pytest.mark.parametrize("uuid", [7, True], ids=["number", "boolean"])
def test_claude_non_string_line_uuid_keeps_the_graph_decodable(tmp_path: Path, uuid: object) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps({"type": "user", "uuid": uuid, "message": {"content": "hi"}}) + "\n")
    [imported] = read_claude_file(path)
    assert g.decode_graph(g.encode_graph(imported.graph)) == imported.graph


BILLING = (parse_billing_config, BillingConfigError)
PRICES = (parse_price_file, PriceFileError)


@pytest.mark.parametrize(
    ("parse", "error_type", "raw"),
    [
        (*BILLING, b'"a\\nb" = 1\n'),
        (*BILLING, b'[[budget]]\ntag = "a:b"\nlimit_usd = 1\n"x\\ry" = 1\n'),
        (*BILLING, b'[metrics]\n"\\u2028" = 1\n'),
        (*PRICES, b'"a\\nb" = 1\n'),
        (*PRICES, b'[[price]]\nmodel = "m"\ninput_mtok = 1\noutput_mtok = 1\n"x\\u0085y" = 1\n'),
    ],
    ids=["billing-top-level", "billing-budget", "billing-metrics", "prices-top-level", "prices-entry"],
)
def test_an_unknown_key_with_a_line_break_is_a_one_line_error(
    parse: Callable[..., object], error_type: type[Exception], raw: bytes
) -> None:
    with pytest.raises(error_type) as error:
        parse(raw, name="file.toml")
    assert len(str(error.value).splitlines()) == 1, str(error.value)
    assert "unknown" in str(error.value)


@pytest.mark.parametrize(
    "session_id", ["x" * 5000, "../elsewhere/s1", "a\x00b", ".."], ids=["too-long", "up", "nul", "dots"]
)
def test_an_agent_file_whose_session_id_is_not_a_file_name_has_no_owner(tmp_path: Path, session_id: str) -> None:
    projects = tmp_path / "projects"
    (projects / "-repo").mkdir(parents=True)
    (projects / "elsewhere").mkdir()
    line = {"type": "user", "uuid": "a-u0", "sessionId": session_id, "message": {"role": "user", "content": "hi"}}
    (projects / "elsewhere" / "s1.jsonl").write_text(json.dumps({**line, "sessionId": "s1"}) + "\n")
    agent = projects / "-repo" / "agent-a1.jsonl"
    agent.write_text(json.dumps(line) + "\n")
    # No owner: the agent file is read on its own, and nothing outside its project folder is read.
    assert claude_owner_session_file(agent) is None
    trees = read_claude_file(agent)
    assert trees and all(tree.source_files == (agent,) for tree in trees)
