"""Sizes on a real nats-server, at its default max_payload (1 MiB) and at 64 KiB: a chat text too large
for one message is rejected before anything is published, a tool result is cut to fit, a model's
message too large fails its turn — and the loop's connection stays open. A connection the server
closes anyway stops the service, which says so on /healthz and exits non-zero."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import nats
import pytest
from nats.aio.client import Client

from commonos.loop.approvals import NatsApprover
from commonos.loop.locks import NatsSessionLocks
from commonos.loop.loop import Loop
from commonos.loop.nats_journal import NatsJournal
from commonos.loop.profiles import Profile
from commonos.loop.providers import build_provider
from commonos.loop.service import LoopService
from commonos.loop.tools import MAX_RESULT_CHARS
from commonos.proto.cloudevents import event_headers
from commonos.proto.events import (
    Event,
    MessageAppended,
    ModelCallCompleted,
    ProfileUpserted,
    SessionCreated,
    ToolCallRecorded,
    TurnFinished,
    TurnStatus,
    encode_event,
)
from commonos.proto.ids import new_id
from commonos.proto.messages import ToolResultMessage, UserMessage
from commonos.proto.requests import ChatReply, ChatRequest, chat_subject
from commonos.proto.subjects import EVENTS_ALL, EVENTS_STREAM
from commonos.runtime.embedded import NatsServer
from commonos.runtime.limits import header_bytes, message_bytes, with_stream_header
from commonos.runtime.nats import ensure_streams
from tests.loop.helpers import of_type, write_profile
from tests.loop.test_loop_nats import assert_stored_once


@dataclass
class Served:
    """A loop service on its own connection, and a client's connection to talk to it."""

    service: LoopService
    loop_nc: Client
    client: Client
    max_payload: int

    async def chat(self, text: str, profile: str = "demo") -> ChatReply:
        data = msgspec.json.encode(ChatRequest(text=text))
        msg = await self.client.request(chat_subject(profile), data, timeout=20)
        return msgspec.json.decode(msg.data, type=ChatReply)

    async def events(self) -> list[Event]:
        return await NatsJournal(self.client.jetstream()).events([EVENTS_ALL])


async def _connect(url: str) -> Client:
    return await nats.connect(url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)


async def serve_loop(url: str, profile: Profile) -> AsyncIterator[Served]:
    loop_nc = await _connect(url)
    client = await _connect(url)
    js = loop_nc.jetstream()
    await ensure_streams(js)
    loop = Loop(
        NatsJournal(js),
        {profile.id: profile},
        {profile.id: build_provider(profile)},
        locks=NatsSessionLocks(js),
        approver=NatsApprover(loop_nc),
    )
    service = LoopService(loop_nc, loop, handle_signals=False, grace_s=0.1)
    await service.start()
    serving = asyncio.create_task(service.serve())
    try:
        yield Served(service, loop_nc, client, loop_nc.max_payload)
    finally:
        service.stop_event.set()
        await serving
        await service.shutdown()
        await client.close()
        await loop_nc.close()


#: `read` reads a large file, `shout` answers with a text just under max_payload, anything else `hello`.
SIZES_SCRIPT = """
[[conversations]]
match = "read"
[[conversations.steps]]
tool_calls = [{{ name = "read_file", args = {{ path = "big.txt" }} }}]
[[conversations.steps]]
text = "read it"

[[conversations]]
match = "shout"
[[conversations.steps]]
text = "{shout}"

[[conversations]]
[[conversations.steps]]
text = "hello"
"""

#: Characters JSON writes as 6 bytes (control characters), 2 (a quote, a line break), and 1 to 4 bytes of
#: UTF-8: 16,000 characters of it (what a model is shown at most) are 73,600 bytes, over a 64 KiB message.
MIXED = '\x01\x02\x03\x04\x05\x06"é😀\n'


