"""API keys for the JSON API, made and revoked by `cos console key` (a real process, as an operator runs it)
against the console running on real NATS and PostgreSQL: a key reads as its role and profiles (an analyst key
under row-level security), needs no CSRF token, is refused the moment it is revoked, a wrong one is 401 with the
reason, and the database never holds a key in clear."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import secrets
import subprocess
import sys
import uuid
from typing import Any

import aiohttp

from commonos.console.keys import API_KEYS, KEY_SHAPE
from commonos.runtime.postgres import connect
from tests.console.conftest import REPO, ROLES, RunningConsole, Seeded


async def cos(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`cos <args>` as a process of its own with COS_DATABASE_URL, in a thread (the console runs in this loop)."""
    env = {**os.environ, "COS_DATABASE_URL": dsn}
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "commonos.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


async def create_key(dsn: str, *args: str) -> str:
    result = await cos(dsn, "console", "key", "create", *args)
    assert result.returncode == 0, result.stderr
    token = result.stdout.strip()
    assert KEY_SHAPE.fullmatch(token), result.stdout
    return token


async def key_id(dsn: str, name: str) -> str:
    result = await cos(dsn, "console", "key", "list")
    assert result.returncode == 0, result.stderr
    found = [line.split()[0] for line in result.stdout.splitlines() if line.split()[1:2] == [name]]
    assert len(found) == 1, result.stdout
    return found[0]


async def call(
    console: RunningConsole, method: str, path: str, token: str | None, **kwargs: Any
) -> tuple[int, Any, aiohttp.ClientResponse]:
    client = await console.client()
    headers = kwargs.pop("headers", {})
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    async with client.request(method, path, headers=headers, **kwargs) as r:
        body = await r.json() if r.content_type == "application/json" else await r.text()
        return r.status, body, r


def session_ids(listing: dict[str, Any]) -> set[str]:
    return {s["id"] for s in listing["sessions"]}


async def test_a_key_reads_the_api_as_its_role_and_its_profiles(console: RunningConsole, console_db: Seeded) -> None:
    dsn = console_db.dsn
    acme = {str(s) for s in console_db.sessions("acme")}
    globex = {str(s) for s in console_db.sessions("globex")}
    operator = await create_key(dsn, "--name", "ops-bot", "--role", "operator")
    analyst = await create_key(
        dsn, "--name", "billing-bot", "--role", "analyst", "--profile", "acme", "--pg-role", console_db.analyst_role
    )

    status, body, _ = await call(console, "GET", "/api/me", analyst)
    assert status == 200, body
    assert (body["name"], body["role"], body["profiles"]) == ("key:billing-bot", "analyst", ["acme"])

    status, body, _ = await call(console, "GET", "/api/sessions", operator)
    assert status == 200, body
    assert session_ids(body) >= acme | globex

    # The analyst key sees acme only: by list, by search and by URL.
    status, body, _ = await call(console, "GET", "/api/sessions", analyst)
    assert status == 200, body
    assert session_ids(body) == acme
    [other] = globex
    status, body, _ = await call(console, "GET", f"/api/sessions/{other}", analyst)
    assert status == 404, body
    status, body, _ = await call(console, "GET", f"/api/sessions/{other}", operator)
    assert (status, body["profile_id"]) == (200, "globex")
    status, body, _ = await call(console, "GET", "/api/operations", analyst)
    assert status == 403, body


