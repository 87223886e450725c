"""The console under hostile input and failure: a sign-out (or a password change) ends every copy of the cookie,
on every console sharing the database; a body is bounded before it is read; password hashing never stalls the
event loop; only known Host names are served; a connection that never finishes its headers is closed; a
database that went away is a 503 with the reason. The console in-process against real NATS and PostgreSQL."""

from __future__ import annotations

import asyncio
import statistics
import time

import aiohttp

from commonos.console.users import Role, User, add_user, hash_password
from tests.console.conftest import PASSWORDS, RunningConsole, Seeded, StartConsole
from tests.harness import PgServer


async def me_status(console: RunningConsole, cookie: str) -> int:
    headers = {"Cookie": f"cos_console={cookie}"}
    async with aiohttp.ClientSession(base_url=console.url) as raw, raw.get("/api/me", headers=headers) as r:
        return r.status


def cookie_of(client: aiohttp.ClientSession) -> str:
    found = [c.value for c in client.cookie_jar if c.key == "cos_console"]
    assert found, "no session cookie was set"
    return found[0]


async def test_a_sign_out_ends_every_copy_of_the_cookie(console: RunningConsole) -> None:
    client, token = await console.signed_in("olivia")
    copy = cookie_of(client)
    assert await me_status(console, copy) == 200
    async with client.post("/api/logout", headers={"X-CSRF-Token": token}) as r:
        assert r.status == 204
    # The copy taken before the sign-out is worth nothing now, for reading and for acting.
    assert await me_status(console, copy) == 401
    async with aiohttp.ClientSession(base_url=console.url) as raw:
        headers = {"Cookie": f"cos_console={copy}", "X-CSRF-Token": token}
        async with raw.post("/api/chat", headers=headers, json={"profile_id": "acme", "text": "hi"}) as r:
            assert r.status == 401, await r.text()
    # Signing in again gives a new sign-in that works.
    again, _ = await console.signed_in("olivia")
    assert await me_status(console, cookie_of(again)) == 200


async def test_a_sign_out_holds_on_every_console_of_the_database(
    console: RunningConsole, start_console: StartConsole, console_db: Seeded
) -> None:
    """Two replicas (same key, same database): signing out at one signs out at the other."""
    other = await start_console(analyst_role=console_db.analyst_role, secret=console.settings.secret)
    client, token = await console.signed_in("alice")
    copy = cookie_of(client)
    assert await me_status(other, copy) == 200
    async with client.post("/logout", data={"csrf_token": token}, allow_redirects=False) as r:
        assert r.status == 303
    assert await me_status(other, copy) == 401
    assert await me_status(console, copy) == 401


async def test_a_password_change_ends_earlier_sign_ins(console: RunningConsole) -> None:
    client, _ = await console.signed_in("abel")
    copy = cookie_of(client)
    assert await me_status(console, copy) == 200
    # What `cos console user add abel ... --password-stdin` does: the person's hash is replaced.
    users = console.settings.users_file
    old = console.app.state.users.get("abel")
    assert old is not None
    add_user(users, User("abel", old.role, old.profiles, old.pg_role, hash_password("a-new-password")))
    assert await me_status(console, copy) == 401
    # A change of something else (their role) keeps them signed in: only the password ends sign-ins.
    olivia, _ = await console.signed_in("olivia")
    kept = cookie_of(olivia)
    add_user(users, User("olivia", Role.OPERATOR, password_hash=console.app.state.users.get("olivia").password_hash))
    assert await me_status(console, kept) == 200


async def _answer_to(console: RunningConsole, head: str, body: bytes = b"") -> bytes:
    """Send a request head (and the start of a body), then wait for the status line without sending more."""
    host, port = console.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(head.format(host=f"{host}:{port}").encode() + body)
        await writer.drain()
        return await asyncio.wait_for(reader.readline(), 5)
    finally:
        writer.close()


POST = "POST {path} HTTP/1.1\r\nHost: {{host}}\r\nContent-Type: application/json\r\n"


async def test_an_unauthenticated_body_is_refused_before_it_is_read(console: RunningConsole) -> None:
    # 400 MB announced, none sent: the answer comes from the head alone (it used to wait for, and read, it all).
    big = POST.format(path="/api/login") + "Content-Length: 400000000\r\n\r\n"
    assert (await _answer_to(console, big)).startswith(b"HTTP/1.1 413")
    # Without a sign-in even 9 KiB is too much; a body without a length is cut off once it passes the limit.
    assert (await _answer_to(console, big.replace("400000000", "9000"))).startswith(b"HTTP/1.1 413")
    chunked = POST.format(path="/api/login") + "Transfer-Encoding: chunked\r\n\r\n"
    status = await _answer_to(console, chunked, b"4000\r\n" + b" " * 0x4000 + b"\r\n")
    assert status.startswith(b"HTTP/1.1 413"), status
    # Every route has a limit, a signed-in person's larger (1 MiB), and a body under it still works.
    client, token = await console.signed_in("olivia")
    cookie = f"Cookie: cos_console={cookie_of(client)}\r\nX-CSRF-Token: {token}\r\n"
    chat = POST.format(path="/api/chat") + cookie + "Content-Length: {n}\r\n\r\n"
    assert (await _answer_to(console, chat.replace("{n}", str(2 * 1024 * 1024)))).startswith(b"HTTP/1.1 413")
    assert (await _answer_to(console, chat.replace("{n}", "9000"), b" " * 9000)).startswith(b"HTTP/1.1 422")
    async with client.get("/api/me") as r:
        assert r.status == 200


