"""The session list as people use it (issue 32), on data projected by the real journal-writer and billing: search
finds imported work by the words of its prompts and replies; each row's cost (its delegated sessions' included),
tokens, model calls, models and duration, for the loop's and imported sessions alike; sorting by cost, in keyset
pages; a parent row's tags are its profile's too, as its children's are; a malformed session id is a clear 404."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import asyncpg
import msgspec
import pytest

from commonos.console.pages import sessions as sessions_page
from commonos.proto import events as ev
from commonos.proto.messages import AssistantMessage, UserMessage
from commonos.runtime.postgres import apply_schemas, connect
from tests.console.conftest import RunningConsole, Seeded, project
from tests.console.test_imported import claude_session
from tests.console.test_sessions import get_json
from tests.factories import Clock, SessionBuilder

#: Before every session of the tests' data (tests.factories.Clock starts on 2026-11-01).
SINCE = "2026-10-01T00:00:00Z"
T0 = datetime(2026, 11, 3, 9, 0, tzinfo=UTC)


def prompted(
    profile: str, title: str, prompt: str, reply: str, at: datetime
) -> tuple[ev.TranscriptImported, ev.ModelCallCompleted]:
    """A Claude Code tree (tests.console.test_imported.claude_session: a subagent, a billed call) whose first
    prompt and first reply are these."""
    imported, billed = claude_session(profile, title, at)
    graph = imported.graph
    first, *inputs = graph.user_inputs
    answer, *answers = graph.assistant_messages
    graph = msgspec.structs.replace(
        graph,
        user_inputs=[msgspec.structs.replace(first, text=prompt), *inputs],
        assistant_messages=[msgspec.structs.replace(answer, text=reply), *answers],
    )
    return msgspec.structs.replace(imported, graph=graph), billed


@pytest.fixture
async def imported_work(console_db: Seeded, nats_url: str) -> dict[str, uuid.UUID]:
    """Two Claude Code trees of acme (prompts and replies with the issue's words) and one of globex."""
    jupyter, jupyter_call = prompted(
        "acme",
        "create a jupyter notebook file",
        "create a jupyter notebook file so that i can test each step of the way",
        "I created the notebook; run sync_budget_data first.",
        T0,
    )
    ember, ember_call = prompted("acme", "port the app", "port the app from Ember to React", "Done.", T0 + timedelta(1))
    secret, secret_call = prompted("globex", "globex work", "the jupyter secret of globex", "Fine.", T0 + timedelta(2))
    await project(nats_url, console_db.dsn, [jupyter, ember, secret, jupyter_call, ember_call, secret_call])
    return {"jupyter": jupyter.session_id, "ember": ember.session_id, "globex": secret.session_id}


@pytest.mark.parametrize("few_hits", [2000, 1], ids=["from-the-matches", "from-the-newest-sessions"])
async def test_search_finds_imported_work_by_its_prompts_and_replies(
    console: RunningConsole, imported_work: dict[str, uuid.UUID], few_hits: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sessions_page, "FEW_HITS", few_hits)
    client, _ = await console.signed_in("olivia")
    found = (await get_json(client, "/api/sessions?q=jupyter"))["sessions"]
    assert [(r["id"], r["kind"]) for r in found] == [
        (str(imported_work["globex"]), "imported"),
        (str(imported_work["jupyter"]), "imported"),
    ]
    row = found[1]
    assert row["url"] == f"/imported/{imported_work['jupyter']}"
    assert "<mark>jupyter</mark> notebook" in row["snippet_html"] and "jupyter notebook" in row["snippet"]
    # A word of the assistant's reply, and the other words.
    [reply] = (await get_json(client, "/api/sessions?q=sync_budget_data"))["sessions"]
    assert reply["id"] == str(imported_work["jupyter"]) and "<mark>" in reply["snippet_html"]
    [ember] = (await get_json(client, "/api/sessions?q=Ember"))["sessions"]
    assert ember["id"] == str(imported_work["ember"])
    assert "<mark>Ember</mark>" in ember["snippet_html"]
    # Filters still apply: imported only, a profile; the loop's messages are searched as before.
    assert [
        r["id"] for r in (await get_json(client, "/api/sessions?q=jupyter&kind=imported&profile=acme"))["sessions"]
    ] == [str(imported_work["jupyter"])]
    assert (await get_json(client, "/api/sessions?q=jupyter&kind=loop"))["sessions"] == []
    # The page shows the imported row with its highlighted snippet and its link.
    async with client.get("/sessions?q=jupyter") as r:
        html = await r.text()
    assert f'href="/imported/{imported_work["jupyter"]}"' in html and "<mark>jupyter</mark>" in html
    # An analyst of acme finds acme's import only (row-level security on the graph tables).
    analyst, _ = await console.signed_in("alice")
    seen = (await get_json(analyst, "/api/sessions?q=jupyter"))["sessions"]
    assert [r["id"] for r in seen] == [str(imported_work["jupyter"])]


async def test_the_graph_tables_gain_their_search_columns(database_url: str) -> None:
    """A database made before the search columns: applying the schema adds them and their indexes, and the rows
    already stored are searchable."""
    from commonos.journal_writer.graph_schema import SCHEMA

    conn = await connect(database_url)
    try:
        await apply_schemas(conn, [SCHEMA])
        for table in ("user_inputs", "assistant_messages"):
            await conn.execute(f"ALTER TABLE graph.{table} DROP COLUMN search")
        root = uuid.uuid4()
        await conn.execute("INSERT INTO graph.sessions (id, outcome, started_at) VALUES ($1, 'unknown', now())", root)
        await conn.execute(
            "INSERT INTO graph.user_inputs (id, session_id, ordinal, text, interrupted, kind, origin, metadata) "
            "VALUES ($1, $2, 0, 'open the jupyter notebook', false, 'prompt', 'human', '{}')",
            uuid.uuid4(),
            root,
        )
        await apply_schemas(conn, [SCHEMA])
        indexes = {
            r["indexname"] for r in await conn.fetch("SELECT indexname FROM pg_indexes WHERE schemaname = 'graph'")
        }
        assert {"user_inputs_search", "assistant_messages_search"} <= indexes
        found = await conn.fetchval(
            "SELECT session_id FROM graph.user_inputs WHERE search @@ websearch_to_tsquery('english', 'Jupyter')"
        )
        assert found == root
        await apply_schemas(conn, [SCHEMA])  # again: nothing to change
    finally:
        await conn.close()


async def _costs(dsn: str) -> dict[uuid.UUID, tuple[Decimal, int]]:
    """Per session, billing's own sum of cost_usd and count of calls."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT session_id, sum(cost_usd) AS usd, count(*) AS n FROM model_calls GROUP BY 1")
    finally:
        await conn.close()
    return {r["session_id"]: (r["usd"], r["n"]) for r in rows}


async def test_each_row_has_its_cost_tokens_calls_models_and_duration(
    console: RunningConsole,
    console_db: Seeded,
    hostile: Any,
    imported_work: dict[str, uuid.UUID],
) -> None:
    parent, child = hostile
    billed = await _costs(console_db.dsn)
    client, _ = await console.signed_in("olivia")
    rows = {r["id"]: r for r in (await get_json(client, "/api/sessions"))["sessions"]}
    # The loop's parent: its own calls and its delegated child's.
    top = rows[str(parent.session_id)]
    want = billed[parent.session_id][0] + billed[child.session_id][0]
    assert Decimal(top["cost_usd"]) == want > 0
    assert top["model_calls"] == 2 and top["unpriced_calls"] == 0
    assert (top["input_tokens"], top["output_tokens"]) == (1200 + 500, 300 + 50)
    assert top["models"] == ["claude-sonnet-4-5"]
    assert top["duration_s"] > 0
    sub = rows[str(child.session_id)]
    assert Decimal(sub["cost_usd"]) == billed[child.session_id][0] and sub["model_calls"] == 1
    # An imported tree: what billing billed to its top-level session; the subagent's are billed with it.
    jupyter = rows[str(imported_work["jupyter"])]
    assert Decimal(jupyter["cost_usd"]) == billed[imported_work["jupyter"]][0] > 0
    assert jupyter["model_calls"] == 1 and jupyter["duration_s"] == 300.0
    assert jupyter["models"] == ["claude-sonnet-4-5"] and not jupyter["billed_with_parent"]
    subagent = next(r for r in rows.values() if r["parent_session_id"] == str(imported_work["jupyter"]))
    assert subagent["billed_with_parent"] and subagent["cost_usd"] is None
    assert subagent["models"] == ["claude-haiku-4-5"] and subagent["model_calls"] == 1
    # The same on the Imported page's rows, with its cost column.
    imported = {r["id"]: r for r in (await get_json(client, "/api/imported"))["sessions"]}
    assert Decimal(imported[str(imported_work["jupyter"])]["cost_usd"]) == Decimal(jupyter["cost_usd"])
    assert imported[str(imported_work["jupyter"])]["billed_calls"] == 1
    async with client.get("/imported") as r:
        html = await r.text()
    assert ">Cost" in html and "in parent" in html
    async with client.get("/sessions") as r:
        html = await r.text()
    assert ">Cost" in html and ">Tokens<" in html and ">Duration<" in html and "claude-sonnet-4-5" in html


async def test_sorted_by_cost_in_keyset_pages(
    console: RunningConsole, console_db: Seeded, hostile: Any, imported_work: dict[str, uuid.UUID]
) -> None:
    client, _ = await console.signed_in("olivia")
    everything = await get_json(client, f"/api/sessions?sort=cost&since={SINCE}&limit=200")
    rows = everything["sessions"]
    assert len(rows) == len((await get_json(client, f"/api/sessions?since={SINCE}&limit=200"))["sessions"])

    def cost(r: dict[str, Any]) -> Decimal:
        return Decimal(r["cost_usd"] or 0)

    assert [cost(r) for r in rows] == sorted((cost(r) for r in rows), reverse=True)
    assert cost(rows[0]) > 0 and everything["next_cursor"] is None
    # The parent ranks with its child's calls included: above the child.
    parent, child = hostile
    ids = [r["id"] for r in rows]
    assert ids.index(str(parent.session_id)) < ids.index(str(child.session_id))
    # Pages of two: every session once, in the same order.
    seen: list[str] = []
    cursor: str | None = None
    while True:
        url = f"/api/sessions?sort=cost&since={SINCE}&limit=2" + (f"&cursor={cursor}" if cursor else "")
        page = await get_json(client, url)
        seen += [r["id"] for r in page["sessions"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids
    # A cursor of the time-sorted list is not one of this list.
    first = await get_json(client, "/api/sessions?limit=1")
    async with client.get(f"/api/sessions?sort=cost&cursor={first['next_cursor']}") as r:
        assert r.status == 422
    # Without `since`: the sessions started in the last days only, and the page says which.
    recent = await get_json(client, "/api/sessions?sort=cost")
    assert recent["sessions"] == [] and recent["ranked_since"] is not None
    ranked_since = datetime.fromisoformat(recent["ranked_since"])
    assert timedelta(days=6) < datetime.now(UTC) - ranked_since < timedelta(days=8)
    async with client.get("/sessions?sort=cost") as r:
        html = await r.text()
    assert "The most expensive sessions started since" in html and "the last 30 days" in html
    # The Imported page sorts the same way.
    imported = (await get_json(client, f"/api/imported?sort=cost&since={SINCE}"))["sessions"]
    costs = [Decimal(r["cost_usd"]) for r in imported if r["cost_usd"] is not None]
    assert costs == sorted(costs, reverse=True) and len(costs) == 3
    # An analyst ranks as their database role reads billing's per-session totals: their profiles' sessions only.
    analyst, _ = await console.signed_in("alice")
    theirs = (await get_json(analyst, f"/api/sessions?sort=cost&since={SINCE}&limit=200"))["sessions"]
    assert theirs and {r["profile_id"] for r in theirs} == {"acme"}
    assert [r["id"] for r in theirs] == [r["id"] for r in rows if r["profile_id"] == "acme"]


async def test_search_sorted_by_cost_is_the_same_from_the_matches_and_from_the_ranked_sessions(
    console: RunningConsole, console_db: Seeded, hostile: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A common word sorted by cost checks the ranked sessions in rank order until a page is full; a rare one
    ranks its matches. Both give the same sessions in the same order, in keyset pages."""
    client, _ = await console.signed_in("olivia")
    parent, child = hostile

    async def pages() -> list[tuple[str, str | None]]:
        seen: list[tuple[str, str | None]] = []
        cursor: str | None = None
        while True:
            url = f"/api/sessions?q=xylophone&sort=cost&since={SINCE}&limit=1" + (f"&cursor={cursor}" if cursor else "")
            page = await get_json(client, url)
            seen += [(r["id"], r["cost_usd"]) for r in page["sessions"]]
            assert all("<mark>xylophone</mark>" in r["snippet_html"] for r in page["sessions"])
            cursor = page["next_cursor"]
            if cursor is None:
                return seen

    monkeypatch.setattr(sessions_page, "FEW_HITS", 2000)
    from_matches = await pages()
    monkeypatch.setattr(sessions_page, "FEW_HITS", 1)
    walked = await pages()
    assert walked == from_matches
    # The parent ranks with its child's calls included: first.
    assert [i for i, _ in walked] == [str(parent.session_id), str(child.session_id)]


async def test_a_parent_row_shows_its_profile_tags_as_its_child_does(
    console: RunningConsole, console_db: Seeded, nats_url: str
) -> None:
    """The loop copies a turn's tags (the profile's and the session's) onto a delegated child session: the list
    showed them on the child and only the session's own on the parent."""
    clock = Clock()
    clock.tick(7_200_000)
    profile = ev.ProfileUpserted(profile_id="acme", tags=("area:ops",), occurred_at=clock.tick())
    parent = SessionBuilder("acme", clock, ("project:site",)).create(source="cli", title="parent")
    turn = parent.start_turn()
    parent.message(turn, UserMessage(text="delegate this"))
    child = SessionBuilder("acme", clock, ("area:ops", "project:site")).create(
        source="subagent", title="child", parent_session_id=parent.session_id
    )
    child_turn = child.start_turn(parent_turn_id=turn, depth=1)
    child.message(child_turn, UserMessage(text="on it"))
    child.message(child_turn, AssistantMessage(text="done"))
    child.finish(child_turn)
    parent.finish(turn)
    await project(nats_url, console_db.dsn, [profile, *parent.events, *child.events])
    client, _ = await console.signed_in("olivia")
    rows = {r["id"]: r for r in (await get_json(client, "/api/sessions"))["sessions"]}
    assert rows[str(parent.session_id)]["tags"] == ["area:ops", "project:site"]
    assert rows[str(child.session_id)]["tags"] == ["area:ops", "project:site"]
    # The tag filter finds what the list shows.
    tagged = {r["id"] for r in (await get_json(client, "/api/sessions?tag=area:ops"))["sessions"]}
    assert {str(parent.session_id), str(child.session_id)} <= tagged


@pytest.mark.parametrize(
    "path", ["/sessions/nope", "/sessions/nope/live", "/imported/nope", "/sessions/1234"], ids=lambda p: p
)
async def test_a_malformed_session_id_is_a_clear_not_found_page(
    console: RunningConsole, console_db: Seeded, path: str
) -> None:
    client, _ = await console.signed_in("olivia")
    async with client.get(path) as r:
        assert r.status == 404
        html = await r.text()
    assert "404 Not found" in html and "a session id is a UUID" in html
    assert "Input should be" not in html and "invalid character" not in html
    async with client.get("/api" + path.removesuffix("/live") + ("/events" if path.endswith("/live") else "")) as r:
        assert r.status == 404
        body = await r.json()
    assert "a session id is a UUID" in body["detail"] and path.split("/")[2] in body["detail"]


async def _ranks_from_the_calls(conn: asyncpg.Connection, since: datetime) -> list[tuple[uuid.UUID, Decimal]]:
    """The loop's sessions started from `since` on, ranked as the list ranked them before billing's per-session
    totals, summed here from every call: a session's calls from `since` - CLOCK_SLACK (one day) on, with those of
    its delegated sessions started from `since` on (up to MAX_CHILD_DEPTH levels up); most expensive first, then
    newest."""
    sessions = {r["id"]: r for r in await conn.fetch("SELECT id, parent_session_id, created_at FROM sessions")}
    own: dict[uuid.UUID, Decimal] = {}
    for m in await conn.fetch("SELECT session_id, cost_usd, created_at FROM model_calls"):
        if m["created_at"] >= since - timedelta(days=1):
            own[m["session_id"]] = own.get(m["session_id"], Decimal(0)) + (m["cost_usd"] or 0)
    rank = {sid: own.get(sid, Decimal(0)) for sid, s in sessions.items() if s["created_at"] >= since}
    for sid, s in sessions.items():
        if s["created_at"] < since or s["parent_session_id"] is None:
            continue
        ancestor, level = s["parent_session_id"], 1
        while True:
            if ancestor in rank:
                rank[ancestor] += own.get(sid, Decimal(0))
            parent = sessions[ancestor]["parent_session_id"]
            if parent is None or level >= sessions_page.MAX_CHILD_DEPTH:
                break
            ancestor, level = parent, level + 1
    ordered = sorted(rank, key=lambda sid: (rank[sid], sessions[sid]["created_at"], sid), reverse=True)
    return [(sid, rank[sid]) for sid in ordered]


async def test_the_cost_ranking_reads_the_rollup_and_ranks_as_the_calls_would(
    console_db: Seeded, hostile: Any, nats_url: str
) -> None:
    """Sorted by cost, the list reads billing's per-session totals (`session_costs`) and ranks as summing the calls
    did: delegated sessions two levels down count with their ancestor, a call in the day before the range counts,
    a call earlier than that does not (the session's total is then not its range's: its calls are summed), a
    session whose calls all are earlier ranks with none, and a session started before the range is not ranked."""
    since = datetime(2026, 11, 10, tzinfo=UTC)
    events: list[ev.Event] = []

    def session(start: datetime, calls: list[tuple[datetime, int]], parent: uuid.UUID | None = None) -> uuid.UUID:
        s = SessionBuilder("acme", Clock(start), ("client:acme",)).create(parent_session_id=parent)
        turn = s.start_turn()
        for at, tokens in calls:
            s.model_call(turn, input_tokens=tokens, output_tokens=tokens // 10)
            s.events[-1] = msgspec.structs.replace(s.events[-1], occurred_at=at)
        events.extend(s.events)
        return s.session_id

    day = timedelta(days=1)
    early = session(since + 2 * day, [(since + 2 * day, 40_000), (since - 5 * day, 900_000)])
    slack = session(since + 2 * day, [(since - day / 2, 50_000)])
    child = session(since + 3 * day, [(since + 3 * day, 30_000)], parent=early)
    session(since + 3 * day, [(since + 3 * day, 20_000), (since - 3 * day, 10_000)], parent=child)
    before = session(since - 2 * day, [(since + day, 990_000)])
    session(since + day, [(since + day, 5_000)], parent=before)
    session(since + day, [(since - 4 * day, 800_000)])
    session(since + 4 * day, [])
    await project(nats_url, console_db.dsn, events)

    conn = await connect(console_db.dsn)
    try:
        assert await conn.fetchval("SELECT count(*) FROM session_costs") > 0
        want = await _ranks_from_the_calls(conn, since)
        f = sessions_page.SessionFilters(sort="cost", since=since, kind="loop")
        async with conn.transaction(readonly=True):
            sql, args = sessions_page._loop_query(f, None, 1000, None, since)
            got = [(r["id"], r["rank_usd"]) for r in await conn.fetch(sql, *args)]
            assert got == want
            ids = [sid for sid, _ in want]
            assert before not in ids and ids.index(early) < ids.index(slack)
            # Keyset pages of three give the same order, through list_sessions itself.
            paged: list[uuid.UUID] = []
            cursor: str | None = None
            while True:
                page = await sessions_page.list_sessions(conn, f, cursor, limit=3)
                paged += [r.id for r in page.sessions]
                if page.next_cursor is None:
                    break
                cursor = page.next_cursor
            assert paged == ids
    finally:
        await conn.close()
