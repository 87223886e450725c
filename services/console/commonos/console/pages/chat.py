"""Chat: /chat (a page, static/chat.js), the WebSocket /api/chat/ws, and POST /api/chat for API users.

The console only asks the loop service, as `cos chat` does (`cos.cmd.<profile>.chat`, commonos.proto.
requests); the loop records everything. A new session's source is `web` (said in each request: a request's
default source is `service`).

Who may chat: chatting is writing (a turn runs tools and costs money), so operators may chat with every profile
and approvers with the profiles of theirs in the people file (`profiles`); analysts read only. To continue a
session, the person must also be able to see it (row-level security, as on /sessions/{id}): a session they
cannot see is "no session", as if it did not exist. That check reads the primary (COS_DATABASE_URL), not the read
replica: the session may have been started a moment ago. The turn itself is shown from NATS as it runs (its deltas,
events and reply), never read back from a table, so a lagging replica does not hold it back.

The socket (JSON text frames; one turn at a time, in the order sent):

    → {"text": "...", "profile_id": "acme", "session_id": null, "tags": ["client:acme"]}
        the specification's chat message: session_id continues a session (then no tags), without it a new
        session starts with the extra tags (the tag rules of commonos.proto.tags; a bad one is refused).
    ← {"type": "error", "error": "invalid tag 'Bad:x': upper case in the key (...)"}   the message is refused;
        the socket stays open
    ← {"type": "started", "profile_id", "session_id", "turn_id"}   the turn runs
    ← {"type": "delta", "seq", "kind": "text" | "tool_call" | "done", "text"}   the reply as the model
        produces it (commonos.proto.deltas; the text deltas of a model call make its message)
    ← {"type": "approval", "approval_id", "call_id", "tool", "args", "risk", "expires_at"}   a risky call waits:
        the page decides it in place (POST /api/approvals/{approval_id}/approve or /deny, as /approvals does)
    ← {"type": "approval_decided", "call_id", "status", "decided_by"}   it was decided (or timed out)
    ← {"type": "tool_call", "call_id", "name", "args", "result", "is_error", "risk", "approval", "duration_ms"}
    ← {"type": "done", "status", "profile_id", "session_id", "turn_id", "text", "error"}   the final status

    → {"follow": "<session id>"}   a page showing a session again (a reload, Back) while a turn of it runs
    ← {"type": "following", "profile_id", "session_id", "turn_id"}, then that turn's deltas, approvals,
        decisions and tool calls as above, and its `done` (text "": its reply is in the deltas); `done` at once,
        with the last turn's status, when none runs

The handshake needs the sign-in's cookie (or the trusted proxy header), the subprotocol `cos.chat` with the
sign-in's CSRF token offered beside it as the subprotocol `csrf.<token>` (`new WebSocket(url, ["cos.chat",
"csrf." + token])`: a header, never the URL, which access logs keep), and, when the browser sends an Origin, this
console's own (or one of COS_CONSOLE_ORIGINS): otherwise the server refuses it (HTTP 403) before any message. A
person removed from the people file mid-way is refused at their next message.

The page (`GET /chat?session=ID`) shows a session's conversation again from PostgreSQL's primary (its messages,
tool calls and the approvals of it still waiting), so that a reload or Back keeps it, and follows (`follow`
above) the turn of it still running; it offers the profiles a loop service answers for (an imported profile is
listed, not offered).

The console subscribes to the session's deltas (`cos.deltas.<profile>.<session>`), events (`cos.events.<profile>.
<session>.*`) and the profile's approval requests before it sends the request; for a new session, to the
profile's, keeping only the session the loop names in its `started` reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Final

import msgspec
import nats.errors
from fastapi import APIRouter, Depends, HTTPException, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import HTMLResponse, JSONResponse
from nats.aio.client import Client
from nats.aio.msg import Msg
from pydantic import BaseModel, Field, ValidationError

from commonos.console.auth import Auth, CsrfChecked, Principal, SignedIn
from commonos.console.db import Database, get_db
from commonos.console.templating import render
from commonos.console.users import Role, User
from commonos.proto import events as ev
from commonos.proto.deltas import decode_delta, deltas_subject
from commonos.proto.errors import DataError, OperationalError
from commonos.proto.events import decode_event
from commonos.proto.requests import ApprovalRequest, ChatReply, ChatRequest, chat_subject
from commonos.proto.tags import InvalidTag, parse_tag
from commonos.runtime.loop_requests import LoopAnswers, ask_loops

log = logging.getLogger(__name__)

router = APIRouter(tags=["chat"])

Db = Annotated[Database, Depends(get_db)]

#: How long a turn may take before the console stops waiting (the turn goes on in the loop).
TURN_TIMEOUT_S: Final = 600.0
#: After the final reply, how long the console waits for events still on their way.
SETTLE_S: Final = 0.1
MAX_TAGS: Final = 32
MAX_TEXT: Final = 200_000
#: The socket's subprotocol, which the console accepts; the CSRF token is offered beside it as `csrf.<token>`.
SUBPROTOCOL: Final = "cos.chat"
TOKEN_PREFIX: Final = "csrf."


class ChatMessage(BaseModel):
    """The dashboard's chat message: continue `session_id`, or start a session of `profile_id` with `tags`."""

    text: str = Field(min_length=1, max_length=MAX_TEXT)
    profile_id: str = Field(pattern=r"^[a-z0-9_-]{1,64}$")
    session_id: uuid.UUID | None = None
    tags: list[str] = Field(default_factory=list, max_length=MAX_TAGS)


