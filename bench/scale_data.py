"""The synthetic rows of `make bench-scale`, made by PostgreSQL itself (`INSERT ... SELECT generate_series`).

Shape (the issue's): 1,000 profiles; sessions spread over 18 calendar months ending now; per session 4 turns,
per turn 10 messages of 20-80 words, 2 tool calls and 3 model calls; 3% of tool calls are high-risk and have an
approval (a tenth of them denied). So one million messages come with 25,000 sessions, 100,000 turns, 200,000 tool
calls, 6,060 approvals and 300,000 model calls.

How the rows are made, and what is synthetic about them:

* Every row comes from a session index `s` (0, 1, 2, ...): its time is `start + span * frac(s * golden ratio)`, so
  any range of indexes is spread evenly over the 18 months, and a growth step adds the indexes after the last
  step's (sorted by time, so each step's rows go in in time order). A session ends within 20 minutes and never
  crosses a month boundary, so a month's rows are exactly those of the sessions that started in it. Every other
  choice (profile, tags, source, tool, text, model) is a hash of the index (`hashint8extended`): the same index
  always gives the same rows, which is how the month dropped at one size is put back before the next one.
* Ids are UUIDv7 made in SQL from the row's own time: 48 bits of Unix milliseconds, the version, then the table
  and the row's number instead of random bits (unique without a lookup). The journal-writer derives an approval's
  id from its tool call's (UUIDv5); here approvals get a UUIDv7 like every other row.
* Message texts: 50,000 sentences of 20-80 words drawn in Python from a 5,000-word vocabulary (the tests' words,
  then made-up ones, Zipf-distributed: `bench.console.Text`), copied into a table; each message takes one by a
  hash of its number. Every 50,000th message also carries the rare word (`RARE_WORD`). The content is the JSON
  the journal-writer stores for the message struct (role tag, text, tool calls, tool result); the search
  tsvector is the table's generated column, computed by PostgreSQL on insert as for the writer's rows.
* Model calls are billing's rows: 2,400 distinct calls (3 models x token sizes) priced once with the real Pricer
  and billing's `build_row`, and each synthetic call takes one of them by a hash, with its own ids, tags and time
  (`cost_usd`, `cost_status` and the price columns are therefore those billing writes).
* Not made here: the newest part of each step, written by the real journal-writer from events published to
  JetStream (`bench.scale`); the graph, memory and budget tables (empty).
"""

from __future__ import annotations

import itertools
import random
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import asyncpg

from bench.console import Text
from commonos.accounting.pricing import Pricer
from commonos.billing.projection import build_row
from commonos.billing.schema import MODEL_CALLS
from commonos.proto import events as ev

PROFILES: Final = 1000
MONTHS: Final = 18
TURNS: Final = 4
MESSAGES_PER_TURN: Final = 10
MESSAGES_PER_SESSION: Final = TURNS * MESSAGES_PER_TURN
TOOL_CALLS_PER_TURN: Final = 2
MODEL_CALLS_PER_TURN: Final = 3
#: One tool call in RISKY_EVERY is high-risk and has an approval; one approval in DENIED_EVERY is a denial.
RISKY_EVERY: Final = 33
DENIED_EVERY: Final = 10
VOCABULARY: Final = 5000
SENTENCES: Final = 50_000
#: The rare search word: in one message of RARE_EVERY (20 a million messages). The common one is the
#: vocabulary's fifth word, in about two thirds of the messages.
RARE_WORD: Final = "quetzal"
RARE_EVERY: Final = 50_000
COMMON_WORD: Final = "invoice"
CLIENTS: Final = 40
TEAMS: Final = 8
TOOLS: Final = ("read_file", "search_docs", "run_query", "http_get", "write_file")
MODELS: Final = (("anthropic", "claude-sonnet-4-5"), ("anthropic", "claude-haiku-4-5"), ("openai", "gpt-4.1-mini"))
SCHEMA: Final = "bench_scale"

#: The id of a row: `uuid7(time, kind, n)`; kind numbers the tables.
KIND: Final = {"sessions": 1, "turns": 2, "messages": 3, "tool_calls": 4, "approvals": 5, "model_calls": 7}

#: Message m of a turn: its role and what it holds. Model calls are made at messages 1, 3 and 5 (the assistant
#: messages asking for the two tools and giving the answer); 6 to 9 are a follow-up exchange in the same turn.
ROLES: Final = ("user", "assistant", "tool_result", "assistant", "tool_result", "assistant", "user", "assistant")
ROLES_10: Final = (*ROLES, "user", "assistant")

