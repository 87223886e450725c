"""Chat on real servers (nats-server, PostgreSQL, the loop service on the scripted provider, the journal-writer):
the WebSocket starts a `web` session with an extra tag and streams the reply before its final message, tool
calls included; a continued session; refusals (a bad tag, tags with a session, an analyst, another profile's
approver); the handshake's checks (sign-in, CSRF token, Origin); POST /api/chat; the page."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import aiohttp
import pytest

from commonos.loop.service import LoopService
from tests.console.chat_support import fetch_value, globex_loop, loop_service
from tests.console.conftest import RunningConsole, Seeded

__all__ = ["globex_loop", "loop_service"]


def protocols(token: str) -> tuple[str, str]:
    """The socket's subprotocols: `cos.chat`, and the CSRF token beside it (never in the URL)."""
    return ("cos.chat", f"csrf.{token}")


async def socket(console: RunningConsole, client: aiohttp.ClientSession, token: str) -> aiohttp.ClientWebSocketResponse:
    ws = await client.ws_connect("/api/chat/ws", protocols=protocols(token), headers={"Origin": console.url})
    assert ws.protocol == "cos.chat"
    return ws


async def turn(ws: aiohttp.ClientWebSocketResponse, message: dict[str, Any]) -> list[dict[str, Any]]:
    """Send a chat message; every message the console sends back up to `done` or `error`."""
    await ws.send_str(json.dumps(message))
    out: list[dict[str, Any]] = []
    while True:
        received = await ws.receive_json(timeout=30)
        out.append(received)
        if received["type"] in {"done", "error"}:
            return out


async def test_a_web_session_streams_its_reply_and_tool_calls(
    console: RunningConsole, console_db: Seeded, loop_service: LoopService
) -> None:
    client, token = await console.signed_in("olivia")
    ws = await socket(console, client, token)
    got = await turn(ws, {"text": "weather in Charleston?", "profile_id": "acme", "tags": ["client:web-test"]})
    kinds = [m["type"] for m in got]
    assert kinds[0] == "started" and kinds[-1] == "done", kinds
    done = got[-1]
    assert (done["status"], done["text"], done["error"]) == (
        "completed",
        "Bring an umbrella: 18°C and light rain.",
        None,
    )
    session = done["session_id"]
    assert got[0]["session_id"] == session and got[0]["turn_id"] == done["turn_id"]
    deltas = [m for m in got if m["type"] == "delta"]
    assert [d["seq"] for d in deltas] == list(range(len(deltas)))
    assert "".join(d["text"] for d in deltas if d["kind"] == "text") == done["text"]
    assert [d["text"] for d in deltas if d["kind"] == "tool_call"] == ["list_dir"]
    [tool] = [m for m in got if m["type"] == "tool_call"]
    assert (tool["name"], tool["args"], tool["is_error"]) == ("list_dir", {"path": "."}, False)
    # The tool call and every delta came before the final message.
    assert kinds.index("tool_call") < kinds.index("done") and max(got.index(d) for d in deltas) < len(got) - 1

    # Stored: a web session with the extra tag, the turn's tags the profile's and the session's.
    dsn = console_db.dsn
    sid = uuid.UUID(session)
    assert await fetch_value(dsn, "SELECT source FROM sessions WHERE id = $1", sid) == "web"
    assert await fetch_value(dsn, "SELECT tags FROM sessions WHERE id = $1", sid) == ["client:web-test"]
    turn_tags = await fetch_value(dsn, "SELECT tags FROM turns WHERE id = $1", uuid.UUID(done["turn_id"]))
    assert turn_tags == ["client:web-test", "team:core"]

    # Continued on the same socket (before or after the journal-writer has it).
    again = await turn(ws, {"text": "and now?", "profile_id": "acme", "session_id": session})
    assert (again[-1]["status"], again[-1]["session_id"]) == ("completed", session) and again[-1]["text"]
    assert "".join(m["text"] for m in again if m["type"] == "delta" and m["kind"] == "text") == again[-1]["text"]

    # Refused, with the reason, and the socket stays open.
    [bad] = await turn(ws, {"text": "x", "profile_id": "acme", "tags": ["Bad:tag"]})
    assert bad["type"] == "error" and "invalid tag 'Bad:tag': upper case in the key" in bad["error"]
    [fixed] = await turn(ws, {"text": "x", "profile_id": "acme", "session_id": session, "tags": ["a:b"]})
    assert fixed["type"] == "error" and "tags are fixed" in fixed["error"]
    [other] = await turn(ws, {"text": "x", "profile_id": "globex", "session_id": session})
    assert other["type"] == "error" and "is of profile 'acme'" in other["error"]
    [unknown] = await turn(ws, {"text": "x", "profile_id": "acme", "session_id": str(uuid.uuid4())})
    assert unknown["type"] == "error" and unknown["code"] == 404
    [garbage] = await turn(ws, {"profile_id": "acme"})
    assert garbage["type"] == "error" and garbage["error"].startswith("not a chat message: text")
    [nobody] = (await turn(ws, {"text": "hi", "profile_id": "globex"}))[-1:]
    assert (nobody["type"], nobody["status"]) == ("done", "unavailable")
    assert "no loop service answers for profile 'globex'" in nobody["error"]
    assert (await turn(ws, {"text": "still here", "profile_id": "acme"}))[-1]["status"] == "completed"
    await ws.close()


