"""Approvals: the risky tool calls waiting for a decision that the signed-in person may decide, and the decision.

Where "pending" lives: only in the loop services whose turns wait (PostgreSQL's `approvals` holds decisions, made
or timed out, never a waiting one). The console asks every loop service (`cos.approvals.pending`: each answers
with its own waiting approvals; commonos.runtime.loop_requests.list_pending) and follows
`cos.approvals.<profile>.request` (a new one waits) and the `approval_decided` events (one is decided or timed
out) to update the page live.

Who decides: operators every profile's approvals; approvers those of their profiles (the people file's
`profiles`), another profile's is a 403; analysts never (their list is empty, a decision a 403). A decision is
sent as `cos approve` / `cos deny` send theirs (`cos.approvals.decide.<profile>.<id>.<approver>`), the approver
being `web:<name>`, which the loop records as `decided_by`. A name that cannot be one subject token (a `.` in
it) cannot decide here (422): use `cos approve --by`.

    GET  /api/approvals                          the pending approvals this person may decide
    POST /api/approvals/{approval_id}/approve    (or /deny) with the X-CSRF-Token header
    GET  /approvals                              the page (htmx: one click per decision, live updates by SSE)
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any, Final, Literal

import msgspec
import nats.errors
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse
from nats.aio.client import Client
from nats.aio.msg import Msg
from pydantic import BaseModel
from sse_starlette.sse import EventSourceResponse

from commonos.console.auth import CsrfChecked, SignedIn
from commonos.console.metrics import LIVE_WATCHERS
from commonos.console.templating import render
from commonos.console.users import Role, User
from commonos.proto.events import ApprovalStatus
from commonos.proto.requests import APPROVAL_REQUESTS_ALL, APPROVER, ApprovalRequest
from commonos.runtime.loop_requests import list_pending, send_decision

router = APIRouter(tags=["approvals"])

#: Every approval decision (or timeout) of every profile, as the loop records it.
DECISIONS_ALL: Final = "cos.events.*.*.approval_decided"


class PendingApproval(BaseModel):
    approval_id: uuid.UUID
    profile_id: str
    session_id: uuid.UUID
    turn_id: uuid.UUID
    call_id: str
    tool: str
    args: dict[str, Any]
    risk: str
    #: Unanswered by then, the call is denied (`timed_out`).
    expires_at: datetime
    session_url: str


class ApprovalList(BaseModel):
    approvals: list[PendingApproval]
    #: False for analysts: they decide nothing.
    may_decide: bool


class Decision(BaseModel):
    approval_id: uuid.UUID
    profile_id: str
    status: Literal["approved", "denied"]
    decided_by: str


def may_decide(user: User, profile_id: str) -> bool:
    if user.role is Role.OPERATOR:
        return True
    return user.role is Role.APPROVER and profile_id in user.profiles


def scope(user: User) -> tuple[str, ...] | None:
    """The profiles whose approvals `user` may decide: None for all (operators)."""
    if user.role is Role.OPERATOR:
        return None
    if user.role is Role.APPROVER:
        return user.profiles
    return ()


def _nc(request: Request) -> Client:
    nc: Client | None = request.app.state.nc
    if nc is None:
        raise HTTPException(503, "the console has no NATS connection (COS_NATS_URL)")
    return nc


def _view(r: ApprovalRequest) -> PendingApproval:
    return PendingApproval(
        approval_id=r.approval_id,
        profile_id=r.profile_id,
        session_id=r.session_id,
        turn_id=r.turn_id,
        call_id=r.call_id,
        tool=r.tool,
        args=r.args,
        risk=r.risk.value,
        expires_at=r.expires_at,
        session_url=f"/sessions/{r.session_id}",
    )


async def load(request: Request, user: User) -> ApprovalList:
    profiles = scope(user)
    if profiles == ():
        return ApprovalList(approvals=[], may_decide=False)
    pending = await list_pending(_nc(request), profiles)
    return ApprovalList(approvals=[_view(r) for r in pending], may_decide=True)


@router.get("/api/approvals", response_model=ApprovalList)
async def api_approvals(request: Request, who: SignedIn) -> ApprovalList:
    """The approvals waiting now that this person may decide, soonest to expire first."""
    return await load(request, who.user)


async def send(request: Request, user: User, approval_id: uuid.UUID, status: ApprovalStatus) -> Decision:
    if user.role is Role.ANALYST:
        raise HTTPException(403, "analysts do not decide approvals")
    approver = f"web:{user.name}"
    if not APPROVER.fullmatch(approver):
        raise HTTPException(422, f"the name {user.name!r} cannot name an approver (no '.'): use cos approve --by")
    nc = _nc(request)
    waiting = {r.approval_id: r for r in await list_pending(nc)}
    found = waiting.get(approval_id)
    if found is None:
        raise HTTPException(404, f"no approval {approval_id} is waiting (decided, timed out, or unknown)")
    if not may_decide(user, found.profile_id):
        raise HTTPException(403, f"{user.name} does not decide for profile {found.profile_id!r}")
    ack = await send_decision(nc, found.profile_id, approval_id, status, approver)
    if not ack.ok:
        raise HTTPException(409, ack.error or "the decision was not taken")
    return Decision(
        approval_id=approval_id,
        profile_id=found.profile_id,
        status="approved" if status is ApprovalStatus.APPROVED else "denied",
        decided_by=approver,
    )


DECISIONS: Final = {"approve": ApprovalStatus.APPROVED, "deny": ApprovalStatus.DENIED}

RESPONSES: Final[dict[int | str, dict[str, Any]]] = {
    403: {"description": "not this person's to decide, or no CSRF token"},
    404: {"description": "no such approval is waiting"},
    409: {"description": "the loop did not take the decision (already decided, timed out)"},
}


@router.post("/api/approvals/{approval_id}/approve", response_model=Decision, responses=RESPONSES)
async def api_approve(request: Request, who: CsrfChecked, approval_id: uuid.UUID) -> Decision:
    """Let the waiting call run; `decided_by` is `web:<name>`."""
    return await send(request, who.user, approval_id, ApprovalStatus.APPROVED)


@router.post("/api/approvals/{approval_id}/deny", response_model=Decision, responses=RESPONSES)
async def api_deny(request: Request, who: CsrfChecked, approval_id: uuid.UUID) -> Decision:
    """Refuse the waiting call; `decided_by` is `web:<name>`."""
    return await send(request, who.user, approval_id, ApprovalStatus.DENIED)


# The page.


@router.get("/approvals", include_in_schema=False, response_class=HTMLResponse)
async def approvals_page(request: Request, who: SignedIn) -> HTMLResponse:
    return render(request, "approvals.html", {"page": await load(request, who.user), "note": None})


@router.get("/approvals/list", include_in_schema=False, response_class=HTMLResponse)
async def approvals_fragment(request: Request, who: SignedIn) -> HTMLResponse:
    return render(request, "approvals_list.html", {"page": await load(request, who.user), "note": None})


@router.post("/approvals/{approval_id}/{decision}", include_in_schema=False, response_class=HTMLResponse)
async def decide_from_page(request: Request, who: CsrfChecked, approval_id: uuid.UUID, decision: str) -> HTMLResponse:
    """One click (htmx): the decision, then the list as it is now, with a line saying what was done."""
    status = DECISIONS.get(decision)
    if status is None:
        raise HTTPException(404, "approve or deny")
    try:
        done = await send(request, who.user, approval_id, status)
        note, ok = f"{done.status} {approval_id} as {done.decided_by}", True
    except HTTPException as exc:
        if exc.status_code == 403 and who.user.role is Role.ANALYST:
            raise
        note, ok = str(exc.detail), False
    context = {"page": await load(request, who.user), "note": note, "note_ok": ok}
    return render(request, "approvals_list.html", context)


async def _changes(request: Request, nc: Client, user: User) -> AsyncIterator[dict[str, str]]:
    """`changed` whenever an approval of this person's profiles starts to wait or is decided."""
    profiles = scope(user)
    queue: asyncio.Queue[str] = asyncio.Queue(maxsize=100)

    async def on_message(msg: Msg) -> None:
        profile = msg.subject.split(".")[2]
        if msg.subject.endswith(".request"):
            with contextlib.suppress(msgspec.DecodeError):
                profile = msgspec.json.decode(msg.data, type=ApprovalRequest).profile_id
        if (profiles is None or profile in profiles) and not queue.full():
            queue.put_nowait(profile)

    subs = [await nc.subscribe(APPROVAL_REQUESTS_ALL, cb=on_message), await nc.subscribe(DECISIONS_ALL, cb=on_message)]
    LIVE_WATCHERS.inc()
    live = request.app.state.live
    try:
        yield {"event": "ready", "data": "following"}
        while not live.closing.is_set():
            if await request.is_disconnected():
                return
            try:
                await asyncio.wait_for(queue.get(), 1.0)
            except TimeoutError:
                continue
            while not queue.empty():  # a burst is one reload
                queue.get_nowait()
            yield {"event": "changed", "data": "changed"}
    finally:
        LIVE_WATCHERS.dec()
        for sub in subs:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()


@router.get("/approvals/live", include_in_schema=False)
async def approvals_live(request: Request, who: SignedIn) -> EventSourceResponse:
    """Server-sent events: `changed` when the list may have changed (the page then fetches /approvals/list)."""
    if scope(who.user) == ():
        raise HTTPException(403, "analysts do not decide approvals")
    return EventSourceResponse(_changes(request, _nc(request), who.user), ping=15)
