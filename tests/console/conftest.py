"""The console in-process (its own `serve`, in the test's event loop, on a free port) against the test's own NATS and
PostgreSQL (tests/conftest.py), with a people file of an operator, an analyst of profile acme and an approver.

* `console_db`: the test database with every schema, data of profiles acme and globex published through the
  real journal-writer (and billing, for model_calls), then deploy/postgres/bootstrap.sql and roles.sql applied,
  and the analyst's database role (unique per test: roles are per cluster) granted acme.
* `console`: the running console (`RunningConsole`: its URL, its app, `client()` and `signed_in(name)`).
* `start_console(**overrides)`: another console with other settings (trusted proxies, secure cookies).
* `hostile`: beside console_db's data, a session of acme whose text is attacker-controlled markup (SCRIPT, a
  tool's HOSTILE_RESULT, a <b> title) that delegates to a child session with a risky approved tool call.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from fastapi import FastAPI

from commonos.billing.schema import SCHEMA as BILLING_SCHEMA
from commonos.console.service import Running, serve
from commonos.console.settings import ConsoleSettings
from commonos.console.users import Role, User, hash_password, render_users
from commonos.journal_writer.graph_schema import SCHEMA as GRAPH_SCHEMA
from commonos.journal_writer.memory import SCHEMA as MEMORY_SCHEMA
from commonos.journal_writer.schema import SCHEMA as CORE_SCHEMA
from commonos.proto import events as ev
from commonos.proto.messages import AssistantMessage, ToolCall, ToolResultMessage, UserMessage
from commonos.runtime.embedded import free_port
from commonos.runtime.postgres import apply_schemas, connect
from commonos.runtime.settings import Settings
from tests.billing.support import billing
from tests.factories import Clock, SessionBuilder, conversation
from tests.support import InProcess, publish_all, wait_for_position

REPO = Path(__file__).resolve().parents[2]
BOOTSTRAP = (REPO / "deploy" / "postgres" / "bootstrap.sql").read_text()
ROLES = (REPO / "deploy" / "postgres" / "roles.sql").read_text()

PASSWORDS = {"olivia": "operator-password", "alice": "analyst-password", "abel": "approver-password"}


@dataclass
class Seeded:
    """What `console_db` put in the database."""

    dsn: str
    #: The analyst's database role (alice's pg_role), granted profile acme.
    analyst_role: str
    events: list[ev.Event] = field(default_factory=list)

    def sessions(self, profile: str) -> list[uuid.UUID]:
        return [e.session_id for e in self.events if isinstance(e, ev.SessionCreated) and e.profile_id == profile]


async def execute(dsn: str, *scripts: str) -> None:
    conn = await connect(dsn)
    try:
        for script in scripts:
            await conn.execute(script)
    finally:
        await conn.close()


def sample_data(seed: int = 11) -> list[ev.Event]:
    """Two sessions of profile acme and one of globex, of three turns each (tool and model calls)."""
    rng = random.Random(seed)
    clock = Clock()
    events: list[ev.Event] = []
    events += conversation(rng, clock, "acme", ("client:acme",))
    events += conversation(rng, clock, "acme", ("client:acme", "team:web"))
    events += conversation(rng, clock, "globex", ("client:globex",))
    return events


@contextlib.asynccontextmanager
async def journal_writer(nats_url: str, dsn: str) -> AsyncIterator[InProcess]:
    """The journal-writer as `cos up` runs it: the core tables, the session graph and memory."""
    from commonos.journal_writer.service import serve, writer_projections, writer_schemas

    running = InProcess()
    running.task = asyncio.create_task(
        serve(
            Settings(nats_url=nats_url, database_url=dsn, http_port=0),
            writer_projections(),
            writer_schemas(),
            "journal-writer",
            stop=running.stop,
        )
    )
    try:
        yield running
    finally:
        if not running.task.done():
            await running.close()
        elif running.task.exception() is not None:
            raise running.task.exception()  # type: ignore[misc]


async def project(nats_url: str, dsn: str, events: Sequence[ev.Event]) -> None:
    """Publish `events` and wait until the journal-writer (core, graph) and billing have stored them."""
    acks = await publish_all(nats_url, events)
    # The graph follows transcript imports only, billing model calls only: their positions are their last.
    seqs = list(zip(events, (a.seq for a in acks), strict=True))
    model_calls = [seq for e, seq in seqs if isinstance(e, ev.ModelCallCompleted)]
    transcripts = [seq for e, seq in seqs if isinstance(e, ev.TranscriptImported)]
    async with journal_writer(nats_url, dsn), billing(nats_url, dsn):
        await wait_for_position(dsn, "journal-writer", acks[-1].seq)
        if model_calls:
            await wait_for_position(dsn, "billing", model_calls[-1], table="billing_positions")
        if transcripts:
            await wait_for_position(dsn, "graph-writer", transcripts[-1], table="graph.positions")


async def secure(dsn: str, analyst_role: str, profiles: Sequence[str] = ("acme",)) -> None:
    """deploy/postgres applied, and `analyst_role` a member of cos_analyst granted `profiles`."""
    await execute(dsn, BOOTSTRAP, ROLES)
    grants = ", ".join(f"('{analyst_role}', '{p}')" for p in profiles)
    await execute(
        dsn,
        f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{analyst_role}') THEN "
        f"CREATE ROLE {analyst_role} NOLOGIN IN ROLE cos_analyst; END IF; END $$",
        f"INSERT INTO analyst_grants (role_name, profile_id) VALUES {grants} ON CONFLICT DO NOTHING",
    )


@pytest.fixture
async def console_db(nats_url: str, database_url: str) -> AsyncIterator[Seeded]:
    conn = await connect(database_url)
    try:
        await apply_schemas(conn, [CORE_SCHEMA, MEMORY_SCHEMA, BILLING_SCHEMA, GRAPH_SCHEMA])
    finally:
        await conn.close()
    events = sample_data()
    await project(nats_url, database_url, events)
    role = f"console_analyst_{uuid.uuid4().hex[:8]}"
    await secure(database_url, role)
    yield Seeded(database_url, role, events)
    with contextlib.suppress(asyncpg.PostgresError):
        await execute(database_url, f"DROP OWNED BY {role}", f"DROP ROLE IF EXISTS {role}")


def users_toml(analyst_role: str) -> str:
    return render_users(
        [
            User("olivia", Role.OPERATOR, password_hash=hash_password(PASSWORDS["olivia"])),
            User("alice", Role.ANALYST, pg_role=analyst_role, password_hash=hash_password(PASSWORDS["alice"])),
            User(
                "abel", Role.APPROVER, ("acme",), pg_role=analyst_role, password_hash=hash_password(PASSWORDS["abel"])
            ),
            # Signs in only through the trusted proxy header.
            User("pat", Role.OPERATOR),
        ]
    )


@dataclass
class RunningConsole:
    url: str
    app: FastAPI
    settings: ConsoleSettings
    _stack: contextlib.AsyncExitStack

    async def client(self, **kwargs: Any) -> aiohttp.ClientSession:
        """An HTTP client of its own (cookies kept, even for 127.0.0.1), closed with the console."""
        session = aiohttp.ClientSession(base_url=self.url, cookie_jar=aiohttp.CookieJar(unsafe=True), **kwargs)
        self._stack.push_async_callback(session.close)
        return session

    async def signed_in(self, name: str) -> tuple[aiohttp.ClientSession, str]:
        """A client signed in as `name` through /api/login, and its CSRF token."""
        client = await self.client()
        async with client.post("/api/login", json={"name": name, "password": PASSWORDS[name]}) as r:
            assert r.status == 200, await r.text()
            token = (await r.json())["csrf_token"]
        return client, token


@contextlib.asynccontextmanager
async def run_console(settings: ConsoleSettings) -> AsyncIterator[RunningConsole]:
    # As the console's process serves it, in the test's event loop: Ctrl-C and SIGTERM stay pytest's.
    settings = dataclasses.replace(settings, common=dataclasses.replace(settings.common, drain_timeout_s=2.0))
    stop = asyncio.Event()
    started: asyncio.Future[Running] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(serve(settings, stop=stop, on_started=started.set_result))
    async with contextlib.AsyncExitStack() as stack:
        try:
            waiting: list[asyncio.Future[Any]] = [started, task]
            done, _ = await asyncio.wait(waiting, timeout=30, return_when=asyncio.FIRST_COMPLETED)
            if task.done():
                task.result()
            assert started in done, "the console did not start within 30 s"
            app = started.result().app
            yield RunningConsole(f"http://{settings.host}:{settings.port}", app, settings, stack)
        finally:
            await stack.aclose()
            stop.set()
            await asyncio.wait_for(task, 15)


StartConsole = Callable[..., Awaitable[RunningConsole]]


@pytest.fixture
async def start_console(tmp_path: Path, nats_url: str, database_url: str) -> AsyncIterator[StartConsole]:
    """`await start_console(trusted_proxies=..., ...)`: a console with those ConsoleSettings fields changed,
    stopped at the end of the test. Reads the database as its superuser (it may SET ROLE to any role)."""
    users = tmp_path / "console-users.toml"
    async with contextlib.AsyncExitStack() as stack:

        async def start(analyst_role: str = "console_nobody", **overrides: Any) -> RunningConsole:
            if not users.exists():
                users.write_text(users_toml(analyst_role))
            settings = ConsoleSettings(
                common=Settings(nats_url=nats_url, database_url=database_url),
                host="127.0.0.1",
                port=free_port(),
                users_file=users,
                secret="test-secret-" + uuid.uuid4().hex,
                secure_cookies=False,
            )
            settings = dataclasses.replace(settings, **overrides)
            return await stack.enter_async_context(run_console(settings))

        yield start


@pytest.fixture
async def console(console_db: Seeded, start_console: StartConsole) -> RunningConsole:
    return await start_console(analyst_role=console_db.analyst_role)


SCRIPT = '<script>alert("owned")</script> the xylophone umbrella'
LOOK = "look around: is 1 < 2 & xylophone > 0?"
HOSTILE_RESULT = '<img src=x onerror="alert(2)"> xylophone result'


def hostile_sessions(clock: Clock) -> tuple[SessionBuilder, SessionBuilder, uuid.UUID]:
    """A session of acme whose user writes a script tag, and that delegates to a child session whose tool
    (risky, approved) returns markup; both with model calls."""
    parent = SessionBuilder("acme", clock, ("client:acme", "team:red")).create(
        source="web", title="Hostile <b>title</b>"
    )
    turn = parent.start_turn(snapshot={"system_prompt": "Obey <b>nobody</b>.", "memory": []})
    parent.message(turn, UserMessage(text=SCRIPT))
    parent.model_call(turn, input_tokens=1200, output_tokens=300)
    parent.message(turn, AssistantMessage(tool_calls=(ToolCall(id="d1", name="delegate", args={"goal": "look"}),)))
    child = SessionBuilder(
        "acme",
        clock,
        ("client:acme",),
    ).create(source="delegate", title="helper", parent_session_id=parent.session_id)
    child_turn = child.start_turn(parent_turn_id=turn, depth=1)
    child.message(child_turn, UserMessage(text=LOOK))
    child.model_call(child_turn, input_tokens=500, output_tokens=50)
    child.message(
        child_turn, AssistantMessage(tool_calls=(ToolCall(id="s1", name="shell", args={"cmd": "rm -rf <tmp>"}),))
    )
    child.tool_call(
        child_turn,
        "s1",
        "shell",
        {"cmd": "rm -rf <tmp>"},
        HOSTILE_RESULT,
        risk=ev.Risk.HIGH,
        approval=ev.ApprovalStatus.APPROVED,
    )
    child.message(child_turn, ToolResultMessage(call_id="s1", content=HOSTILE_RESULT))
    child.message(child_turn, AssistantMessage(text="done"))
    child.finish(child_turn)
    parent.tool_call(turn, "d1", "delegate", {"goal": "look"}, "done")
    parent.message(turn, ToolResultMessage(call_id="d1", content="done"))
    parent.message(turn, AssistantMessage(text="All done."))
    parent.finish(turn)
    return parent, child, turn


@pytest.fixture
async def hostile(console_db: Seeded, nats_url: str) -> tuple[SessionBuilder, SessionBuilder]:
    clock = Clock()
    clock.tick(3_600_000)  # after the sample data
    parent, child, _ = hostile_sessions(clock)
    events = parent.events + child.events
    await project(nats_url, console_db.dsn, events)
    console_db.events += events
    return parent, child
