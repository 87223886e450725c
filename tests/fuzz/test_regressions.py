"""Bugs the fuzz targets found, each kept as its smallest failing example, now fixed: regressions.

The fuzz strategies generate all of these inputs again; later findings are in `test_regressions_second_round.py`.
"""

from __future__ import annotations

import contextlib
import decimal
import io
import json
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import asyncpg
import nats
import pytest
from nats.aio.msg import Msg

from commonos.accounting.pricing import PriceFileError, Pricer, parse_price_file
from commonos.accounting.usage import TokenUsage
from commonos.billing.config import BillingConfigError, parse_billing_config
from commonos.cli.main import main
from commonos.importer.claude import read_claude_file
from commonos.importer.codex import read_codex_file
from commonos.importer.model import TranscriptError
from commonos.loop.profiles import ProfileError, load_profiles
from commonos.proto import events as ev
from commonos.proto import graph as g
from commonos.proto.cloudevents import event_headers
from commonos.proto.subjects import subject_for
from commonos.runtime.dlq import dead_letter, list_dead_letters
from commonos.runtime.nats import ensure_streams
from commonos.runtime.settings import ConfigError, Settings
from tests.support import journal_writer, position

SESSION = uuid.UUID("0199a6f0-0000-7000-8000-000000000001")
DEEP = 100_000
#: The last hour Python can hold, five hours west of UTC: in UTC it is past year 9999.
LATEST_MINUS_5 = datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-5)))


def deep_object(depth: int = DEEP) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


def deep_toml(depth: int = 1000) -> bytes:
    return b"x = " + b"[" * depth + b"]" * depth + b"\n"


# --- proto -------------------------------------------------------------------------------------------------


def test_deep_json_event_payload_raises_event_decode_error() -> None:
    payload = b'{"type":"transcript_imported","profile_id":"p","session_id":"%s","vendor":"v","graph":%s}' % (
        str(SESSION).encode(),
        deep_object(),
    )
    with pytest.raises(ev.EventDecodeError):
        ev.decode_event(payload)


@pytest.mark.parametrize("field", ["tags", "profile_id"])
def test_decoded_event_rejects_a_trailing_newline_in_tags_and_profile_id(field: str) -> None:
    doc: dict[str, object] = {"type": "session_created", "profile_id": "p", "session_id": str(SESSION), "source": "cli"}
    doc[field] = ["a:b\n"] if field == "tags" else "p\n"
    with pytest.raises(ev.EventDecodeError):
        ev.decode_event(json.dumps(doc).encode())


# --- writer (real servers) ---------------------------------------------------------------------------------


async def publish_raw(nats_url: str, items: list[tuple[str, bytes, dict[str, str] | None]]) -> int:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        last = 0
        for subject, data, headers in items:
            last = (await js.publish(subject, data, headers=headers)).seq
        return last
    finally:
        await nc.close()


def as_item(event: ev.Event) -> tuple[str, bytes, dict[str, str] | None]:
    return subject_for(event), ev.encode_event(event), event_headers(event)


async def writer_outcome(nats_url: str, dsn: str, last: int, timeout_s: float = 15.0) -> tuple[int, list[str]]:
    """Run the writer until it reaches `last` (or `timeout_s` passes); its position and dead letters."""
    import asyncio

    async with journal_writer(nats_url, dsn) as writer:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        at = 0
        while loop.time() < deadline and at < last and writer.task is not None and not writer.task.done():
            at = await position(dsn, "journal-writer")
            await asyncio.sleep(0.05)
        assert writer.task is not None and not writer.task.done(), "the writer died"
    nc = await nats.connect(nats_url)
    try:
        reasons = [d.reason for d in await list_dead_letters(nc.jetstream())]
    finally:
        await nc.close()
    return at, reasons


@pytest.mark.slow
async def test_deep_json_delivery_is_dead_lettered_and_the_writer_lives(nats_url: str, database_url: str) -> None:
    payload = b'{"type":"session_created","profile_id":"p","session_id":"%s","source":"cli","zzz":%s}' % (
        str(SESSION).encode(),
        deep_object(50_000),
    )
    last = await publish_raw(nats_url, [(f"cos.events.p.{SESSION}.session_created", payload, None)])
    at, reasons = await writer_outcome(nats_url, database_url, last)
    assert at == last and len(reasons) == 1


@pytest.mark.slow
async def test_a_time_that_overflows_utc_is_dead_lettered_and_the_writer_lives(
    nats_url: str, database_url: str
) -> None:
    created = ev.SessionCreated(profile_id="p", session_id=SESSION, source="cli", occurred_at=LATEST_MINUS_5)
    last = await publish_raw(nats_url, [as_item(created)])
    at, reasons = await writer_outcome(nats_url, database_url, last)
    assert at == last and len(reasons) == 1


