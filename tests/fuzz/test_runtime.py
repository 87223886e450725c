"""Fuzz targets of the runtime's edges: one delivery as the consumer sees it, its projection, the environment."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from nats.aio.msg import Msg

from commonos.journal_writer.projection import InvariantViolation, check_event, plan_events, profiles_mentioned
from commonos.proto.subjects import subject_for
from commonos.runtime.consumer import decode_delivery
from commonos.runtime.settings import ConfigError, Settings
from tests.fuzz import strategies as fz


def message(delivery: fz.RawDelivery) -> Msg:
    """The message object the consumer is handed (no client: decoding never acks)."""
    return Msg(_client=None, subject=delivery.subject, data=delivery.data, headers=delivery.headers)  # type: ignore[arg-type]


@given(fz.deliveries(), st.integers(1, 2**63))
def test_decode_delivery_turns_every_delivery_into_an_event_or_a_reason(delivery: fz.RawDelivery, seq: int) -> None:
    d = decode_delivery(message(delivery), seq)
    assert d.stream_seq == seq
    assert (d.event is None) != (d.error is None), "exactly one of an event and a reason"
    if d.error is not None:
        assert d.error.strip(), "a dead letter's reason is never empty"
        event(f"dead letter: {d.error.split(':', 1)[0]}")
        return
    event("event")
    assert d.event is not None
    assert subject_for(d.event) == delivery.subject
    if delivery.headers and (ce_id := delivery.headers.get("ce-id")) is not None:
        assert ce_id.replace("%2D", "-").replace("%2d", "-").lower() == str(d.event.event_id)


@given(fz.deliveries())
def test_an_accepted_delivery_is_checked_and_planned_without_surprises(delivery: fz.RawDelivery) -> None:
    """What the journal-writer does next with an event: check its invariants, then plan its rows."""
    decoded = decode_delivery(message(delivery), 1).event
    if decoded is None:
        return
    try:
        check_event(decoded)
    except InvariantViolation as exc:
        assert str(exc)
        event("invariant violated")
        return
    event("planned")
    plan = plan_events([decoded])
    assert plan.events == 1
    profiles_mentioned([decoded])


@pytest.fixture(scope="module")
def secret_files() -> Iterator[list[str]]:
    """Files `COS_NATS_PASSWORD_FILE` may name: readable, empty, not UTF-8, a folder, missing."""
    with tempfile.TemporaryDirectory(prefix="cos-fuzz-env-") as tmp:
        root = Path(tmp)
        (root / "secret").write_text("s3cret\n")
        (root / "empty").write_bytes(b"")
        (root / "latin1").write_bytes(b"caf\xe9")
        (root / "dir").mkdir()
        names = ["secret", "empty", "latin1", "dir", "missing", ""]
        yield [str(root / n) if n else "" for n in names]


@given(data=st.data())
def test_settings_from_env_returns_settings_or_raises_a_one_line_config_error(
    secret_files: list[str], data: st.DataObject
) -> None:
    env = data.draw(fz.environments(secret_files))
    try:
        settings = Settings.from_env(env)
    except ConfigError as exc:
        assert len(str(exc).splitlines()) == 1, "the message is one line"
        event("ConfigError")
        return
    event("settings")
    assert 1 <= settings.partitions <= 1024
    assert settings.partition is None or 0 <= settings.partition < settings.partitions
    assert 0 <= settings.http_port <= 65535
