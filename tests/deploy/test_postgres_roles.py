"""deploy/postgres on a real PostgreSQL: each service writes only its own tables, analysts see only the profiles
granted to them (row-level security), and the files can be applied again and again."""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from commonos.billing.schema import BILLING_TABLES
from commonos.billing.schema import SCHEMA as BILLING_SCHEMA
from commonos.console.sign_outs import SCHEMA as SIGN_OUTS_SCHEMA
from commonos.journal_writer.graph_schema import SCHEMA as GRAPH_SCHEMA
from commonos.journal_writer.memory import SCHEMA as MEMORY_SCHEMA
from commonos.journal_writer.schema import CORE_TABLES
from commonos.journal_writer.schema import SCHEMA as CORE_SCHEMA
from commonos.journal_writer.store import JournalProjection
from commonos.proto.events import ModelCallCompleted
from commonos.runtime.postgres import apply_schemas, connect
from commonos.runtime.settings import Settings
from tests.deploy.conftest import DEPLOY
from tests.deploy.system import sample_events
from tests.support import journal_writer, publish_all, wait_for_position

BOOTSTRAP = (DEPLOY / "postgres" / "bootstrap.sql").read_text()
ROLES = (DEPLOY / "postgres" / "roles.sql").read_text()
SERVICE_ROLES = ("cos_journal_writer", "cos_billing", "cos_loop", "cos_console")
#: Every table a profile's data lives in, and the column holding the profile.
PROFILE_TABLES = {
    "profiles": "id",
    "sessions": "profile_id",
    "turns": "profile_id",
    "messages": "profile_id",
    "tool_calls": "profile_id",
    "approvals": "profile_id",
    "model_calls": "profile_id",
}


def as_role(dsn: str, role: str, password: str) -> str:
    """The same database, logged in as `role` (the test server trusts local logins; others check the password)."""
    parts = urlsplit(dsn)
    host = parts.hostname or "127.0.0.1"
    netloc = f"{role}:{password}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


