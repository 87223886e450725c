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
    ← {"type": "approval", "approval_id", "tool", "args", "risk", "expires_at"}   a risky call waits (/approvals)
    ← {"type": "approval_decided", "call_id", "status", "decided_by"}
    ← {"type": "tool_call", "call_id", "name", "args", "result", "is_error", "risk", "approval", "duration_ms"}
    ← {"type": "done", "status", "profile_id", "session_id", "turn_id", "text", "error"}   the final status

The handshake needs the sign-in's cookie (or the trusted proxy header), the sign-in's CSRF token as the query
parameter `csrf_token` (the page has it), and, when the browser sends an Origin, this console's own (or one of
COS_CONSOLE_ORIGINS): otherwise
the server refuses it (HTTP 403) before any message. A person removed from the people file mid-way is refused
at their next message.

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
from typing import Annotated, Any, Final

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

log = logging.getLogger(__name__)

router = APIRouter(tags=["chat"])

Db = Annotated[Database, Depends(get_db)]

#: How long a turn may take before the console stops waiting (the turn goes on in the loop).
TURN_TIMEOUT_S: Final = 600.0
#: After the final reply, how long the console waits for events still on their way.
SETTLE_S: Final = 0.1
MAX_TAGS: Final = 32
MAX_TEXT: Final = 200_000


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
        if kind == "delta":
            try:
                delta = decode_delta(msg.data)
            except ValueError:
                return
            if delta.turn_id == turn:
                await emit({"type": "delta", "seq": delta.seq, "kind": delta.kind.value, "text": delta.text})
        elif kind == "approval":
            try:
                approval = msgspec.json.decode(msg.data, type=ApprovalRequest)
            except msgspec.DecodeError:
                return
            if approval.turn_id == turn:
                await emit(
                    {
                        "type": "approval",
                        "approval_id": str(approval.approval_id),
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
                return
            if getattr(event, "turn_id", None) != turn:
                return
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


@router.get("/chat", include_in_schema=False, response_class=HTMLResponse)
async def chat_page(
    request: Request, who: SignedIn, session: uuid.UUID | None = None, profile: str | None = None
) -> HTMLResponse:
    profiles = await chat_profiles(request.app.state.db, who.user)
    return render(
        request,
        "chat.html",
        {
            "profiles": profiles,
            "selected": profile if profile in profiles else (profiles[0] if profiles else None),
            "session": session,
            "may_chat": bool(profiles),
        },
    )


# The socket.


def socket_principal(websocket: WebSocket) -> Principal | None:
    """The signed-in person of a handshake that carries their CSRF token and comes from this console."""
    auth: Auth = websocket.app.state.auth
    who = auth.principal(websocket)
    if who is None or not auth.same_origin(websocket):
        return None
    token = websocket.query_params.get("csrf_token", "")
    if not hmac.compare_digest(token.encode(), who.csrf_token.encode()):
        return None
    return who


@router.websocket("/api/chat/ws")
async def chat_socket(websocket: WebSocket) -> None:
    who = socket_principal(websocket)
    if who is None:
        await websocket.close(code=1008)  # before accepting: the handshake is answered 403
        return
    await websocket.accept()
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
