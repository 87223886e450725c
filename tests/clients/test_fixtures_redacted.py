"""The recorded fixtures hold no text the CLIs authored: only our scenario texts and placeholders.

Every string longer than `LONG` must be one of our scenario texts (prompts, fake replies, tool inputs
and outputs) or the placeholder, and no string may hold a phrase of the CLIs' own prompts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clients.redact import FAKE_CWD, LONG, PLACEHOLDER, VENDOR_PHRASES, redact_jsonl, redact_value, unredacted
from clients.scenarios import our_texts
from tests.clients.support import fixture_files, recorded

OURS = our_texts(FAKE_CWD)


def records(path: Path) -> list[object]:
    text = path.read_text()
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return [json.loads(text)]


def test_fixtures_are_present() -> None:
    # The exactness tests below run over these; an empty folder would make them vacuous.
    assert {r.cli for r in recorded()} == {"claude-code", "codex"}
    assert fixture_files()


@pytest.mark.parametrize("path", fixture_files(), ids=lambda p: str(p.relative_to(p.parents[3])))
def test_fixture_holds_no_vendor_text(path: Path) -> None:
    for number, record in enumerate(records(path), 1):
        leftover = unredacted(record, OURS)
        assert leftover == [], f"{path.name}:{number} keeps text the CLI wrote: {leftover[0][:120]!r}"


def test_paths_are_normalized() -> None:
    for path in fixture_files():
        assert "/tmp/" not in path.read_text(), path
        assert "cos-clients-" not in str(path), path


# --- the check itself can fail --------------------------------------------------------------------

VENDOR_LINE = {
    "type": "api-request-shape",
    "shape": {"system": [{"type": "text", "text": "You are Claude Code, " + "a helpful assistant. " * 8}]},
}


def test_the_check_catches_an_unredacted_line() -> None:
    leftover = unredacted(VENDOR_LINE, OURS)
    assert len(leftover) == 1 and leftover[0].startswith("You are Claude Code")
    # A short line holding a known phrase is caught too, though it is under the length limit.
    assert unredacted({"text": "You are Codex."}, OURS) == ["You are Codex."]
    assert any(phrase in VENDOR_LINE["shape"]["system"][0]["text"] for phrase in VENDOR_PHRASES)


def test_redaction_replaces_vendor_text_and_keeps_ours_and_the_structure() -> None:
    prompt = next(t for t in OURS if t.startswith("Scenario plain"))
    line = {
        "type": "user",
        "n": 7,
        "ok": True,
        "id": "msg_0123",
        "message": {"content": [prompt, "x" * (LONG + 1), "You are a coding agent running in a terminal."]},
    }
    redacted = redact_value(line, OURS)
    assert redacted == {
        "type": "user",
        "n": 7,
        "ok": True,
        "id": "msg_0123",
        "message": {"content": [prompt, PLACEHOLDER, PLACEHOLDER]},
    }
    assert unredacted(redacted, OURS) == []
    text = json.dumps(VENDOR_LINE) + "\n" + json.dumps({"cwd": "/tmp/x/home/project"}) + "\n"
    out = redact_jsonl(text, OURS, [("/tmp/x/home/project", FAKE_CWD)])
    assert [json.loads(x) for x in out.splitlines()] == [
        {"type": "api-request-shape", "shape": {"system": [{"type": "text", "text": PLACEHOLDER}]}},
        {"cwd": FAKE_CWD},
    ]
