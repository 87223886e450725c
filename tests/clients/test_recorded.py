"""The importer against ground truth: what the real CLIs wrote while the fake model answered them.

For every recorded scenario of every CLI version (`make clients`), the importer's dry run must count
every call the fake model answered exactly once, with exactly the tokens it reported, matched call by
call by the vendor id the server returned (Claude Code: the message id; Codex: the response id), and
no invocation the server did not answer. A call the CLI writes no line for (Claude Code's /compact
summary call, a reply cut off mid-stream) is no invocation; where the transcript states the vendor's own
totals (Claude Code's ``cost-state``), what those count beyond the invocations must be exactly the usage
of such calls. One test imports everything for real and checks the stored ``model_calls`` rows
against the same log.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from commonos.importer.claude import read_claude
from commonos.importer.codex import read_codex
from commonos.importer.model import ImportedSession
from commonos.importer.report import describe_tree
from commonos.proto.graph import ModelInvocation
from tests.clients.support import Recorded, recorded
from tests.importer.pipeline import import_and_compare

TOKENS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "cache_write_1h_tokens")

#: Scenarios a transcript cannot be counted exactly from, and why: (cli, scenario) -> reason. Each is an
#: xfail(strict=True), so a fix shows as an unexpected pass. None today.
XFAIL: dict[tuple[str, str], str] = {}


def read(item: Recorded) -> list[ImportedSession]:
    return list(read_claude(item.tree) if item.cli == "claude-code" else read_codex(item.tree))


def server_id(call: dict[str, Any]) -> str:
    return str(call.get("message_id") or call["response_id"])


def counted(call: dict[str, Any]) -> bool:
    """Whether the CLI could have written this call: a reply cut off mid-stream (the interrupted turn)
    never completed, and no CLI records the usage of a reply it did not receive."""
    return not call.get("stalled")


def response_id_at(tree: Path, ref: str) -> str | None:
    """The ``response_id`` of the Codex line a source reference (``<rollout file>:<line>``) points at."""
    name, _, number = ref.rpartition(":")
    if not number.isdigit():
        return None
    for path in tree.rglob(name):
        line = path.read_text().splitlines()[int(number) - 1]
        payload = json.loads(line).get("payload") or {}
        return payload.get("response_id") if isinstance(payload, dict) else None
    return None


def invocations_by_server_id(item: Recorded, imported: list[ImportedSession]) -> dict[str, list[ModelInvocation]]:
    """Each server id (Claude Code: the message id; Codex: the response id of the ``token_usage_record``
    line the invocation was read from) mapped to the invocations carrying it, each invocation once."""
    found: dict[str, dict[str, ModelInvocation]] = {}
    for session in imported:
        rows = {m.id: m for m in session.graph.model_invocations}
        for vendor in session.graph.vendor_ids:
            if vendor.our_id not in rows:
                continue
            value: str | None = vendor.vendor_id
            if vendor.vendor_id_kind == "token_usage_record":
                value = response_id_at(item.tree, vendor.vendor_id)
            if value:
                found.setdefault(value, {})[vendor.our_id] = rows[vendor.our_id]
    return {key: list(rows.values()) for key, rows in found.items()}


def tokens(row: ModelInvocation) -> dict[str, int]:
    return {k: int(getattr(row, k) or 0) for k in TOKENS}


def expected(call: dict[str, Any]) -> dict[str, int]:
    return {k: int(call["expected"].get(k) or 0) for k in TOKENS}


def cases() -> list[Any]:
    params = []
    for item in recorded():
        reason = XFAIL.get((item.cli, item.name))
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        params.append(pytest.param(item, id=item.id, marks=marks))
    return params


@pytest.mark.parametrize("item", cases())
def test_every_server_call_is_counted_once_with_its_tokens(item: Recorded) -> None:
    calls = item.calls()
    assert calls, f"{item.id}: the fake model answered no call"
    imported = read(item)
    by_id = invocations_by_server_id(item, imported)
    all_rows = [m for i in imported for m in i.graph.model_invocations]
    matched: set[str] = set()
    for call in calls:
        rows = {m.id: m for m in by_id.get(server_id(call), [])}
        if not counted(call):
            assert not rows, f"{item.id} call {call['call']}: a reply cut off mid-stream was counted"
            continue
        if not rows:
            continue  # a call the CLI wrote no line for: see the vendor's totals below
        assert len(rows) == 1, f"{item.id} call {call['call']} ({server_id(call)}) counted {len(rows)} times"
        row = next(iter(rows.values()))
        assert tokens(row) == expected(call), f"{item.id} call {call['call']} ({server_id(call)})"
        assert row.model == call["model"]
        matched.add(row.id)
    extra = [m for m in all_rows if m.id not in matched]
    assert extra == [], f"{item.id}: invocations the server never answered: {[tokens(m) for m in extra]}"
    unwritten = [c for c in calls if not by_id.get(server_id(c))]
    beyond = [describe_tree(i).usage_without_transcript_line for i in imported]
    if all(b is None for b in beyond):  # no vendor totals: only a call cut off mid-stream may be missing
        assert all(not counted(c) for c in unwritten), f"{item.id}: calls not in the transcript: {unwritten}"
        return
    kinds = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
    stated = {k: sum(getattr(b, k) for b in beyond if b is not None) for k in kinds}
    assert stated == {k: sum(int(c["expected"][k] or 0) for c in unwritten) for k in kinds}, item.id


def test_the_match_is_by_id_and_tokens() -> None:
    # The comparison above must be able to fail: a log line with other tokens does not match.
    item = next(r for r in recorded() if r.cli == "claude-code" and r.name == "plain")
    call = item.calls()[0]
    row = next(iter(invocations_by_server_id(item, read(item))[server_id(call)]))
    assert tokens(row) == expected(call)
    wrong = {**call, "expected": {**call["expected"], "output_tokens": call["expected"]["output_tokens"] + 1}}
    assert tokens(row) != expected(wrong)


# --- the whole pipeline ---------------------------------------------------------------------------


def exact_items() -> list[Recorded]:
    """The scenarios the dry run counts exactly (the xfail ones would fail the full import's comparison)."""
    return [r for r in recorded() if (r.cli, r.name) not in XFAIL]


def written(item: Recorded) -> list[dict[str, Any]]:
    """The calls the CLI wrote a line for: the model calls an import stores."""
    ids = invocations_by_server_id(item, read(item))
    return [c for c in item.calls() if counted(c) and ids.get(server_id(c))]


async def test_full_import_stores_each_server_call_once(nats_url: str, database_url: str) -> None:
    items = exact_items()
    sources: list[tuple[Path, str]] = [(item.tree, item.vendor) for item in items]
    await import_and_compare(sources, nats_url, database_url)
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT model, input_tokens, output_tokens, cache_read_tokens, cache_write_5m_tokens,"
            " cache_write_1h_tokens, reasoning_tokens FROM model_calls"
        )
    finally:
        await conn.close()
    stored = Counter(
        (
            r["model"],
            r["input_tokens"],
            r["output_tokens"],
            r["cache_read_tokens"],
            r["cache_write_5m_tokens"] + r["cache_write_1h_tokens"],
            r["cache_write_1h_tokens"],
        )
        for r in rows
    )
    # Every call's tokens are distinct (the server chooses them per scenario and call), so equal
    # multisets are a call-by-call match.
    logged = Counter((c["model"], *expected(c).values()) for item in items for c in written(item))
    assert len(logged) == sum(logged.values()), "the server's usage repeats: the match would be ambiguous"
    assert stored == logged