async def test_who_may_chat(console: RunningConsole, console_db: Seeded, loop_service: LoopService) -> None:
    # An analyst reads only.
    alice, alice_token = await console.signed_in("alice")
    ws = await socket(console, alice, alice_token)
    [refused] = await turn(ws, {"text": "hello", "profile_id": "acme"})
    assert refused["code"] == 403 and "analysts read only" in refused["error"]
    await ws.close()
    # An approver chats with its profiles only; it sees the session it continues.
    abel, abel_token = await console.signed_in("abel")
    ws = await socket(console, abel, abel_token)
    [refused] = await turn(ws, {"text": "hello", "profile_id": "globex"})
    assert refused["code"] == 403 and "not one of yours" in refused["error"]
    [globex_session] = console_db.sessions("globex")
    [hidden] = await turn(ws, {"text": "x", "profile_id": "globex", "session_id": str(globex_session)})
    assert hidden["code"] == 403
    acme_session = console_db.sessions("acme")[0]
    done = (await turn(ws, {"text": "hello", "profile_id": "acme", "session_id": str(acme_session)}))[-1]
    assert (done["status"], done["session_id"]) == ("completed", str(acme_session))
    await ws.close()


async def test_the_handshake_needs_the_sign_in_its_token_and_this_origin(
    console: RunningConsole, loop_service: LoopService
) -> None:
    client, token = await console.signed_in("olivia")
    good = protocols(token)
    for url, offered, headers in (
        ("/api/chat/ws", (), {"Origin": console.url}),  # no token
        ("/api/chat/ws", ("cos.chat",), {"Origin": console.url}),
        ("/api/chat/ws", ("cos.chat", "csrf.wrong"), {"Origin": console.url}),
        ("/api/chat/ws", (f"csrf.{token}",), {"Origin": console.url}),  # not the chat's subprotocol
        ("/api/chat/ws", (*good, "csrf.wrong"), {"Origin": console.url}),  # two tokens
        # The token in the URL (where access logs keep it) is not taken.
        (f"/api/chat/ws?csrf_token={token}", (), {"Origin": console.url}),
        (f"/api/chat/ws?csrf_token={token}", ("cos.chat",), {"Origin": console.url}),
        ("/api/chat/ws", good, {"Origin": "http://evil.example"}),
        ("/api/chat/ws", good, {"Origin": "null"}),
    ):
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await client.ws_connect(url, protocols=offered, headers=headers)
        assert refused.value.status == 403, (url, offered, headers)
    stranger = await console.client()
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await stranger.ws_connect("/api/chat/ws", protocols=good, headers={"Origin": console.url})
    assert refused.value.status == 403
    # Without an Origin (not a browser), the token and the cookie are enough.
    ws = await client.ws_connect("/api/chat/ws", protocols=good)
    assert ws.protocol == "cos.chat"
    assert (await turn(ws, {"text": "hi", "profile_id": "acme"}))[-1]["status"] == "completed"
    await ws.close()


