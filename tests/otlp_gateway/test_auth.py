"""Bearer tokens: refused without one, with a wrong one and once revoked; `cos otlp token` create/list/revoke."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import aiohttp
import nats
from google.rpc import status_pb2  # type: ignore[import-untyped]
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from commonos.otlp_gateway.auth import (
    TOKENS_BUCKET,
    TokenIndex,
    bearer_token,
    list_tokens,
    revoke_token,
    token_digest,
    tokens_bucket,
)
from tests.conftest import REPO
from tests.otlp_gateway.conftest import Gateway, make_token, post

PB = "application/x-protobuf"
EMPTY = ExportTraceServiceRequest().SerializeToString()


def test_bearer_header_parsing_and_digest() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer   abc ") == "abc"
    assert bearer_token("Basic abc") is None
    assert bearer_token("Bearer") is None
    assert bearer_token(None) is None
    assert token_digest("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    index = TokenIndex()
    assert index.lookup("abc") is None


async def test_requests_without_a_valid_token_are_refused_and_counted(gateway: Gateway, nats_url: str) -> None:
    token = await make_token(nats_url, "acme", name="laptop")
    for sent, headers in (
        (None, {}),
        ("cos_otlp_wrong", {}),
        (None, {"Authorization": f"Basic {token}"}),
    ):
        answer = await post(gateway.url, "traces", EMPTY, token=sent, content_type=PB, headers=headers)
        assert answer.status == 401
        assert answer.headers["WWW-Authenticate"].startswith("Bearer realm=")
        assert "bearer token" in status_pb2.Status.FromString(answer.body).message
    assert gateway.metric("cos_otlp_refused_total", {"reason": "unauthenticated"}) == 3
    assert gateway.metric("cos_otlp_requests_total", {"signal": "traces", "encoding": "protobuf", "code": "401"}) == 3
    # The same on the service port's /metrics, beside /readyz.
    service = f"http://127.0.0.1:{gateway.running.http.port}"
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{service}/metrics") as r:
            assert 'cos_otlp_refused_total{reason="unauthenticated"} 3.0' in await r.text()
        async with s.get(f"{service}/readyz") as r:
            assert r.status == 200, await r.text()

    # Known within moments of its creation, refused within a second of its revocation.
    deadline = time.monotonic() + 5
    while (await post(gateway.url, "traces", EMPTY, token=token, content_type=PB)).status != 200:
        assert time.monotonic() < deadline, "the new token was not accepted within 5 s"
        await asyncio.sleep(0.05)
    nc = await nats.connect(nats_url)
    try:
        kv = await tokens_bucket(nc.jetstream())
        [listed] = await list_tokens(kv)
        assert (listed.profile_id, listed.name, listed.digest) == ("acme", "laptop", token_digest(token))
        await revoke_token(kv, "laptop")
    finally:
        await nc.close()
    revoked = time.monotonic()
    while (await post(gateway.url, "traces", EMPTY, token=token, content_type=PB)).status != 401:
        assert time.monotonic() - revoked < 1.0, "the revoked token was still accepted after 1 s"
        await asyncio.sleep(0.02)


def _cos(nats_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COS_")} | {
        "COS_NATS_URL": nats_url,
        "COS_DATA_DIR": "/nonexistent-cos-data",
    }
    return subprocess.run(
        [sys.executable, "-m", "commonos.cli.main", "otlp", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_cos_otlp_token_create_list_revoke(gateway: Gateway, nats_url: str) -> None:
    made = await asyncio.to_thread(_cos, nats_url, "token", "create", "--profile", "acme", "--name", "ci")
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert token.startswith("cos_otlp_") and len(token) > 40
    assert "shown once" in made.stderr and "OTEL_EXPORTER_OTLP_HEADERS" in made.stderr
    again = await asyncio.to_thread(_cos, nats_url, "token", "create", "--profile", "acme", "--name", "ci")
    assert again.returncode == 2 and "exists already" in again.stderr
    bad = await asyncio.to_thread(_cos, nats_url, "token", "create", "--profile", "Not A Profile!")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    pinned = await asyncio.to_thread(
        _cos,
        nats_url,
        "token",
        "create",
        "--profile",
        "acme",
        "--name",
        "pinned",
        "--tag",
        "client:acme",
        "--tag-keys",
        "project,team",
    )
    assert pinned.returncode == 0, pinned.stderr
    for wrong in (["--tag", "Client:acme"], ["--tag-keys", "Project"]):
        refused = await asyncio.to_thread(_cos, nats_url, "token", "create", "--profile", "acme", *wrong)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr

    listed = await asyncio.to_thread(_cos, nats_url, "token", "list", "--format", "json")
    assert listed.returncode == 0, listed.stderr
    row, pinned_row = json.loads(listed.stdout)
    assert (row["name"], row["profile_id"], row["tags"], row["tag_keys"]) == ("ci", "acme", [], None)
    assert (pinned_row["name"], pinned_row["tags"], pinned_row["tag_keys"]) == (
        "pinned",
        ["client:acme"],
        ["project", "team"],
    )
    assert token not in listed.stdout and token_digest(token) not in listed.stdout
    table = await asyncio.to_thread(_cos, nats_url, "token", "list")
    assert table.stdout.splitlines()[0].split() == [
        "name",
        "profile",
        "created_at",
        "sha256",
        "tags",
        "(senders",
        "may",
        "set)",
    ]
    assert table.stdout.splitlines()[2].split()[-2:] == ["client:acme", "(project,team)"]

    deadline = time.monotonic() + 5
    while (await post(gateway.url, "traces", EMPTY, token=token, content_type=PB)).status != 200:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    revoked = await asyncio.to_thread(_cos, nats_url, "token", "revoke", "ci")
    assert revoked.returncode == 0 and "revoked 'ci'" in revoked.stdout
    missing = await asyncio.to_thread(_cos, nats_url, "token", "revoke", "ci")
    assert missing.returncode == 2 and "no token named" in missing.stderr
    deadline = time.monotonic() + 1.0
    while (await post(gateway.url, "traces", EMPTY, token=token, content_type=PB)).status != 401:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)


async def test_the_watch_survives_a_nats_restart(gateway: Gateway, nats_server: object, nats_url: str) -> None:
    """Tokens made after NATS came back are known (the watch is started again after a reconnection)."""
    nats_server.stop()  # type: ignore[attr-defined]
    await asyncio.sleep(1.0)
    nats_server.start()  # type: ignore[attr-defined]
    token = await make_token(nats_url, "acme", name="after-restart")
    deadline = time.monotonic() + 15
    while (await post(gateway.url, "traces", EMPTY, token=token, content_type=PB)).status != 200:
        assert time.monotonic() < deadline, "a token made after NATS restarted was not accepted within 15 s"
        await asyncio.sleep(0.1)
    assert TOKENS_BUCKET == "COS_OTLP_TOKENS"
