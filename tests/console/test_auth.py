"""Sign-in, the session cookie, CSRF, the trusted proxy header, and row-level security deciding what an analyst
reads: the console in-process against real NATS and PostgreSQL."""

from __future__ import annotations

import ipaddress
import re
import subprocess
import sys
from http.cookies import SimpleCookie
from pathlib import Path

import aiohttp
import pytest
from fastapi import HTTPException, WebSocket

from commonos.console.auth import COOKIE, websocket_principal
from commonos.console.db import Database
from commonos.console.pages import signin
from commonos.console.users import Role, User, Users, verify_password
from tests.console.conftest import PASSWORDS, RunningConsole, Seeded, StartConsole


def cookie_attributes(header: str) -> dict[str, str]:
    parsed = SimpleCookie()
    parsed.load(header)
    morsel = parsed[COOKIE]
    return {k: str(v) for k, v in morsel.items() if v}


async def test_sign_in_with_the_form_then_out(console: RunningConsole) -> None:
    client = await console.client()
    async with client.get("/logout?x=1", allow_redirects=False) as r:
        assert r.status == 303
        assert r.headers["Location"] == "/login?next=%2Flogout%3Fx%3D1"
    async with client.get("/login?next=/sessions") as r:
        assert r.status == 200
        assert 'name="password"' in await r.text()
    async with client.post(
        "/login", data={"name": "olivia", "password": PASSWORDS["olivia"], "next": "/api/me"}, allow_redirects=False
    ) as r:
        assert r.status == 303
        assert r.headers["Location"] == "/api/me"
    async with client.get("/api/me") as r:
        me = await r.json()
        assert (me["name"], me["role"]) == ("olivia", "operator")
    # Signing out needs the token, as every form does.
    async with client.post("/logout", data={}, allow_redirects=False) as r:
        assert r.status == 403
    async with client.post("/logout", data={"csrf_token": me["csrf_token"]}, allow_redirects=False) as r:
        assert r.status == 303
        assert r.headers["Location"] == "/login"
    async with client.get("/api/me") as r:
        assert r.status == 401


async def test_a_wrong_password_or_name_is_refused_alike(console: RunningConsole) -> None:
    client = await console.client()
    for name, password in (("olivia", "not-her-password"), ("nobody", "whatever-it-is"), ("pat", "")):
        async with client.post("/login", data={"name": name, "password": password or "x"}) as r:
            assert r.status == 401
            assert "Wrong name or password." in await r.text()
            assert COOKIE not in r.cookies
        async with client.post("/api/login", json={"name": name, "password": password or "x"}) as r:
            assert r.status == 401
    async with client.get("/api/me") as r:
        assert r.status == 401


async def test_next_never_leaves_the_console(console: RunningConsole) -> None:
    client = await console.client()
    for target in ("https://evil.example/", "//evil.example/x", "/\\evil.example"):
        async with client.post(
            "/login", data={"name": "olivia", "password": PASSWORDS["olivia"], "next": target}, allow_redirects=False
        ) as r:
            assert r.headers["Location"] == "/sessions", target


async def test_cookie_flags(start_console: StartConsole) -> None:
    secure = await start_console(secure_cookies=True, session_max_age_s=3600)
    client = await secure.client()
    async with client.post("/api/login", json={"name": "olivia", "password": PASSWORDS["olivia"]}) as r:
        assert r.status == 200
        [header] = r.headers.getall("Set-Cookie")
    attributes = cookie_attributes(header)
    assert attributes["httponly"] is not None and "httponly" in header.lower()
    assert "secure" in attributes
    assert attributes["samesite"].lower() == "lax"
    assert attributes["path"] == "/"
    assert attributes["max-age"] == "3600"
    # The value is signed: changed by one character it is no sign-in at all.
    value = header.split(";", 1)[0].split("=", 1)[1]
    # (The payload's first character: the signature's last one may carry only padding bits.)
    tampered = ("A" if value[0] != "A" else "B") + value[1:]
    async with client.get("/api/me", headers={"Cookie": f"{COOKIE}={value}"}) as r:
        assert r.status == 200
    async with client.get("/api/me", headers={"Cookie": f"{COOKIE}={tampered}"}) as r:
        assert r.status == 401
    # Every answer carries the security headers.
    async with client.get("/login") as r:
        assert "script-src 'self'" in r.headers["Content-Security-Policy"]
        assert r.headers["X-Content-Type-Options"] == "nosniff"
    # A cookie signed with another console's key is no sign-in either.
    other = await start_console(secure_cookies=True)
    other_client = await other.client()
    async with other_client.get("/api/me", headers={"Cookie": f"{COOKIE}={value}"}) as r:
        assert r.status == 401