_HELPERS: Final = f"""
CREATE SCHEMA IF NOT EXISTS {SCHEMA};
-- A UUIDv7 of `at` (Unix ms), version 7, then the table's kind and the row's number where the random bits go.
CREATE OR REPLACE FUNCTION {SCHEMA}.uuid7(at timestamptz, kind int, n bigint) RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT (lpad(to_hex(floor(extract(epoch FROM at) * 1000)::bigint), 12, '0') || '7'
          || lpad(to_hex(kind), 3, '0') || '8' || lpad(to_hex(n), 15, '0'))::uuid
$$;
-- A number in [0, m) from the hash of (n, salt).
CREATE OR REPLACE FUNCTION {SCHEMA}.pick(n bigint, salt bigint, m int) RETURNS int
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
  SELECT ((hashint8extended(n, salt) & 2147483647) % m)::int
$$;
CREATE TABLE IF NOT EXISTS {SCHEMA}.texts (i int PRIMARY KEY, body text NOT NULL);
CREATE TABLE IF NOT EXISTS {SCHEMA}.words (i int PRIMARY KEY, word text NOT NULL);
CREATE TABLE IF NOT EXISTS {SCHEMA}.priced AS SELECT * FROM public.model_calls WITH NO DATA;
ALTER TABLE {SCHEMA}.priced ADD COLUMN IF NOT EXISTS k int;
"""

#: The sessions of one step: indexes [$1, $2), and those below $1 whose time falls in [$5, $6) (a dropped month
#: put back), sorted by time. $3 start, $4 span (seconds).
_STEP: Final = f"""
DROP TABLE IF EXISTS {SCHEMA}.step;
CREATE UNLOGGED TABLE {SCHEMA}.step AS
WITH idx AS (
  SELECT s FROM generate_series($1::bigint, $2::bigint - 1) AS s
  UNION ALL
  SELECT s FROM generate_series(0, $1::bigint - 1) AS s
  WHERE $5::timestamptz IS NOT NULL
    AND $3::timestamptz + make_interval(secs => $4::float8 * ((s * 0.6180339887498949) - floor(s * 0.6180339887498949)))
        >= $5::timestamptz - interval '1 hour'
    AND $3::timestamptz + make_interval(secs => $4::float8 * ((s * 0.6180339887498949) - floor(s * 0.6180339887498949)))
        < $6::timestamptz
), raw AS (
  SELECT s, date_trunc('milliseconds',
           $3::timestamptz + make_interval(secs => $4::float8 * ((s * 0.6180339887498949)
                                                                  - floor(s * 0.6180339887498949)))) AS t
  FROM idx
), timed AS (
  -- A session lasts 20 minutes at most: one starting in the last hour of a month starts an hour earlier.
  SELECT s, CASE WHEN date_trunc('month', t) + interval '1 month' - t < interval '1 hour'
                 THEN t - interval '1 hour' ELSE t END AS at
  FROM raw
)
SELECT s, at,
  {SCHEMA}.uuid7(at, {KIND["sessions"]}, s) AS id,
  'profile-' || lpad(floor({PROFILES} * power({SCHEMA}.pick(s, 1, 1000000) / 1000000.0, 2))::int::text, 4, '0')
    AS profile_id,
  (ARRAY['cli', 'cli', 'cli', 'web', 'web', 'api'])[1 + {SCHEMA}.pick(s, 2, 6)] AS source,
  CASE WHEN {SCHEMA}.pick(s, 3, 10) < 3
    THEN ARRAY['client:c' || lpad({SCHEMA}.pick(s, 4, {CLIENTS})::text, 2, '0'),
               'team:t' || {SCHEMA}.pick(s, 5, {TEAMS})]
    ELSE ARRAY['client:c' || lpad({SCHEMA}.pick(s, 4, {CLIENTS})::text, 2, '0')] END AS tags,
  {SCHEMA}.pick(s, 6, 25) = 0 AS failed
FROM timed
WHERE $5::timestamptz IS NULL OR s >= $1 OR (at >= $5::timestamptz AND at < $6::timestamptz)
ORDER BY at;
ANALYZE {SCHEMA}.step;
"""

#: The text of message number n.
_TEXT: Final = (
    f"(SELECT body FROM {SCHEMA}.texts WHERE i = {SCHEMA}.pick(n, 7, {SENTENCES}))"
    f" || CASE WHEN n % {RARE_EVERY} = 7 THEN ' {RARE_WORD}.' ELSE '' END"
)

