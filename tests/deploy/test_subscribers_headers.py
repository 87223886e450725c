"""deploy/SUBSCRIBERS.md's header table names every header an event may carry: the CloudEvents attributes
`event_headers` writes, and the W3C Trace Context headers the publisher adds inside a span (`traceparent`,
`tracestate`), which subscribers were not told of."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime

from commonos.proto.cloudevents import TRACEPARENT, TRACESTATE, event_headers
from commonos.proto.events import SessionCreated
from tests.conftest import REPO


def documented_headers() -> set[str]:
    text = (REPO / "deploy" / "SUBSCRIBERS.md").read_text(encoding="utf-8")
    table = text.split("| header | value |", 1)[1].split("\n\n", 1)[0]
    return set(re.findall(r"^\| `([^`]+)` \|", table, flags=re.MULTILINE))


def test_the_header_table_names_every_header_an_event_may_carry() -> None:
    event = SessionCreated(
        event_id=uuid.uuid4(),
        session_id=uuid.uuid4(),
        profile_id="default",
        source="cli",
        occurred_at=datetime.now(UTC),
    )
    written = set(event_headers(event, "urn:commonos:loop"))
    assert written | {TRACEPARENT, TRACESTATE, "Nats-Msg-Id"} <= documented_headers()
