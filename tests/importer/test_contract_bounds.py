"""An imported value outside the event contract's bounds is refused by the importer, with the reason.

Billing stores provider and model names of at most `MAX_NAME_CHARS` characters. The bound is part of
`model_call_completed` (`commonos.proto.events`), so the importer refuses such a session as not
imported, saying why, instead of publishing a call that billing could only dead-letter.
"""

from __future__ import annotations

from pathlib import Path

import nats

from commonos.proto.events import MAX_NAME_CHARS
from commonos.proto.subjects import DLQ_STREAM
from commonos.runtime.embedded import NatsServer
from tests.importer.pipeline import acos, wait_stored, writers
from tests.importer.test_not_imported import _add_session_with_a_huge_model_name
from tests.importer.transcripts import small_claude_home


async def test_a_model_name_over_the_bound_is_refused_by_the_importer(
    tmp_path: Path, small_nats_server: NatsServer, database_url: str
) -> None:
    home = small_claude_home(tmp_path, sessions=1)
    long_name = _add_session_with_a_huge_model_name(home, MAX_NAME_CHARS + 1)
    argv = ("import", "claude", str(home), "--format", "json", "--no-progress", "--jobs", "1", "--settle", "0")
    async with writers(small_nats_server.url, database_url):
        full = await acos(*argv, nats_url=small_nats_server.url)
        summary = full.json()
        good, bad = sorted(summary["sessions"], key=lambda s: s["vendor_session_id"] == long_name)
        assert bad["vendor_session_id"] == long_name
        assert bad["imported"] is False, "published: billing would dead-letter its call"
        assert "model_call_completed" in bad["not_imported"]
        assert f"length <= {MAX_NAME_CHARS} - at `$.model`" in bad["not_imported"]
        assert good["imported"] is True
        assert full.code == 1 and len(summary["errors"]) == 1 and bad["source_path"] in summary["errors"][0]
        await wait_stored(small_nats_server.url, database_url, good["invocations"])
    nc = await nats.connect(small_nats_server.url)
    try:
        info = await nc.jetstream().stream_info(DLQ_STREAM)
    finally:
        await nc.close()
    assert info.state.messages == 0
