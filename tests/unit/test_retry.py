"""The shared backoff, the stop-aware sleep, the message headers and the CLI's settings helper."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from commonos.proto.cloudevents import decode_headers, message_headers
from commonos.runtime.args import CliError
from commonos.runtime.cli_support import cli_settings
from commonos.runtime.retry import Backoff, sleep_or_stop
from commonos.runtime.settings import Settings


def test_backoff_doubles_up_to_its_ceiling_and_resets() -> None:
    backoff = Backoff(0.1, 0.5)
    assert [backoff.next() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    assert backoff.current == 0.5
    backoff.reset()
    assert backoff.next() == 0.1
    assert [Backoff(1.0, 10.0, factor=3).next() for _ in range(2)] == [1.0, 1.0]


@pytest.mark.parametrize(("initial", "maximum", "factor"), [(0, 1, 2), (2, 1, 2), (1, 2, 0.5)])
def test_a_backoff_that_cannot_work_is_refused(initial: float, maximum: float, factor: float) -> None:
    with pytest.raises(ValueError):
        Backoff(initial, maximum, factor)


async def test_sleep_or_stop_sleeps_or_returns_at_the_stop() -> None:
    stop = asyncio.Event()
    started = time.monotonic()
    assert await sleep_or_stop(stop, 0.05) is False
    assert time.monotonic() - started >= 0.04
    asyncio.get_running_loop().call_later(0.05, stop.set)
    started = time.monotonic()
    assert await sleep_or_stop(stop, 30) is True
    assert time.monotonic() - started < 5
    assert await sleep_or_stop(stop, 30) is True


def test_message_headers_are_cloudevents_headers_percent_encoded() -> None:
    alert_id = uuid.uuid4()
    at = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    schema = "https://commonos.dev/schemas/alerts/budget_exceeded/v1.json"
    headers = message_headers(
        id=str(alert_id), type="cos.budget_exceeded.v1", source="urn:x", time=at, subject="café", dataschema=schema
    )
    assert list(headers) == [
        "ce-specversion",
        "ce-id",
        "ce-source",
        "ce-type",
        "ce-time",
        "ce-subject",
        "ce-datacontenttype",
        "ce-dataschema",
        "content-type",
        "Nats-Msg-Id",
    ]
    assert headers["ce-time"] == "2026-11-30T12:00:00Z"
    assert headers["ce-subject"] == "caf%C3%A9"
    assert headers["ce-datacontenttype"] == headers["content-type"] == "application/json"
    assert headers["ce-dataschema"] == schema
    # JetStream deduplicates by the CloudEvents id.
    assert headers["Nats-Msg-Id"] == headers["ce-id"] == str(alert_id)
    assert decode_headers(headers)["subject"] == "café"
    # A time is written as given.
    later = at.astimezone(timezone(timedelta(hours=2)))
    plain = message_headers(id="i", type="t", source="s", time=later, subject="x", dataschema=schema)
    assert plain["Nats-Msg-Id"] == "i" and plain["ce-time"] == "2026-11-30T14:00:00+02:00"


def test_cli_settings_take_what_is_configured_and_else_the_running_system(tmp_path: Path) -> None:
    both = Settings(nats_url="nats://n:4222", database_url="postgresql://d/x", data_dir=tmp_path)
    assert cli_settings(both) == both
    only_nats = Settings(nats_url="nats://n:4222", data_dir=tmp_path)
    assert cli_settings(only_nats, database=False) == only_nats
    with pytest.raises(CliError, match="no system to talk to"):
        cli_settings(only_nats)
    with pytest.raises(CliError, match="no system to talk to"):
        cli_settings(Settings(data_dir=tmp_path), nats=False)