@pytest.fixture
def sized_profile(sized_nats_server: NatsServer, tmp_path: Path) -> Profile:
    max_payload = sized_nats_server.max_payload or 1024 * 1024
    profile = write_profile(tmp_path / "profiles", script=SIZES_SCRIPT.format(shout="y" * (max_payload - 600)))
    profile.workspace.mkdir(parents=True, exist_ok=True)
    (profile.workspace / "big.txt").write_text(MIXED * (3 * max_payload // len(MIXED)))
    return profile


@pytest.fixture
async def served(sized_nats_server: NatsServer, sized_profile: Profile) -> AsyncIterator[Served]:
    async for s in serve_loop(sized_nats_server.url, sized_profile):
        yield s


def appended_sizes(text: str) -> tuple[int, int]:
    """The body of the `message_appended` that records `text` as a user message, and its headers."""
    event = MessageAppended(
        profile_id="demo", session_id=new_id(), turn_id=new_id(), seq=1, content=UserMessage(text=text)
    )
    headers = with_stream_header(event_headers(event, "urn:commonos:loop"), EVENTS_STREAM)
    return len(encode_event(event)), header_bytes(headers)


async def test_a_chat_just_under_max_payload_is_rejected_and_the_loop_keeps_serving(served: Served) -> None:
    # The finding: a text whose event body fits max_payload but whose headers push it over.
    text = "x" * (served.max_payload - 600)
    body, headers = appended_sizes(text)
    assert body <= served.max_payload < body + headers

    reply = await served.chat(text)

    assert reply.status == "rejected", reply
    assert reply.session_id is None and reply.turn_id is None
    error = reply.error or ""
    assert "\n" not in error
    assert str(body + headers) in error, error  # the message's size, as NATS counts it
    limit = served.service.loop.journal.message_limit
    assert limit < served.max_payload and str(limit) in error, error
    # nothing of the turn is published: no session, no turn, no message
    assert [type(e) for e in await served.events()] == [ProfileUpserted]
    # the loop's own connection is still open, and the next chat works
    assert served.loop_nc.is_connected
    after = await served.chat("hello")
    assert (after.status, after.text) == ("completed", "hello")


def stored_bytes(event: Event) -> int:
    return message_bytes(
        encode_event(event), with_stream_header(event_headers(event, "urn:commonos:loop"), EVENTS_STREAM)
    )


async def test_the_limit_is_the_smaller_of_the_setting_and_the_servers_max_payload(served: Served) -> None:
    journal = served.service.loop.journal
    assert isinstance(journal, NatsJournal)
    assert journal.message_limit == min(256 * 1024, served.max_payload - 1024)
    journal.max_message_bytes = 10_000
    assert journal.message_limit == 10_000


async def test_a_huge_tool_result_is_cut_to_fit_and_the_turn_completes(served: Served, sized_profile: Profile) -> None:
    reply = await served.chat("read the file")
    assert (reply.status, reply.text) == ("completed", "read it"), reply
    events = await served.events()
    assert_stored_once(events)
    [call] = of_type(events, ToolCallRecorded)
    full = (sized_profile.workspace / "big.txt").read_bytes()
    assert call.result_bytes == len(full) > served.max_payload
    assert call.result is not None
    shown, marker = call.result.rsplit("\n", 1)
    assert (
        full.decode().startswith(shown) and marker == f"[truncated: showing {len(shown.encode())} of {len(full)} bytes]"
    )
    [result] = [m for m in of_type(events, MessageAppended) if isinstance(m.content, ToolResultMessage)]
    assert result.content.content == call.result
    limit = served.service.loop.journal.message_limit
    assert stored_bytes(result) <= limit and stored_bytes(call) <= limit
    # at 1 MiB a model is shown MAX_RESULT_CHARS; at 64 KiB less: as much as fits
    assert (len(shown) == MAX_RESULT_CHARS) == (served.max_payload > 256 * 1024)
    if len(shown) < MAX_RESULT_CHARS:
        assert max(stored_bytes(result), stored_bytes(call)) > limit - 32
    assert [f.status for f in of_type(events, TurnFinished)] == [TurnStatus.COMPLETED]
    assert served.loop_nc.is_connected


async def test_a_model_message_too_large_fails_the_turn_and_the_loop_keeps_serving(served: Served) -> None:
    reply = await served.chat("shout")
    assert reply.status == "failed" and reply.error is not None, reply
    limit = served.service.loop.journal.message_limit
    assert reply.error.startswith("the assistant message is ") and f"limit of {limit} bytes" in reply.error
    events = await served.events()
    [finished] = of_type(events, TurnFinished)
    assert (finished.turn_id, finished.status, finished.error) == (reply.turn_id, TurnStatus.FAILED, reply.error)
    assert [m.role for m in of_type(events, MessageAppended)] == ["user"]
    assert len(of_type(events, ModelCallCompleted)) == 1 and len(of_type(events, SessionCreated)) == 1
    assert served.loop_nc.is_connected
    after = await served.chat("hello")
    assert (after.status, after.text) == ("completed", "hello")