async def execute(dsn: str, *scripts: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        for script in scripts:
            await conn.execute(script)
    finally:
        await conn.close()


async def model_call_rows(conn: asyncpg.Connection, calls: list[ModelCallCompleted]) -> None:
    """model_calls rows as billing stores them (the priced columns here are placeholders)."""
    for c in calls:
        await conn.execute(
            "INSERT INTO model_calls (event_id, profile_id, session_id, turn_id, provider, model, input_tokens, "
            "output_tokens, cache_read_tokens, cache_write_5m_tokens, cache_write_1h_tokens, reasoning_tokens, "
            "cost_usd, cost_status, price_source, price_version, tags, created_at) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 0, 0, 0, 0, 0.01, 'priced', 'test', '1', $9, $10)",
            c.event_id,
            c.profile_id,
            c.session_id,
            c.turn_id,
            c.provider,
            c.model,
            c.input_tokens,
            c.output_tokens,
            list(c.tags),
            c.occurred_at,
        )


@pytest.fixture
async def secured_database(database_url: str) -> AsyncIterator[str]:
    """A database with every schema applied by the superuser, its data for profiles acme and globex, then
    bootstrap.sql and roles.sql applied twice (they must be idempotent). The service roles get test passwords."""
    conn = await connect(database_url)
    try:
        await apply_schemas(conn, [CORE_SCHEMA, MEMORY_SCHEMA, BILLING_SCHEMA, GRAPH_SCHEMA])
        events = sample_events()
        async with conn.transaction():
            await JournalProjection().apply(conn, events)
            await model_call_rows(conn, [e for e in events if isinstance(e, ModelCallCompleted)])
    finally:
        await conn.close()
    await execute(database_url, BOOTSTRAP, ROLES, BOOTSTRAP, ROLES)
    await execute(database_url, *(f"ALTER ROLE {r} PASSWORD 'test-{r}'" for r in SERVICE_ROLES))
    yield database_url


@pytest.fixture
async def analyst(secured_database: str) -> AsyncIterator[str]:
    """A login role in cos_analyst granted profile acme (another analyst is granted globex)."""
    name = f"analyst_{uuid.uuid4().hex[:8]}"
    await execute(
        secured_database,
        f"CREATE ROLE {name} LOGIN PASSWORD 'test' IN ROLE cos_analyst",
        f"INSERT INTO analyst_grants (role_name, profile_id) VALUES ('{name}', 'acme'), ('someone_else', 'globex')",
    )
    yield as_role(secured_database, name, "test")
    await execute(secured_database, f"DROP ROLE {name}")


async def test_an_analyst_sees_only_the_profiles_granted_to_it(secured_database: str, analyst: str) -> None:
    admin = await asyncpg.connect(secured_database)
    conn = await asyncpg.connect(analyst)
    try:
        for table, column in PROFILE_TABLES.items():
            everyone = await admin.fetch(f"SELECT DISTINCT {column} AS p FROM {table}")
            assert {r["p"] for r in everyone} == {"acme", "globex"}, table
            seen = await conn.fetch(f"SELECT DISTINCT {column} AS p FROM {table}")
            assert {r["p"] for r in seen} == {"acme"}, table
        assert [r["profile_id"] for r in await conn.fetch("SELECT profile_id FROM analyst_grants")] == ["acme"]
        # The seed's useful queries still run, limited to the analyst's profiles.
        rows = await conn.fetch(
            "SELECT t.started_at, t.profile_id, t.status, t.depth, s.title FROM turns t "
            "JOIN sessions s ON s.id = t.session_id ORDER BY t.started_at DESC LIMIT 10"
        )
        assert [r["profile_id"] for r in rows] == ["acme"]
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("UPDATE messages SET active = false")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("INSERT INTO analyst_grants (role_name, profile_id) VALUES (current_user, 'globex')")
        for table in ("projection_positions", "billing_positions", "budget_spend", "memory_changes_applied"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.fetch(f"SELECT * FROM {table}")
        # The session graph is seen by profile (the next test); its bookkeeping not at all.
        for table in ("graph.positions", "graph.profile_deletions"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.fetch(f"SELECT * FROM {table}")
    finally:
        await conn.close()
        await admin.close()


async def test_each_service_writes_only_its_own_tables(secured_database: str) -> None:
    admin = await asyncpg.connect(secured_database)
    billing = await asyncpg.connect(as_role(secured_database, "cos_billing", "test-cos_billing"))
    writer = await asyncpg.connect(as_role(secured_database, "cos_journal_writer", "test-cos_journal_writer"))
    loop = await asyncpg.connect(as_role(secured_database, "cos_loop", "test-cos_loop"))
    try:
        rows = await admin.fetch(
            "SELECT c.relname, pg_get_userbyid(c.relowner) AS owner FROM pg_class c "
            "WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition AND c.relnamespace = 'public'::regnamespace"
        )
        # each month of a partitioned table is its table's owner's (who drops it)
        months = await admin.fetch(
            "SELECT i.inhparent::regclass::text AS parent, pg_get_userbyid(c.relowner) AS owner FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid WHERE c.relkind = 'r'"
        )

        owners = {r["relname"]: r["owner"] for r in rows}
        assert {r["parent"] for r in months} >= {"messages", "turns", "tool_calls", "approvals", "model_calls"}
        for month in months:
            assert month["owner"] == owners[month["parent"]], month
        for table in (*CORE_TABLES, "projection_positions", "memory_entries", "memory_changes_applied"):
            assert owners[table] == "cos_journal_writer", table
        for table in BILLING_TABLES:
            assert owners[table] == "cos_billing", table
        graph_owners = await admin.fetch("SELECT DISTINCT tableowner FROM pg_tables WHERE schemaname = 'graph'")
        assert [r["tableowner"] for r in graph_owners] == ["cos_journal_writer"]

        [message] = await admin.fetch("SELECT * FROM messages LIMIT 1")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await billing.execute(
                "INSERT INTO messages (id, session_id, turn_id, profile_id, seq, role, content, created_at) "
                "VALUES ($1, $2, $3, $4, 99, 'user', '{}', now())",
                uuid.uuid4(),
                message["session_id"],
                message["turn_id"],
                message["profile_id"],
            )
        for statement in ("SELECT * FROM messages", "DELETE FROM messages", "SELECT * FROM sessions"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await billing.execute(statement)
        assert await billing.execute("UPDATE model_calls SET repriced_at = now()") == "UPDATE 2"

        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await writer.execute("UPDATE model_calls SET repriced_at = now()")
        messages = await admin.fetchval("SELECT count(*) FROM messages")
        assert await writer.execute("UPDATE messages SET active = active") == f"UPDATE {messages}"

        assert {r["profile_id"] for r in await loop.fetch("SELECT profile_id FROM messages")} == {"acme", "globex"}
        for statement in ("UPDATE messages SET active = true", "SELECT * FROM sessions", "SELECT * FROM model_calls"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await loop.execute(statement)
    finally:
        for conn in (admin, billing, writer, loop):
            await conn.close()


async def test_the_console_reads_everything_and_as_an_analyst_only_what_it_may(
    secured_database: str, analyst: str
) -> None:
    """cos_console sees every profile's rows (the operators' view) of what its pages read, writes nothing, and
    reads for an analyst after SET ROLE, as that analyst, once granted the analyst's role."""
    analyst_role = urlsplit(analyst).username
    console = await asyncpg.connect(as_role(secured_database, "cos_console", "test-cos_console"))
    try:
        for table, column in PROFILE_TABLES.items():
            seen = await console.fetch(f"SELECT DISTINCT {column} AS p FROM {table}")
            assert {r["p"] for r in seen} == {"acme", "globex"}, table
        for table in ("projection_positions", "billing_positions", "budget_spend", "budget_alerts"):
            await console.fetch(f"SELECT * FROM {table}")
        for table in ("graph.sessions", "graph.model_invocations", "graph.positions"):
            await console.fetch(f"SELECT * FROM {table}")
        for statement in (
            "UPDATE messages SET active = true",
            "DELETE FROM model_calls",
            "SELECT * FROM analyst_grants",
        ):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await console.execute(statement)
        with pytest.raises(asyncpg.InsufficientPrivilegeError):  # not yet a member of the analyst's role
            await console.execute(f'SET ROLE "{analyst_role}"')
        await execute(secured_database, f'GRANT "{analyst_role}" TO cos_console')
        async with console.transaction():
            await console.execute(f'SET LOCAL ROLE "{analyst_role}"')
            for table, column in PROFILE_TABLES.items():
                seen = await console.fetch(f"SELECT DISTINCT {column} AS p FROM {table}")
                assert {r["p"] for r in seen} == {"acme"}, table
        with pytest.raises(asyncpg.InsufficientPrivilegeError):  # as the analyst, nothing beyond its grants
            async with console.transaction():
                await console.execute(f'SET LOCAL ROLE "{analyst_role}"')
                await console.fetch("SELECT * FROM budget_spend")
    finally:
        await console.close()


async def test_the_console_keeps_its_sign_outs_and_no_one_else_reads_them(secured_database: str, analyst: str) -> None:
    """The console, as cos_console, makes its table of sign-outs when it starts (bootstrap.sql lets it) and
    writes and reads it; after roles.sql it owns it, and no other role may read or write it."""
    console_url = as_role(secured_database, "cos_console", "test-cos_console")
    console = await connect(console_url)
    try:
        await apply_schemas(console, [SIGN_OUTS_SCHEMA, SIGN_OUTS_SCHEMA])  # at every start: idempotent
        await console.execute("INSERT INTO console_sign_outs VALUES ('sid-1', now() + interval '1 hour')")
    finally:
        await console.close()
    await execute(secured_database, ROLES)
    console = await connect(console_url)
    try:
        assert await console.fetchval("SELECT count(*) FROM console_sign_outs") == 1
        owner = await console.fetchval("SELECT tableowner FROM pg_tables WHERE tablename = 'console_sign_outs'")
        assert owner == "cos_console"
    finally:
        await console.close()
    for role in ("cos_journal_writer", "cos_billing", "cos_loop"):
        conn = await asyncpg.connect(as_role(secured_database, role, f"test-{role}"))
        try:
            for statement in ("SELECT * FROM console_sign_outs", "DELETE FROM console_sign_outs"):
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await conn.execute(statement)
        finally:
            await conn.close()
    conn = await asyncpg.connect(analyst)
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("SELECT * FROM console_sign_outs")
    finally:
        await conn.close()


async def test_roles_sql_refuses_to_run_before_the_tables_exist(database_url: str) -> None:
    await execute(database_url, BOOTSTRAP)
    with pytest.raises(asyncpg.RaiseError, match="start the journal-writer and billing once"):
        await execute(database_url, ROLES)


async def test_the_initdb_script_creates_the_roles_with_their_passwords(database_url: str) -> None:
    """deploy/postgres/initdb/10-commonos-roles.sh as the postgres image runs it, with psql."""
    parts = urlsplit(database_url)
    env = {
        **os.environ,
        "POSTGRES_USER": parts.username or "postgres",
        "POSTGRES_DB": parts.path.lstrip("/"),
        "PGHOST": parts.hostname or "127.0.0.1",
        "PGPORT": str(parts.port or 5432),
        "PGPASSWORD": parts.password or "",
        "COMMONOS_SQL_DIR": str(DEPLOY / "postgres"),
        "PG_JOURNAL_WRITER_PASSWORD": "jw-secret",
        "PG_BILLING_PASSWORD": "billing-secret",
        "PG_LOOP_PASSWORD": "it's-a-loop",
        "PG_CONSOLE_PASSWORD": "console-secret",
    }
    script = DEPLOY / "postgres" / "initdb" / "10-commonos-roles.sh"
    result = await asyncio.to_thread(
        subprocess.run, ["sh", str(script)], env=env, capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0, result.stderr
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT rolname, rolcanlogin, rolpassword IS NOT NULL AS has_password FROM pg_authid "
            "WHERE rolname LIKE 'cos\\_%' ORDER BY rolname"
        )
        assert [tuple(r) for r in rows] == [
            ("cos_analyst", False, False),
            ("cos_billing", True, True),
            ("cos_console", True, True),
            ("cos_journal_writer", True, True),
            ("cos_loop", True, True),
        ]
    finally:
        await conn.close()


async def test_the_journal_writer_runs_as_its_role(nats_url: str, database_url: str) -> None:
    """Bootstrap only, then the journal-writer creates its tables as cos_journal_writer and projects events."""
    await execute(database_url, BOOTSTRAP, "ALTER ROLE cos_journal_writer PASSWORD 'test-cos_journal_writer'")
    role_url = as_role(database_url, "cos_journal_writer", "test-cos_journal_writer")
    acks = await publish_all(nats_url, sample_events())
    async with journal_writer(nats_url, role_url):
        await wait_for_position(role_url, "journal-writer", acks[-1].seq)
    conn = await asyncpg.connect(database_url)
    try:
        assert await conn.fetchval("SELECT pg_get_userbyid(relowner) FROM pg_class WHERE relname = 'messages'") == (
            "cos_journal_writer"
        )
        assert await conn.fetchval("SELECT count(*) FROM sessions") == 2
    finally:
        await conn.close()


async def test_billing_runs_as_its_role(nats_url: str, database_url: str) -> None:
    """With the core tables already the journal-writer's, billing creates and fills only its own."""
    from commonos.billing.service import serve

    await execute(
        database_url,
        BOOTSTRAP,
        "ALTER ROLE cos_billing PASSWORD 'test-cos_billing'",
        "ALTER ROLE cos_journal_writer PASSWORD 'test-cos_journal_writer'",
    )
    # the journal-writer came first and created the core tables
    await execute(as_role(database_url, "cos_journal_writer", "test-cos_journal_writer"), CORE_SCHEMA)
    role_url = as_role(database_url, "cos_billing", "test-cos_billing")
    events = sample_events()
    acks = await publish_all(nats_url, events)
    last_call = max(i for i, e in enumerate(events) if isinstance(e, ModelCallCompleted))
    stop = asyncio.Event()
    task = asyncio.create_task(serve(Settings(nats_url=nats_url, database_url=role_url), stop=stop))
    try:
        waiting = asyncio.create_task(
            wait_for_position(role_url, "billing", acks[last_call].seq, table="billing_positions")
        )
        done, _ = await asyncio.wait([task, waiting], return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            waiting.cancel()
            await task  # raises what stopped it
        await waiting
    finally:
        stop.set()
        if not task.done():
            await asyncio.wait_for(task, 30)
    conn = await asyncpg.connect(database_url)
    try:
        owners = await conn.fetch(
            "SELECT relname, pg_get_userbyid(relowner) AS owner FROM pg_class WHERE relname = ANY($1::text[])",
            ["sessions", "messages", *BILLING_TABLES],
        )
        assert {r["relname"]: r["owner"] for r in owners} == {
            "sessions": "cos_journal_writer",
            "messages": "cos_journal_writer",
            **dict.fromkeys(BILLING_TABLES, "cos_billing"),
        }
        assert await conn.fetchval("SELECT count(*) FROM model_calls") == 2
    finally:
        await conn.close()


async def test_an_analyst_sees_only_the_imported_graphs_of_its_profiles(secured_database: str, analyst: str) -> None:
    """graph.sessions carries the importing profile; every other graph table is seen through its session."""
    admin = await asyncpg.connect(secured_database)
    sessions = {profile: uuid.uuid4() for profile in ("acme", "globex")}
    try:
        for profile, session in sessions.items():
            await admin.execute(
                "INSERT INTO graph.sessions (id, outcome, profile_id) VALUES ($1, 'unknown', $2)", session, profile
            )
            await admin.execute(
                "INSERT INTO graph.user_inputs (id, session_id, ordinal, text, interrupted, kind, origin, metadata) "
                "VALUES ($1, $2, 0, $3, false, 'prompt', 'human', '{}')",
                uuid.uuid4(),
                session,
                f"asked under {profile}",
            )
    finally:
        await admin.close()
    conn = await asyncpg.connect(analyst)
    try:
        assert [r["id"] for r in await conn.fetch("SELECT id FROM graph.sessions")] == [sessions["acme"]]
        assert [r["text"] for r in await conn.fetch("SELECT text FROM graph.user_inputs")] == ["asked under acme"]
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.fetch("SELECT * FROM graph.positions")
    finally:
        await conn.close()