@pytest.mark.slow
async def test_a_rejected_session_leaves_no_profile_row(nats_url: str, database_url: str) -> None:
    # U+0000 in its source used to be the rejection; it is stored escaped now (␀): a time PostgreSQL cannot
    # hold in UTC is refused by PostgreSQL as well, with the profile row in the same transaction.
    rejected = ev.SessionCreated(profile_id="orphan", session_id=SESSION, source="cli", occurred_at=LATEST_MINUS_5)
    last = await publish_raw(nats_url, [as_item(rejected)])
    at, reasons = await writer_outcome(nats_url, database_url, last)
    assert at == last and len(reasons) == 1 and reasons[0].startswith("rejected by PostgreSQL")
    conn = await asyncpg.connect(database_url)
    try:
        assert await conn.fetch("SELECT id FROM profiles") == []
    finally:
        await conn.close()


@pytest.mark.slow
async def test_an_empty_delivery_with_a_status_header_is_dead_lettered(nats_url: str, database_url: str) -> None:
    good = ev.ProfileUpserted(profile_id="p")
    last = await publish_raw(
        nats_url, [(f"cos.events.p.{SESSION}.session_created", b"", {"Status": "100"}), as_item(good)]
    )
    at, reasons = await writer_outcome(nats_url, database_url, last)
    assert at == last
    assert [r.split(":")[0] for r in reasons] == ["undecodable event"]


@pytest.mark.slow
async def test_a_non_ascii_dead_letter_reason_reads_back_as_text(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        msg = Msg(_client=nc, subject=f"cos.events.p.{SESSION}.session_created", data=b"{}")
        await dead_letter(js, msg, "undecodable event: Invalid value 'é' - at `$.type`", "journal-writer", 1)
        [letter] = await list_dead_letters(js)
    finally:
        await nc.close()
    assert isinstance(letter.reason, str)
    assert letter.reason == "undecodable event: Invalid value 'é' - at `$.type`"


# --- operator files ----------------------------------------------------------------------------------------


def test_deep_toml_profile_config_raises_profile_error(tmp_path: Path) -> None:
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "config.toml").write_bytes(deep_toml())
    with pytest.raises(ProfileError):
        load_profiles(tmp_path)


def test_deep_toml_price_file_raises_price_file_error() -> None:
    with pytest.raises(PriceFileError):
        parse_price_file(deep_toml(), name="prices.toml")


def test_deep_toml_billing_config_raises_billing_config_error() -> None:
    with pytest.raises(BillingConfigError):
        parse_billing_config(deep_toml(), name="billing.toml")


@pytest.mark.parametrize(
    ("prompt_file", "content"), [(r"p\u0000.md", b"hi"), ("prompt.md", b"caf\xe9")], ids=["nul-in-name", "not-utf8"]
)
def test_profile_prompt_file_problems_raise_profile_error(tmp_path: Path, prompt_file: str, content: bytes) -> None:
    folder = tmp_path / "p"
    folder.mkdir()
    (folder / "config.toml").write_text(f'system_prompt_file = "{prompt_file}"\n')
    (folder / "prompt.md").write_bytes(content)
    with pytest.raises(ProfileError):
        load_profiles(tmp_path)


def test_huge_override_price_raises_price_file_error() -> None:
    raw = b'[[price]]\nprovider = "anthropic"\nmodel = "m"\ninput_mtok = "9e999999"\noutput_mtok = 1\n'
    raw += b"cache_write_5m_mtok = 1\n"
    with pytest.raises(PriceFileError):
        parse_price_file(raw, name="prices.toml")


def test_an_absurd_override_price_is_refused_and_the_largest_accepted_one_prices() -> None:
    with pytest.raises(PriceFileError, match="beyond any real price"):
        parse_price_file(b'[[price]]\nmodel = "m"\ninput_mtok = "1e47"\noutput_mtok = 1\n', name="p.toml")
    price_file = parse_price_file(b'[[price]]\nmodel = "m"\ninput_mtok = "1000000"\noutput_mtok = 1\n', name="p.toml")
    usage = TokenUsage(input_tokens=10**12, output_tokens=10)
    result = Pricer(price_file).price("anthropic", "m", usage, datetime(2026, 1, 1, tzinfo=UTC))
    assert result.cost_usd == decimal.Decimal("1000000000000.0000100000")


# --- settings and command lines ----------------------------------------------------------------------------


def test_settings_bad_ipv6_url_raises_config_error() -> None:
    with pytest.raises(ConfigError):
        Settings.from_env({"COS_NATS_URL": "nats://[::1"})


def test_settings_unknown_home_raises_config_error() -> None:
    with pytest.raises(ConfigError):
        Settings.from_env({"COS_DATA_DIR": "~no-such-user-cos/x"})


def test_settings_password_file_not_utf8_raises_config_error(tmp_path: Path) -> None:
    (tmp_path / "pw").write_bytes(b"caf\xe9")
    with pytest.raises(ConfigError):
        Settings.from_env({"COS_NATS_PASSWORD_FILE": str(tmp_path / "pw")})


