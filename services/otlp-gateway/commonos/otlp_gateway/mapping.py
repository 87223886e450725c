"""OTLP requests -> our events: what every source module shares, and the dispatch (pure: no I/O).

One module per source maps its records: :mod:`~commonos.otlp_gateway.genai` (spans following the
OpenTelemetry GenAI semantic conventions), :mod:`~commonos.otlp_gateway.claude_code` (Claude Code's log
events) and :mod:`~commonos.otlp_gateway.codex` (Codex's log events). Metrics are never mapped to
events: the log events and spans carry the same usage, and billing both would count it twice.

Every event id is deterministic (derived from the source's own identifiers), so an exporter's retry of
a request publishes the same ids again, and JetStream and the consumers drop them as duplicates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from commonos.proto.events import EventBase


@dataclass(frozen=True)
class Source:
    """Who sent a request: the profile its bearer token belongs to, and how resource attributes become tags."""

    profile_id: str
    #: Bare resource attribute keys mapped to tags (`client=acme` -> `client:acme`); `cos.tag.<key>` always maps.
    tag_attributes: tuple[str, ...] = ("client", "project", "team")


@dataclass
class Mapped:
    """The events of one request, in publishing order, and the records refused (with why)."""

    events: list[EventBase] = field(default_factory=list)
    #: Records (spans or log records) refused: the OTLP partial-success `rejected_*` count.
    rejected: int = 0
    #: Why records were refused, one line each (the partial-success `error_message` joins them).
    errors: list[str] = field(default_factory=list)
    #: Records accepted that map to no event (a source's other log events, spans of no GenAI operation).
    ignored: int = 0

    def reject(self, reason: str, records: int = 1) -> None:
        self.rejected += records
        if reason not in self.errors:
            self.errors.append(reason)

    def extend(self, other: Mapped) -> None:
        self.events.extend(other.events)
        self.rejected += other.rejected
        self.ignored += other.ignored
        for reason in other.errors:
            if reason not in self.errors:
                self.errors.append(reason)


class CallOrdinals(Protocol):
    """Where a source without call ids (Codex) keeps each session's calls in order, across requests.

    ``ordinal`` returns the 0-based place of the call `fingerprint` identifies among the session's calls:
    the same fingerprint always gets the same ordinal (an exporter's retry), a new one the next.
    """

    async def ordinal(self, vendor: str, session_key: str, fingerprint: str) -> int: ...


class MemoryOrdinals:
    """`CallOrdinals` in memory (tests, and replaying recorded payloads)."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], dict[str, int]] = {}

    async def ordinal(self, vendor: str, session_key: str, fingerprint: str) -> int:
        seen = self._seen.setdefault((vendor, session_key), {})
        return seen.setdefault(fingerprint, len(seen))
