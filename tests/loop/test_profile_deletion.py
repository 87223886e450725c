"""The loop and a deleted profile: it learns deletions from the journal (the stream) at start and at every turn,
refuses the profile's chats (`rejected`), never continues a session from before a deletion, stops a turn whose
profile is deleted under it, reports a profile whose folder is gone, and deletes on `cos.cmd.<profile>.delete`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from commonos.loop.approvals import FixedApprover, NatsApprover
from commonos.loop.event_journal import EventJournal
from commonos.loop.journal import MemoryChange
from commonos.loop.locks import MemorySessionLocks, NatsSessionLocks
from commonos.loop.loop import BadRequest, Loop, TurnRequest
from commonos.loop.memory import MemoryJournal
from commonos.loop.nats_journal import NatsJournal
from commonos.loop.profile_admin import DeleteReply, DeleteRequest, ProfileAdminError, delete_profile
from commonos.loop.profiles import Profile, load_profiles
from commonos.loop.providers import ModelRequest, ModelResponse, build_provider
from commonos.loop.providers.base import Provider
from commonos.loop.service import LoopService
from commonos.loop.subjects import delete_subject
from commonos.proto.events import (
    NO_SESSION,
    MemoryOp,
    MemoryTarget,
    ModelCallCompleted,
    ProfileDeleted,
    ProfileUpserted,
    TurnFinished,
    TurnStatus,
)
from commonos.proto.identity import NewSession, TurnInfo
from commonos.proto.ids import new_id
from commonos.proto.requests import ChatReply, ChatRequest, chat_subject
from commonos.proto.subjects import EVENTS_ALL
from commonos.runtime.nats import ensure_streams
from commonos.runtime.publisher import EventPublisher
from tests.loop.helpers import of_type, write_profile

ANSWERS = """
[[conversations]]
match = "look"

[[conversations.steps]]
tool_calls = [{ name = "list_dir", args = { path = "." } }]

[[conversations.steps]]
text = "seen"

[[conversations]]

