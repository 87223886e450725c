"""What a chat request may carry, checked before anything of its turn is published: text PostgreSQL can
store (no U+0000), tags of at most 256 characters and only on a new session, a source of `web`, `cli`
or `service` (`subagent` only from delegation), a parent session of the profile's own. An approval
answer naming its decider with a NUL is refused and the approval keeps waiting."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from commonos.loop.approvals import NatsApprover, new_request
from commonos.loop.locks import NatsSessionLocks
from commonos.loop.loop import Loop
from commonos.loop.nats_journal import NatsJournal
from commonos.loop.profiles import Profile
from commonos.loop.providers import build_provider
from commonos.loop.service import LoopService
from commonos.proto import events as ev
from commonos.proto.ids import new_id
from commonos.proto.requests import ApprovalAnswer, ChatReply, chat_subject
from commonos.proto.subjects import EVENTS_ALL
from commonos.runtime.loop_requests import send_decision
from commonos.runtime.nats import ensure_streams
from tests.loop.helpers import of_type, write_profile

LONG_TAG = "client:" + "a" * 250  # 257 characters
COS = str(Path(sys.executable).with_name("cos"))


@pytest.fixture
def profiles(tmp_path: Path) -> dict[str, Profile]:
    return {p: write_profile(tmp_path / "profiles", p, timeout_s=30) for p in ("acme", "other")}


@pytest.fixture
async def service(nc: Client, js: JetStreamContext, profiles: dict[str, Profile]) -> AsyncIterator[LoopService]:
    await ensure_streams(js)
    loop = Loop(
        NatsJournal(js),
        profiles,
        {p.id: build_provider(p) for p in profiles.values()},
        locks=NatsSessionLocks(js),
        approver=NatsApprover(nc),
    )
    svc = LoopService(nc, loop, handle_signals=False, grace_s=0.1)
    await svc.start()
    serving = asyncio.create_task(svc.serve())
    yield svc
    svc.stop_event.set()
    await serving
    await svc.shutdown()


async def chat(nc: Client, request: dict[str, object], profile: str = "acme") -> ChatReply:
    msg = await nc.request(chat_subject(profile), msgspec.json.encode(request), timeout=20)
    return msgspec.json.decode(msg.data, type=ChatReply)


async def sessions(js: JetStreamContext) -> list[ev.SessionCreated]:
    return of_type(await NatsJournal(js).events([EVENTS_ALL]), ev.SessionCreated)


async def test_a_request_with_nul_is_rejected_and_nothing_of_it_published(
    nc: Client, js: JetStreamContext, service: LoopService
) -> None:
    first = await chat(nc, {"text": "hello"})
    assert first.status == "completed"
    before = (await js.stream_info("COS_EVENTS")).state.messages
    cases: list[tuple[dict[str, object], str]] = [
        ({"text": "a\x00b"}, "the chat text contains U+0000 (NUL), which cannot be stored"),
        ({"text": "a\x00b", "session_id": str(first.session_id)}, "the chat text contains U+0000 (NUL)"),
        ({"text": "hi", "source": "web\x00"}, "the source contains U+0000 (NUL), which cannot be stored"),
        ({"text": "hi", "tags": ["client:a\x00"]}, "a tag contains U+0000 (NUL), which cannot be stored"),
        ({"text": "hi", "session_id": "\x00"}, "bad chat request: Invalid UUID - at `$.session_id`"),
        ({"text": "hi", "parent_session_id": "\x00"}, "bad chat request: Invalid UUID - at `$.parent_session_id`"),
    ]
    for request, error in cases:
        reply = await chat(nc, request)
        assert reply.status == "rejected", request
        assert reply.error is not None and reply.error.startswith(error) and "\n" not in reply.error, reply.error
    assert (await js.stream_info("COS_EVENTS")).state.messages == before


async def test_an_approval_answer_with_nul_is_refused_and_the_approval_keeps_waiting(nc: Client) -> None:
    request = new_request(
        approval_id=new_id(),
        profile_id="acme",
        session_id=new_id(),
        turn_id=new_id(),
        call_id="c1",
        tool="shell",
        args={"command": "ls"},
        risk=ev.Risk.HIGH,
        timeout_s=30,
    )
    asked = asyncio.create_task(NatsApprover(nc).ask(request, 30))
    await asyncio.sleep(0.1)  # subscribed
    # Who decides is the answer subject's last token: one with U+0000 is not a name, and never sent.
    with pytest.raises(ValueError, match="approver"):
        await send_decision(nc, request.profile_id, request.approval_id, ev.ApprovalStatus.APPROVED, "cli:ann\x00")
    assert not asked.done()
    taken = await send_decision(nc, request.profile_id, request.approval_id, ev.ApprovalStatus.DENIED, "cli:ann")
    assert taken.ok
    assert await asked == ApprovalAnswer(status=ev.ApprovalStatus.DENIED, decided_by="cli:ann")


async def test_tags_are_at_most_256_characters_and_only_for_a_new_session(
    nc: Client, js: JetStreamContext, service: LoopService
) -> None:
    too_long = await chat(nc, {"text": "hi", "tags": [LONG_TAG]})
    assert too_long.status == "rejected"
    assert too_long.error == f"invalid tag '{LONG_TAG[:40]}…' (257 characters): longer than 256 characters"
    longest = await chat(nc, {"text": "hi", "tags": [LONG_TAG[:-1]]})
    assert longest.status == "completed"
    again = await chat(nc, {"text": "hi", "tags": ["project:x"], "session_id": str(longest.session_id)})
    assert again.status == "rejected"
    assert again.error == (
        f"a session's tags are fixed when it starts: send no tags to continue session {longest.session_id}"
    )
    fine = await chat(nc, {"text": "hi", "session_id": str(longest.session_id)})
    assert fine.status == "completed"
    [created] = await sessions(js)
    assert created.tags == (LONG_TAG[:-1],)


async def test_sources_and_parents(nc: Client, js: JetStreamContext, service: LoopService) -> None:
    for source in ("subagent", "bogus", ""):
        reply = await chat(nc, {"text": "hi", "source": source})
        assert reply.status == "rejected"
        assert reply.error == (
            f"source {source!r} is not allowed: a chat request comes from 'web', 'cli' or 'service' "
            "(subagent sessions are made by delegation only)"
        )
    unsaid = await chat(nc, {"text": "hi"})
    web = await chat(nc, {"text": "hi", "source": "web"})
    theirs = await chat(nc, {"text": "hi"}, profile="other")
    unknown = new_id()
    for parent in (unknown, theirs.session_id):
        reply = await chat(nc, {"text": "hi", "parent_session_id": str(parent)})
        assert reply.status == "rejected"
        assert reply.error == f"parent session {parent} not found for profile 'acme'"
    both = await chat(nc, {"text": "hi", "session_id": str(web.session_id), "parent_session_id": str(web.session_id)})
    assert both.status == "rejected"
    assert both.error == (
        f"a session's parent is fixed when it starts: send no parent_session_id to continue session {web.session_id}"
    )
    child = await chat(nc, {"text": "hi", "source": "web", "parent_session_id": str(web.session_id)})
    assert child.status == "completed"
    created = {s.session_id: s for s in await sessions(js)}
    assert (created[unsaid.session_id].source, created[unsaid.session_id].parent_session_id) == ("service", None)
    assert created[web.session_id].source == "web"
    assert (created[child.session_id].source, created[child.session_id].parent_session_id) == ("web", web.session_id)
    assert not any(s.source == "subagent" for s in created.values())


def cos(*args: str, env: dict[str, str], stdin: str = "") -> tuple[int, str, str]:
    done = subprocess.run(
        [COS, *args], check=False, env={**os.environ, **env}, input=stdin, capture_output=True, text=True, timeout=30
    )
    return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize(
    ("args", "first_line"),
    [
        (
            ("--tag", LONG_TAG, "hi"),
            f"cos chat: error: argument --tag: invalid tag '{LONG_TAG[:40]}…' (257 characters): longer than 256 "
            "characters (see `cos chat --help`)",
        ),
        (
            ("--session", "01a23200-0000-7000-8000-000000000000", "--tag", "client:acme", "hi"),
            "cos: error: --tag is for a new session: a session's tags are fixed when it starts "
            "(leave out --tag to continue session 01a23200-0000-7000-8000-000000000000)",
        ),
    ],
)
def test_cos_chat_refuses_bad_tags_in_one_line(args: tuple[str, ...], first_line: str, tmp_path: Path) -> None:
    code, out, err = cos("chat", *args, env={"COS_DATA_DIR": str(tmp_path), "COS_NATS_URL": "nats://127.0.0.1:1"})
    assert (code, out, err.splitlines()[0]) == (2, "", first_line)
    assert err.count("\n") == 1 and "Traceback" not in err


async def test_a_cos_chat_conversation_gives_its_tags_once(
    nats_url: str, js: JetStreamContext, service: LoopService, profiles: dict[str, Profile]
) -> None:
    env = {"COS_NATS_URL": nats_url, "COS_PROFILES_DIR": str(profiles["acme"].folder.parent)}
    code, out, err = await asyncio.to_thread(
        cos, "chat", "--profile", "acme", "--tag", "client:acme", env=env, stdin="hello\nhello again\n"
    )
    assert (code, out) == (0, "you> hello\nyou> I have nothing more scripted to say.\nyou> "), err
    [created] = await sessions(js)
    assert created.tags == ("client:acme",)
    turns = of_type(await NatsJournal(js).events([EVENTS_ALL]), ev.TurnFinished)
    assert [t.status for t in turns] == ["completed", "completed"]
    assert {t.session_id for t in turns} == {created.session_id}
    assert isinstance(created.session_id, uuid.UUID)