class ChatToolCall(BaseModel):
    call_id: str
    name: str
    args: dict[str, Any]
    result: str | None
    is_error: bool
    risk: str
    approval: str | None
    duration_ms: float


class ChatResult(BaseModel):
    """The turn's end: `status` is the loop's (completed, failed, cancelled, interrupted, busy, rejected,
    unavailable) or `timeout` (the console stopped waiting; the turn may go on)."""

    status: str
    profile_id: str
    session_id: uuid.UUID | None
    turn_id: uuid.UUID | None
    text: str
    error: str | None
    tool_calls: list[ChatToolCall] = []


class ChatRefused(DataError):
    """A chat message refused as it is (a 4xx): not allowed, a bad tag, an unknown session, ..."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message


class ChatUnavailable(OperationalError):
    """The console cannot take a chat now (503): no database or NATS connection."""

    status_code = 503

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def may_chat(user: User, profile_id: str) -> bool:
    """Operators with every profile, approvers with theirs; analysts never."""
    if user.role is Role.OPERATOR:
        return True
    return user.role is Role.APPROVER and profile_id in user.profiles


async def check_message(
    db: Database | None, user: User, message: ChatMessage, started_here: dict[uuid.UUID, str] | None = None
) -> ChatRequest:
    """The loop's request for `message` from `user`, or ChatRefused (403, 404, 422) saying why."""
    if not may_chat(user, message.profile_id):
        why = "analysts read only" if user.role is Role.ANALYST else "it is not one of yours"
        raise ChatRefused(403, f"{user.name} may not chat with profile {message.profile_id!r}: {why}")
    tags: list[str] = []
    for tag in message.tags:
        try:
            tags.append(parse_tag(tag))
        except InvalidTag as exc:
            raise ChatRefused(422, str(exc)) from None
    if "\x00" in message.text:
        raise ChatRefused(422, "the text contains U+0000 (NUL), which cannot be stored")
    if message.session_id is not None:
        if tags:
            raise ChatRefused(
                422, f"a session's tags are fixed when it starts: send no tags to continue {message.session_id}"
            )
        # A session this socket started may not be in PostgreSQL yet: its profile is known.
        profile = (started_here or {}).get(message.session_id)
        if profile is None:
            if db is None:
                raise ChatUnavailable("the console has no database (COS_DATABASE_URL)")
            # The primary's: a session started a moment ago (on another page) may not be on the read replica yet.
            async with db.reader(user, primary=True) as conn:
                profile = await conn.fetchval("SELECT profile_id FROM sessions WHERE id = $1", message.session_id)
        if profile is None:
            raise ChatRefused(404, f"no session {message.session_id}")
        if profile != message.profile_id:
            raise ChatRefused(422, f"session {message.session_id} is of profile {profile!r}")
    return ChatRequest(text=message.text, session_id=message.session_id, tags=tuple(tags), source="web")