async def test_the_command_prints_the_key_once_and_the_database_keeps_its_hash_only(
    console: RunningConsole, console_db: Seeded
) -> None:
    result = await cos(
        console_db.dsn, "console", "key", "create", "--name", "Billing.Bot-2", "--role", "analyst", "--profile", "acme"
    )
    assert result.returncode == 0, result.stderr
    token = result.stdout.strip()
    assert result.stdout == token + "\n" and KEY_SHAPE.fullmatch(token)
    # Said on standard error: what it is, that it is shown once, and the statements for its database role.
    assert "shown this once" in result.stderr
    assert "INSERT INTO analyst_grants (role_name, profile_id) VALUES ('billing_bot_2', 'acme');" in result.stderr

    conn = await connect(console_db.dsn)
    try:
        rows = await conn.fetch("SELECT k.*, row_to_json(k)::text AS whole FROM console_api_keys k")
        # Nowhere else either: no other table of the database holds the key's text.
        tables = await conn.fetch(
            "SELECT quote_ident(table_schema) || '.' || quote_ident(table_name) AS name FROM information_schema.tables "
            "WHERE table_schema NOT IN ('pg_catalog', 'information_schema') AND table_type = 'BASE TABLE'"
        )
        holding = [
            t["name"]
            for t in tables
            if await conn.fetchval(f"SELECT count(*) FROM {t['name']} x WHERE x::text LIKE '%' || $1 || '%'", token)
        ]
    finally:
        await conn.close()
    assert holding == []
    [row] = rows
    assert token not in row["whole"] and token[len("cosk_") :] not in row["whole"]
    assert row["token_hash"] == hashlib.sha256(token.encode()).hexdigest()
    assert (row["name"], row["role"], list(row["profiles"]), row["pg_role"]) == (
        "Billing.Bot-2",
        "analyst",
        ["acme"],
        "billing_bot_2",
    )
    listing = await cos(console_db.dsn, "console", "key", "list")
    assert token not in listing.stdout and row["token_hash"] not in listing.stdout
    assert f"{row['id']}  Billing.Bot-2  analyst profiles=acme pg_role=billing_bot_2" in listing.stdout


async def test_a_revoked_key_is_refused_at_once_by_the_running_console(
    console: RunningConsole, console_db: Seeded
) -> None:
    token = await create_key(console_db.dsn, "--name", "cron", "--role", "operator")
    status, body, _ = await call(console, "GET", "/api/sessions", token)
    assert status == 200, body
    ident = await key_id(console_db.dsn, "cron")
    listed = (await cos(console_db.dsn, "console", "key", "list")).stdout
    assert re.search(rf"{ident}  cron  operator created=\S+ last_used=\S+", listed), listed

    revoked = await cos(console_db.dsn, "console", "key", "revoke", ident)
    assert revoked.returncode == 0, revoked.stderr
    assert f"revoked API key {ident} cron" in revoked.stdout
    # The same console, no restart: its very next request is refused.
    status, body, response = await call(console, "GET", "/api/sessions", token)
    assert status == 401, body
    assert body == {"detail": "invalid API key: unknown or revoked"}
    assert response.headers["WWW-Authenticate"] == 'Bearer error="invalid_token"'

    again = await cos(console_db.dsn, "console", "key", "revoke", ident)
    assert (again.returncode, again.stderr.strip()) == (2, f"cos: error: key {ident} was revoked already")
    assert "cron" not in (await cos(console_db.dsn, "console", "key", "list")).stdout
    assert f"{ident}  cron  operator" in (await cos(console_db.dsn, "console", "key", "list", "--all")).stdout
    unknown = await cos(console_db.dsn, "console", "key", "revoke", "000000000000")
    assert (unknown.returncode, unknown.stderr.strip()) == (2, "cos: error: no key 000000000000 (cos console key list)")


async def test_a_wrong_key_is_401_with_the_reason_whatever_cookie_comes_with_it(
    console: RunningConsole, console_db: Seeded
) -> None:
    status, body, response = await call(console, "GET", "/api/sessions", "not-a-key")
    assert (status, body) == (401, {"detail": "invalid API key: not a key (cosk_…)"})
    assert response.headers["WWW-Authenticate"] == 'Bearer error="invalid_token"'
    made_up = "cosk_" + secrets.token_urlsafe(32)
    status, body, _ = await call(console, "GET", "/api/sessions", made_up)
    assert (status, body) == (401, {"detail": "invalid API key: unknown or revoked"})
    # A signed-in browser's cookie does not make a wrong key good: the key is the request's only identity.
    client, _ = await console.signed_in("olivia")
    async with client.get("/api/sessions", headers={"Authorization": f"Bearer {made_up}"}) as r:
        assert r.status == 401, await r.text()
    async with client.get("/api/sessions") as r:
        assert r.status == 200
    # Another scheme is no key: the request is not signed in.
    status, body, _ = await call(console, "GET", "/api/sessions", None, headers={"Authorization": "Basic b2s6b2s="})
    assert (status, body) == (401, {"detail": "not signed in"})
    # Keys are for the JSON API: a page with one is a page without a sign-in (to /login).
    token = await create_key(console_db.dsn, "--name", "pages", "--role", "operator")
    client = await console.client()
    async with client.get("/sessions", headers={"Authorization": f"Bearer {token}"}, allow_redirects=False) as r:
        assert r.status == 303 and r.headers["Location"].startswith("/login")