async def test_post_api_chat(console: RunningConsole, console_db: Seeded, loop_service: LoopService) -> None:
    abel, token = await console.signed_in("abel")
    body = {"text": "weather?", "profile_id": "acme", "tags": ["client:api"]}
    async with abel.post("/api/chat", json=body) as r:
        assert r.status == 403, await r.text()
    async with abel.post("/api/chat", json=body, headers={"X-CSRF-Token": token}) as r:
        assert r.status == 200, await r.text()
        result = await r.json()
    assert (result["status"], result["text"]) == ("completed", "Bring an umbrella: 18°C and light rain.")
    assert [c["name"] for c in result["tool_calls"]] == ["list_dir"]
    sid = uuid.UUID(result["session_id"])
    assert await fetch_value(console_db.dsn, "SELECT tags FROM sessions WHERE id = $1", sid) == ["client:api"]
    async with abel.post("/api/chat", json={**body, "tags": ["a b"]}, headers={"X-CSRF-Token": token}) as r:
        assert r.status == 422 and "no spaces allowed" in (await r.json())["detail"]
    async with abel.post("/api/chat", json={**body, "profile_id": "globex"}, headers={"X-CSRF-Token": token}) as r:
        assert r.status == 403
    # The page: the profiles this person may chat with, the socket's token, no inline script.
    async with abel.get("/chat") as r:
        html = await r.text()
    assert r.status == 200 and '<option value="acme" selected>acme</option>' in html and "globex" not in html
    assert f'data-csrf="{token}"' in html and "/static/chat.js" in html
    alice, _ = await console.signed_in("alice")
    async with alice.get("/chat") as r:
        assert "Analysts read only" in await r.text()
    async with (await console.client()).get("/static/chat.js") as r:
        assert r.status == 200 and "textContent" in await r.text()


async def test_the_page_offers_the_profiles_a_loop_serves(console: RunningConsole, globex_loop: LoopService) -> None:
    """acme (first on the list) has no loop service, as an imported profile has none: it is listed, marked and
    not offered; the page starts on globex, which a loop serves, even when asked for acme."""
    olivia, _ = await console.signed_in("olivia")
    for path in ("/chat", "/chat?profile=acme"):
        async with olivia.get(path) as r:
            html = await r.text()
        assert r.status == 200
        assert '<option value="acme" disabled>acme (no loop serves it)</option>' in html, path
        assert '<option value="globex" selected>globex</option>' in html, path
        assert 'id="chat-no-loop"' not in html


async def test_the_page_says_when_no_loop_serves_any_profile(console: RunningConsole) -> None:
    olivia, _ = await console.signed_in("olivia")
    async with olivia.get("/chat") as r:
        html = await r.text()
    assert '<option value="acme" disabled>acme (no loop serves it)</option>' in html
    assert '<option value="globex" disabled>globex (no loop serves it)</option>' in html
    assert "No loop service answers for your profiles now" in html and not re.search(r"<option[^>]* selected", html)


