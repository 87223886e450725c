"""OTLP/HTTP bodies <-> the official `opentelemetry-proto` messages (pure: no I/O).

Protobuf bodies are parsed as they are. JSON bodies follow the OTLP JSON mapping
(https://opentelemetry.io/docs/specs/otlp/#json-protobuf-encoding), which differs from protobuf's canonical
JSON in one way that matters: `traceId`, `spanId` and `parentSpanId` are hex strings, not base64. Enum
values may be names or integers, 64-bit integers strings or numbers, field names lowerCamelCase (the
protobuf names are accepted too), and unknown fields are ignored (a newer client's additions).
"""

from __future__ import annotations

import base64
import binascii
import json
import zlib
from typing import Any, Final, TypeVar

from google.protobuf import json_format  # type: ignore[import-untyped]
from google.protobuf.message import DecodeError, Message  # type: ignore[import-untyped]
from google.rpc import status_pb2  # type: ignore[import-untyped]

from commonos.proto.errors import DataError

PROTOBUF: Final = "application/x-protobuf"
JSON: Final = "application/json"

#: The fields holding trace and span ids, in OTLP JSON (lowerCamelCase) and protobuf (snake_case) names.
_ID_FIELDS: Final = frozenset({"traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"})

M = TypeVar("M", bound=Message)


class BadRequest(DataError):
    """The body cannot be read (400)."""


class TooLarge(DataError):
    """The body is over the limit, compressed or not (413)."""


class UnsupportedMediaType(DataError):
    """Neither protobuf nor JSON, or an encoding other than gzip (415)."""


def encoding_of(content_type: str | None) -> str:
    """`protobuf` or `json` for a Content-Type (parameters such as charset ignored); else UnsupportedMediaType."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media == PROTOBUF:
        return "protobuf"
    if media == JSON:
        return "json"
    raise UnsupportedMediaType(
        f"Content-Type {media or '(none)'!r} is not supported: send {PROTOBUF} or {JSON} (OTLP/HTTP)"
    )


#: How much of a gzip body is handed to zlib at a time (`gunzip`).
_GZIP_SLICE: Final = 64 * 1024


def gunzip(body: bytes, limit: int) -> bytes:
    """The gzip-compressed `body` inflated, never more than `limit` bytes of it (a gzip bomb stops there).

    A gzip body may be several members one after the other (RFC 1952 2.2; ``cat a.gz b.gz``): each is
    inflated in turn, the limit holding for all of them together. Bytes after a member that do not make a
    whole gzip member refuse the body: no request is answered 200 with data left unread. The body is fed
    in slices of `_GZIP_SLICE`, so what zlib hands back after a member's end is at most one slice, never
    a copy of the whole rest (which made a body of many small members quadratic).
    """
    out = bytearray()
    view = memoryview(body)
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    pending: bytes | memoryview = b""
    offset = 0
    while True:
        if not pending:
            if offset >= len(view):
                break
            pending = view[offset : offset + _GZIP_SLICE]
            offset += len(pending)
        try:
            # max_length 0 would mean no limit: at least 1 is asked for (`out` never exceeds `limit` here).
            out += inflater.decompress(pending, limit + 1 - len(out))
        except zlib.error as exc:
            raise BadRequest(f"the gzip body cannot be inflated: {exc}") from None
        if len(out) > limit or inflater.unconsumed_tail:
            raise TooLarge(f"the body inflates to more than {limit} bytes")
        pending = b""
        if inflater.eof:
            pending = inflater.unused_data
            if not pending and offset >= len(view):
                return bytes(out)
            inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    raise BadRequest("the gzip body is truncated")


def decode_body(body: bytes, content_encoding: str | None, limit: int) -> bytes:
    encoding = (content_encoding or "identity").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding in ("gzip", "x-gzip"):
        return gunzip(body, limit)
    raise UnsupportedMediaType(f"Content-Encoding {encoding!r} is not supported: send gzip or no encoding")


def _hex_to_base64(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return base64.b64encode(bytes.fromhex(value)).decode("ascii")
    except ValueError:
        raise BadRequest(f"{value!r} is not a hex trace or span id") from None


def _ids_as_base64(node: Any) -> Any:
    """A copy of parsed OTLP JSON with every trace/span id turned from hex into protobuf JSON's base64."""
    if isinstance(node, dict):
        return {k: _hex_to_base64(v) if k in _ID_FIELDS else _ids_as_base64(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_ids_as_base64(v) for v in node]
    return node


def parse_request(message: M, data: bytes, encoding: str) -> M:
    """Fill `message` (an Export*ServiceRequest) from `data`; BadRequest when it cannot be read."""
    if encoding == "protobuf":
        try:
            message.ParseFromString(data)
        except (DecodeError, ValueError, RecursionError) as exc:
            raise BadRequest(f"the protobuf body cannot be decoded: {exc}") from None
        return message
    try:
        parsed = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"the JSON body cannot be decoded: {exc}") from None
    if not isinstance(parsed, dict):
        raise BadRequest("the JSON body is not an object")
    try:
        json_format.ParseDict(_ids_as_base64(parsed), message, ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError, TypeError, RecursionError, binascii.Error) as exc:
        raise BadRequest(f"the JSON body is not an OTLP request: {exc}") from None
    return message


def encode_message(message: Message, encoding: str) -> tuple[bytes, str]:
    """Body and Content-Type of a response in the request's encoding."""
    if encoding == "json":
        text = json_format.MessageToJson(message, indent=None)
        return text.encode("utf-8"), JSON
    return message.SerializeToString(), PROTOBUF


def status_body(code: int, text: str, encoding: str) -> tuple[bytes, str]:
    """A google.rpc.Status (what OTLP/HTTP error responses carry) with a gRPC `code` and a message."""
    return encode_message(status_pb2.Status(code=code, message=text), encoding)