_SESSIONS: Final = f"""
INSERT INTO sessions (id, profile_id, source, title, tags, parent_session_id, context_snapshot, created_at, updated_at)
SELECT st.id, st.profile_id, st.source,
  left((SELECT body FROM {SCHEMA}.texts WHERE i = {SCHEMA}.pick(st.s * {MESSAGES_PER_SESSION}, 7, {SENTENCES})), 60),
  st.tags, NULL, '{{"system_prompt": "Be brief.", "memory": []}}'::jsonb, st.at, st.at + interval '10 ms'
FROM {SCHEMA}.step st
-- Sessions are not partitioned: `cos retention` leaves a dropped month's sessions, whose rows come back here.
ON CONFLICT (id) DO NOTHING
"""

_TURNS: Final = f"""
INSERT INTO turns (id, session_id, profile_id, parent_turn_id, tags, depth, status, error, started_at, finished_at)
SELECT {SCHEMA}.uuid7(st.at + k * interval '5 min', {KIND["turns"]}, st.s * {TURNS} + k), st.id, st.profile_id, NULL,
  st.tags, 0,
  CASE WHEN st.failed AND k = {TURNS - 1} THEN 'failed' ELSE 'completed' END,
  CASE WHEN st.failed AND k = {TURNS - 1} THEN 'model_error: upstream overloaded' END,
  st.at + k * interval '5 min', st.at + k * interval '5 min' + interval '4 min 30 s'
FROM {SCHEMA}.step st, generate_series(0, {TURNS - 1}) AS k
"""

# Message m of turn k is at start + 5 min k + 25 s m + 1 s; its number n = 40 s + 10 k + m.
_MESSAGES: Final = f"""
INSERT INTO messages (id, session_id, turn_id, profile_id, seq, role, content, active, created_at)
SELECT {SCHEMA}.uuid7(x.at, {KIND["messages"]}, x.n), x.sid, x.tid, x.profile_id, x.seq, x.role,
  CASE x.role
    WHEN 'tool_result' THEN jsonb_build_object('role', 'tool_result', 'call_id', x.call_id, 'content', x.body,
                                               'is_error', false)
    WHEN 'assistant' THEN CASE WHEN x.m IN (1, 3)
      THEN jsonb_build_object('role', 'assistant', 'text', x.body, 'tool_calls', jsonb_build_array(
             jsonb_build_object('id', x.call_id, 'name', x.tool, 'args', jsonb_build_object('path', x.path))))
      ELSE jsonb_build_object('role', 'assistant', 'text', x.body) END
    ELSE jsonb_build_object('role', 'user', 'text', x.body) END,
  true, x.at
FROM (
  SELECT st.id AS sid, st.profile_id, n, m, k * {MESSAGES_PER_TURN} + m + 1 AS seq,
    {SCHEMA}.uuid7(st.at + k * interval '5 min', {KIND["turns"]}, st.s * {TURNS} + k) AS tid,
    st.at + k * interval '5 min' + m * interval '25 s' + interval '1 s' AS at,
    (ARRAY{list(ROLES_10)!r})[m + 1] AS role,
    'call_' || k || '_' || ((m - 1) / 2) AS call_id,
    (ARRAY{list(TOOLS)!r})[1 + {SCHEMA}.pick(st.s * 8 + k * 2 + (m - 1) / 2, 8, {len(TOOLS)})] AS tool,
    '/srv/' || (SELECT word FROM {SCHEMA}.words WHERE i = {SCHEMA}.pick(st.s * 8 + k * 2 + (m - 1) / 2, 9, 200))
      || '/' || (st.s * 8 + k * 2 + (m - 1) / 2) % 1000 || '.txt' AS path,
    {_TEXT} AS body
  FROM {SCHEMA}.step st, generate_series(0, {TURNS - 1}) AS k, generate_series(0, {MESSAGES_PER_TURN - 1}) AS m,
    LATERAL (SELECT st.s * {MESSAGES_PER_SESSION} + k * {MESSAGES_PER_TURN} + m AS n) AS num
  WHERE st.s % $2 = $1
) AS x
"""

