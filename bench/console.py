"""The console phase of `make bench`: the web console (`python -m commonos.console`, its own process) over
100,000 sessions and 1,000,000 messages (`--quick`: 10,000 and 100,000), against the same queries run directly.

**Data, loaded with COPY.** Running the real journal-writer over that much is too slow for the benchmark's
15 minutes: a session of 10 messages, 2 turns, 3 tool calls and 5 model calls is about 22 events, so 2.2M
events; building them and the writer's plan alone costs about 34 µs per event in Python (75 s), and the
writer projects about 8,500 events/s on this machine (bench/README.md): over 4 minutes before the first
request. So the rows are written straight into the tables with COPY, in the shape the journal-writer gives
them (commonos.journal_writer.projection): the message content is the message struct encoded by the writer's
own `_json`, `role` its tag, the session's title `title_from_text` of its first user message, the first
turn's context snapshot on the session (with updated_at), the turn's finish on its row, tool calls with
their risk and approval (and the approval's row, its id derived by the writer's `_approval_id`), and the
`search` tsvector is the table's own generated column, computed by PostgreSQL as for every insert. The
model calls are billing's rows (`build_row` with the real Pricer; each distinct call priced once), and their
per-session totals (`session_costs`, what sorting by cost reads) are filled from them as billing's schema fills
them on a database billed before the table existed (`BACKFILL_SESSION_COSTS`). The
secondary indexes are dropped before the load and created again from their own definitions after it,
foreign keys are not re-checked during it (`session_replication_role = replica`: every row's parent is
loaded in the same run), then VACUUM (ANALYZE), as after the writer's phase.

The text: a Zipf-distributed vocabulary (the tests' words first, then 3,000 made-up words) and planted
words for search (`SEARCH_WORDS`: at 1M messages in about 15, 700 and 2,100 messages (all under the console's
FEW_HITS, so searched from their matches; the common words are searched from the newest sessions), and in none);
five profiles, a client tag on every session and a team tag on some, sources cli/web/api, 4% of sessions ending
failed, 2% delegated children. Beside them, imported Claude Code trees of the session graph (one for every ten
sessions, `IMPORTED_SHARE`): prompts and replies of the same text in `graph.user_inputs` and
`graph.assistant_messages` (their `search` columns generated), calls billed to the tree's top-level session.

**What is measured**, each request alone on a keep-alive connection (aiohttp), signed in as an operator
through POST /api/login (the cookie), timed from sending the request to the end of its body:

* the session list (/api/sessions, each row with its cost, tokens, model calls, models and duration): the first
  page, keyset pages deep in the list (cursors at 10% to 90%) and the next pages after them, with no filter and
  with each filter (profile, tag, source, status, a time range), the imported sessions alone, and sorted by cost
  (the default range, 30 days, a week's range, with a filter; the next pages); p50, p95, max (and the cost-sorted
  lists' p95 alone);
* search (/api/sessions?q=, the loop's messages and the imported prompts and replies): each planted word, a common
  word and a two-word query, with their snippets; imported work alone; sorted by cost;
* a session page: the HTML page /sessions/{id} a browser loads, of random sessions (and a few with
  delegated children). The console sends no Server-Timing header: the target's figure is the whole request
  on the loopback interface, an upper bound of the server's time; the console's own histogram
  (cos_console_request_seconds, request to response start, from its /metrics before and after) gives the
  server's mean and the share within 200 ms;
* event-to-browser: /sessions/{id}/live (the server-sent HTML fragments the page shows) open for a session
  while its events (messages and tool calls) are published to JetStream as the loop publishes them, at a
  steady rate; from just before each publish to the moment its fragment is read from the stream; p50, p99.

Baselines in the same run: the console's own list, search and session queries (`list_sessions`,
`load_session`) run directly with asyncpg from the benchmark, so the difference is the console's HTTP,
validation and rendering.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import json
import math
import os
import random
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlencode

import aiohttp
import asyncpg
from uuid_utils import UUID as Id
from uuid_utils import uuid7

from bench.services import BenchError, ServiceRun, cpu_seconds
from commonos.accounting.pricing import Pricer
from commonos.billing.projection import build_row
from commonos.billing.schema import BACKFILL_SESSION_COSTS, MODEL_CALLS
from commonos.billing.schema import SCHEMA as BILLING_SCHEMA
from commonos.console.pages.sessions import SessionFilters, encode_cursor, list_sessions, load_session
from commonos.console.users import Role, User, hash_password, render_users
from commonos.journal_writer.graph_schema import SCHEMA as GRAPH_SCHEMA
from commonos.journal_writer.projection import _approval_id, _json, _text
from commonos.journal_writer.schema import SCHEMA as CORE_SCHEMA
from commonos.proto import events as ev
from commonos.proto.identity import title_from_text
from commonos.proto.ids import new_id
from commonos.proto.messages import AssistantMessage, Message, ToolCall, ToolResultMessage, UserMessage
from commonos.runtime import partitions
from commonos.runtime.embedded import NatsServer, PostgresCluster, free_port
from commonos.runtime.nats import connect as nats_connect
from commonos.runtime.nats import ensure_streams
from commonos.runtime.postgres import apply_schemas
from commonos.runtime.publisher import EventPublisher
from commonos.runtime.settings import Settings
from tests.factories import WORDS

DB: Final = "console"
USER: Final = "bench"
PASSWORD: Final = "console-bench-password"

PROFILES: Final = (("default", 0.45), ("ops", 0.25), ("support", 0.15), ("research", 0.1), ("sales", 0.05))
CLIENTS: Final = tuple(f"client:{name}" for name in ("acme", "globex", "initech", "umbrella", "hooli", "stark"))
TEAMS: Final = ("team:web", "team:data", "team:infra")
SOURCES: Final = (("cli", 0.6), ("web", 0.3), ("api", 0.1))
TOOLS: Final = ("read_file", "search_docs", "run_query", "http_get", "write_file")
MODELS: Final = (("anthropic", "claude-sonnet-4-5"), ("anthropic", "claude-haiku-4-5"), ("openai", "gpt-4.1-mini"))
#: Planted words and the share of texts holding each (7 of a session's 10 messages have text: at 1M messages about
#: 15, 700, 2,100 and no messages).
SEARCH_WORDS: Final = {"zanzibar": 2e-5, "quokka": 1e-3, "marmalade": 3e-3, "xylophonist": 0.0}
#: A word of the vocabulary's head (in about a third of the messages) and a two-word query.
COMMON_QUERIES: Final = ("invoice", "deploy budget")
FAILED_SHARE: Final = 0.04
CHILD_SHARE: Final = 0.02
#: Imported Claude Code trees beside the loop's sessions (one for every ten), in the same 60 days: 2 to 4 prompts,
#: each answered by one or two model invocations with their text (the planted words at the same rates), billed to
#: the tree's top-level session; one in twenty with a subagent session.
IMPORTED_SHARE: Final = 0.1
IMPORTED_CHILD_SHARE: Final = 0.05
IMPORTED_PROFILE: Final = "claude-code"
#: Messages per session: a turn of 4 (user, assistant calling a tool, its result, answer) and one of 6 (two tools).
MESSAGES_PER_SESSION: Final = 10


def _vocabulary(rng: random.Random, size: int = 3000) -> list[str]:
    onsets = [
        "b",
        "c",
        "d",
        "f",
        "g",
        "h",
        "j",
        "k",
        "l",
        "m",
        "n",
        "p",
        "r",
        "s",
        "t",
        "v",
        "w",
        "z",
        "br",
        "cr",
        "dr",
        "fl",
        "gr",
        "pl",
        "st",
        "tr",
    ]
    vowels = ["a", "e", "i", "o", "u", "ai", "ea", "io", "ou"]
    codas = ["", "", "n", "r", "s", "l", "m", "x", "nd", "st"]
    made: set[str] = set()
    planted = set(SEARCH_WORDS)
    while len(made) < size:
        word = "".join(rng.choice(onsets) + rng.choice(vowels) for _ in range(rng.randint(2, 3))) + rng.choice(codas)
        if word not in planted and word not in WORDS:
            made.add(word)
    return [*WORDS, *sorted(made)]


class Text:
    """Sentences of Zipf-distributed words, with the planted search words at their rates.

    The words are drawn once (a pool of `pool` words); a sentence is a slice of it at a random offset. The
    vocabulary is the tests' words and made-up ones, `vocabulary` words in all.
    """

    def __init__(self, rng: random.Random, pool: int = 1 << 20, vocabulary: int = 3000 + len(WORDS)) -> None:
        self.rng = rng
        self.words = _vocabulary(rng, vocabulary - len(WORDS))
        weights = [1.0 / (rank + 1) for rank in range(len(self.words))]
        self.pool = rng.choices(self.words, cum_weights=list(itertools.accumulate(weights)), k=pool)
        planted = [(w, p) for w, p in SEARCH_WORDS.items() if p > 0]
        self.planted_words = [w for w, _ in planted]
        self.planted_cum = list(itertools.accumulate(p for _, p in planted))

    def sentence(self, n: int) -> str:
        start = int(self.rng.random() * (len(self.pool) - n))
        words = self.pool[start : start + n]
        draw = self.rng.random()
        if draw < self.planted_cum[-1]:
            words[int(self.rng.random() * n)] = self.planted_words[bisect.bisect_right(self.planted_cum, draw)]
        return " ".join(words).capitalize() + "."


#: COPY column lists, as the journal-writer's statements fill them (`search` is generated).
COLUMNS: Final[dict[str, tuple[str, ...]]] = {
    "profiles": ("id", "tags", "created_at", "updated_at"),
    "sessions": (
        "id",
        "profile_id",
        "source",
        "title",
        "tags",
        "parent_session_id",
        "context_snapshot",
        "created_at",
        "updated_at",
    ),
    "turns": (
        "id",
        "session_id",
        "profile_id",
        "parent_turn_id",
        "tags",
        "depth",
        "status",
        "error",
        "started_at",
        "finished_at",
    ),
    "messages": ("id", "session_id", "turn_id", "profile_id", "seq", "role", "content", "active", "created_at"),
    "tool_calls": (
        "id",
        "turn_id",
        "session_id",
        "profile_id",
        "call_id",
        "name",
        "args",
        "result",
        "is_error",
        "risk",
        "approval",
        "started_at",
        "finished_at",
    ),
    "approvals": ("id", "tool_call_id", "turn_id", "profile_id", "status", "decided_by", "decided_at"),
    "model_calls": tuple(c.name for c in MODEL_CALLS.columns),
    # The session graph's, as the graph writer fills them (`search` is generated).
    "graph.sessions": (
        "id",
        "parent_session_id",
        "spawned_by_tool_use_id",
        "started_at",
        "ended_at",
        "title",
        "outcome",
        "profile_id",
    ),
    "graph.user_inputs": (
        "id",
        "session_id",
        "ordinal",
        "text",
        "triggered_at",
        "interrupted",
        "kind",
        "origin",
        "metadata",
    ),
    "graph.model_invocations": (
        "id",
        "session_id",
        "user_input_id",
        "model",
        "input_tokens",
        "output_tokens",
        "cache_read_tokens",
        "cache_write_tokens",
        "total_tokens",
        "stop_reason",
        "started_at",
    ),
    "graph.assistant_messages": ("id", "session_id", "user_input_id", "model_invocation_id", "text", "timestamp"),
    "graph.vendor_ids": ("our_type", "vendor", "vendor_id_kind", "vendor_id", "our_id", "session_id"),
}
#: The graph's tables, loaded by the second connection with the calls.
GRAPH_COPY: Final = tuple(t for t in COLUMNS if t.startswith("graph."))


@dataclass
class Chunk:
    rows: dict[str, list[tuple[Any, ...]]] = field(default_factory=lambda: {t: [] for t in COLUMNS})


@dataclass(frozen=True)
class Watched:
    """A session of the loaded data: its id, profile and time (for cursors)."""

    id: uuid.UUID
    profile_id: str
    created_at: datetime


class Generator:
    """Rows of `sessions` sessions, chunk by chunk, their times spread evenly over the last 60 days."""

    def __init__(self, sessions: int, seed: int = 18) -> None:
        self.rng = random.Random(seed)
        self.text = Text(self.rng)
        self.sessions = sessions
        self.end = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
        self.start = self.end - timedelta(days=60)
        self.step = (self.end - self.start) / sessions
        self.snapshot = _json({"system_prompt": "Be brief.", "memory": []})
        self.pricer = Pricer()
        #: A priced call's own columns (request_id to price_detail), by its model and sizes.
        self.priced: dict[tuple[int, int, int], tuple[Any, ...]] = {}
        self.recent_roots: list[tuple[Id, str, Id, tuple[str, ...]]] = []
        self.profile_names = [p for p, _ in PROFILES]
        self.profile_cum = list(itertools.accumulate([w for _, w in PROFILES]))
        self.source_names = [s for s, _ in SOURCES]
        self.source_cum = list(itertools.accumulate([w for _, w in SOURCES]))
        self.done = 0

    def profiles(self) -> list[tuple[Any, ...]]:
        return [(p, [], self.start, self.start) for p in self.profile_names]

    def _model_call(
        self, chunk: Chunk, profile: str, sid: Id, tid: Id | None, tags: Any, at: datetime, models: int = len(MODELS)
    ) -> None:
        """A priced call of the session (and turn); its model one of the first `models` of MODELS."""
        rand = self.rng.random
        key = (int(rand() * models), int(rand() * 40), int(rand() * 20))
        priced = self.priced.get(key)
        if priced is None:
            provider, model = MODELS[key[0]]
            event = ev.ModelCallCompleted(
                profile_id=profile,
                session_id=uuid.UUID(bytes=sid.bytes),
                turn_id=None if tid is None else uuid.UUID(bytes=tid.bytes),
                provider=provider,
                model=model,
                input_tokens=200 + 150 * key[1],
                output_tokens=20 + 40 * key[2],
                latency_s=0.4 + key[2] / 10,
                occurred_at=at,
            )
            # Columns 4 to 22 are the call's own.
            priced = self.priced[key] = tuple(MODEL_CALLS.row_args(build_row(event, self.pricer))[4:23])
        # The priced row with this call's ids, tags and time.
        chunk.rows["model_calls"].append((uuid7(), profile, sid, tid, *priced, tags, at))

    def chunk(self, count: int) -> Chunk:
        chunk = Chunk()
        rows = chunk.rows
        rng, text = self.rng, self.text
        rand = rng.random

        def below(n: int) -> int:
            return int(rand() * n)

        def ms(lo: int, hi: int) -> timedelta:
            return timedelta(milliseconds=lo + int(rand() * (hi - lo)))

        for i in range(self.done, min(self.done + count, self.sessions)):
            at = self.start + self.step * i + ms(0, 1000)
            sid = uuid7()
            parent: tuple[Id, str, Id, tuple[str, ...]] | None = None
            if self.recent_roots and rng.random() < CHILD_SHARE:
                parent = rng.choice(self.recent_roots)
                profile, tags = parent[1], parent[3]
            else:
                profile = rng.choices(self.profile_names, cum_weights=self.profile_cum)[0]
                tags = (rng.choice(CLIENTS), rng.choice(TEAMS)) if rng.random() < 0.3 else (rng.choice(CLIENTS),)
            source = rng.choices(self.source_names, cum_weights=self.source_cum)[0]
            tag_list = list(tags)
            seq = 0
            title: str | None = None
            t = at
            failed = rng.random() < FAILED_SHARE
            turn_ids = []
            for n, tool_rounds in enumerate((1, 2)):
                tid = uuid7()
                turn_ids.append(tid)
                t += timedelta(milliseconds=10)
                started = t
                parent_turn = parent[2] if parent is not None and n == 0 else None

                def message(content: Message, sid: Id = sid, tid: Id = tid, profile: str = profile) -> None:
                    nonlocal seq, t
                    seq += 1
                    t += ms(200, 4000)
                    role = type(content).__struct_config__.tag
                    rows["messages"].append((uuid7(), sid, tid, profile, seq, role, _json(content), True, t))

                user_text = text.sentence(4 + below(27))
                if title is None:
                    title = _text(title_from_text(user_text))
                message(UserMessage(text=user_text))
                for r in range(tool_rounds):
                    name = TOOLS[below(len(TOOLS))]
                    call_id = f"call_{n}_{r}"
                    args = {"path": f"/srv/{text.words[below(200)]}/{below(1000)}.txt"}
                    self._model_call(chunk, profile, sid, tid, tag_list, t)
                    message(AssistantMessage(tool_calls=(ToolCall(id=call_id, name=name, args=args),)))
                    result = text.sentence(400 if rand() < 0.05 else 10 + below(31))
                    tool_id = uuid7()
                    risky = rng.random() < 0.03
                    approval = "approved" if risky else None
                    if risky:
                        approval_id = _approval_id(uuid.UUID(bytes=tool_id.bytes))
                        rows["approvals"].append((approval_id, tool_id, tid, profile, "approved", "console:olivia", t))
                    rows["tool_calls"].append(
                        (
                            tool_id,
                            tid,
                            sid,
                            profile,
                            call_id,
                            name,
                            _json(args),
                            result,
                            False,
                            "high" if risky else "low",
                            approval,
                            t,
                            t + ms(5, 900),
                        )
                    )
                    message(ToolResultMessage(call_id=call_id, content=result))
                self._model_call(chunk, profile, sid, tid, tag_list, t)
                message(AssistantMessage(text=text.sentence(5 + below(56))))
                status, error = ("completed", None)
                if failed and n == 1:
                    status, error = ("failed", "model_error: upstream overloaded")
                rows["turns"].append(
                    (tid, sid, profile, parent_turn, tag_list, 1 if parent_turn else 0, status, error, started, t)
                )
            first_turn_at = at + timedelta(milliseconds=10)
            rows["sessions"].append(
                (
                    sid,
                    profile,
                    source,
                    title,
                    tag_list,
                    parent[0] if parent is not None else None,
                    self.snapshot,
                    at,
                    first_turn_at,
                )
            )
            if parent is None:
                self.recent_roots.append((sid, profile, turn_ids[0], tags))
                if len(self.recent_roots) > 20:
                    self.recent_roots.pop(0)
            if rand() < IMPORTED_SHARE:
                self._imported_tree(chunk, at + ms(0, 1000))
        self.done = min(self.done + count, self.sessions)
        return chunk

    def _imported_tree(self, chunk: Chunk, at: datetime) -> None:
        """An imported Claude Code tree's graph rows and its billed calls (see IMPORTED_SHARE)."""
        rows, text, rand = chunk.rows, self.text, self.rng.random
        root = uuid7()
        t = at
        tree: list[tuple[Id, Id | None]] = [(root, None)]
        if rand() < IMPORTED_CHILD_SHARE:
            tree.append((uuid7(), root))
        for sid, parent in tree:
            started = t
            title: str | None = None
            for ordinal in range(1 if parent else 2 + int(rand() * 3)):
                prompt = text.sentence(6 + int(rand() * 35))
                title = title or _text(title_from_text(prompt))
                input_id = uuid7()
                origin = "agent" if parent else "human"
                rows["graph.user_inputs"].append((input_id, sid, ordinal, prompt, t, False, "prompt", origin, "{}"))
                for _ in range(1 + int(rand() * 2)):
                    t += timedelta(milliseconds=500 + int(rand() * 20_000))
                    invocation = uuid7()
                    tokens = (300 + int(rand() * 4000), 20 + int(rand() * 800), int(rand() * 30_000))
                    rows["graph.model_invocations"].append(
                        (invocation, sid, input_id, MODELS[0][1], *tokens, 0, sum(tokens), "end_turn", t)
                    )
                    reply = text.sentence(5 + int(rand() * 56))
                    rows["graph.assistant_messages"].append((uuid7(), sid, input_id, invocation, reply, t))
                    # The importer bills a tree's calls to its top-level session.
                    self._model_call(chunk, IMPORTED_PROFILE, root, None, ["vendor:claude-code"], t, models=2)
            spawned_by = uuid7() if parent else None
            rows["graph.sessions"].append((sid, parent, spawned_by, started, t, title, "unknown", IMPORTED_PROFILE))
        rows["graph.vendor_ids"].append(("session", "claude-code", "session_id", str(root), root, root))