Emit = Callable[[dict[str, Any]], Awaitable[None]]


def _tool_call(event: ev.ToolCallRecorded) -> ChatToolCall:
    return ChatToolCall(
        call_id=event.call_id,
        name=event.name,
        args=event.args,
        result=event.result,
        is_error=event.is_error,
        risk=event.risk.value,
        approval=event.approval.value if event.approval is not None else None,
        duration_ms=round((event.finished_at - event.started_at).total_seconds() * 1000, 3),
    )


async def run_turn(
    nc: Client, profile_id: str, request: ChatRequest, emit: Emit, timeout_s: float = TURN_TIMEOUT_S
) -> ChatResult:
    """Ask the loop for the turn and pass on, as they come, its deltas, approvals and tool calls; its result."""
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    def put(kind: str) -> Callable[[Msg], Awaitable[None]]:
        async def on_message(msg: Msg) -> None:
            queue.put_nowait((kind, msg))

        return on_message

    target = str(request.session_id) if request.session_id is not None else "*"
    subjects = [
        (deltas_subject(profile_id, target), "delta"),
        (f"cos.events.{profile_id}.{target}.*", "event"),
        (f"cos.approvals.{profile_id}.request", "approval"),
    ]
    subs = []
    inbox = nc.new_inbox()
    result = ChatResult(
        status="timeout", profile_id=profile_id, session_id=request.session_id, turn_id=None, text="", error=None
    )
    try:
        # Everything of the turn is subscribed to before the request leaves.
        for subject, kind in subjects:
            subs.append(await nc.subscribe(subject, cb=put(kind)))
        subs.append(await nc.subscribe(inbox, cb=put("reply")))
        data = msgspec.json.encode(msgspec.structs.replace(request, started=True))
        await nc.publish(chat_subject(profile_id), data, reply=inbox)
        await nc.flush()
        result = await _follow(queue, profile_id, request, emit, timeout_s)
    finally:
        for sub in subs:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
    return result


async def _relay(
    kind: str, msg: Msg, turn: uuid.UUID | None, emit: Emit, tool_calls: list[ChatToolCall]
) -> ev.TurnFinished | None:
    """Pass on what `msg` tells of `turn` (a delta, an approval that waits, a decision, a recorded tool call);
    the turn's `turn_finished` is returned, not passed on."""
    if kind == "delta":
        try:
            delta = decode_delta(msg.data)
        except ValueError:
            return None
        if delta.turn_id == turn:
            await emit({"type": "delta", "seq": delta.seq, "kind": delta.kind.value, "text": delta.text})
    elif kind == "approval":
        try:
            approval = msgspec.json.decode(msg.data, type=ApprovalRequest)
        except msgspec.DecodeError:
            return None
        if approval.turn_id == turn:
            await emit(
                {
                    "type": "approval",
                    "approval_id": str(approval.approval_id),
                    "call_id": approval.call_id,
                    "tool": approval.tool,
                    "args": approval.args,
                    "risk": approval.risk.value,
                    "expires_at": approval.expires_at.isoformat(),
                }
            )
    elif kind == "event":
        try:
            event = decode_event(msg.data)
        except ValueError:
            return None
        if getattr(event, "turn_id", None) != turn:
            return None
        if isinstance(event, ev.ToolCallRecorded):
            call = _tool_call(event)
            tool_calls.append(call)
            await emit({"type": "tool_call", **call.model_dump(mode="json")})
        elif isinstance(event, ev.ApprovalDecided):
            await emit(
                {
                    "type": "approval_decided",
                    "call_id": event.call_id,
                    "status": event.status.value,
                    "decided_by": event.decided_by,
                }
            )
        elif isinstance(event, ev.TurnFinished):
            return event
    return None