_TOOL_CALLS: Final = f"""
INSERT INTO tool_calls (id, turn_id, session_id, profile_id, call_id, name, args, result, is_error, risk, approval,
                        started_at, finished_at)
SELECT {SCHEMA}.uuid7(x.at, {KIND["tool_calls"]}, x.n), x.tid, x.sid, x.profile_id, 'call_' || x.k || '_' || x.j,
  (ARRAY{list(TOOLS)!r})[1 + {SCHEMA}.pick(x.n, 8, {len(TOOLS)})],
  jsonb_build_object('path', '/srv/' || (SELECT word FROM {SCHEMA}.words WHERE i = {SCHEMA}.pick(x.n, 9, 200))
                             || '/' || x.n % 1000 || '.txt'),
  (SELECT body FROM {SCHEMA}.texts WHERE i = {SCHEMA}.pick(x.n, 10, {SENTENCES})), false,
  CASE WHEN x.n % {RISKY_EVERY} = 0 THEN 'high' ELSE 'low' END,
  CASE WHEN x.n % {RISKY_EVERY} <> 0 THEN NULL
       WHEN (x.n / {RISKY_EVERY}) % {DENIED_EVERY} = 0 THEN 'denied' ELSE 'approved' END,
  x.at, x.at + interval '2 s'
FROM (
  SELECT st.id AS sid, st.profile_id, k, j, st.s * {TURNS * TOOL_CALLS_PER_TURN} + k * {TOOL_CALLS_PER_TURN} + j AS n,
    {SCHEMA}.uuid7(st.at + k * interval '5 min', {KIND["turns"]}, st.s * {TURNS} + k) AS tid,
    st.at + k * interval '5 min' + (1 + 2 * j) * interval '25 s' + interval '2 s' AS at
  FROM {SCHEMA}.step st, generate_series(0, {TURNS - 1}) AS k, generate_series(0, {TOOL_CALLS_PER_TURN - 1}) AS j
) AS x
"""

_APPROVALS: Final = f"""
INSERT INTO approvals (id, tool_call_id, turn_id, profile_id, status, decided_by, decided_at)
SELECT {SCHEMA}.uuid7(tc.started_at - interval '1 s', {KIND["approvals"]}, n.n), tc.id, tc.turn_id, tc.profile_id,
  tc.approval, 'console:olivia', tc.started_at - interval '1 s'
FROM {SCHEMA}.step st JOIN tool_calls tc ON tc.session_id = st.id AND tc.risk = 'high',
  LATERAL (SELECT st.s * {TURNS * TOOL_CALLS_PER_TURN} + substr(tc.call_id, 6, 1)::int * {TOOL_CALLS_PER_TURN}
                  + substr(tc.call_id, 8, 1)::int AS n) AS n
"""

_MODEL_CALLS: Final = f"""
INSERT INTO model_calls
SELECT {SCHEMA}.uuid7(x.at, {KIND["model_calls"]}, x.n), x.profile_id, x.sid, x.tid,
  p.request_id, p.provider, p.model, p.input_tokens, p.output_tokens, p.cache_read_tokens, p.cache_write_5m_tokens,
  p.cache_write_1h_tokens, p.reasoning_tokens, p.speed, p.latency_s, p.stop_reason, p.usage_estimated,
  p.reported_cost_usd, p.cost_usd, p.cost_status, p.price_source, p.price_version, p.price_detail,
  x.tags, x.at, x.at + interval '2 s', NULL
FROM (
  SELECT st.id AS sid, st.profile_id, st.tags,
    st.s * {TURNS * MODEL_CALLS_PER_TURN} + k * {MODEL_CALLS_PER_TURN} + c AS n,
    {SCHEMA}.uuid7(st.at + k * interval '5 min', {KIND["turns"]}, st.s * {TURNS} + k) AS tid,
    st.at + k * interval '5 min' + (1 + 2 * c) * interval '25 s' AS at
  FROM {SCHEMA}.step st, generate_series(0, {TURNS - 1}) AS k, generate_series(0, {MODEL_CALLS_PER_TURN - 1}) AS c
) AS x JOIN {SCHEMA}.priced p ON p.k = {SCHEMA}.pick(x.n, 11, $1)
"""


@dataclass(frozen=True)
class Span:
    """The 18 calendar months the sessions are spread over: from the first day of the month 17 months before
    `now`'s to an hour before `now`."""

    start: datetime
    end: datetime

    @classmethod
    def ending(cls, now: datetime) -> Span:
        first = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        year, month = divmod(first.year * 12 + first.month - 1 - (MONTHS - 1), 12)
        return cls(first.replace(year=year, month=month + 1), now.replace(microsecond=0) - timedelta(hours=1))

    @property
    def seconds(self) -> float:
        return (self.end - self.start).total_seconds()

    @property
    def first_month_end(self) -> datetime:
        year, month = divmod(self.start.year * 12 + self.start.month, 12)
        return self.start.replace(year=year, month=month + 1)


def sessions_for(messages: int) -> int:
    return max(1, round(messages / MESSAGES_PER_SESSION))