async def test_the_page_shows_a_session_again(
    console: RunningConsole, console_db: Seeded, loop_service: LoopService
) -> None:
    """`/chat?session=ID`: the session's messages and tool calls, rendered by the server (a reload, Back), escaped;
    another person's session is not shown."""
    client, token = await console.signed_in("olivia")
    ws = await socket(console, client, token)
    done = (await turn(ws, {"text": "weather <b>here</b>?", "profile_id": "acme"}))[-1]
    await ws.close()
    session = done["session_id"]
    await fetch_value(
        console_db.dsn, "SELECT 1 FROM turns WHERE session_id = $1 AND status <> 'running'", uuid.UUID(session)
    )
    async with client.get(f"/chat?session={session}") as r:
        html = await r.text()
    assert r.status == 200
    assert '<div class="text">weather &lt;b&gt;here&lt;/b&gt;?</div>' in html
    assert "<strong>list_dir</strong>" in html and "&#34;path&#34;: &#34;.&#34;" in html
    assert '<div class="text">Bring an umbrella: 18°C and light rain.</div>' in html
    assert f'id="chat-session" size="38" value="{session}"' in html
    assert '<option value="acme" selected>acme</option>' in html
    # abel decides for acme only: globex's session is no session for him.
    abel, _ = await console.signed_in("abel")
    [globex_session] = console_db.sessions("globex")
    async with abel.get(f"/chat?session={globex_session}") as r:
        html = await r.text()
    assert f"No session {globex_session} that you may see: a new session starts here." in html
    assert 'id="chat-session" size="38" value=""' in html
    async with abel.get("/chat?session=nope") as r:
        assert r.status == 200 and "&#39;nope&#39; is not a session id" in await r.text()


async def test_a_second_socket_follows_the_running_turn_of_a_session(
    console: RunningConsole, console_db: Seeded, loop_service: LoopService
) -> None:
    """`{"follow": session}`: a page shown again while the session's turn waits gets the rest of that turn."""
    client, token = await console.signed_in("olivia")
    first = await socket(console, client, token)
    await first.send_str(json.dumps({"text": "wait for it", "profile_id": "acme"}))
    got: list[dict[str, Any]] = []
    while not any(m["type"] == "approval" for m in got):
        got.append(await first.receive_json(timeout=30))
    started = next(m for m in got if m["type"] == "started")
    approval = next(m for m in got if m["type"] == "approval")
    assert approval["call_id"] and approval["tool"] == "shell"
    session = started["session_id"]
    await fetch_value(console_db.dsn, "SELECT 1 FROM turns WHERE session_id = $1", uuid.UUID(session))

    second = await socket(console, client, token)
    await second.send_str(json.dumps({"follow": session}))
    following = await second.receive_json(timeout=30)
    assert following == {
        "type": "following",
        "profile_id": "acme",
        "session_id": session,
        "turn_id": started["turn_id"],
    }
    async with client.post(f"/api/approvals/{approval['approval_id']}/approve", headers={"X-CSRF-Token": token}) as r:
        assert r.status == 200, await r.text()
    rest: list[dict[str, Any]] = []
    while not rest or rest[-1]["type"] != "done":
        rest.append(await second.receive_json(timeout=30))
    kinds = [m["type"] for m in rest]
    assert kinds[0] == "approval_decided" and "tool_call" in kinds, kinds
    assert rest[0] == {
        "type": "approval_decided",
        "call_id": approval["call_id"],
        "status": "approved",
        "decided_by": "web:olivia",
    }
    assert "".join(m["text"] for m in rest if m["type"] == "delta" and m["kind"] == "text") == "waited"
    assert (rest[-1]["status"], rest[-1]["session_id"], rest[-1]["turn_id"]) == (
        "completed",
        session,
        started["turn_id"],
    )

    # Nothing runs any more: `done` at once, with the last turn's status; a bad id is refused.
    await fetch_value(
        console_db.dsn, "SELECT 1 FROM turns WHERE session_id = $1 AND status = 'completed'", uuid.UUID(session)
    )
    await second.send_str(json.dumps({"follow": session}))
    again = await second.receive_json(timeout=30)
    assert (again["type"], again["status"], again["session_id"]) == ("done", "completed", session)
    [bad] = await turn(second, {"follow": "nope"})
    assert bad["type"] == "error" and "'nope' is not a session id" in bad["error"]
    [unknown] = await turn(second, {"follow": str(uuid.uuid4())})
    assert unknown["code"] == 404
    await first.close()
    await second.close()