async def _follow(
    queue: asyncio.Queue[tuple[str, Any]], profile_id: str, request: ChatRequest, emit: Emit, timeout_s: float
) -> ChatResult:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    session: uuid.UUID | None = request.session_id
    turn: uuid.UUID | None = None
    held: list[tuple[str, Any]] = []  # before the loop names the turn
    tool_calls: list[ChatToolCall] = []
    final: ChatReply | None = None

    async def handle(kind: str, msg: Msg) -> None:
        await _relay(kind, msg, turn, emit, tool_calls)

    while True:
        left = deadline - loop.time()
        if final is not None:
            left = min(left, SETTLE_S)
        if left <= 0:
            break
        try:
            kind, msg = await asyncio.wait_for(queue.get(), left)
        except TimeoutError:
            break
        if kind == "reply":
            if msg.headers and msg.headers.get("Status") == "503":
                final = ChatReply(status="unavailable", error=f"no loop service answers for profile {profile_id!r}")
                break
            try:
                reply = msgspec.json.decode(msg.data, type=ChatReply)
            except msgspec.DecodeError as exc:
                final = ChatReply(status="failed", error=f"the loop's reply was not understood: {exc}")
                break
            if reply.status == "started":
                session, turn = reply.session_id, reply.turn_id
                await emit(
                    {"type": "started", "profile_id": profile_id, "session_id": str(session), "turn_id": str(turn)}
                )
                for kept in held:
                    await handle(*kept)
                held.clear()
                continue
            final = reply
            if reply.turn_id is None:
                break  # refused before any turn: nothing more comes
            if turn is None:  # an older loop that does not say `started`
                session, turn = reply.session_id, reply.turn_id
                for kept in held:
                    await handle(*kept)
                held.clear()
            continue
        if turn is None:
            held.append((kind, msg))
        else:
            await handle(kind, msg)
    if final is None:
        return ChatResult(
            status="timeout",
            profile_id=profile_id,
            session_id=session,
            turn_id=turn,
            text="",
            error=f"no reply from the loop within {timeout_s:.0f}s (the turn may still be running)",
            tool_calls=tool_calls,
        )
    return ChatResult(
        status=final.status,
        profile_id=profile_id,
        session_id=final.session_id or session,
        turn_id=final.turn_id or turn,
        text=final.text,
        error=final.error,
        tool_calls=tool_calls,
    )


async def follow_turn(
    nc: Client, db: Database | None, user: User, session_id: uuid.UUID, emit: Emit, timeout_s: float = TURN_TIMEOUT_S
) -> None:
    """Pass on what the running turn of `session_id` does from now on (a page shown again while it runs: its
    reply, approvals, decisions and tool calls), then its end as `done`; `done` at once when none runs."""
    if db is None:
        raise ChatUnavailable("the console has no database (COS_DATABASE_URL)")
    async with db.reader(user, primary=True) as conn:
        profile = await conn.fetchval("SELECT profile_id FROM sessions WHERE id = $1", session_id)
    if profile is None:
        raise ChatRefused(404, f"no session {session_id}")
    if not may_chat(user, profile):
        raise ChatRefused(403, f"{user.name} may not chat with profile {profile!r}")
    queue: asyncio.Queue[tuple[str, Msg]] = asyncio.Queue()

    def put(kind: str) -> Callable[[Msg], Awaitable[None]]:
        async def on_message(msg: Msg) -> None:
            queue.put_nowait((kind, msg))

        return on_message

    subs = []
    try:
        # Subscribed before the running turn is looked up: nothing of it after that is missed.
        for subject, kind in (
            (deltas_subject(profile, str(session_id)), "delta"),
            (f"cos.events.{profile}.{session_id}.*", "event"),
            (f"cos.approvals.{profile}.request", "approval"),
        ):
            subs.append(await nc.subscribe(subject, cb=put(kind)))
        await nc.flush()
        async with db.reader(user, primary=True) as conn:
            last = await conn.fetchrow(
                "SELECT id, status, error FROM turns WHERE session_id = $1 ORDER BY started_at DESC, id DESC LIMIT 1",
                session_id,
            )
        done = {"type": "done", "profile_id": profile, "session_id": str(session_id), "text": ""}
        if last is None or last["status"] != "running":
            await emit({**done, "status": last["status"] if last else "none", "turn_id": None, "error": None})
            return
        turn: uuid.UUID = last["id"]
        await emit({"type": "following", "profile_id": profile, "session_id": str(session_id), "turn_id": str(turn)})
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (left := deadline - loop.time()) > 0:
            try:
                kind, msg = await asyncio.wait_for(queue.get(), left)
            except TimeoutError:
                break
            finished = await _relay(kind, msg, turn, emit, [])
            if finished is not None:
                await emit({**done, "status": finished.status.value, "turn_id": str(turn), "error": finished.error})
                return
        error = f"the turn did not end within {timeout_s:.0f}s (it may still be running)"
        await emit({**done, "status": "timeout", "turn_id": str(turn), "error": error})
    finally:
        for sub in subs:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()