async def _connect(dsn: str) -> asyncpg.Connection:
    return await asyncpg.connect(dsn)


async def _leaf_tables(conn: asyncpg.Connection, tables: Iterable[str]) -> list[str]:
    """The tables holding rows: each table, or each month of a partitioned one (storage settings are theirs)."""
    out: list[str] = []
    for table in tables:
        months = await conn.fetch(
            "SELECT inhrelid::regclass::text AS name FROM pg_inherits WHERE inhparent = $1::regclass", table
        )
        out += [r["name"] for r in months] if months else [table]
    return out


async def load(dsn: str, sessions: int, say: Callable[[str], None], chunk_sessions: int = 5000) -> dict[str, float]:
    """The tables filled (see the module's docstring); returns the seconds of each step."""
    took: dict[str, float] = {}
    conn = await _connect(dsn)
    try:
        await apply_schemas(conn, [CORE_SCHEMA, BILLING_SCHEMA, GRAPH_SCHEMA])
        indexes = await conn.fetch(
            """
            SELECT i.schemaname, i.indexname, i.indexdef FROM pg_indexes i
            WHERE (i.schemaname || '.' || i.tablename = ANY($1::text[])
                   OR i.schemaname = 'public' AND i.tablename = ANY($1::text[]))
              AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conname = i.indexname)
            """,
            list(COLUMNS),
        )
        for r in indexes:
            await conn.execute(f'DROP INDEX "{r["schemaname"]}"."{r["indexname"]}"')
        gen = Generator(sessions)
        # The months the rows fall in (the tables that grow are partitioned by month): made before the COPY.
        await partitions.ensure_range(conn, gen.start, gen.end + timedelta(days=1))
        for table in await _leaf_tables(conn, COLUMNS):  # VACUUM (ANALYZE) follows the load: no autovacuum meanwhile
            await conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    finally:
        await conn.close()
    started = time.monotonic()
    loaders = [await _connect(dsn) for _ in range(2)]
    try:
        for c in loaders:
            await c.execute("SET session_replication_role = replica")
        await loaders[0].copy_records_to_table("profiles", records=gen.profiles(), columns=COLUMNS["profiles"])

        async def copy(c: asyncpg.Connection, tables: Sequence[str], chunk: Chunk) -> None:
            for table in tables:
                schema, _, name = table.rpartition(".")  # asyncpg quotes the name whole: the schema apart
                await c.copy_records_to_table(
                    name, records=chunk.rows[table], columns=COLUMNS[table], schema_name=schema or None
                )

        pending: Awaitable[Any] | None = None
        while gen.done < gen.sessions:
            chunk = await asyncio.to_thread(gen.chunk, chunk_sessions)
            if pending is not None:
                await pending
            if gen.done % (chunk_sessions * 4) == 0:
                say(f"console: {gen.done:,} of {gen.sessions:,} sessions generated")
            pending = asyncio.gather(
                copy(loaders[0], ("sessions", "turns", "messages"), chunk),
                copy(loaders[1], ("tool_calls", "approvals", "model_calls", *GRAPH_COPY), chunk),
            )
        if pending is not None:
            await pending
        took["copy_s"] = time.monotonic() - started
        say(f"console: {sessions:,} sessions copied in {took['copy_s']:.1f} s; creating {len(indexes)} indexes")
        started = time.monotonic()
        for c in loaders:
            await c.execute("SET maintenance_work_mem = '256MB'")
        queue = sorted(indexes, key=lambda r: not r["indexname"].endswith("_search"))  # the longest first

        async def build(c: asyncpg.Connection) -> None:
            while queue:
                # a partitioned table's index is shown `ON ONLY` the parent: made here for every month
                await c.execute(queue.pop(0)["indexdef"].replace(" ON ONLY ", " ON "))

        await asyncio.gather(*(build(c) for c in loaders))
        took["index_s"] = time.monotonic() - started
        started = time.monotonic()
        # Billing's per-session totals of the calls, as its schema fills them on a database billed before them.
        await loaders[1].execute(BACKFILL_SESSION_COSTS)
        took["rollup_s"] = time.monotonic() - started
        started = time.monotonic()
        await asyncio.gather(
            loaders[0].execute("VACUUM (ANALYZE) messages"),
            loaders[1].execute(
                "VACUUM (ANALYZE) sessions, turns, tool_calls, approvals, model_calls, session_costs, profiles, "
                + ", ".join(GRAPH_COPY)
            ),
        )
        took["vacuum_s"] = time.monotonic() - started
        for table in await _leaf_tables(loaders[0], COLUMNS):
            await loaders[0].execute(f"ALTER TABLE {table} RESET (autovacuum_enabled)")
    finally:
        for c in loaders:
            await c.close()
    return took


