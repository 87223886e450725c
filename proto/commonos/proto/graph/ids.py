"""Our ids: stable UUIDv5s minted from the identity of what they name."""

from __future__ import annotations

import hashlib
import uuid

import msgspec

# A fixed namespace for our ids; changing it would change every id ever minted.
_ID_NAMESPACE = uuid.UUID("6f1c3b52-2d1e-5a8e-9c57-0c0a7e5e3d10")
_ID_NAMESPACE_BYTES = _ID_NAMESPACE.bytes


def mint_id(kind: str, *parts: str) -> str:
    """Derive a stable id from the identity of the thing being named.

    The id is the RFC 4122 name-based UUIDv5 (SHA-1) of the JSON array ``[kind, *parts]``
    (compact msgspec encoding, UTF-8) under the fixed namespace
    ``6f1c3b52-2d1e-5a8e-9c57-0c0a7e5e3d10``, rendered in lowercase hyphenated form. A JSON array
    keeps the tuple unambiguous whatever characters the parts hold, and nothing depends on the
    machine, the process or the time, so re-reading a transcript that has grown gives its earlier
    records the same ids. ``kind`` separates the entity types' id spaces; ``parts`` must be the
    tuple that uniquely identifies the entity (for a stored row, its uniqueness constraint).
    """
    # uuid.uuid5 spelled out, without building a UUID object: an import mints ~100,000 ids.
    digest = bytearray(hashlib.sha1(_ID_NAMESPACE_BYTES + msgspec.json.encode([kind, *parts])).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = digest.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
