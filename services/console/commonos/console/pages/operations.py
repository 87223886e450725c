"""Operations (operators only): each consumer's position and lag, dead letters with their reasons, and how to
replay them. /operations and /api/operations.

* Consumers: the durable consumers of COS_EVENTS as JetStream reports them (`$JS.API.CONSUMER.LIST.COS_EVENTS`):
  messages not yet delivered (num_pending), delivered but not acknowledged (num_ack_pending), redelivered, the
  last stream sequence delivered and acknowledged; and each projection's committed position in PostgreSQL
  (projection_positions, billing_positions, graph.positions: written in the same transaction as the rows), with
  how many events COS_EVENTS holds after it (`behind`: of every kind, so not a lag for a projection that reads a
  few kinds: the graph follows transcript imports and profiles only) and what its own consumers (its lanes) have
  still to apply (`pending`: the lag).
* The read replica (COS_DATABASE_READ_URL), when the pages read one: how far it is behind its primary (seconds
  since the last transaction it replayed, 0 once it has replayed all it received; WAL bytes received and not yet
  replayed; whether its replay is paused), or "no replica". The projections' positions are the primary's (what
  the projections have done, not what the replica has replayed of it).
* Dead letters: COS_DLQ, oldest first as `cos dlq list` lists them, a page at a time by dead-letter sequence
  (`$JS.API.STREAM.MSG.GET.COS_DLQ`, next message on `cos.dlq.>` from a sequence): the original subject, the
  reason (Cos-Dlq-Reason), the consumer that refused it, when, and its size.
* Replay is not done from the web. Replaying a dead letter (`cos dlq replay`) publishes the original event back
  onto COS_EVENTS and deletes the dead letter from COS_DLQ: only the admin identity may publish arbitrary events
  and delete stream messages (deploy/nats/auth.conf), and the console, a web-facing process, holds neither
  right. Rebuilding the projections (`cos replay`) needs the journal-writer stopped. The page shows the exact
  commands to run as an operator.

The console's NATS user may read exactly these (deploy/nats/auth.conf, user console): COS_EVENTS' and COS_DLQ's
state (STREAM.INFO), the list of COS_EVENTS' consumers (CONSUMER.LIST), and a dead letter (STREAM.MSG.GET on
COS_DLQ). It publishes nothing else.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Final

import asyncpg
import nats.errors
import nats.js.errors
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse
from pydantic import BaseModel, Field

from commonos.console.auth import Operator
from commonos.console.db import Database, get_db
from commonos.console.metrics import show_replica_lag
from commonos.console.sign_outs import DatabaseUnavailable
from commonos.console.templating import render
from commonos.proto.cloudevents import percent_decode
from commonos.proto.events import MAX_COUNT
from commonos.proto.subjects import DLQ_STREAM, EVENTS_STREAM
from commonos.runtime.dlq import BODY, BODY_BYTES, CONSUMER, DEAD_AT, OMITTED, ORIGINAL_SUBJECT, REASON, STREAM_SEQ
from commonos.runtime.postgres import Conn

router = APIRouter(tags=["operations"])

Db = Annotated[Database, Depends(get_db)]

PAGE_SIZE: Final = 50
NATS_TIMEOUT_S: Final = 5.0
#: The projections' position tables (each written in the same transaction as its rows).
POSITION_TABLES: Final = ("projection_positions", "billing_positions", "graph.positions")


class StreamView(BaseModel):
    name: str
    messages: int
    bytes: int
    first_seq: int
    last_seq: int
    consumers: int


class ConsumerView(BaseModel):
    name: str
    filter_subjects: list[str]
    #: Messages of its filter not yet delivered.
    num_pending: int
    #: Delivered, not yet acknowledged.
    num_ack_pending: int
    num_redelivered: int
    #: The last COS_EVENTS sequence delivered to it, and the one below which all are acknowledged.
    delivered_stream_seq: int
    ack_floor_stream_seq: int
    last_active: datetime | None
    #: Messages it has still to finish: num_pending + num_ack_pending.
    lag: int


class PositionView(BaseModel):
    table: str
    consumer: str
    stream_seq: int
    updated_at: datetime
    #: COS_EVENTS' last sequence minus this position: the events of every kind stored after it. Not a lag for a
    #: projection that reads some kinds only (the graph: transcript imports and profiles): most of them are not
    #: its own. Its lag is `pending`.
    behind: int | None
    #: What its JetStream consumers (the projection's lanes) have still to apply: messages of their own filters
    #: not yet delivered or not yet acknowledged. Null when none of them is found.
    pending: int | None = None


class DeadLetterView(BaseModel):
    dlq_seq: int
    #: The original event's subject.
    subject: str
    reason: str
    #: The consumer that refused it.
    consumer: str
    #: The original's sequence in COS_EVENTS.
    stream_seq: int | None
    dead_at: str
    body_bytes: int
    #: The body was too large to keep with the reason: a replay reads it from COS_EVENTS by its sequence.
    body_omitted: bool
    #: The command that replays it (as an operator, with the admin NATS identity).
    replay_command: str


class DeadLetterPage(BaseModel):
    letters: list[DeadLetterView]
    #: Pass as `after` for the next page; null on the last page.
    next_after: int | None
    #: Dead letters in COS_DLQ now.
    total: int


class ReplayHelp(BaseModel):
    #: Why the console does not replay itself.
    why: str
    #: Replay every dead letter (after the fix that was missing).
    all_dead_letters: str
    #: Rebuild the core tables from COS_EVENTS (journal-writer stopped).
    rebuild: str


class ReplicaView(BaseModel):
    #: A read replica is configured (COS_DATABASE_READ_URL).
    configured: bool
    #: One line: "no replica", the lag ("0.0 s behind (0 bytes received, not yet replayed)"), or why it is unknown.
    state: str
    #: Seconds behind its primary (0 once it has replayed all it received); null: no replica, or unknown.
    lag_seconds: float | None = None
    #: WAL received, not yet replayed.
    lag_bytes: int | None = None
    replay_paused: bool = False


class Operations(BaseModel):
    events: StreamView | None
    dead_letter_stream: StreamView | None
    consumers: list[ConsumerView]
    positions: list[PositionView]
    dead_letters: DeadLetterPage
    replay: ReplayHelp
    #: The read replica the pages read, and its lag.
    replica: ReplicaView
    #: What could not be read (NATS or PostgreSQL), one line each.
    problems: list[str] = Field(default_factory=list)


REPLAY: Final = ReplayHelp(
    why=(
        "Replaying publishes the original event back onto COS_EVENTS and deletes the dead letter from COS_DLQ: "
        "only the admin NATS identity may do both, and the console (a web-facing process) may do neither. Run "
        "these as an operator, after fixing what the reason names."
    ),
    all_dead_letters="cos dlq replay --all",
    rebuild="cos replay --truncate  # stop the journal-writer first, or point COS_DATABASE_URL at another database",
)


def _stream(info: Any) -> StreamView:
    state = info.state
    return StreamView(
        name=info.config.name,
        messages=state.messages,
        bytes=state.bytes,
        first_seq=state.first_seq,
        last_seq=state.last_seq,
        consumers=state.consumer_count,
    )


def _consumer(info: Any) -> ConsumerView:
    config = info.config
    filters = list(config.filter_subjects or ([config.filter_subject] if config.filter_subject else []))
    pending = info.num_pending or 0
    ack_pending = info.num_ack_pending or 0
    delivered = info.delivered
    ack_floor = info.ack_floor
    last_active = getattr(delivered, "last_active", None)
    return ConsumerView(
        name=info.name,
        filter_subjects=filters,
        num_pending=pending,
        num_ack_pending=ack_pending,
        num_redelivered=info.num_redelivered or 0,
        delivered_stream_seq=(delivered.stream_seq or 0) if delivered else 0,
        ack_floor_stream_seq=(ack_floor.stream_seq or 0) if ack_floor else 0,
        last_active=last_active if isinstance(last_active, datetime) else None,
        lag=pending + ack_pending,
    )


def _header(headers: dict[str, str], name: str, default: str = "") -> str:
    value = headers.get(name, default)
    try:
        return percent_decode(value)
    except (UnicodeDecodeError, ValueError):
        return value


def _letter(seq: int, subject: str, data: bytes | None, headers: dict[str, str]) -> DeadLetterView:
    raw_seq = headers.get(STREAM_SEQ, "")
    size = headers.get(BODY_BYTES, "")
    return DeadLetterView(
        dlq_seq=seq,
        subject=_header(headers, ORIGINAL_SUBJECT, subject),
        reason=_header(headers, REASON),
        consumer=headers.get(CONSUMER, ""),
        stream_seq=int(raw_seq) if raw_seq.isdigit() else None,
        dead_at=headers.get(DEAD_AT, ""),
        body_bytes=int(size) if size.isdigit() else len(data or b""),
        body_omitted=headers.get(BODY) == OMITTED,
        replay_command=f"cos dlq replay {int(seq)}",
    )


async def dead_letters(js: Any, after: int, limit: int) -> DeadLetterPage:
    """A page of COS_DLQ from the message after `after`, oldest first (skipping deleted sequences)."""
    info = await js.stream_info(DLQ_STREAM)
    letters: list[DeadLetterView] = []
    seq = max(after + 1, info.state.first_seq or 1)
    while len(letters) < limit + 1 and seq <= info.state.last_seq:
        try:
            raw = await js.get_msg(DLQ_STREAM, seq=seq, subject="cos.dlq.>", next=True)
        except nats.js.errors.NotFoundError:
            break
        found = int(raw.seq or seq)
        headers = {str(k): str(v) for k, v in (raw.headers or {}).items()}
        letters.append(_letter(found, raw.subject or "", raw.data, headers))
        seq = found + 1
    page = letters[:limit]
    more = len(letters) > limit
    return DeadLetterPage(
        letters=page, next_after=page[-1].dlq_seq if more and page else None, total=info.state.messages
    )


async def read_nats(nc: Any, after: int, limit: int) -> tuple[dict[str, Any], list[str]]:
    """Streams, consumers and dead letters from JetStream; what failed is a problem line, not an error page."""
    js = nc.jetstream(timeout=NATS_TIMEOUT_S)
    out: dict[str, Any] = {}
    problems: list[str] = []

    async def attempt(key: str, what: str, work: Any) -> None:
        try:
            out[key] = await work
        except nats.js.errors.NotFoundError:
            problems.append(f"{what}: not found (run `cos streams ensure` as admin)")
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            problems.append(f"{what}: {type(exc).__name__}: {exc}".rstrip(": "))

    await attempt("events", f"stream {EVENTS_STREAM}", js.stream_info(EVENTS_STREAM))
    await attempt("dlq", f"stream {DLQ_STREAM}", js.stream_info(DLQ_STREAM))
    await attempt("consumers", f"consumers of {EVENTS_STREAM}", js.consumers_info(EVENTS_STREAM))
    if "dlq" in out:
        await attempt("letters", "dead letters", dead_letters(js, after, limit))
    return out, problems


async def read_positions(conn: Conn, last_seq: int | None) -> tuple[list[PositionView], list[str]]:
    positions: list[PositionView] = []
    problems: list[str] = []
    for table in POSITION_TABLES:
        readable = await conn.fetchval(
            "SELECT to_regclass($1) IS NOT NULL AND has_table_privilege(to_regclass($1), 'SELECT')", table
        )
        if not readable:
            exists = await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", table)
            if exists:
                problems.append(f"{table}: the console's database role may not read it")
            continue
        # `table` is one of POSITION_TABLES, never input.
        rows = await conn.fetch(f"SELECT consumer, stream_seq, updated_at FROM {table} ORDER BY consumer")
        for r in rows:
            positions.append(
                PositionView(
                    table=table,
                    consumer=r["consumer"],
                    stream_seq=r["stream_seq"],
                    updated_at=r["updated_at"],
                    behind=max(0, last_seq - r["stream_seq"]) if last_seq is not None else None,
                )
            )
    return positions, problems


_PARTITION: Final = re.compile(r"^p\d+-of-\d+")


def lanes_of(position_consumer: str, consumers: list[ConsumerView]) -> list[ConsumerView]:
    """The JetStream consumers that apply a position's projection: its own name, and its other lanes
    (`billing-session_created`, `graph-writer-profiles`: commonos.runtime.lanes), not another partition's."""
    prefix = position_consumer + "-"
    return [
        c
        for c in consumers
        if c.name == position_consumer
        or (c.name.startswith(prefix) and not _PARTITION.match(c.name.removeprefix(prefix)))
    ]