async def test_state_changing_calls_need_the_csrf_token_and_the_same_origin(console: RunningConsole) -> None:
    client, token = await console.signed_in("olivia")
    async with client.post("/api/logout") as r:
        assert r.status == 403
        assert "CSRF" in (await r.json())["detail"]
    async with client.post("/api/logout", headers={"X-CSRF-Token": "0" * 64}) as r:
        assert r.status == 403
    async with client.post("/api/logout", headers={"X-CSRF-Token": token, "Origin": "https://evil.example"}) as r:
        assert r.status == 403
        assert "cross-origin" in (await r.json())["detail"]
    # Another person's token is no good either: it is bound to the sign-in.
    _, other_token = await console.signed_in("alice")
    assert other_token != token
    async with client.post("/api/logout", headers={"X-CSRF-Token": other_token}) as r:
        assert r.status == 403
    async with client.get("/api/me") as r:
        assert r.status == 200
    async with client.post("/api/logout", headers={"X-CSRF-Token": token, "Origin": console.url}) as r:
        assert r.status == 204
    async with client.get("/api/me") as r:
        assert r.status == 401
    # Signing in from another origin's page is refused too.
    async with client.post(
        "/login",
        data={"name": "olivia", "password": PASSWORDS["olivia"]},
        headers={"Origin": "https://evil.example"},
        allow_redirects=False,
    ) as r:
        assert r.status == 403


async def test_the_proxy_header_is_believed_only_from_a_trusted_proxy(start_console: StartConsole) -> None:
    trusting = await start_console(
        trusted_header="X-Forwarded-User", trusted_proxies=(ipaddress.ip_network("127.0.0.0/8"),)
    )
    client = await trusting.client()
    async with client.get("/api/me", headers={"X-Forwarded-User": "pat"}) as r:
        assert r.status == 200
        me = await r.json()
        assert (me["name"], me["role"]) == ("pat", "operator")
    async with client.get("/api/me", headers={"X-Forwarded-User": "someone-not-listed"}) as r:
        assert r.status == 401
    # The proxy's sign-in needs its CSRF token like any other.
    async with client.post("/api/logout", headers={"X-Forwarded-User": "pat"}) as r:
        assert r.status == 403
    # pat has no password: the form does not let him in.
    async with client.post("/api/login", json={"name": "pat", "password": "anything-at-all"}) as r:
        assert r.status == 401

    elsewhere = await start_console(
        trusted_header="X-Forwarded-User", trusted_proxies=(ipaddress.ip_network("10.0.0.0/8"),)
    )
    client = await elsewhere.client()
    async with client.get("/api/me", headers={"X-Forwarded-User": "pat"}) as r:
        assert r.status == 401
    async with client.get("/api/me", headers={"X-Forwarded-User": "olivia"}) as r:
        assert r.status == 401


async def test_an_analyst_reads_what_row_level_security_lets_it(console: RunningConsole, console_db: Seeded) -> None:
    """PostgreSQL decides: the same query, as the operator and as the analyst, on one pooled connection (so a
    role taken for one transaction must not stay for the next)."""
    db = await Database.open(console_db.dsn, max_size=1)
    operator = User("olivia", Role.OPERATOR)
    analyst = User("alice", Role.ANALYST, pg_role=console_db.analyst_role)
    try:
        for _ in range(2):
            for user, expected in ((analyst, {"acme"}), (operator, {"acme", "globex"})):
                async with db.reader(user) as conn:
                    for table in ("sessions", "turns", "messages", "tool_calls", "model_calls"):
                        rows = await conn.fetch(f"SELECT DISTINCT profile_id FROM {table}")
                        assert {r["profile_id"] for r in rows} == expected, (user.name, table)
        # Read-only even for the operator.
        async with db.reader(operator) as conn:
            with pytest.raises(Exception, match="read-only"):
                await conn.execute("DELETE FROM messages")
        # A role the console cannot take is a refusal, not someone else's view.
        with pytest.raises(HTTPException) as refused:
            async with db.reader(User("mallory", Role.ANALYST, pg_role="console_no_such_role")):
                pass
        assert refused.value.status_code == 403
    finally:
        await db.close()

    # Through the running console: the analyst's API answers come from the same rule.
    client, _ = await console.signed_in("alice")
    async with client.get("/api/me") as r:
        assert (await r.json())["role"] == "analyst"