# --- measuring ------------------------------------------------------------------------------------------


def pct(samples: Sequence[float], p: float) -> float:
    """The p-quantile (nearest rank) of `samples`, in ms (samples are in seconds)."""
    ordered = sorted(samples)
    rank = max(1, math.ceil(p * len(ordered)))
    return 1000 * ordered[min(rank, len(ordered)) - 1]


@dataclass
class Timings:
    """Samples (seconds) by case, e.g. "list first page"."""

    cases: dict[str, list[float]] = field(default_factory=dict)

    def add(self, case: str, seconds: float) -> None:
        self.cases.setdefault(case, []).append(seconds)

    def all(self) -> list[float]:
        return [s for v in self.cases.values() for s in v]

    def lines(self) -> list[str]:
        return [
            f"  {case}: p50 {pct(v, 0.5):.1f} ms, p95 {pct(v, 0.95):.1f} ms, max {pct(v, 1.0):.1f} ms (n={len(v)})"
            for case, v in self.cases.items()
        ]


@dataclass
class ConsoleResult:
    figures: dict[str, float | int] = field(default_factory=dict)
    baselines: dict[str, float | int] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)


@dataclass
class Request:
    """One measured list request: its case name and its query parameters (cursor at a depth, or none)."""

    case: str
    params: dict[str, str]
    filters: SessionFilters
    cursor: str | None


