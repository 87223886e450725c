"""The OpenAPI document declares how to call the JSON API: an API key as a bearer token, or the sign-in cookie, on
every operation that needs a sign-in; the committed proto/openapi/console.json is what a console serves."""

from __future__ import annotations

from typing import Any

from commonos.console.openapi import EXPORTED, document, render
from tests.console.conftest import REPO, RunningConsole

BOTH: list[dict[str, list[str]]] = [{"bearer": []}, {"cookie": []}]


def test_the_committed_document_is_the_console_s() -> None:
    committed = (REPO / EXPORTED).read_text(encoding="utf-8")
    assert committed == render(document()), f"{EXPORTED} differs from the console's routes: run `make schema`"


def check_security(doc: dict[str, Any]) -> None:
    schemes = doc["components"]["securitySchemes"]
    assert schemes["bearer"]["type"] == "http" and schemes["bearer"]["scheme"] == "bearer"
    assert schemes["bearer"]["bearerFormat"] == "cosk_…"
    assert "cos console key create" in schemes["bearer"]["description"]
    assert (schemes["cookie"]["type"], schemes["cookie"]["in"], schemes["cookie"]["name"]) == (
        "apiKey",
        "cookie",
        "cos_console",
    )
    paths = doc["paths"]
    for path, method in [
        ("/api/sessions", "get"),
        ("/api/sessions/{session_id}", "get"),
        ("/api/costs", "get"),
        ("/api/me", "get"),
        ("/api/approvals/{approval_id}/approve", "post"),
    ]:
        assert paths[path][method]["security"] == BOTH, (path, paths[path][method].get("security"))
    # Signing in needs nothing.
    assert "security" not in paths["/api/login"]["post"]
    # Every operation but the sign-in needs one of the two.
    unguarded = [
        f"{method.upper()} {path}"
        for path, operations in paths.items()
        for method, operation in operations.items()
        if operation.get("security") != BOTH
    ]
    assert unguarded == ["POST /api/login"]


def test_the_document_declares_the_api_key_and_the_cookie() -> None:
    check_security(document())


async def test_the_served_document_is_the_committed_one(console: RunningConsole) -> None:
    client = await console.client()
    async with client.get("/api/openapi.json") as r:
        assert r.status == 200
        served = await r.json()
    check_security(served)
    assert render(served) == render(document())