def _priced_rows(seed: int = 11) -> list[tuple[Any, ...]]:
    """Billing's rows of 2,400 distinct calls (3 models x 40 input sizes x 20 output sizes), priced once."""
    pricer = Pricer()
    rows = []
    names = [c.name for c in MODEL_CALLS.columns]
    profile_at = names.index("request_id")
    for k, (m, i, o) in enumerate(itertools.product(range(len(MODELS)), range(40), range(20))):
        provider, model = MODELS[m]
        event = ev.ModelCallCompleted(
            profile_id="profile-0000",
            session_id=uuid.UUID(int=0),
            turn_id=uuid.UUID(int=0),
            provider=provider,
            model=model,
            input_tokens=200 + 150 * i,
            output_tokens=20 + 40 * o,
            latency_s=0.4 + o / 10,
            occurred_at=datetime(2026, 1, 1, tzinfo=UTC),
        )
        args = MODEL_CALLS.row_args(build_row(event, pricer))
        # The call's own columns (request_id to price_detail); ids, tags and times come from each synthetic call.
        rows.append((k, *args[profile_at : names.index("tags")]))
    return rows


def _sentences(seed: int = 31) -> tuple[list[str], list[str]]:
    """(50,000 sentences of 20-80 words, the vocabulary's words) from the 5,000-word vocabulary."""
    rng = random.Random(seed)
    text = Text(rng, vocabulary=VOCABULARY)
    return [text.sentence(20 + int(rng.random() * 61)) for _ in range(SENTENCES)], text.words


async def prepare(conn: asyncpg.Connection) -> None:
    """The helper functions and tables (texts, words, priced calls), once per database."""
    await conn.execute(_HELPERS)
    if await conn.fetchval(f"SELECT count(*) FROM {SCHEMA}.texts") == 0:
        sentences, words = _sentences()
        await conn.copy_records_to_table("texts", schema_name=SCHEMA, records=list(enumerate(sentences)))
        await conn.copy_records_to_table("words", schema_name=SCHEMA, records=list(enumerate(words)))
    if await conn.fetchval(f"SELECT count(*) FROM {SCHEMA}.priced") == 0:
        names = [c.name for c in MODEL_CALLS.columns]
        columns = ["k", *names[names.index("request_id") : names.index("tags")]]
        await conn.copy_records_to_table("priced", schema_name=SCHEMA, records=_priced_rows(), columns=columns)
    await conn.execute(f"ANALYZE {SCHEMA}.texts, {SCHEMA}.words, {SCHEMA}.priced")
    await conn.execute(
        "INSERT INTO profiles (id, tags, created_at, updated_at) "
        "SELECT 'profile-' || lpad(i::text, 4, '0'), '{}', $1, $1 FROM generate_series(0, $2 - 1) AS i "
        "ON CONFLICT (id) DO NOTHING",
        await conn.fetchval("SELECT now() - interval '19 months'"),
        PROFILES,
    )


async def plan_step(
    conn: asyncpg.Connection, span: Span, first: int, last: int, refill: tuple[datetime, datetime] | None
) -> int:
    """The step's sessions in `bench_scale.step`; returns how many (new ones and those of a month put back)."""
    await conn.execute("SET TIME ZONE 'UTC'")
    lo, hi = refill if refill is not None else (None, None)
    # asyncpg runs one statement with parameters at a time.
    for statement in (s.strip() for s in _STEP.split(";") if s.strip()):
        if "$" in statement:
            await conn.execute(statement, first, last, span.start, span.seconds, lo, hi)
        else:
            await conn.execute(statement)
    return int(await conn.fetchval(f"SELECT count(*) FROM {SCHEMA}.step"))


async def fill_step(conns: Sequence[asyncpg.Connection]) -> None:
    """The rows of the sessions in `bench_scale.step`: the messages split between the connections, the other
    tables on the first. Foreign keys are not checked row by row (`session_replication_role = replica`): every
    row's parent is made by the same step."""
    import asyncio

    for c in conns:
        await c.execute("SET session_replication_role = replica")
        await c.execute("SET TIME ZONE 'UTC'")
    await conns[0].execute(_SESSIONS)
    await conns[0].execute(_TURNS)
    parts = len(conns)

    async def others(c: asyncpg.Connection) -> None:
        await c.execute(_TOOL_CALLS)
        await c.execute(_APPROVALS)
        await c.execute(_MODEL_CALLS, len(MODELS) * 40 * 20)

    await asyncio.gather(
        *(c.execute(_MESSAGES, i, parts) for i, c in enumerate(conns)),
    )
    await others(conns[0])
    for c in conns:
        await c.execute("SET session_replication_role = DEFAULT")
