"""The exported JSON Schemas at the path their `$id` names: `/schemas/events/<type>/v1.json` and the rest of
proto/schema/, as `cos schema export` writes them (the same text), public and cacheable.

`ce-dataschema` names `https://commonos.dev/schemas/events/<type>/v1.json`; a deployment that wants that name
to resolve maps it to this console (a reverse proxy or DNS for `commonos.dev/schemas/`, or a registry tool's
URL rewrite to `<console>/schemas/`): the path stays the same, only the host differs (deploy/SUBSCRIBERS.md).
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Final

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from commonos.proto.schemas import schema_files

router = APIRouter(include_in_schema=False)

MEDIA_TYPE: Final = "application/schema+json"
#: A published version's schema changes only compatibly, and rarely: an hour, then revalidated by its ETag.
CACHE_CONTROL: Final = "public, max-age=3600"


def render(document: dict[str, object]) -> str:
    """A schema file's text, as `cos schema export` commits it."""
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


@functools.cache
def served() -> dict[str, tuple[bytes, str]]:
    """Every schema file's bytes and ETag, by its path under /schemas/."""
    out: dict[str, tuple[bytes, str]] = {}
    for path, document in schema_files().items():
        body = render(document).encode()
        out[path] = (body, '"' + hashlib.sha256(body).hexdigest()[:32] + '"')
    return out


@router.get("/schemas/{path:path}")
async def schema(path: str, request: Request) -> Response:
    found = served().get(path)
    if found is None:
        return JSONResponse({"detail": f"no schema at /schemas/{path}"}, status_code=404)
    body, etag = found
    headers = {"Cache-Control": CACHE_CONTROL, "ETag": etag, "Access-Control-Allow-Origin": "*"}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    return Response(body, media_type=MEDIA_TYPE, headers=headers)
