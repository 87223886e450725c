"""The gateway's two ports against what a browser or a slow client can do: DNS rebinding (the Host header) and
sockets that never finish their headers or their body (slowloris)."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from commonos.otlp_gateway.server import allowed_hosts, host_of
from commonos.otlp_gateway.settings import GatewaySettings
from tests.otlp_gateway.conftest import Gateway, make_token, post, run_gateway
from tests.otlp_gateway.test_server import PB, spans


async def _get(url: str, host: str | None) -> int:
    headers = {"Host": host} if host is not None else {}
    async with aiohttp.ClientSession() as s, s.get(url, headers=headers) as r:
        return r.status


def _ports(gateway: Gateway) -> tuple[int, int]:
    return gateway.running.otlp.port, gateway.running.http.port


async def test_a_rebound_host_name_is_refused_on_both_ports(nats_url: str) -> None:
    """Issue #29 (8): `Host: rebind.evil.example` was served `/metrics`. A page whose name was rebound to
    127.0.0.1 reads what a loopback port answers; the gateway listening on loopback answers only its own
    names."""
    async with run_gateway(nats_url) as gateway:
        otlp, http = _ports(gateway)
        token = await make_token(nats_url)
        await asyncio.sleep(0.3)
        metrics = f"http://127.0.0.1:{http}/metrics"
        assert await _get(metrics, f"rebind.evil.example:{http}") == 421
        assert await _get(f"http://127.0.0.1:{http}/healthz", "rebind.evil.example") == 421
        for host in (f"127.0.0.1:{http}", f"localhost:{http}", "LOCALHOST.", f"[::1]:{http}"):
            assert await _get(metrics, host) == 200, host
        body = spans("a").SerializeToString()
        refused = await post(
            gateway.url, "traces", body, token=token, content_type=PB, headers={"Host": f"rebind.evil.example:{otlp}"}
        )
        assert refused.status == 421
        assert gateway.metric("cos_otlp_refused_total", {"reason": "host"}) == 1
        assert (await post(gateway.url, "traces", body, token=token, content_type=PB)).status == 200

    # Names of its own, configured (say the name a reverse proxy forwards), and anything on 0.0.0.0.
    async with run_gateway(nats_url, hosts=("otlp.example.com",)) as gateway:
        _, http = _ports(gateway)
        assert await _get(f"http://127.0.0.1:{http}/metrics", "otlp.example.com") == 200
        assert await _get(f"http://127.0.0.1:{http}/metrics", f"127.0.0.1:{http}") == 421


def test_the_hosts_a_listen_address_allows() -> None:
    assert allowed_hosts("127.0.0.1", None) == frozenset({"localhost", "127.0.0.1", "::1"})
    assert allowed_hosts("127.0.0.2", None) == frozenset({"localhost", "127.0.0.1", "::1", "127.0.0.2"})
    assert allowed_hosts("::1", None) == frozenset({"localhost", "127.0.0.1", "::1"})
    assert allowed_hosts("localhost", None) == frozenset({"localhost", "127.0.0.1", "::1"})
    for anywhere in ("0.0.0.0", "::", "", "10.0.0.5", "gateway.internal"):
        assert allowed_hosts(anywhere, None) is None, anywhere
    assert allowed_hosts("0.0.0.0", ("Otlp.Example.com", "*")) is None
    assert allowed_hosts("0.0.0.0", ("otlp.example.com",)) == frozenset({"otlp.example.com"})
    assert [host_of(h) for h in ("a.example:80", "[::1]:4318", "[::1]", "LocalHost.", "::1")] == [
        "a.example",
        "::1",
        "::1",
        "localhost",
        "::1",
    ]
    settings = GatewaySettings.from_env({"COS_OTLP_HOSTS": " otlp.example.com , other.example "})
    assert settings.hosts == ("otlp.example.com", "other.example")
    assert GatewaySettings.from_env({}).hosts is None


Socket = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def _slow_sockets(port: int, count: int, request: bytes) -> list[Socket]:
    out = []
    for _ in range(count):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        await writer.drain()
        out.append((reader, writer))
    return out


async def _closed_within(socket: Socket, seconds: float) -> float | None:
    """How long the server took to close `socket` while a header line trickles in every 0.25 s; None: not closed."""
    reader, writer = socket
    started = time.monotonic()
    try:
        while time.monotonic() - started < seconds:
            try:
                data = await asyncio.wait_for(reader.read(4096), 0.25)
            except TimeoutError:
                writer.write(b"X-Slow: 1\r\n")  # the next header, never the end of them
                await writer.drain()
                continue
            if not data or b"408" in data.split(b"\r\n", 1)[0]:
                return time.monotonic() - started
        return None
    except (ConnectionError, OSError):
        return time.monotonic() - started
    finally:
        writer.close()


@pytest.mark.parametrize("which", ["otlp", "http"])
async def test_slow_header_sockets_are_closed_and_requests_still_served(nats_url: str, which: str) -> None:
    """Issue #29 (8): 800 slow-header sockets were held 70 s, none closed. Each port now closes a connection
    that has not sent a request's headers within COS_OTLP_HEADER_TIMEOUT_S, and a body that has not arrived
    within COS_OTLP_BODY_TIMEOUT_S; requests meanwhile are served."""
    async with run_gateway(nats_url, header_timeout_s=1.0, body_timeout_s=1.0) as gateway:
        otlp, http = _ports(gateway)
        port = otlp if which == "otlp" else http
        token = await make_token(nats_url)
        await asyncio.sleep(0.3)
        path = b"/v1/traces" if which == "otlp" else b"/metrics"
        headers = await _slow_sockets(port, 100, b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        line = await _slow_sockets(port, 20, b"POST " + path[:3])
        body = await _slow_sockets(
            otlp,
            20 if which == "otlp" else 0,
            b"POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-protobuf\r\n"
            b"Authorization: Bearer " + token.encode() + b"\r\nContent-Length: 1000\r\n\r\n\x0a",
        )
        # Served meanwhile.
        assert (
            await post(gateway.url, "traces", spans("a").SerializeToString(), token=token, content_type=PB)
        ).status == 200
        assert await _get(f"http://127.0.0.1:{http}/healthz", None) == 200
        closed = await asyncio.gather(*(_closed_within(s, 8.0) for s in [*headers, *line, *body]))
        assert all(c is not None for c in closed), sum(c is None for c in closed)
        assert max(c for c in closed if c is not None) < 4.0, max(c for c in closed if c is not None)