async def timed_get(http: aiohttp.ClientSession, path: str) -> tuple[float, bytes]:
    """GET `path`: (seconds from sending the request to the end of the body, the body); raises unless 200."""
    started = time.perf_counter()
    async with http.get(path) as r:
        body = await r.read()
        took = time.perf_counter() - started
        if r.status != 200:
            raise BenchError(f"GET {path} answered {r.status}: {body[:300]!r}")
    return took, body


@contextlib.asynccontextmanager
async def signed_in_console(
    root: Path, logs: Path, nats_url: str, dsn: str
) -> AsyncIterator[tuple[aiohttp.ClientSession, ServiceRun]]:
    """The console (`python -m commonos.console`, its own process) on `dsn`, and an HTTP session signed in to it as
    an operator (POST /api/login, the cookie; keep-alive connections); the console is stopped on leaving."""
    port = free_port()
    users = root / "console-users.toml"
    users.write_text(render_users([User(USER, Role.OPERATOR, password_hash=hash_password(PASSWORD))]))
    console = ServiceRun(
        "console",
        "commonos.console",
        {
            "COS_NATS_URL": nats_url,
            "COS_DATABASE_URL": dsn,
            "COS_CONSOLE_PORT": str(port),
            "COS_CONSOLE_USERS": str(users),
            "COS_CONSOLE_SECRET": "bench-console-secret-0123456789",
            "COS_CONSOLE_INSECURE_COOKIES": "1",
            "COS_LOG_LEVEL": "WARNING",
        },
        logs / "console.log",
        http_port=port,
    )
    console.start()
    try:
        await console.wait_ready()
        async with aiohttp.ClientSession(
            base_url=f"http://127.0.0.1:{port}",
            cookie_jar=aiohttp.CookieJar(unsafe=True),
            connector=aiohttp.TCPConnector(limit=4),
        ) as http:
            async with http.post("/api/login", json={"name": USER, "password": PASSWORD}) as r:
                if r.status != 200:
                    raise BenchError(f"console sign-in answered {r.status}: {await r.text()}")
            yield http, console
    finally:
        await console.stop()