async def test_a_key_needs_no_csrf_token_and_a_cookie_still_does(console: RunningConsole, console_db: Seeded) -> None:
    token = await create_key(console_db.dsn, "--name", "decider", "--role", "operator")
    nothing_waits = f"/api/approvals/{uuid.uuid4()}/approve"
    # Past the CSRF check, to the approval itself (none waits), even sent as from another site.
    status, body, _ = await call(console, "POST", nothing_waits, token, headers={"Origin": "https://evil.example"})
    assert status == 404, body
    assert "is waiting" in body["detail"]
    client, csrf = await console.signed_in("olivia")
    async with client.post(nothing_waits) as r:
        assert (r.status, (await r.json())["detail"]) == (403, "missing or wrong CSRF token")
    async with client.post(nothing_waits, headers={"X-CSRF-Token": csrf, "Origin": "https://evil.example"}) as r:
        assert (r.status, (await r.json())["detail"]) == (403, "cross-origin request refused")
    async with client.post(nothing_waits, headers={"X-CSRF-Token": csrf}) as r:
        assert r.status == 404
    # An analyst key is refused what an analyst is refused.
    analyst = await create_key(
        console_db.dsn, "--name", "reader", "--role", "analyst", "--pg-role", console_db.analyst_role
    )
    status, body, _ = await call(console, "POST", nothing_waits, analyst)
    assert (status, body) == (403, {"detail": "analysts do not decide approvals"})


async def test_api_requests_are_counted_by_how_they_were_signed(console: RunningConsole, console_db: Seeded) -> None:
    def counted(text: str, auth: str) -> float:
        found = re.search(rf'cos_console_api_requests_total\{{auth="{auth}"\}} (\S+)', text)
        return float(found.group(1)) if found else 0.0

    _, before, _ = await call(console, "GET", "/metrics", None)
    token = await create_key(console_db.dsn, "--name", "counted", "--role", "operator")
    for _ in range(3):
        assert (await call(console, "GET", "/api/me", token))[0] == 200
    assert (await call(console, "GET", "/api/me", "cosk_" + secrets.token_urlsafe(32)))[0] == 401
    _, after, _ = await call(console, "GET", "/metrics", None)
    assert counted(after, "key") - counted(before, "key") == 3
    assert counted(after, "none") - counted(before, "none") >= 1


async def test_the_command_makes_the_table_when_no_console_has(database_url: str) -> None:
    result = await cos(database_url, "console", "key", "list")
    assert (result.returncode, result.stdout.strip()) == (
        0,
        "no API keys (cos console key create --name NAME --role operator|analyst|approver)",
    )
    conn = await connect(database_url)
    try:
        assert await conn.fetchval("SELECT to_regclass('public.console_api_keys') IS NOT NULL")
    finally:
        await conn.close()
    refused = await cos(database_url, "console", "key", "create", "--name", "x", "--role", "approver")
    assert (refused.returncode, refused.stderr.strip()) == (
        2,
        "cos: error: an approver key decides for the profiles it is given: give --profile",
    )


def test_roles_sql_gives_the_keys_to_the_console_alone() -> None:
    """deploy/postgres/roles.sql (and its copy for Kubernetes) holds the table's grants as declared."""
    assert API_KEYS.owner == "cos_console"
    assert API_KEYS.grants() in ROLES
    copy = (REPO / "deploy" / "k8s" / "base" / "config" / "postgres" / "roles.sql").read_text()
    assert API_KEYS.grants() in copy
