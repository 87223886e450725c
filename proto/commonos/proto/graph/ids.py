"""Our ids: stable UUIDv5s minted from the identity of what they name."""

from __future__ import annotations

import hashlib
import uuid

import msgspec

from commonos.proto.ids import GATEWAY_NAMESPACE, GRAPH_NAMESPACE, IMPORT_NAMESPACE, name_id

_ID_NAMESPACE_BYTES = GRAPH_NAMESPACE.bytes


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
    h = _digest(kind, parts).hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def mint_uuid(kind: str, *parts: str) -> uuid.UUID:
    """`mint_id` as a UUID (without formatting and parsing its text)."""
    return uuid.UUID(bytes=bytes(_digest(kind, parts)))


def _digest(kind: str, parts: tuple[str, ...]) -> bytearray:
    digest = bytearray(hashlib.sha1(_ID_NAMESPACE_BYTES + msgspec.json.encode([kind, *parts])).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # RFC 4122 variant
    return digest


# --- whose vendor ids --------------------------------------------------------------------------


def vendor_scope(vendor: str, profile_id: str) -> str:
    """The vendor part of the ids minted from a vendor's own identifiers for `profile_id`'s records.

    A vendor's session and request ids are chosen by its clients, so two profiles can send the same ones; an
    id minted from them alone would let one profile's records pre-empt (or be dead-lettered against) the
    other's. The profile is therefore part of every such id: ``<vendor>@<profile>`` (neither a vendor name
    nor a profile id holds ``@``), except for the vendor's own default profile (``claude-code``,
    ``codex``: the one ``cos import`` uses without ``--profile``), whose ids stay ``<vendor>`` as they were
    minted before profiles were part of them, so that nothing already stored is counted again. The
    importer and the OTLP gateway both mint with it: one profile's import and telemetry of the same
    session agree, two profiles' never meet.
    """
    return vendor if profile_id == vendor else f"{vendor}@{profile_id}"


def vendor_session_id(vendor: str, profile_id: str, session_key: str) -> str:
    """Our id of a vendor's top-level session (Claude Code's ``session.id``, Codex's conversation) as
    `profile_id`'s: the importer's root session of its transcript and the OTLP gateway's session of its
    telemetry."""
    return mint_id("session", vendor_scope(vendor, profile_id), session_key)


def vendor_turn_id(vendor: str, session_key: str, turn_key: str) -> uuid.UUID:
    """Our id of a vendor session's turn: the OTLP gateway's turn of it, and the turn the importer gives the
    calls of the same prompt (`vendor` is `vendor_scope`'s).

    Claude Code names each prompt (``prompt.id`` in its telemetry, ``promptId`` on its transcript's lines),
    so both sources mint the same turn for one prompt: UUIDv5 under the gateway's namespace of
    ``["turn", vendor, session_key, turn_key]``, the gateway's turn ids since its first release.
    """
    return name_id(GATEWAY_NAMESPACE, "turn", vendor, session_key, turn_key)


# --- event ids of model calls ---------------------------------------------------------------------
# Shared by the importer and the OTLP gateway, so that a call reaching us both ways is one event (under
# `IMPORT_NAMESPACE`: a call imported or received again is not billed again).


def _call_event_id(*parts: str) -> uuid.UUID:
    return name_id(IMPORT_NAMESPACE, *parts)


def model_call_event_id(invocation_id: str) -> uuid.UUID:
    """The id of the ``model_call_completed`` of one model invocation (our id of it, `mint_id`).

    UUIDv5, under the namespace ``2b7c4e0a-5d3f-5c61-9f2e-8a1d7b6c9e40``, of the JSON array
    ``["model_call_completed", invocation_id]``: the importer's ids since its first release.
    """
    return _call_event_id("model_call_completed", invocation_id)


def request_call_event_id(vendor: str, request_id: str) -> uuid.UUID:
    """The id of the ``model_call_completed`` of the API request a vendor names `request_id`.

    Claude Code names each API request (``req_…``) in its transcript lines (``requestId``) and in its
    OpenTelemetry ``api_request`` events (``request_id``), so the importer and the OTLP gateway mint
    the same id for one call: UUIDv5 (same namespace as `model_call_event_id`) of
    ``["model_call_completed", "request", vendor, request_id]``.
    """
    return _call_event_id("model_call_completed", "request", vendor, request_id)


def usage_call_event_id(
    vendor: str, session_key: str, usage: tuple[int, int, int, int], occurrence: int = 0
) -> uuid.UUID:
    """The id of the ``model_call_completed`` of a call known by its usage alone (Codex).

    Codex's telemetry names neither a call nor its place; what a ``response.completed`` record and the
    rollout's usage record both carry is the call's conversation and its tokens. `usage` is the call's
    ``(input, output, cache_read, cache_write)`` in our disjoint buckets, and `occurrence` how many calls of
    the session with the very same usage came before it (0 but for a repeat): UUIDv5 (same namespace as
    `model_call_event_id`) of ``["model_call_completed", "usage", vendor, session_key, "i/o/r/w",
    occurrence]``. Nothing in it depends on the order in which the calls are read, so the gateway's
    replicas and retries and the importer name each call alike.
    """
    tokens = "/".join(str(n) for n in usage)
    return _call_event_id("model_call_completed", "usage", vendor, session_key, tokens, str(occurrence))