class ConsolePhase:
    def __init__(
        self,
        root: Path,
        logs: Path,
        pg: PostgresCluster,
        say: Callable[[str], None],
        sessions: int,
        rounds: int = 3,
        live_events: int = 300,
        live_rate: float = 50.0,
    ) -> None:
        self.root, self.logs, self.pg, self.say = root, logs, pg, say
        self.sessions = sessions
        self.rounds = rounds
        self.live_events = live_events
        self.live_rate = live_rate
        self.rng = random.Random(5)

    async def _fresh_db(self) -> str:
        admin = await asyncpg.connect(self.pg.url)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
            await admin.execute(f'CREATE DATABASE "{DB}"')
        finally:
            await admin.close()
        return self.pg.dsn(DB)

    async def _drop_db(self) -> None:
        admin = await asyncpg.connect(self.pg.url)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
        finally:
            await admin.close()

    async def run(self) -> ConsoleResult:
        result = ConsoleResult()
        dsn = await self._fresh_db()
        nats = NatsServer(self.root / "nats-console")
        try:
            started = time.monotonic()
            cpu_before = cpu_seconds()
            took = await load(dsn, self.sessions, self.say)
            load_s = time.monotonic() - started
            cpu = {k: v - cpu_before.get(k, 0.0) for k, v in cpu_seconds().items()}
            counts = await self._counts(dsn)
            result.figures |= {
                "console_sessions": counts["sessions"],
                "console_messages": counts["messages"],
                "console_imported_sessions": counts["graph.sessions"],
                "console_imported_texts": counts["graph.user_inputs"] + counts["graph.assistant_messages"],
                "console_load_s": round(load_s, 1),
            }
            self.say(
                f"console: loaded {counts['sessions']:,} sessions, {counts['messages']:,} messages, "
                f"{counts['tool_calls']:,} tool calls, {counts['model_calls']:,} model calls, "
                f"{counts['graph.sessions']:,} imported sessions in {load_s:.1f} s "
                f"(COPY {took['copy_s']:.1f} s, indexes {took['index_s']:.1f} s, "
                f"session_costs {took['rollup_s']:.1f} s, "
                f"VACUUM ANALYZE {took['vacuum_s']:.1f} s); CPU used: "
                + ", ".join(f"{k} {v:.0f} s" for k, v in sorted(cpu.items()))
            )
            nats.start()
            nc = await nats_connect(Settings(nats_url=nats.url), "cos-bench-console")
            try:
                await ensure_streams(nc.jetstream())
            finally:
                await nc.close()
            async with signed_in_console(self.root, self.logs, nats.url, dsn) as (http, console):
                conn = await asyncpg.connect(dsn)
                try:
                    await self.measure(http, conn, console, result)
                finally:
                    await conn.close()
                console.check_alive()
                result.figures["console_peak_rss_mb"] = round((console.peak_rss_kb() or 0) / 1024, 1)
        finally:
            nats.stop()
            await self._drop_db()
        return result

    async def _counts(self, dsn: str) -> dict[str, int]:
        conn = await asyncpg.connect(dsn)
        try:
            return {t: int(await conn.fetchval(f"SELECT count(*) FROM {t}")) for t in COLUMNS}
        finally:
            await conn.close()

    # --- the cases ---

    async def _list_requests(self, conn: asyncpg.Connection) -> tuple[list[Request], list[Request]]:
        """(list requests, search requests): each filter at the first page and at cursors deep in the list."""
        total = int(await conn.fetchval("SELECT count(*) FROM sessions"))
        # The first page, and pages starting 10%, 50% and 90% down the list.
        cursors: list[tuple[str, str | None]] = [("first page", None)]
        for share in (0.1, 0.5, 0.9):
            row = await conn.fetchrow(
                "SELECT created_at, id FROM sessions ORDER BY created_at DESC, id DESC OFFSET $1 LIMIT 1",
                int(total * share),
            )
            assert row is not None
            cursors.append((f"at {int(share * 100)}%", encode_cursor(row["created_at"], row["id"])))
        newest = await conn.fetchval("SELECT max(created_at) FROM sessions")
        week_ago = (newest - timedelta(days=7)).isoformat()
        two_weeks_ago = (newest - timedelta(days=14)).isoformat()
        filters: list[tuple[str, dict[str, str]]] = [
            ("no filter", {}),
            ("profile", {"profile": "sales"}),
            ("tag", {"tag": "client:initech"}),
            ("team tag", {"tag": "team:infra"}),
            ("source", {"source": "api"}),
            ("status", {"status": "failed"}),
            ("time range", {"since": two_weeks_ago, "until": week_ago}),
            ("profile+tag+source", {"profile": "ops", "tag": "client:acme", "source": "web"}),
        ]
        lists = [
            Request(f"list {name}", params, _filters(params), cursor)
            for name, params in filters
            for _, cursor in cursors
        ]
        # Sorted by cost (the first page; the next pages are walked in `measure`): the default range (the last
        # days), a month, a range of a week two weeks back, with a filter; the imported sessions alone.
        month_ago = (newest - timedelta(days=30)).isoformat()
        by_cost: list[tuple[str, dict[str, str]]] = [
            ("by cost", {"sort": "cost"}),
            ("by cost, last 30 days", {"sort": "cost", "since": month_ago}),
            ("by cost, time range", {"sort": "cost", "since": two_weeks_ago, "until": week_ago}),
            ("by cost + profile", {"sort": "cost", "profile": "ops"}),
            ("by cost + tag", {"sort": "cost", "tag": "client:initech"}),
            ("by cost, imported", {"sort": "cost", "kind": "imported", "since": month_ago}),
        ]
        lists += [Request(f"list {name}", params, _filters(params), None) for name, params in by_cost]
        lists += [
            Request(f"list imported{name}", {"kind": "imported"}, _filters({"kind": "imported"}), cursor)
            for name, cursor in (("", None), (", at 50%", cursors[2][1]))
        ]
        queries = [*SEARCH_WORDS, *COMMON_QUERIES]
        searches = [
            Request(f"search {q!r}", {"q": q}, _filters({"q": q}), cursor) for q in queries for _, cursor in cursors[:2]
        ]
        searches += [
            Request(f"search {q!r} + profile", {"q": q, "profile": "ops"}, _filters({"q": q, "profile": "ops"}), None)
            for q in ("quokka", "invoice")
        ]
        # Imported work alone (its prompts and replies), and search sorted by cost.
        searches += [
            Request(f"search {q!r}, imported", params, _filters(params), None)
            for q in ("quokka", "invoice")
            for params in ({"q": q, "kind": "imported"},)
        ]
        searches += [
            Request(
                f"search {q!r} by cost, last 30 days",
                {"q": q, "sort": "cost", "since": month_ago},
                _filters({"q": q, "sort": "cost", "since": month_ago}),
                None,
            )
            for q in ("quokka", "invoice")
        ]
        return lists, searches

    async def _get(self, http: aiohttp.ClientSession, path: str) -> tuple[float, bytes]:
        return await timed_get(http, path)

    async def measure(
        self, http: aiohttp.ClientSession, conn: asyncpg.Connection, console: ServiceRun, out: ConsoleResult
    ) -> None:
        lists, searches = await self._list_requests(conn)
        api, direct = Timings(), Timings()
        search_api, search_direct = Timings(), Timings()
        #: The cost-sorted lists among `api`'s, on their own too.
        by_cost = Timings()
        # One untimed pass (connections of the console's pool, caches), then `rounds` timed passes, interleaved
        # with the direct queries so both see the same state of the machine.
        for rnd in range(self.rounds + 1):
            for req in [*lists, *searches]:
                params = dict(req.params)
                if req.cursor is not None:
                    params["cursor"] = req.cursor
                took, _ = await self._get(http, "/api/sessions?" + urlencode(params))
                started = time.perf_counter()
                async with conn.transaction(readonly=True):
                    page = await list_sessions(conn, req.filters, req.cursor)
                direct_took = time.perf_counter() - started
                if not page.sessions and req.cursor is None and req.filters.q != "xylophonist":
                    self.say(f"console: {req.case} found no session")
                if rnd == 0:
                    continue
                is_search = req.filters.q is not None
                (search_api if is_search else api).add(req.case, took)
                (search_direct if is_search else direct).add(req.case, direct_took)
                if not is_search and req.filters.sort == "cost":
                    by_cost.add(req.case, took)
            # The next pages after the first: a person paging on, newest first and by cost.
            if rnd:
                for name, query in (("", ""), (" by cost", "sort=cost")):
                    cursor: str | None = None
                    for _ in range(5):
                        page_query = "&".join(p for p in (query, f"cursor={cursor}" if cursor else "") if p)
                        took, body = await self._get(http, "/api/sessions" + (f"?{page_query}" if page_query else ""))
                        api.add(f"list no filter{name}, next pages", took)
                        if name:
                            by_cost.add(f"list no filter{name}, next pages", took)
                        cursor = _next_cursor(body)
            console.check_alive()
        f, b = out.figures, out.baselines
        f["console_list_p50_ms"] = round(pct(api.all(), 0.5), 1)
        f["console_list_p95_ms"] = round(pct(api.all(), 0.95), 1)
        f["console_list_max_ms"] = round(pct(api.all(), 1.0), 1)
        f["console_list_requests"] = len(api.all())
        f["console_list_by_cost_p95_ms"] = round(pct(by_cost.all(), 0.95), 1)
        b["console_list_direct_p95_ms"] = round(pct(direct.all(), 0.95), 1)
        f["console_search_p50_ms"] = round(pct(search_api.all(), 0.5), 1)
        f["console_search_p95_ms"] = round(pct(search_api.all(), 0.95), 1)
        f["console_search_max_ms"] = round(pct(search_api.all(), 1.0), 1)
        f["console_search_requests"] = len(search_api.all())
        b["console_search_direct_p95_ms"] = round(pct(search_direct.all(), 0.95), 1)
        out.lines += ["session list (console over HTTP; first page and pages at 10/50/90%):", *api.lines()]
        out.lines += ["session list (the same queries directly):", *direct.lines()]
        out.lines += ["search (console over HTTP; first page and the page at 10%):", *search_api.lines()]
        out.lines += ["search (the same queries directly):", *search_direct.lines()]

        # Session pages: random sessions, the HTML page and the same data directly.
        ids = [r["id"] for r in await conn.fetch("SELECT id FROM sessions TABLESAMPLE BERNOULLI (5) LIMIT 2000")]
        ids += [
            r["id"]
            for r in await conn.fetch(
                "SELECT DISTINCT parent_session_id AS id FROM sessions WHERE parent_session_id IS NOT NULL LIMIT 20"
            )
        ]
        self.rng.shuffle(ids)
        pages, page_direct = Timings(), Timings()
        server_before: dict[str, float] = {}
        for n, sid in enumerate(ids[: 30 + 100 * self.rounds // 3]):
            if n == 10:
                server_before = await _server_times(http, SESSION_ROUTE)
            took, _ = await self._get(http, f"/sessions/{sid}")
            started = time.perf_counter()
            async with conn.transaction(readonly=True):
                view = await load_session(conn, sid)
            if view is None:
                raise BenchError(f"session {sid} not found directly")
            if n >= 10:  # the first ten warm up
                pages.add("session page /sessions/{id}", took)
                page_direct.add("load_session directly", time.perf_counter() - started)
        server_after = await _server_times(http, SESSION_ROUTE)
        server_line = "  the console's own histogram: no requests counted"
        served = server_after["count"] - server_before.get("count", 0.0)
        if served > 0:
            within = server_after["0.2"] - server_before.get("0.2", 0.0)
            mean_ms = 1000 * (server_after["sum"] - server_before.get("sum", 0.0)) / served
            f["console_session_page_server_mean_ms"] = round(mean_ms, 1)
            f["console_session_page_server_within_200ms_pct"] = round(100 * within / served, 1)
            server_line = (
                f"  the console's own histogram (request to response start): mean {mean_ms:.1f} ms, "
                f"{within:.0f} of {served:.0f} within 200 ms"
            )
        f["console_session_page_p50_ms"] = round(pct(pages.all(), 0.5), 1)
        f["console_session_page_p95_ms"] = round(pct(pages.all(), 0.95), 1)
        f["console_session_page_max_ms"] = round(pct(pages.all(), 1.0), 1)
        f["console_session_pages"] = len(pages.all())
        b["console_session_direct_p95_ms"] = round(pct(page_direct.all(), 0.95), 1)
        out.lines += ["session page:", *pages.lines(), *page_direct.lines(), server_line]

        live = await self.live(http, conn, console)
        f["console_live_p50_ms"] = round(pct(live, 0.5), 1)
        f["console_live_p99_ms"] = round(pct(live, 0.99), 1)
        f["console_live_max_ms"] = round(pct(live, 1.0), 1)
        f["console_live_events"] = len(live)
        out.lines.append(
            f"event-to-browser over {len(live)} events at {self.live_rate:g}/s: p50 {f['console_live_p50_ms']} ms, "
            f"p99 {f['console_live_p99_ms']} ms, max {f['console_live_max_ms']} ms"
        )
        await self.timeline_in_a_browser(http, conn, console, out)

    async def live(self, http: aiohttp.ClientSession, conn: asyncpg.Connection, console: ServiceRun) -> list[float]:
        """Events of a watched session published to JetStream; the time until each one's fragment is read."""
        row = await conn.fetchrow(
            "SELECT s.id, s.profile_id, s.tags, (SELECT max(seq) FROM messages m WHERE m.session_id = s.id) AS seq "
            "FROM sessions s ORDER BY created_at DESC LIMIT 1"
        )
        if row is None:
            raise BenchError("no session to watch")
        sid, profile, tags, seq = row["id"], row["profile_id"], tuple(row["tags"]), int(row["seq"])
        sent: dict[str, float] = {}
        seen: dict[str, float] = {}
        markers = [f"probe{n:05d}x" for n in range(self.live_events)]
        done = asyncio.Event()
        ready = asyncio.Event()
        settings = Settings(nats_url=_nats_url(console))
        async with http.get(f"/sessions/{sid}/live", timeout=aiohttp.ClientTimeout(total=None)) as r:
            if r.status != 200:
                raise BenchError(f"/sessions/{sid}/live answered {r.status}")

            async def read() -> None:
                async for raw in r.content:
                    now = time.perf_counter()
                    line = raw.decode(errors="replace")
                    if line.startswith("event: ready"):
                        ready.set()
                    if "probe" in line:
                        for part in line.split("probe")[1:]:
                            marker = "probe" + part[:6]
                            if marker in sent and marker not in seen:
                                seen[marker] = now
                        if len(seen) == len(markers):
                            done.set()
                            return

            reader = asyncio.create_task(read())
            try:
                await asyncio.wait_for(ready.wait(), 10)
                nc = await nats_connect(settings, "cos-bench-console-live")
                try:
                    publisher = EventPublisher(nc.jetstream(), "urn:commonos:bench", nc=nc)
                    turn = new_id()
                    await publisher.publish(
                        ev.TurnStarted(
                            profile_id=profile, session_id=sid, turn_id=turn, tags=tags, occurred_at=datetime.now(UTC)
                        )
                    )
                    interval = 1.0 / self.live_rate
                    next_at = time.perf_counter()
                    for n, marker in enumerate(markers):
                        now = datetime.now(UTC)
                        event: ev.Event
                        if n % 5 == 4:
                            event = ev.ToolCallRecorded(
                                profile_id=profile,
                                session_id=sid,
                                turn_id=turn,
                                tool_call_id=new_id(),
                                call_id=f"call_{n}",
                                name="read_file",
                                args={"path": f"/srv/{marker}.txt"},
                                result=f"{marker} contents",
                                is_error=False,
                                risk=ev.Risk.LOW,
                                started_at=now,
                                finished_at=now,
                                occurred_at=now,
                            )
                        else:
                            seq += 1
                            event = ev.MessageAppended(
                                profile_id=profile,
                                session_id=sid,
                                turn_id=turn,
                                seq=seq,
                                content=AssistantMessage(text=f"Step {n}: {marker} {self.rng.choice(WORDS)}"),
                                occurred_at=now,
                            )
                        sent[marker] = time.perf_counter()
                        await publisher.publish(event)
                        next_at += interval
                        await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
                    await publisher.publish(
                        ev.TurnFinished(
                            profile_id=profile,
                            session_id=sid,
                            turn_id=turn,
                            status=ev.TurnStatus.COMPLETED,
                            occurred_at=datetime.now(UTC),
                        )
                    )
                finally:
                    await nc.close()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), 10)
            finally:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
                    await reader
        console.check_alive()
        missing = len(markers) - len(seen)
        if missing:
            raise BenchError(f"{missing} of {len(markers)} live events never reached the stream")
        return [seen[m] - sent[m] for m in markers]

    async def timeline_in_a_browser(
        self, http: aiohttp.ClientSession, conn: asyncpg.Connection, console: ServiceRun, out: ConsoleResult
    ) -> None:
        """The session page with its turn timeline in headless Chromium (Debian's, as the console's browser tests
        drive it; without it the figures are left out, saying why): a session page of the loaded data until its
        timeline is drawn; then a turn of that session published at `live_rate` as the loop publishes it (model
        calls, each tool call requested, recorded and answered), from just before each publish to the moment the
        page shows it (a MutationObserver notes when each event's marker appears; both sides read this machine's
        wall clock)."""
        try:
            from playwright.async_api import Error as PlaywrightError
            from playwright.async_api import async_playwright
        except ImportError:
            self.say("console: timeline in a browser skipped: playwright is not installed (pip install -e '.[dev]')")
            return
        chromium = shutil.which(os.environ.get("COS_CHROMIUM") or "chromium")
        if chromium is None:
            self.say("console: timeline in a browser skipped: no chromium on PATH (scripts/setup installs it)")
            return
        row = await conn.fetchrow(
            "SELECT s.id, s.profile_id, s.tags, (SELECT max(seq) FROM messages m WHERE m.session_id = s.id) AS seq "
            "FROM sessions s WHERE s.parent_session_id IS NULL ORDER BY created_at DESC OFFSET 1 LIMIT 1"
        )
        if row is None:
            raise BenchError("no session to watch")
        sid, profile, tags, seq = row["id"], row["profile_id"], tuple(row["tags"]), int(row["seq"])
        base = f"http://127.0.0.1:{console.env['COS_CONSOLE_PORT']}"
        cookies = [
            {"name": c.key, "value": c.value, "url": base} for c in http.cookie_jar if c.key and c.value is not None
        ]
        loads: list[float] = []
        seen: dict[str, float] = {}
        sent: dict[str, float] = {}
        async with async_playwright() as pw:
            args = ["--no-sandbox"] if os.geteuid() == 0 else []
            browser = await pw.chromium.launch(executable_path=chromium, headless=True, args=args)
            try:
                context = await browser.new_context(base_url=base, viewport={"width": 1280, "height": 800})
                await context.add_cookies(cookies)  # type: ignore[arg-type]
                page = await context.new_page()
                ids = [r["id"] for r in await conn.fetch("SELECT id FROM sessions ORDER BY random() LIMIT 25")]
                for n, other in enumerate(ids):
                    started = time.perf_counter()
                    await page.goto(f"/sessions/{other}", wait_until="domcontentloaded")
                    await page.wait_for_function("() => document.querySelectorAll('.turn-timeline').length > 0")
                    if n >= 5:  # the first five warm up
                        loads.append(time.perf_counter() - started)
                await page.add_init_script(TIMELINE_WATCH)
                await page.goto(f"/sessions/{sid}")
                await page.wait_for_function("() => window.__cosReady === true", timeout=10_000)
                sent = await self._publish_turn(console, profile, sid, tags, seq)
                markers = list(sent)
                try:
                    await page.wait_for_function(
                        "(n) => Object.keys(window.__cosSeen).length >= n", arg=len(markers), timeout=15_000
                    )
                except PlaywrightError as exc:
                    self.say(f"console: timeline in a browser: not every event shown ({type(exc).__name__})")
                seen = await page.evaluate("window.__cosSeen")
            finally:
                await browser.close()
        console.check_alive()
        missing = [m for m in sent if m not in seen]
        if missing:
            raise BenchError(f"{len(missing)} of {len(sent)} events never shown in the browser, e.g. {missing[:3]}")
        took = [max(seen[m] - sent[m], 0.0) / 1000 for m in sent]  # seconds, as `pct` takes them
        f = out.figures
        f["console_timeline_page_p50_ms"] = round(pct(loads, 0.5), 1)
        f["console_timeline_page_p95_ms"] = round(pct(loads, 0.95), 1)
        f["console_browser_live_p50_ms"] = round(pct(took, 0.5), 1)
        f["console_browser_live_p99_ms"] = round(pct(took, 0.99), 1)
        f["console_browser_live_max_ms"] = round(pct(took, 1.0), 1)
        f["console_browser_live_events"] = len(took)
        out.lines.append(
            f"session page with its timeline drawn, in Chromium ({len(loads)} pages): p50 "
            f"{f['console_timeline_page_p50_ms']} ms, p95 {f['console_timeline_page_p95_ms']} ms"
        )
        out.lines.append(
            f"event-to-browser in Chromium, merged into the turn and its timeline, over {len(took)} events at "
            f"{self.live_rate:g}/s: p50 {f['console_browser_live_p50_ms']} ms, p99 {f['console_browser_live_p99_ms']} "
            f"ms, max {f['console_browser_live_max_ms']} ms"
        )

    async def _publish_turn(
        self, console: ServiceRun, profile: str, sid: uuid.UUID, tags: tuple[str, ...], seq: int
    ) -> dict[str, float]:
        """A turn of `live_events` events at `live_rate`: per step a model call, an assistant message requesting a
        tool, the call recorded, its result, each with its own marker; {marker: wall-clock ms just before publish}."""
        sent: dict[str, float] = {}
        nc = await nats_connect(Settings(nats_url=_nats_url(console)), "cos-bench-console-timeline")
        try:
            publisher = EventPublisher(nc.jetstream(), "urn:commonos:bench", nc=nc)
            turn = new_id()
            base: dict[str, Any] = {"profile_id": profile, "session_id": sid, "turn_id": turn}
            await publisher.publish(ev.TurnStarted(**base, tags=tags, occurred_at=datetime.now(UTC)))
            interval = 1.0 / self.live_rate
            next_at = time.perf_counter()
            for n in range(self.live_events):
                marker = f"mark{n:05d}q"
                now = datetime.now(UTC)
                step, call = n % 4, f"call_{n // 4}"
                event: ev.Event
                if step == 0:
                    event = ev.ModelCallCompleted(
                        **base, provider="anthropic", model=marker, input_tokens=900, output_tokens=40,
                        latency_s=0.2, tags=tags, occurred_at=now,
                    )  # fmt: skip
                elif step == 1:
                    seq += 1
                    request = ToolCall(id=call, name="read_file", args={"path": f"/srv/{marker}.txt"})
                    event = ev.MessageAppended(
                        **base, seq=seq, content=AssistantMessage(tool_calls=(request,)), occurred_at=now
                    )
                elif step == 2:
                    event = ev.ToolCallRecorded(
                        **base, tool_call_id=new_id(), call_id=call, name="read_file", args={"path": "/srv/x"},
                        result=f"{marker} contents", started_at=now, finished_at=now, occurred_at=now,
                    )  # fmt: skip
                else:
                    seq += 1
                    event = ev.MessageAppended(
                        **base, seq=seq, content=AssistantMessage(text=f"Step {n}: {marker}"), occurred_at=now
                    )
                sent[marker] = time.time() * 1000
                await publisher.publish(event)
                next_at += interval
                await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            await publisher.publish(
                ev.TurnFinished(**base, status=ev.TurnStatus.COMPLETED, occurred_at=datetime.now(UTC))
            )
        finally:
            await nc.close()
        return sent


