"""The Memory plugin's projection from `memory_changed` events (its tables are declared by the journal-writer,
`commonos.journal_writer.memory`, which stores them).

`memory_rows(event)` is
pure: it turns one event into the statements that apply it, for the journal-writer to run in its own
transaction. They are idempotent — each is guarded by the event id recorded in
`memory_changes_applied` — so a redelivered event changes nothing, and they keep positions exactly as
`commonos.loop.session_state.apply_memory_op` does (add inserts and shifts the rest down, past the end
appends; replace and remove need an existing position; remove closes the gap).

Changes of one profile must be applied in stream order (they come from any session of the profile).
"""

from __future__ import annotations

import uuid
from typing import Any, Final, NamedTuple

from commonos.proto.events import Event, MemoryChanged, MemoryOp
from commonos.proto.text import escape_nul


class Statement(NamedTuple):
    sql: str
    args: tuple[Any, ...]


_NOT_APPLIED: Final = "NOT EXISTS (SELECT 1 FROM memory_changes_applied WHERE event_id = $1)"

_SHIFT_DOWN: Final = f"""
UPDATE memory_entries SET position = position + 1
WHERE profile_id = $2 AND target = $3 AND position >= $4 AND {_NOT_APPLIED}
"""
_INSERT: Final = f"""
INSERT INTO memory_entries (profile_id, target, position, content, updated_at, event_id)
SELECT $2::text, $3::text,
       LEAST($4::integer, (SELECT count(*) FROM memory_entries WHERE profile_id = $2 AND target = $3)),
       $5::text, $6::timestamptz, $1::uuid
WHERE {_NOT_APPLIED}
"""
_REPLACE: Final = f"""
UPDATE memory_entries SET content = $5, updated_at = $6, event_id = $1
WHERE profile_id = $2 AND target = $3 AND position = $4 AND {_NOT_APPLIED}
"""
_DELETE: Final = f"""
DELETE FROM memory_entries
WHERE profile_id = $2 AND target = $3 AND position = $4 AND {_NOT_APPLIED}
"""
_CLOSE_GAP: Final = f"""
UPDATE memory_entries SET position = position - 1
WHERE profile_id = $2 AND target = $3 AND position > $4
  AND NOT EXISTS (SELECT 1 FROM memory_entries WHERE profile_id = $2 AND target = $3 AND position = $4)
  AND {_NOT_APPLIED}
"""
_MARK: Final = """
INSERT INTO memory_changes_applied (event_id, profile_id) VALUES ($1, $2) ON CONFLICT (event_id) DO NOTHING
"""
#: A profile's deletion: its entries, and the record of the changes applied to them.
_DELETE_PROFILE: Final = (
    "DELETE FROM memory_entries WHERE profile_id = $1",
    "DELETE FROM memory_changes_applied WHERE profile_id = $1",
)


def profile_deleted_rows(profile_id: str) -> list[Statement]:
    """The statements that delete a profile's memory (`profile_deleted`), in order."""
    return [Statement(sql, (profile_id,)) for sql in _DELETE_PROFILE]


def memory_rows(event: Event) -> list[Statement]:
    """The statements that apply `event` to `memory_entries`, in order; none for other event types.

    Run them in order inside one transaction (`await conn.execute(s.sql, *s.args)`).
    """
    if not isinstance(event, MemoryChanged):
        return []
    e: uuid.UUID = event.event_id
    where = (e, event.profile_id, event.target.value, event.position)
    content = escape_nul(event.content or "")  # stored as text PostgreSQL can hold (commonos.proto.text)
    mark = Statement(_MARK, (e, event.profile_id))
    match event.op:
        case MemoryOp.ADD:
            return [
                Statement(_SHIFT_DOWN, where),
                Statement(_INSERT, (*where, content, event.occurred_at)),
                mark,
            ]
        case MemoryOp.REPLACE:
            return [Statement(_REPLACE, (*where, content, event.occurred_at)), mark]
        case MemoryOp.REMOVE:
            return [Statement(_DELETE, where), Statement(_CLOSE_GAP, where), mark]