async def test_health_metrics_static_and_openapi(console: RunningConsole) -> None:
    client = await console.client()
    async with client.get("/healthz") as r:
        assert r.status == 200
        assert (await r.json())["status"] == "ok"
    async with client.get("/readyz") as r:
        assert r.status == 200, await r.text()
    async with client.get("/login") as r:
        pass
    async with client.get("/metrics") as r:
        text = await r.text()
        assert re.search(r'cos_console_requests_total\{code="200",method="GET",route="/login"\} \d', text), text[:2000]
    async with client.get("/static/vendor/htmx-2.0.11/htmx.min.js") as r:
        assert r.status == 200
    async with client.get("/static/vendor/htmx-2.0.11/LICENSE") as r:
        assert "Zero-Clause BSD" in await r.text()
    async with client.get("/static/console.css") as r:
        assert r.status == 200
    async with client.get("/api/openapi.json") as r:
        paths = (await r.json())["paths"]
        assert "/api/me" in paths and "/api/login" in paths


def test_cos_console_user_add_writes_an_argon2_hash(tmp_path: Path) -> None:
    path = tmp_path / "people.toml"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "commonos.cli",
            "console",
            "user",
            "add",
            "carol",
            "--role",
            "analyst",
            "--profile",
            "acme",
            "--password-stdin",
            "--users",
            str(path),
        ],
        input="a-long-password\n",
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    carol = Users(path).get("carol")
    assert carol is not None and carol.password_hash is not None and carol.password_hash.startswith("$argon2id$")
    assert (carol.role, carol.profiles, carol.db_role) == (Role.ANALYST, ("acme",), "carol")
    assert verify_password(carol, "a-long-password") and not verify_password(carol, "another-password")
    assert path.stat().st_mode & 0o077 == 0
    # What a superuser runs so that the console may read as carol, printed whole.
    for statement in (
        "CREATE ROLE carol NOLOGIN IN ROLE cos_analyst;",
        "GRANT carol TO cos_console;",
        "INSERT INTO analyst_grants (role_name, profile_id) VALUES ('carol', 'acme');",
    ):
        assert statement in result.stdout, result.stdout


async def test_a_websocket_needs_the_sign_in_and_this_origin(console: RunningConsole) -> None:
    """websocket_principal, as the chat's WebSocket uses it: the cookie, and an Origin of this console."""

    async def whoami(websocket: WebSocket) -> None:
        who = websocket_principal(websocket)
        if who is None:
            await websocket.close(code=1008)
            return
        await websocket.accept()
        await websocket.send_text(who.user.name)
        await websocket.close()

    console.app.add_api_websocket_route("/test/whoami", whoami)
    client, _ = await console.signed_in("alice")
    async with client.ws_connect("/test/whoami", origin=console.url) as ws:
        assert (await ws.receive_str()) == "alice"
    # Closed before it is accepted: the handshake is refused (403).
    for origin in ("https://evil.example", None):
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await client.ws_connect("/test/whoami", origin=origin)
        assert refused.value.status == 403, origin
    stranger = await console.client()
    with pytest.raises(aiohttp.WSServerHandshakeError):
        await stranger.ws_connect("/test/whoami", origin=console.url)


async def test_a_public_origin_behind_a_proxy_is_accepted(start_console: StartConsole) -> None:
    """COS_CONSOLE_ORIGINS: a proxy may rewrite Host; the browser's Origin is then the public one."""
    behind = await start_console(origins=("https://console.example.com",))
    client = await behind.client()
    async with client.post(
        "/api/login",
        json={"name": "olivia", "password": PASSWORDS["olivia"]},
        headers={"Origin": "https://console.example.com"},
    ) as r:
        assert r.status == 200
        token = (await r.json())["csrf_token"]
    async with client.post("/api/logout", headers={"X-CSRF-Token": token, "Origin": "https://other.example.com"}) as r:
        assert r.status == 403
    async with client.post(
        "/api/logout", headers={"X-CSRF-Token": token, "Origin": "https://console.example.com"}
    ) as r:
        assert r.status == 204


async def test_guessing_passwords_is_throttled(console: RunningConsole, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(signin, "MAX_FAILURES", 3)
    client = await console.client()
    for _ in range(3):
        async with client.post("/api/login", json={"name": "olivia", "password": "a-wrong-guess"}) as r:
            assert r.status == 401
    async with client.post("/api/login", json={"name": "olivia", "password": PASSWORDS["olivia"]}) as r:
        assert r.status == 429
        assert int(r.headers["Retry-After"]) > 0
    async with client.post("/login", data={"name": "olivia", "password": PASSWORDS["olivia"]}) as r:
        assert r.status == 429
