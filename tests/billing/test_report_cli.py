"""`cos report cost` and `cos billing reprice` as a user runs them (a subprocess), on a real PostgreSQL.

Sums are exact for any valid token counts, and a time range far in the past or the future is a correct
(empty or full) report or one line of error, never a traceback.
"""

from __future__ import annotations

import asyncio
import csv as csv_module
import io
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from commonos.accounting.pricing import Pricer
from commonos.billing.days import insert_calls, rebuild_days
from commonos.billing.projection import build_row
from commonos.billing.service import billing_schemas
from commonos.proto import events as ev
from commonos.proto.ids import new_id
from commonos.runtime.postgres import apply_schemas, connect
from tests.billing.support import POSITIONS, billing
from tests.support import publish_all, wait_for_position

BIG = 2**62
MAX_BIGINT = 2**63 - 1


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out, parse_float=Decimal)


def cos(database_url: str, *argv: str) -> Run:
    env = {**os.environ, "COS_DATABASE_URL": database_url, "COS_NATS_URL": "nats://127.0.0.1:1"}
    done = subprocess.run(
        [sys.executable, "-m", "commonos.cli.main", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    return Run(done.returncode, done.stdout, done.stderr)


async def acos(database_url: str, *argv: str) -> Run:
    return await asyncio.to_thread(cos, database_url, *argv)


def call(at: datetime, model: str = "gpt-99-imaginary", **fields: Any) -> ev.ModelCallCompleted:
    return ev.ModelCallCompleted(
        profile_id="default",
        session_id=new_id(),
        provider="openai",
        model=model,
        occurred_at=at,
        **({"tags": ("client:acme",)} | fields),
    )


async def test_the_tag_note_reads_as_a_sentence(nats_url: str, database_url: str) -> None:
    """Issue 32: the note of a tag grouping read "counted once in every client: group it carries". It says in
    plain words what the numbers above it show: a call of two clients is in both groups, once in the total."""
    now = datetime.now(UTC)
    calls = [call(now, "o4-mini", tags=("client:acme", "client:initech")), call(now, "o4-mini")]
    acks = await publish_all(nats_url, calls)
    async with billing(nats_url, database_url):
        await wait_for_position(database_url, "billing", acks[-1].seq, table=POSITIONS)
    run = await acos(database_url, "report", "cost", "--group-by", "tag:client")
    assert (run.code, run.err) == (0, "")
    rows = {line.split()[0]: line.split()[2] for line in run.out.splitlines()[2:] if line.startswith("client:")}
    assert rows == {"client:acme": "2", "client:initech": "1"}
    assert [line for line in run.out.splitlines() if line.startswith("Note: ")] == [
        "Note: A call that carries more than one client tag (client:a and client:b) is counted in the group of "
        "each, so the groups can add up to more than the total, which counts every call once."
    ]
    assert "group it carries" not in run.out
    as_json = await acos(database_url, "report", "cost", "--group-by", "tag:team", "--format", "json")
    assert as_json.json()["notes"][0].startswith("A call that carries more than one team tag (team:a and team:b)")


async def test_report_sums_are_exact_beyond_64_bits(nats_url: str, database_url: str) -> None:
    now = datetime.now(UTC)
    calls = [
        # Issue #14: each count is a valid bigint, their sum is not.
        call(now, cache_write_5m_tokens=BIG, cache_write_1h_tokens=BIG),
        call(now, input_tokens=MAX_BIGINT, output_tokens=MAX_BIGINT, reasoning_tokens=MAX_BIGINT),
        call(now, input_tokens=MAX_BIGINT, output_tokens=MAX_BIGINT, reasoning_tokens=BIG, cache_read_tokens=BIG),
        call(now, cache_read_tokens=MAX_BIGINT, tags=("client:globex",)),
        call(now, "o4-mini", input_tokens=1_000_000, output_tokens=10),  # priced: $1.10 + $0.000044
    ]
    acks = await publish_all(nats_url, calls)
    async with billing(nats_url, database_url):
        await wait_for_position(database_url, "billing", acks[-1].seq, table=POSITIONS)

    expected = {
        "calls": 5,
        "unpriced_calls": 4,
        "input_tokens": 2 * MAX_BIGINT + 1_000_000,
        "output_tokens": 2 * MAX_BIGINT + 10,
        "reasoning_tokens": MAX_BIGINT + BIG,
        "cache_read_tokens": BIG + MAX_BIGINT,
        "cache_write_tokens": 2 * BIG,
        "usd": "1.1000440000",
    }
    since = ("--since", "0001-01-01")
    for group_by in ("model", "provider", "profile", "day", "tag:client"):
        run = await acos(database_url, "report", "cost", *since, "--group-by", group_by, "--format", "json")
        assert (run.code, run.err) == (0, "")
        total = run.json()["total"]
        assert {key: total[key] for key in expected} == expected, group_by
    by_client = {g["group"]: g for g in run.json()["groups"]}
    assert by_client["client:acme"]["input_tokens"] == 2 * MAX_BIGINT + 1_000_000
    assert by_client["client:acme"]["cache_write_tokens"] == 2 * BIG
    assert by_client["client:globex"]["cache_read_tokens"] == MAX_BIGINT

    table = await acos(database_url, "report", "cost", *since)
    assert (table.code, table.err) == (0, "")
    assert f"{2 * BIG:,}" in table.out  # cache_write of the total, with thousands separators
    csv = await acos(database_url, "report", "cost", *since, "--format", "csv")
    assert (csv.code, csv.err) == (0, "")
    assert csv.out.splitlines()[-1].endswith(f",{BIG + MAX_BIGINT},{2 * BIG}")


@pytest.fixture
async def three_calls(database_url: str) -> str:
    """A database holding three billed calls: last year, yesterday and now."""
    now = datetime.now(UTC)
    pricer = Pricer()
    rows = [
        build_row(call(at, "o4-mini", input_tokens=1000), pricer)
        for at in (now - timedelta(days=365), now - timedelta(days=1), now)
    ]
    conn = await connect(database_url)
    try:
        await apply_schemas(conn, billing_schemas())
        await insert_calls(conn, rows)
    finally:
        await conn.close()
    return database_url


#: (range arguments, calls in the report), for ranges that are valid however far they reach.
VALID_RANGES = [
    (("--since", "9999-12-31"), 0),
    (("--since", "9999-12-31T23:59:59.999999"), 0),
    (("--since", "100000d"), 3),
    (("--since", "0001-01-01"), 3),
    (("--since", "0001-01-01T00:00:00+00:00"), 3),
    (("--since", "0001-01-01", "--until", "9999-12-31"), 3),
    (("--since", "0001-01-01", "--until", "9999-12-31T23:59:59.999999Z"), 3),
    (("--since", "2d", "--until", "9999-12-31"), 2),
    (("--until", "0001-01-01"), 0),
]

#: (range arguments, the flag, the value, what the one-line error says about it)
BAD_RANGES = [
    ("--since", "9999-12-31T23:59:59-01:00", "is after the year 9999 in UTC"),
    ("--since", "0001-01-01T00:00:00+01:00", "is before the year 1 in UTC"),
    ("--until", "9999-12-31T23:59:59-01:00", "is after the year 9999 in UTC"),
    ("--until", "0001-01-01T00:59:59.999999+01:00", "is before the year 1 in UTC"),
    ("--since", "10000000d", "reaches before the year 1"),
    ("--since", "99999999999999999999999999999999h", "reaches before the year 1"),
    ("--since", "10000-01-01", "is not a date (2026-11-01), a date-time or a span ago (7d, 12h)"),
    ("--since", "0000-12-31", "is not a date (2026-11-01), a date-time or a span ago (7d, 12h)"),
    ("--since", "9" * 5000 + "d", "is not a date (2026-11-01), a date-time or a span ago (7d, 12h)"),
]


@pytest.mark.parametrize(("argv", "calls"), VALID_RANGES, ids=[" ".join(a) for a, _ in VALID_RANGES])
async def test_a_report_over_any_valid_range_is_correct(three_calls: str, argv: tuple[str, ...], calls: int) -> None:
    run = await acos(three_calls, "report", "cost", *argv, "--format", "json")
    assert (run.code, run.err) == (0, "")
    assert run.json()["total"]["calls"] == calls
    since = datetime.fromisoformat(run.json()["since"])
    assert since.tzinfo is not None, "the range is printed as instants"
    if "--since" in argv and argv[1].startswith("0001-01-01"):
        assert since == datetime(1, 1, 1, tzinfo=UTC)
    table = await acos(three_calls, "report", "cost", *argv)
    assert (table.code, table.err) == (0, "")
    assert table.out.startswith("Cost by model, ")


REPRICE_RANGES = [(argv, calls) for argv, calls in VALID_RANGES if "--since" in argv]  # reprice needs --since


@pytest.mark.parametrize(("argv", "calls"), REPRICE_RANGES, ids=[" ".join(a) for a, _ in REPRICE_RANGES])
async def test_a_reprice_over_any_valid_range_is_correct(three_calls: str, argv: tuple[str, ...], calls: int) -> None:
    run = await acos(three_calls, "billing", "reprice", *argv, "--format", "json")
    assert (run.code, run.err) == (0, "")
    assert (run.json()["rows_examined"], run.json()["rows_changed"]) == (calls, 0)


@pytest.mark.parametrize(("flag", "value", "says"), BAD_RANGES, ids=[f"{f} {v[:40]}" for f, v, _ in BAD_RANGES])
@pytest.mark.parametrize("command", [("report", "cost"), ("billing", "reprice")], ids=" ".join)
async def test_a_time_out_of_range_is_one_line(
    three_calls: str, command: tuple[str, str], flag: str, value: str, says: str
) -> None:
    argv = [*command, flag, value]
    if command == ("billing", "reprice") and flag == "--until":
        argv += ["--since", "0001-01-01"]
    run = await acos(three_calls, *argv)
    prog = "cos " + " ".join(command)
    assert run.code == 2
    assert run.err == f"{prog}: error: argument {flag}: {value!r} {says} (see `{prog} --help`)\n"
    assert run.out == ""


async def test_a_reprice_whose_new_cost_cannot_be_stored_is_one_line_and_changes_nothing(
    database_url: str, tmp_path: Path
) -> None:
    # Billed unpriced; $15 per million tokens then makes 2^63 - 1 tokens cost ~$1.4e14, beyond numeric(24, 10).
    rows = [
        build_row(call(datetime.now(UTC), input_tokens=MAX_BIGINT), Pricer()),
        build_row(call(datetime.now(UTC), input_tokens=1000), Pricer()),
    ]
    conn = await connect(database_url)
    try:
        await apply_schemas(conn, billing_schemas())
        await insert_calls(conn, rows)
        before = [dict(r) for r in await conn.fetch("SELECT * FROM model_calls ORDER BY event_id")]
    finally:
        await conn.close()
    prices = tmp_path / "prices.toml"
    prices.write_text('[[price]]\nmodel = "gpt-99-imaginary"\ninput_mtok = "15"\noutput_mtok = "15"\n')

    for dry_run in ((), ("--dry-run",)):
        run = await acos(database_url, "billing", "reprice", "--since", "1d", "--price-file", str(prices), *dry_run)
        assert run.code == 2 and run.out == ""
        assert run.err == (
            f"cos: error: call {rows[0].event_id}: its new cost 138350580552821.6371050000 USD does not fit "
            "model_calls.cost_usd (below 10^14 USD); nothing was repriced\n"
        )
    conn = await connect(database_url)
    try:
        assert [dict(r) for r in await conn.fetch("SELECT * FROM model_calls ORDER BY event_id")] == before
        assert await conn.fetchval("SELECT count(*) FROM billing_reprices") == 0
    finally:
        await conn.close()


async def test_a_report_says_how_many_calls_are_outside_its_range(three_calls: str) -> None:
    now = datetime.now(UTC)
    last_year = (now - timedelta(days=365)).date().isoformat()
    since = (now - timedelta(hours=1)).isoformat()
    until = (now - timedelta(minutes=30)).isoformat()
    run = await acos(three_calls, "report", "cost", "--since", since, "--until", until, "--format", "json")
    assert (run.code, run.err) == (0, "")
    notes = run.json()["notes"]
    assert (
        f"2 call(s) are before this range (the first on {last_year}, by the calls' own times): "
        f"`--since {last_year}` shows them." in notes
    )
    assert "1 call(s) are after this range: leave out `--until` to show them." in notes
    everything = await acos(three_calls, "report", "cost", "--since", last_year, "--format", "json")
    assert not [n for n in everything.json()["notes"] if "this range" in n]


#: Model names a spreadsheet would run as formulas (OWASP's CSV injection list: = + - @, tab, CR).
FORMULA_MODELS = ('=HYPERLINK("http://evil","x")', "+1+1", "-1+1", "@SUM(A1)", "\t=1+1", "\r=1+1")


async def test_csv_cells_a_spreadsheet_would_run_are_quoted_and_numbers_stay_numbers(database_url: str) -> None:
    now = datetime.now(UTC)
    pricer = Pricer()
    rows = [build_row(call(now, model, input_tokens=1000), pricer) for model in (*FORMULA_MODELS, "o4-mini")]
    conn = await connect(database_url)
    try:
        await apply_schemas(conn, billing_schemas())
        await insert_calls(conn, rows)
        # A negative cost (a credit an operator's price file gives, say) is a number, not a formula.
        await conn.execute("UPDATE model_calls SET cost_usd = -1.5, cost_status = 'override' WHERE model = 'o4-mini'")
        await rebuild_days(conn)  # a change by hand: its days are computed again
    finally:
        await conn.close()
    env = {**os.environ, "COS_DATABASE_URL": database_url}
    argv = [sys.executable, "-m", "commonos.cli.main", "report", "cost", "--since", "0001-01-01", "--format", "csv"]
    # Read as bytes: a CR inside a cell must come out as it went in.
    done = await asyncio.to_thread(subprocess.run, argv, env=env, capture_output=True, timeout=120, check=False)
    assert (done.returncode, done.stderr) == (0, b"")
    assert done.stdout.endswith(b"\r\n") and done.stdout.count(b"\n") == len(FORMULA_MODELS) + 3
    table = list(csv_module.reader(io.StringIO(done.stdout.decode(), newline="")))
    labels = {row[0]: row for row in table[1:]}
    assert set(labels) == {"'" + model for model in FORMULA_MODELS} | {"o4-mini", "(total: each call once)"}
    assert labels["o4-mini"][1] == "-1.5000000000", "a number in a numeric column stays a number"
    assert labels["(total: each call once)"][1] == "-1.5000000000"
    cells = [cell for row in table[1:] for cell in row[1:]]
    assert all(cell == "" or Decimal(cell) is not None for cell in cells), cells