def with_pending(positions: list[PositionView], consumers: list[ConsumerView]) -> list[PositionView]:
    """Each position with what its lanes have still to apply (null when NATS named none of them)."""
    out = []
    for p in positions:
        lanes = lanes_of(p.consumer, consumers)
        out.append(p.model_copy(update={"pending": sum(c.lag for c in lanes) if lanes else None}))
    return out


async def read_replica(db: Database) -> tuple[ReplicaView, list[str]]:
    """The replica's lag (and the gauges set from it), or "no replica"; a replica that does not answer is a
    problem line."""
    try:
        lag = await db.replica_lag()
    except DatabaseUnavailable as exc:
        show_replica_lag(None)
        return ReplicaView(configured=True, state=f"does not answer: {exc}"), [str(exc)]
    except (asyncpg.PostgresError, asyncpg.InterfaceError) as exc:  # a login it refuses, ...
        show_replica_lag(None)
        why = f"the replica's lag cannot be measured: {type(exc).__name__}: {exc}"
        return ReplicaView(configured=True, state=why), [why]
    show_replica_lag(lag)
    if lag is None:
        return ReplicaView(configured=False, state="no replica"), []
    problems = [] if lag.standby else ["COS_DATABASE_READ_URL is not a standby: the pages read another primary"]
    return (
        ReplicaView(
            configured=True, state=str(lag), lag_seconds=lag.seconds, lag_bytes=lag.bytes, replay_paused=lag.paused
        ),
        problems,
    )