[[conversations.steps]]
text = "hello"
"""


@pytest.fixture(params=["memory", "nats"])
async def journal(request: pytest.FixtureRequest, js: JetStreamContext) -> EventJournal:
    if request.param == "memory":
        return MemoryJournal()
    await ensure_streams(js)
    return NatsJournal(js)


def _loop(journal: EventJournal, *profiles: Profile, provider: Provider | None = None) -> Loop:
    return Loop(
        journal,
        {p.id: p for p in profiles},
        {p.id: provider if provider is not None else build_provider(p) for p in profiles},
        locks=MemorySessionLocks(),
        approver=FixedApprover(None),  # never asked: no risky tool in these scripts
        deletion_check_s=0,
    )


async def test_the_journal_says_whether_a_profile_is_deleted_or_re_created(journal: EventJournal) -> None:
    assert not (await journal.profile_status("demo")).known
    await journal.publish_profile("demo", ("team:core",))
    status = await journal.profile_status("demo")
    assert status.known and status.deleted is None and status.deleted_position == 0
    assert status.upserted is not None and status.upserted.tags == ("team:core",)

    deletion = await delete_profile(journal, "demo", "cli:alice")
    status = await journal.profile_status("demo")
    assert status.deleted == deletion and status.deleted_position > status.upserted_position
    with pytest.raises(ProfileAdminError, match=r"^profile 'demo' was deleted at .* by cli:alice already$"):
        await delete_profile(journal, "demo", "cli:bob")
    with pytest.raises(ProfileAdminError, match=r"^no profile 'ghost' in the event stream$"):
        await delete_profile(journal, "ghost", "cli:bob")
    with pytest.raises(ProfileAdminError, match="U\\+0000"):
        await delete_profile(journal, "demo", "cli:\x00")

    # A profile known only from its work (imported before importers published profile_upserted) is deletable.
    await journal.create_session(NewSession(profile_id="imported", source="claude-code"))
    assert not (await journal.profile_status("imported")).known
    await delete_profile(journal, "imported", "cli:alice")
    assert (await journal.profile_status("imported")).deleted is not None

    await journal.publish_profile("demo", ("team:again",))
    again = await journal.profile_status("demo")
    assert again.deleted is None and again.deleted_position == status.deleted_position
    assert set(await journal.profile_statuses()) == {"demo", "imported"}


async def test_a_re_created_profiles_memory_starts_empty(journal: EventJournal, profile: Profile) -> None:
    turn = TurnInfo(profile_id=profile.id, session_id=new_id(), turn_id=new_id())
    await journal.record_memory_change(turn, _add("old"))
    await journal.delete_profile(profile.id, "cli:alice")
    assert (await journal.load_memory(profile.id)).memory == ()
    await journal.publish_profile(profile.id, ())
    await journal.record_memory_change(turn, _add("new"))
    assert (await journal.load_memory(profile.id)).memory == ("new",)


def _add(content: str) -> MemoryChange:
    return MemoryChange(target=MemoryTarget.MEMORY, op=MemoryOp.ADD, position=0, content=content)


async def test_a_deleted_profile_takes_no_chat_and_a_re_created_one_never_continues_an_old_session(
    journal: EventJournal, tmp_path: Path
) -> None:
    demo = write_profile(tmp_path / "profiles", script=ANSWERS)
    await journal.publish_profile(demo.id, demo.tags)
    loop = _loop(journal, demo)
    old = await loop.run_turn(TurnRequest(profile_id="demo", text="hi"))
    assert old.status is TurnStatus.COMPLETED
    await delete_profile(journal, "demo", "cli:alice")
    before = len(await _events(journal))

    with pytest.raises(BadRequest, match=r"^profile 'demo' was deleted at .* UTC by cli:alice: it takes no chats$"):
        await loop.run_turn(TurnRequest(profile_id="demo", text="hello?"))
    with pytest.raises(BadRequest, match=r"^profile 'demo' was deleted at .* UTC by cli:alice: it takes no chats$"):
        await loop.run_turn(TurnRequest(profile_id="demo", text="hello?", session_id=old.session_id))
    assert len(await _events(journal)) == before  # nothing of either turn was recorded

    await journal.publish_profile("demo", demo.tags)  # re-created
    with pytest.raises(BadRequest, match=rf"^session {old.session_id} was deleted with profile 'demo' at .* by "):
        await loop.run_turn(TurnRequest(profile_id="demo", text="hello?", session_id=old.session_id))
    with pytest.raises(BadRequest, match=rf"^parent session {old.session_id} not found for profile 'demo'"):
        await loop.run_turn(TurnRequest(profile_id="demo", text="child", parent_session_id=old.session_id))
    fresh = await loop.run_turn(TurnRequest(profile_id="demo", text="hi"))
    assert fresh.status is TurnStatus.COMPLETED and fresh.session_id != old.session_id
    again = await loop.run_turn(TurnRequest(profile_id="demo", text="hi", session_id=fresh.session_id))
    assert again.status is TurnStatus.COMPLETED


class DeletedMidway:
    """A model that answers with a tool call, while someone deletes its profile."""

    name = "scripted"

    def __init__(self, journal: EventJournal, profile: Profile) -> None:
        self.journal = journal
        self.inner = build_provider(profile)
        self.calls = 0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        if self.calls == 1:
            await self.journal.delete_profile("demo", "cli:bob")
        return await self.inner.complete(request)

    async def close(self) -> None:
        await self.inner.close()


async def test_a_turn_whose_profile_is_deleted_stops_before_its_next_model_call(
    journal: EventJournal, tmp_path: Path
) -> None:
    demo = write_profile(tmp_path / "profiles", script=ANSWERS)
    await journal.publish_profile(demo.id, demo.tags)
    model = DeletedMidway(journal, demo)
    loop = _loop(journal, demo, provider=model)
    result = await loop.run_turn(TurnRequest(profile_id="demo", text="look around"))
    assert result.status is TurnStatus.FAILED and model.calls == 1
    assert result.error is not None and result.error.startswith("profile 'demo' was deleted at ")
    assert result.error.endswith(" by cli:bob during the turn")
    events = await _events(journal)
    assert len(of_type(events, ModelCallCompleted)) == 1
    [finished] = of_type(events, TurnFinished)
    assert finished.status is TurnStatus.FAILED


async def _events(journal: EventJournal) -> list[object]:
    if isinstance(journal, MemoryJournal):
        return list(journal.events)
    assert isinstance(journal, NatsJournal)
    return list(await journal.events([EVENTS_ALL]))


# -- the service -------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _service(nc: Client, js: JetStreamContext, root: Path) -> AsyncIterator[LoopService]:
    profiles = load_profiles(root)
    loop = Loop(
        NatsJournal(js),
        profiles,
        {p.id: build_provider(p) for p in profiles.values()},
        locks=NatsSessionLocks(js),
        approver=NatsApprover(nc),
    )
    svc = LoopService(nc, loop, handle_signals=False, grace_s=0.1, profiles_dir=root)
    await svc.start()
    serving = asyncio.create_task(svc.serve())
    try:
        yield svc
    finally:
        svc.stop_event.set()
        await serving
        await svc.shutdown()


async def _chat(nc: Client, profile: str, request: ChatRequest) -> ChatReply:
    msg = await nc.request(chat_subject(profile), msgspec.json.encode(request), timeout=20)
    return msgspec.json.decode(msg.data, type=ChatReply)


async def _delete(nc: Client, profile: str, body: bytes, requester: str = "service:admin-ui") -> DeleteReply:
    msg = await nc.request(delete_subject(profile, requester), body, timeout=20)
    return msgspec.json.decode(msg.data, type=DeleteReply)


async def test_at_start_the_loop_publishes_no_deleted_profile_and_reports_one_whose_folder_is_gone(
    nc: Client, js: JetStreamContext, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    await ensure_streams(js)
    root = tmp_path / "profiles"
    for name in ("demo", "other", "gone"):
        write_profile(root, name, script=ANSWERS)
    earlier = NatsJournal(js)  # a loop that ran before, with the three folders
    for name in ("demo", "other", "gone"):
        await earlier.publish_profile(name, ())
    await EventPublisher(js, "urn:commonos:importer").publish(ProfileUpserted(profile_id="claude-code"))
    await delete_profile(earlier, "demo", "cli:alice")
    shutil.rmtree(root / "gone")

    caplog.set_level(logging.WARNING, logger="commonos.loop.service")
    async with _service(nc, js, root):
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        refused = await _chat(nc, "demo", ChatRequest(text="hello"))
        served = await _chat(nc, "other", ChatRequest(text="hello"))
    deleted, missing = sorted(warnings)
    assert re.fullmatch(
        rf"profile 'demo' \({re.escape(str(root / 'demo'))}\) was deleted at \S+ \S+ UTC by cli:alice: it is not "
        r"published again and takes no chats \(remove its folder, or re-create it: cos profile recreate demo\)",
        deleted,
    ), deleted
    assert missing == (
        f"profile 'gone': its folder {root / 'gone'} is missing; its history stays "
        "(restore the folder, or delete the profile: cos profile delete gone)"
    )
    assert refused.status == "rejected" and refused.error is not None
    assert refused.error.startswith("profile 'demo' was deleted at ") and refused.error.endswith(
        " by cli:alice: it takes no chats"
    )
    assert (served.status, served.text) == ("completed", "hello")
    upserts = of_type(await NatsJournal(js).events([EVENTS_ALL]), ProfileUpserted)
    assert sorted(u.profile_id for u in upserts) == ["claude-code", "demo", "gone", "other", "other"]


async def test_a_delete_request_deletes_the_profile_and_its_chats_are_refused_from_then_on(
    nc: Client, js: JetStreamContext, tmp_path: Path
) -> None:
    await ensure_streams(js)
    root = tmp_path / "profiles"
    for name in ("demo", "other"):
        write_profile(root, name, script=ANSWERS)
    async with _service(nc, js, root):
        first = await _chat(nc, "demo", ChatRequest(text="hello"))
        assert first.status == "completed"

        reply = await _delete(nc, "demo", msgspec.json.encode(DeleteRequest()))
        assert reply.ok and reply.error is None and reply.event_id is not None
        [deletion] = of_type(await NatsJournal(js).events([EVENTS_ALL]), ProfileDeleted)
        assert (deletion.event_id, deletion.profile_id, deletion.session_id, deletion.deleted_by) == (
            reply.event_id,
            "demo",
            NO_SESSION,
            "service:admin-ui",
        )
        again = await _chat(nc, "demo", ChatRequest(text="still there?", session_id=first.session_id))
        assert again.status == "rejected" and (again.error or "").endswith(" by service:admin-ui: it takes no chats")

        twice = await _delete(nc, "demo", b"{}")
        assert not twice.ok and (twice.error or "").endswith(" by service:admin-ui already")
        ghost = await _delete(nc, "ghost", b"{}")
        assert (ghost.ok, ghost.error) == (False, "no profile 'ghost' in the event stream")
        bad = await _delete(nc, "other", b"{not json")
        assert not bad.ok and (bad.error or "").startswith("bad delete request: ")

        # Deleted by another process: the service learns it from the stream at the next turn.
        await delete_profile(NatsJournal(js), "other", "cli:bob")
        other = await _chat(nc, "other", ChatRequest(text="hello"))
        assert other.status == "rejected" and (other.error or "").endswith(" by cli:bob: it takes no chats")