def _nc(app_state: Any) -> Client:
    nc: Client | None = app_state.nc
    if nc is None:
        raise ChatUnavailable("the console has no NATS connection (COS_NATS_URL)")
    return nc


# The API.

STATUS_CODES: Final = {"rejected": 422, "busy": 409, "unavailable": 503, "timeout": 504}


@router.post(
    "/api/chat",
    response_model=ChatResult,
    responses={
        403: {"description": "not this person's to chat with, or no CSRF token"},
        404: {"description": "no such session"},
        409: {"description": "another turn of the session is running", "model": ChatResult},
        422: {"description": "a bad message (a tag, tags with a session)"},
        503: {"description": "no loop service answers for the profile", "model": ChatResult},
        504: {"description": "the turn took too long (it may still be running)", "model": ChatResult},
    },
)
async def api_chat(request: Request, who: CsrfChecked, message: ChatMessage) -> JSONResponse:
    """One turn: start a `web` session of `profile_id` (with extra `tags`) or continue `session_id`; the turn's
    result once it has finished, with its tool calls."""

    async def ignore(_: dict[str, Any]) -> None:
        return None

    try:
        chat_request = await check_message(request.app.state.db, who.user, message)
        result = await run_turn(_nc(request.app.state), message.profile_id, chat_request, ignore)
    except (ChatRefused, ChatUnavailable) as exc:
        raise HTTPException(exc.status_code, exc.message) from None
    return JSONResponse(result.model_dump(mode="json"), status_code=STATUS_CODES.get(result.status, 200))


# The page.


@dataclass(frozen=True)
class ProfileChoice:
    """A profile on the page's list: `served` when a loop service answers its chats (an imported profile, say
    `claude-code`, has none: it is listed, not offered)."""

    id: str
    served: bool


@dataclass(frozen=True)
class ShownMessage:
    role: str
    text: str
    kind: ClassVar[str] = "message"


@dataclass(frozen=True)
class ShownToolCall:
    call_id: str
    name: str
    args: dict[str, Any]
    result: str | None
    is_error: bool
    risk: str
    approval: str | None
    decided_by: str | None
    kind: ClassVar[str] = "tool_call"


@dataclass
class Conversation:
    """A session as the chat page shows it again (a reload, Back): its messages and tool calls in order, the
    approvals of it still waiting (to decide here), and whether a turn of it is running."""

    session_id: uuid.UUID
    profile_id: str
    entries: list[ShownMessage | ShownToolCall] = field(default_factory=list)
    waiting: list[ApprovalRequest] = field(default_factory=list)
    running: bool = False


#: At most this many messages of a session come back on the chat page (its page has them all).
MAX_SHOWN_MESSAGES: Final = 500


