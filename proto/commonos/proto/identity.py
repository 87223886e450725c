"""Who is running and where: `TurnInfo` and `NewSession` (seed: Turns, Sessions and Tags)."""

from __future__ import annotations

import uuid
from typing import Final

import msgspec

from commonos.proto.ids import new_id
from commonos.proto.tags import check_profile_id, parse_tags

#: Where a chat request may say it comes from (`service` when it says nothing).
REQUEST_SOURCES: Final = ("web", "cli", "service")
#: The source of a session made by delegation (`delegate`), and only by it.
SUBAGENT_SOURCE: Final = "subagent"

MAX_TITLE_CHARS = 60
#: A title given with a new session (a delegated child's goal) is kept whole up to this many characters.
MAX_GIVEN_TITLE_CHARS = 1000


class TurnInfo(msgspec.Struct, frozen=True, kw_only=True):
    """Identity of one turn, handed to every hook, tool and journal call."""

    profile_id: str
    session_id: uuid.UUID
    turn_id: uuid.UUID
    #: Set for a child (delegated) turn.
    parent_turn_id: uuid.UUID | None = None
    #: Resolved tags; a child copies its parent's.
    tags: tuple[str, ...] = ()
    #: 0 for a top-level turn, 1 for a child.
    depth: int = 0

    def __post_init__(self) -> None:
        check_profile_id(self.profile_id)
        parse_tags(self.tags)
        if self.depth < 0:
            raise ValueError(f"depth must be >= 0, got {self.depth}")

    def child(self, session_id: uuid.UUID | None = None) -> TurnInfo:
        """Identity of a delegated turn: same profile and tags, a new session, one level deeper."""
        return TurnInfo(
            profile_id=self.profile_id,
            session_id=session_id if session_id is not None else new_id(),
            turn_id=new_id(),
            parent_turn_id=self.turn_id,
            tags=self.tags,
            depth=self.depth + 1,
        )


class NewSession(msgspec.Struct, frozen=True, kw_only=True):
    profile_id: str
    #: Where it came from: one of `REQUEST_SOURCES`, or `subagent` (delegation).
    source: str
    title: str | None = None
    tags: tuple[str, ...] = ()
    parent_session_id: uuid.UUID | None = None


def title_from_text(text: str) -> str:
    """A new session is titled with the first 60 characters of its first message."""
    return text[:MAX_TITLE_CHARS]


def stored_title(title: str) -> str:
    """A title as given (a child session's is its goal), cut only past MAX_GIVEN_TITLE_CHARS."""
    return title[:MAX_GIVEN_TITLE_CHARS]