#: Before the session page's own scripts: `__cosReady` once its live stream follows, and in `__cosSeen` the
#: wall-clock time each event's marker (`mark00042q`) first appears in the page.
TIMELINE_WATCH: Final = r"""
window.__cosReady = false;
window.__cosSeen = {};
const Native = window.EventSource;
window.EventSource = function (url, init) {
  const source = new Native(url, init);
  source.addEventListener("ready", () => { window.__cosReady = true; });
  return source;
};
window.EventSource.prototype = Native.prototype;
new MutationObserver((records) => {
  const now = Date.now();
  for (const r of records) {
    for (const node of r.addedNodes) {
      for (const m of (node.textContent || "").matchAll(/mark\d{5}q/g)) {
        if (!(m[0] in window.__cosSeen)) { window.__cosSeen[m[0]] = now; }
      }
    }
  }
}).observe(document, { childList: true, subtree: true });
"""


def _filters(params: dict[str, str]) -> SessionFilters:
    """The filters a request's query gives (the console's own model: its times parsed as it parses them)."""
    return SessionFilters.model_validate(params)


def _next_cursor(body: bytes) -> str | None:
    cursor = json.loads(body).get("next_cursor")
    return cursor if isinstance(cursor, str) else None


SESSION_ROUTE: Final = "/sessions/{session_id}"


async def _server_times(http: aiohttp.ClientSession, route: str) -> dict[str, float]:
    """The console's cos_console_request_seconds of `route` from /metrics: count, sum and each bucket (by le)."""
    async with http.get("/metrics") as r:
        text = await r.text()
    out: dict[str, float] = {}
    label = f'route="{route}"'
    for line in text.splitlines():
        if not line.startswith("cos_console_request_seconds") or label not in line:
            continue
        name, _, value = line.rpartition(" ")
        if name.startswith("cos_console_request_seconds_count"):
            out["count"] = float(value)
        elif name.startswith("cos_console_request_seconds_sum"):
            out["sum"] = float(value)
        elif 'le="' in name:
            out[name.split('le="', 1)[1].split('"', 1)[0]] = float(value)
    return out


def _nats_url(console: ServiceRun) -> str:
    return str(console.env["COS_NATS_URL"])