async def chat_profiles(db: Database | None, user: User) -> list[str]:
    """The profiles `user` may chat with that the database knows (as `user` may read them)."""
    if user.role is Role.ANALYST:
        return []
    known: list[str] = []
    if db is not None:
        async with db.reader(user) as conn:
            known = [r["id"] for r in await conn.fetch("SELECT id FROM profiles ORDER BY id")]
    if user.role is Role.APPROVER:
        known = sorted(set(known) | set(user.profiles))
    return [p for p in known if may_chat(user, p)]


async def load_conversation(db: Database, user: User, session_id: uuid.UUID) -> Conversation | None:
    """`session_id` as `user` may see it, read on the primary (it may have started a moment ago), or None."""
    async with db.reader(user, primary=True) as conn:
        profile = await conn.fetchval("SELECT profile_id FROM sessions WHERE id = $1", session_id)
        if profile is None:
            return None
        turns = await conn.fetch(
            "SELECT id, status FROM turns WHERE session_id = $1 ORDER BY started_at, id", session_id
        )
        messages = await conn.fetch(
            "SELECT turn_id, seq, role, content FROM messages WHERE session_id = $1 ORDER BY seq LIMIT $2",
            session_id,
            MAX_SHOWN_MESSAGES,
        )
        calls = await conn.fetch(
            "SELECT c.turn_id, c.call_id, c.name, c.args, c.result, c.is_error, c.risk, "
            "coalesce(a.status, c.approval) AS approval, a.decided_by "
            "FROM tool_calls c LEFT JOIN approvals a ON a.tool_call_id = c.id "
            "WHERE c.turn_id = ANY($1::uuid[]) ORDER BY c.started_at, c.id",
            [t["id"] for t in turns],
        )
    recorded = {
        (c["turn_id"], c["call_id"]): ShownToolCall(
            call_id=c["call_id"],
            name=c["name"],
            args=dict(c["args"] or {}),
            result=c["result"],
            is_error=c["is_error"],
            risk=c["risk"],
            approval=c["approval"],
            decided_by=c["decided_by"],
        )
        for c in calls
    }
    conversation = Conversation(session_id, profile, running=bool(turns) and turns[-1]["status"] == "running")
    for m in messages:
        content = m["content"] if isinstance(m["content"], dict) else {}
        role = str(content.get("role") or m["role"])
        if role == "tool_result":
            continue  # shown with its tool call
        text = content.get("text")
        if isinstance(text, str) and text:
            conversation.entries.append(ShownMessage(role, text))
        for call in content.get("tool_calls") or ():
            shown = recorded.get((m["turn_id"], str(call.get("id", ""))))
            if shown is not None:
                conversation.entries.append(shown)
    return conversation


def _nc_or_none(app_state: Any) -> Client | None:
    nc: Client | None = app_state.nc
    return nc


@router.get("/chat", include_in_schema=False, response_class=HTMLResponse)
async def chat_page(
    request: Request, who: SignedIn, session: str | None = None, profile: str | None = None
) -> HTMLResponse:
    """The chat. `?session=ID` shows that session's conversation again and continues it (the page puts it in
    its address as soon as a turn starts, so a reload or Back brings the conversation back)."""
    db: Database | None = request.app.state.db
    profiles = await chat_profiles(db, who.user)
    nc = _nc_or_none(request.app.state)
    answers = await ask_loops(nc) if nc is not None and profiles else LoopAnswers([], ())
    served = set(answers.served)
    choices = [ProfileChoice(p, p in served) for p in profiles]
    conversation: Conversation | None = None
    missing: str | None = None
    if session and db is not None and profiles:
        try:
            session_id = uuid.UUID(session)
        except ValueError:
            missing = f"{session[:80]!r} is not a session id"
        else:
            conversation = await load_conversation(db, who.user, session_id)
            if conversation is None:
                missing = f"No session {session_id} that you may see"
            elif not may_chat(who.user, conversation.profile_id):
                missing = f"Session {session_id} is of profile {conversation.profile_id!r}, which you may not chat with"
                conversation = None
            else:
                profile = conversation.profile_id
                conversation.waiting = [a for a in answers.approvals if a.session_id == session_id]
    offered = [c.id for c in choices if c.served]
    if profile in profiles and (profile in served or conversation is not None):
        selected: str | None = profile
    else:
        selected = offered[0] if offered else None
    return render(
        request,
        "chat.html",
        {
            "profiles": choices,
            "selected": selected,
            "session": conversation.session_id if conversation is not None else None,
            "conversation": conversation,
            "missing": missing,
            "may_chat": bool(profiles),
            "none_served": bool(profiles) and not offered,
        },
    )