async def test_password_hashing_does_not_stall_the_console(console: RunningConsole) -> None:
    async def sign_in(n: int) -> int:
        async with aiohttp.ClientSession(base_url=console.url) as raw:
            password = PASSWORDS["alice"] if n % 2 else "a wrong password"
            async with raw.post("/api/login", json={"name": "alice", "password": password}) as r:
                return r.status

    async def health() -> list[float]:
        times = []
        async with aiohttp.ClientSession(base_url=console.url) as raw:
            for _ in range(15):
                t0 = time.perf_counter()
                async with raw.get("/healthz") as r:
                    assert r.status == 200
                times.append(time.perf_counter() - t0)
                await asyncio.sleep(0.02)
        return times

    signing = asyncio.gather(*(sign_in(n) for n in range(16)))
    times = await health()
    statuses = await signing
    assert sorted(set(statuses)) == [200, 401]
    # On the event loop 16 argon2 checks made /healthz wait 1.9 s; off it, it answers at once.
    assert statistics.median(times) < 0.1, times
    assert max(times) < 0.5, times


async def test_only_known_host_names_are_served(start_console: StartConsole, console_db: Seeded) -> None:
    console = await start_console(analyst_role=console_db.analyst_role, origins=("https://console.example.com",))
    port = console.settings.port

    async def status(host: str, path: str = "/metrics") -> int:
        async with aiohttp.ClientSession(base_url=console.url) as raw, raw.get(path, headers={"Host": host}) as r:
            return r.status

    # DNS rebinding: a name that points at 127.0.0.1 is not this console's name.
    assert await status("rebind.evil.example") == 421
    assert await status(f"rebind.evil.example:{port}", "/api/openapi.json") == 421
    assert await status("rebind.evil.example", "/login") == 421
    # Loopback names, address literals (a kubelet's probe, a Prometheus scrape by pod address) and the configured
    # origins are served.
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "10.1.2.3:8470", "console.example.com"):
        assert await status(host) == 200, host
    # Names of its own are configured (COS_CONSOLE_HOSTS): a compose service name, say.
    named = await start_console(analyst_role=console_db.analyst_role, hosts=("console",))
    async with aiohttp.ClientSession(base_url=named.url) as raw:
        async with raw.get("/healthz", headers={"Host": "console:8470"}) as r:
            assert r.status == 200
        async with raw.get("/healthz", headers={"Host": "other:8470"}) as r:
            assert r.status == 421


async def test_a_connection_that_never_finishes_its_headers_is_closed(
    start_console: StartConsole, console_db: Seeded
) -> None:
    console = await start_console(analyst_role=console_db.analyst_role, header_timeout_s=1.0)
    host, port = console.url.removeprefix("http://").split(":")
    sockets = []
    for _ in range(50):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        sockets.append((reader, writer))
    started = time.monotonic()

    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> float:
        # One header byte a quarter second: each byte alone is never slow, the headers as a whole are.
        try:
            for _ in range(40):
                writer.write(b"X")
                await writer.drain()
                try:
                    if await asyncio.wait_for(reader.read(1), 0.25) == b"":
                        break
                except TimeoutError:
                    continue
                break
        except ConnectionError:
            pass
        finally:
            writer.close()
        return time.monotonic() - started

    # A normal request is served meanwhile.
    async with aiohttp.ClientSession(base_url=console.url) as raw, raw.get("/healthz") as r:
        assert r.status == 200
    closed_after = await asyncio.gather(*(trickle(r, w) for r, w in sockets))
    assert max(closed_after) < 5, closed_after


async def test_a_database_that_went_away_is_a_503_with_the_reason(console: RunningConsole, pg_server: PgServer) -> None:
    client, _ = await console.signed_in("olivia")
    async with client.get("/api/sessions") as r:
        assert r.status == 200
    pg_server.stop()
    try:
        for path in ("/api/sessions", "/api/costs", "/sessions"):
            async with client.get(path) as r:
                body = await r.text()
                assert r.status == 503, (path, r.status, body)
                assert "database" in body.lower(), body
                assert r.headers.get("Retry-After"), path
        async with client.get("/api/me") as r:
            assert r.status == 503, await r.text()
    finally:
        pg_server.start()
    for _ in range(100):
        async with client.get("/api/sessions") as r:
            if r.status == 200:
                break
        await asyncio.sleep(0.1)
    assert r.status == 200
