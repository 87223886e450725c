"""Message sizes as nats-server counts them: the headers and the body together, against `max_payload`.

nats-py checks only the body against the server's `max_payload` before it sends a message. The
server counts the header block too, and answers a message over the limit by closing the connection
(`-ERR 'Maximum Payload Violation'`), after which nats-py does not reconnect. Every producer
therefore sizes what it publishes here first, counting the headers it and JetStream will send, and
refuses an event that cannot fit before anything of it is published.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Protocol

from commonos.proto.errors import DataError

#: nats-server's default (and recommended) max_payload.
DEFAULT_MAX_PAYLOAD: Final = 1024 * 1024
#: The most nats-server accepts as max_payload.
MAX_MAX_PAYLOAD: Final = 64 * 1024 * 1024
#: `NATS/1.0\r\n` opening the header block and the `\r\n` closing it.
_HEADER_FRAME: Final = len(b"NATS/1.0\r\n") + len(b"\r\n")
#: The header nats-py's `js.publish(..., stream=...)` adds to every message.
EXPECTED_STREAM: Final = "Nats-Expected-Stream"


class MessageTooLarge(DataError):
    """A message that would exceed the server's max_payload; the message says what, how big, and what to change."""

    def __init__(self, what: str, size: int, limit: int, hint: str = "") -> None:
        self.what = what
        self.size = size
        self.limit = limit
        text = f"{what} is {size} bytes with its headers, over the NATS server's max_payload of {limit} bytes"
        super().__init__(f"{text}; {hint}" if hint else text)


class HasMaxPayload(Protocol):
    @property
    def max_payload(self) -> int: ...


def header_bytes(headers: Mapping[str, str] | None) -> int:
    """Bytes of the header block nats-py builds for `headers` (0 without headers)."""
    if headers is None:
        return 0
    size = _HEADER_FRAME
    for key, value in headers.items():
        name = key.strip()
        if not name:
            continue
        # nats-py writes CR and LF in a value as spaces: one byte for one, so the size is the value's own.
        text = value.strip()
        size += (len(name) if name.isascii() else len(name.encode())) + 2
        size += (len(text) if text.isascii() else len(text.encode())) + 2
    return size


def message_bytes(payload: bytes, headers: Mapping[str, str] | None) -> int:
    """What the server counts against max_payload for one message."""
    return len(payload) + header_bytes(headers)


def with_stream_header(headers: Mapping[str, str] | None, stream: str) -> dict[str, str]:
    """The headers `js.publish(..., stream=stream)` actually sends."""
    out = dict(headers or {})
    out[EXPECTED_STREAM] = stream
    return out


def check_fits(what: str, payload: bytes, headers: Mapping[str, str] | None, limit: int, hint: str = "") -> int:
    """The message's size; raises MessageTooLarge when it is over `limit`."""
    size = message_bytes(payload, headers)
    if size > limit:
        raise MessageTooLarge(what, size, limit, hint)
    return size


def server_max_payload(nc: HasMaxPayload | None) -> int:
    """The connected server's max_payload (from its INFO), or the default before a connection."""
    value = getattr(nc, "max_payload", None) if nc is not None else None
    return int(value) if isinstance(value, int) and value > 0 else DEFAULT_MAX_PAYLOAD