# The socket.


def socket_principal(websocket: WebSocket) -> Principal | None:
    """The signed-in person of a handshake that carries their CSRF token and comes from this console.

    The token travels as a WebSocket subprotocol (`Sec-WebSocket-Protocol: cos.chat, csrf.<token>`), never in
    the URL, where access logs and proxies would write it down."""
    auth: Auth = websocket.app.state.auth
    who = auth.principal(websocket)
    if who is None or not auth.same_origin(websocket):
        return None
    offered = websocket.scope.get("subprotocols") or []
    if SUBPROTOCOL not in offered:
        return None
    tokens = [p.removeprefix(TOKEN_PREFIX) for p in offered if p.startswith(TOKEN_PREFIX)]
    if len(tokens) != 1 or not hmac.compare_digest(tokens[0].encode(), who.csrf_token.encode()):
        return None
    return who


def _follow_target(raw: str) -> uuid.UUID | str | None:
    """The session of a `{"follow": "<session id>"}` message, a string saying why it is not one, or None (another
    message: a chat message)."""
    try:
        parsed = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(parsed, dict) or "follow" not in parsed:
        return None
    try:
        return uuid.UUID(str(parsed["follow"]))
    except ValueError:
        return f"follow: {str(parsed['follow'])[:80]!r} is not a session id"


@router.websocket("/api/chat/ws")
async def chat_socket(websocket: WebSocket) -> None:
    who = socket_principal(websocket)
    if who is None:
        await websocket.close(code=1008)  # before accepting: the handshake is answered 403
        return
    await websocket.accept(subprotocol=SUBPROTOCOL)
    started_here: dict[uuid.UUID, str] = {}

    async def emit(message: dict[str, Any]) -> None:
        await websocket.send_text(json.dumps(message))

    try:
        while True:
            raw = await websocket.receive_text()
            # The person as the people file says now (removed or changed since the handshake).
            user = websocket.app.state.users.get(who.user.name)
            if user is None:
                await emit({"type": "error", "error": "signed out: no such person any more"})
                await websocket.close(code=1008)
                return
            target = _follow_target(raw)
            if target is not None:
                try:
                    if isinstance(target, str):
                        raise ChatRefused(422, target)
                    await follow_turn(_nc(websocket.app.state), websocket.app.state.db, user, target, emit)
                except (ChatRefused, ChatUnavailable) as exc:
                    await emit({"type": "error", "error": exc.message, "code": exc.status_code})
                continue
            try:
                message = ChatMessage.model_validate_json(raw)
            except ValidationError as exc:
                detail = "; ".join(
                    f"{'.'.join(str(p) for p in e['loc']) or 'message'}: {e['msg']}" for e in exc.errors()
                )
                await emit({"type": "error", "error": f"not a chat message: {detail}"})
                continue
            try:
                request = await check_message(websocket.app.state.db, user, message, started_here)
                nc = _nc(websocket.app.state)
            except (ChatRefused, ChatUnavailable) as exc:
                await emit({"type": "error", "error": exc.message, "code": exc.status_code})
                continue
            result = await run_turn(nc, message.profile_id, request, emit)
            if result.session_id is not None and result.turn_id is not None:
                started_here[result.session_id] = result.profile_id
            await emit({"type": "done", **result.model_dump(mode="json", exclude={"tool_calls"})})
    except WebSocketDisconnect:
        return
    except (RuntimeError, OSError) as exc:  # the browser went away mid-turn
        log.debug("chat socket closed: %s", exc)