def run_cos(argv: list[str]) -> tuple[object, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            result: object = main(argv)
        except SystemExit as exc:
            result = exc.code
    return result, err.getvalue()


def test_cli_error_with_a_newline_is_one_line() -> None:
    code, err = run_cos(["--no\nsuch-option"])
    assert code == 2 and err.count("\n") == 1


@pytest.mark.parametrize("span", ["99999999999d", "1000000d"])
def test_cli_huge_relative_span_is_a_usage_error(span: str) -> None:
    code, err = run_cos(["report", "cost", "--since", span])
    assert code == 2 and err.count("\n") == 1


# --- importers ---------------------------------------------------------------------------------------------


def write_lines(path: Path, records: Sequence[Mapping[str, object]]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path


def test_mixed_naive_and_aware_timestamps_claude(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "s.jsonl",
        [
            {"type": "user", "uuid": "u1", "timestamp": "2026-01-01T10:00:00", "message": {"content": "hi"}},
            {"type": "assistant", "uuid": "u2", "timestamp": "2026-01-01T10:00:01Z", "message": {"id": "m"}},
        ],
    )
    (read,) = read_claude_file(path)
    g.validate(read.graph)
    (session,) = read.graph.sessions
    # The naive time is taken as UTC, so both ends are comparable and in order.
    assert session.started_at == datetime(2026, 1, 1, 10, 0, tzinfo=UTC)
    assert session.ended_at == datetime(2026, 1, 1, 10, 0, 1, tzinfo=UTC)
    assert read.graph.user_inputs[0].triggered_at == session.started_at


def test_mixed_naive_and_aware_timestamps_codex(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "rollout-x.jsonl",
        [
            {"type": "event_msg", "timestamp": "2026-01-01T10:00:00", "payload": {"type": "user_message"}},
            {
                "type": "event_msg",
                "timestamp": "2026-01-01T10:00:01Z",
                "payload": {"type": "token_count", "info": {"last_token_usage": {"input_tokens": 1}}},
            },
        ],
    )
    read = read_codex_file(path)
    assert read is not None
    g.validate(read.graph)
    (session,) = read.graph.sessions
    assert session.started_at == datetime(2026, 1, 1, 10, 0, tzinfo=UTC)
    assert session.ended_at == datetime(2026, 1, 1, 10, 0, 1, tzinfo=UTC)
    (call,) = read.graph.model_invocations
    assert call.input_tokens == 1 and call.started_at == session.ended_at


@pytest.mark.parametrize(
    "record",
    [
        {"type": "user", "uuid": {"a": 1}, "message": {"content": "hi"}},
        {"type": "assistant", "message": {"id": "m", "content": [{"type": "tool_use", "id": "t", "name": ["Task"]}]}},
    ],
    ids=["uuid-object", "tool-name-list"],
)
def test_claude_unhashable_vendor_values_are_skipped_or_a_transcript_error(
    tmp_path: Path, record: Mapping[str, object]
) -> None:
    try:
        read = read_claude_file(write_lines(tmp_path / "s.jsonl", [record]))
    except TranscriptError as exc:
        assert "s.jsonl" in str(exc)
    else:
        for imported in read:  # skipped: whatever was read still makes a valid, decodable graph
            assert g.decode_graph(g.encode_graph(imported.graph)) == imported.graph


def test_codex_unhashable_type_is_a_transcript_error(tmp_path: Path) -> None:
    with pytest.raises(TranscriptError, match=r"rollout-x\.jsonl"):
        read_codex_file(write_lines(tmp_path / "rollout-x.jsonl", [{"type": "response_item", "payload": {"type": []}}]))


def test_claude_hunk_not_a_number_is_skipped_or_a_transcript_error(tmp_path: Path) -> None:
    tool_use = {"type": "tool_use", "id": "t", "name": "Edit", "input": {"file_path": "a.py"}}
    result = {"type": "tool_result", "tool_use_id": "t", "content": "ok"}
    path = write_lines(
        tmp_path / "s.jsonl",
        [
            {"type": "assistant", "message": {"id": "m", "content": [tool_use]}},
            {
                "type": "user",
                "toolUseResult": {"structuredPatch": [{"oldStart": "x"}]},
                "message": {"content": [result]},
            },
        ],
    )
    try:
        read = read_claude_file(path)
    except TranscriptError as exc:
        # Refused: in one line that names the file, never a bare ValueError from deep inside the reader.
        assert str(path) in str(exc) and "\n" not in str(exc)
    else:  # or skipped: the hunk is dropped and what was read is a valid graph with the edit in it
        (imported,) = read
        g.validate(imported.graph)
        assert [u.name for u in imported.graph.tool_uses] == ["Edit"]


@pytest.mark.parametrize("vendor", ["claude", "codex"])
def test_bool_token_count_is_not_a_count(tmp_path: Path, vendor: str) -> None:
    if vendor == "claude":
        record = {"type": "assistant", "message": {"id": "m", "usage": {"input_tokens": True}}}
        graph = read_claude_file(write_lines(tmp_path / "s.jsonl", [record]))[0].graph
    else:
        usage = {"last_token_usage": {"output_tokens": True}}
        record = {"type": "event_msg", "payload": {"type": "token_count", "info": usage}}
        imported = read_codex_file(write_lines(tmp_path / "rollout-x.jsonl", [record]))
        assert imported is not None
        graph = imported.graph
    assert g.decode_graph(g.encode_graph(graph)) == graph