async def load(request: Request, who: Operator, db: Database, after: int, limit: int) -> Operations:
    nc = request.app.state.nc
    problems: list[str] = []
    found: dict[str, Any] = {}
    if nc is None or not nc.is_connected:
        problems.append("NATS: the console is not connected (COS_NATS_URL)")
    else:
        found, problems = await read_nats(nc, after, limit)
    events = _stream(found["events"]) if "events" in found else None
    async with db.reader(who.user, primary=True) as conn:
        positions, db_problems = await read_positions(conn, events.last_seq if events else None)
    replica, replica_problems = await read_replica(db)
    consumers = sorted((_consumer(c) for c in found.get("consumers", [])), key=lambda c: c.name)
    return Operations(
        events=events,
        dead_letter_stream=_stream(found["dlq"]) if "dlq" in found else None,
        consumers=consumers,
        positions=with_pending(positions, consumers),
        dead_letters=found.get("letters") or DeadLetterPage(letters=[], next_after=None, total=0),
        replay=REPLAY,
        replica=replica,
        problems=problems + db_problems + replica_problems,
    )


After = Annotated[int, Query(ge=0, le=MAX_COUNT, description="next_after of the previous page of dead letters")]
Limit = Annotated[int, Query(ge=1, le=500, description="dead letters per page")]


@router.get("/api/operations", response_model=Operations, responses={403: {"description": "operators only"}})
async def api_operations(
    request: Request, who: Operator, db: Db, after: After = 0, limit: Limit = PAGE_SIZE
) -> Operations:
    """Consumers' positions and lag, projections' positions, the read replica's lag, a page of dead letters, and the
    replay commands."""
    return await load(request, who, db, after, limit)


@router.get("/operations", include_in_schema=False, response_class=HTMLResponse)
async def operations_page(
    request: Request, who: Operator, db: Db, after: After = 0, limit: Limit = PAGE_SIZE
) -> HTMLResponse:
    ops = await load(request, who, db, after, limit)
    seqs = " ".join(str(d.dlq_seq) for d in ops.dead_letters.letters)
    page_command = f"cos dlq replay {seqs}" if seqs else None
    return render(
        request,
        "operations.html",
        {"ops": ops, "after": after, "limit": limit, "page_command": page_command},
    )
