"""The console serves every exported schema file at the path of its `$id` (what `ce-dataschema` names), with no
sign-in, as JSON Schema, cacheable, byte for byte the file of proto/schema/."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

from tests.console.conftest import StartConsole

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "proto" / "schema"


async def test_every_exported_schema_is_served_at_its_id_path(start_console: StartConsole) -> None:
    console = await start_console()
    files = sorted(SCHEMA_DIR.rglob("*.json"))
    assert len(files) > 20
    async with aiohttp.ClientSession(console.url) as anonymous:  # no cookie: not signed in
        for file in files:
            text = file.read_bytes()
            path = urlsplit(json.loads(text)["$id"]).path
            assert path == "/schemas/" + file.relative_to(SCHEMA_DIR).as_posix()
            async with anonymous.get(path, allow_redirects=False) as r:
                assert r.status == 200, (path, r.status)
                assert r.headers["Content-Type"] == "application/schema+json"
                assert r.headers["Cache-Control"] == "public, max-age=3600"
                assert await r.read() == text, path
                etag = r.headers["ETag"]
            async with anonymous.get(path, headers={"If-None-Match": etag}) as r:
                assert r.status == 304
        async with anonymous.get("/schemas/events/nothing/v1.json") as r:
            assert (r.status, (await r.json())["detail"]) == (404, "no schema at /schemas/events/nothing/v1.json")
