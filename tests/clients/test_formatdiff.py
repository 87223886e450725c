"""`python -m clients diff`: the format diff between two recordings names the types and keys that changed."""

from __future__ import annotations

import json
from pathlib import Path

from clients.formatdiff import diff


def write(folder: Path, records: list[dict[str, object]]) -> Path:
    path = folder / "plain" / "codex" / "sessions" / "rollout-x.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def test_diff_names_added_and_removed_types_and_keys(tmp_path: Path) -> None:
    old = write(
        tmp_path / "codex-1.0.0",
        [{"type": "event_msg", "payload": {"type": "token_count", "info": {"a": 1}}}, {"type": "gone", "x": 1}],
    )
    new = write(
        tmp_path / "codex-1.1.0",
        [{"type": "event_msg", "payload": {"type": "token_count", "info": {"b": 1}}}, {"type": "world_state"}],
    )
    text = diff(old, new)
    assert "+ type world_state" in text and "- type gone" in text
    assert "~ type event_msg/token_count" in text
    assert "+ payload.info.b" in text and "- payload.info.a" in text
    assert "no format changes" in diff(old, old)
