"""The session graph's model: its enums and row Structs, and `Graph`, one whole session tree.

This mirrors the Go package ``session`` (v0.1.0-rc.2) field for field and JSON name for JSON name.
Every id in a Graph is one of ours (see :func:`commonos.proto.graph.ids.mint_id`); vendor identifiers
live only in :class:`VendorID` rows.

JSON-valued fields (``content``, ``input``, ``metadata``, ``output``, ``value``) are
:class:`msgspec.Raw`: the bytes are carried verbatim. Fields the Go struct writes without
``omitempty`` have no default here, so they are always written (``null`` when ``None``) and a reader
sees the same keys Go would write. An ``omitempty`` JSON field (``content``, ``output``) is ``None``
when unset and left out of the encoding, as Go leaves out a nil ``json.RawMessage`` (decoding them:
:mod:`commonos.proto.graph.codec`).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Final

import msgspec

SPEED_STANDARD = "standard"
SPEED_FAST = "fast"
SPEED_ULTRAFAST = "ultrafast"
_SPEEDS = frozenset({SPEED_STANDARD, SPEED_FAST, SPEED_ULTRAFAST})

SUBAGENT_DETAIL_KEY = "subagent_detail"

JSON_NULL = msgspec.Raw(b"null")


def speed_valid(speed: str) -> bool:
    """Report whether ``speed`` is a known invocation speed."""
    return speed in _SPEEDS


class _ValidatedEnum(StrEnum):
    @classmethod
    def valid(cls, value: object) -> bool:
        """Report whether ``value`` is one of this enum's values (Go's ``Valid``)."""
        return isinstance(value, str) and value in cls._value2member_map_


class EntityType(_ValidatedEnum):
    """The kind of entity a VendorID row points at (§6)."""

    SESSION = "session"
    USER_INPUT = "user_input"
    MODEL_INVOCATION = "model_invocation"
    ASSISTANT_MESSAGE = "assistant_message"
    TOOL_USE = "tool_use"
    TOOL_RESULT = "tool_result"
    FILE_TOUCH = "file_touch"
    SESSION_ATTRIBUTE = "session_attribute"
    TOKEN_USAGE = "token_usage"


class InputKind(_ValidatedEnum):
    """Classifies a user input (§5.4)."""

    PROMPT = "prompt"
    SLASH_COMMAND = "slash_command"
    INTERRUPT = "interrupt"
    OTHER = "other"


class InputOrigin(_ValidatedEnum):
    """Who caused a user-input-shaped action (§5.5)."""

    HUMAN = "human"
    AGENT = "agent"
    SYSTEM = "system"
    UNKNOWN = "unknown"


class Outcome(_ValidatedEnum):
    """The session end label; commit evidence outranks interrupt evidence."""

    UNKNOWN = "unknown"
    INTERRUPTED = "interrupted"
    COMMITTED = "committed"
    ABANDONED = "abandoned"


class TokenBasis(_ValidatedEnum):
    """Whether token counts came from the vendor or an estimator."""

    REPORTED = "tokens_reported"
    AGGREGATE_REPORTED = "aggregate_reported"
    ESTIMATED = "estimated"
    UNKNOWN = "unknown"


class ToolStatus(_ValidatedEnum):
    """The portable outcome category of a tool call (§5.3)."""

    NO_RESULT = "no_result"
    UNKNOWN = "unknown"
    OK = "ok"
    ERROR = "error"
    INTERRUPTED = "interrupted"


class ToolVerb(_ValidatedEnum):
    """Our normalized category for a tool call (§5.2); the vendor name stays on ToolUse.name."""

    READ = "read"
    EDIT = "edit"
    SEARCH = "search"
    EXECUTE = "execute"
    SPAWN_SUBAGENT = "spawn_subagent"
    OTHER = "other"

    def file_verb(self) -> bool:
        """Report whether a tool with this verb can name a file path, and so produce file touches."""
        return self in (ToolVerb.READ, ToolVerb.EDIT, ToolVerb.SEARCH)


class TouchKind(_ValidatedEnum):
    """How a tool use touched a file (§5.6)."""

    READ = "read"
    EDIT = "edit"


class UsageScope(_ValidatedEnum):
    """The finest owner token usage can be attributed to (§5.7)."""

    INPUT = "input"
    SESSION = "session"


class SubagentDetail(_ValidatedEnum):
    """What the tree holds of a subagent's work, stored under SUBAGENT_DETAIL_KEY."""

    TRANSCRIPT = "transcript"
    """The subagent is a nested session spawned by the call."""
    REPORT = "report"
    """Only the subagent's final report, as the call's result."""
    NONE = "none"
    """The source carried neither: missing detail, never a subagent that did nothing."""


class SpawnLink(msgspec.Struct, frozen=True, kw_only=True):
    """The parent session and tool use that created a nested session."""

    parent_session_id: str
    tool_use_id: str


class Session(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One agent work stretch (§3.1); nested sessions have both parent links, top-level neither."""

    id: str
    parent_session_id: str | None
    spawned_by_tool_use_id: str | None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    title: str | None = None
    working_dir: str | None = None
    git_branch: str | None = None
    outcome: Outcome
    repo_root: str | None = None
    worktree_root: str | None = None

    def top_level(self) -> bool:
        """Report whether this session has no parent."""
        return self.parent_session_id is None

    def link_spawn(self, link: SpawnLink | None) -> Session:
        """Return this session with a nested session's optional spawn relationship applied."""
        if link is None:
            return self
        return msgspec.structs.replace(
            self, parent_session_id=link.parent_session_id, spawned_by_tool_use_id=link.tool_use_id
        )


class SessionAttribute(msgspec.Struct, frozen=True, kw_only=True):
    """One append-only row of session state effective from ``valid_from`` (§3.10).

    ``key`` is the vendor's string, unrenamed; a JSON ``null`` value unsets the key.
    """

    id: str
    session_id: str
    key: str
    value: msgspec.Raw
    valid_from: datetime


class UserInput(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A record of an action the user triggered (§3.2); everything a session does hangs off one."""

    id: str
    session_id: str
    ordinal: int
    text: str
    triggered_at: datetime | None = None
    interrupted: bool
    kind: InputKind
    origin: InputOrigin
    metadata: msgspec.Raw


class ModelInvocation(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One model API reply (§3.4). Token counts are 0 when unknown, never negative.

    Convention for every adapter: ``input_tokens`` excludes cache reads and cache writes,
    ``output_tokens`` includes reasoning, and ``total_tokens`` is
    input + output + cache_read + cache_write.
    """

    id: str
    session_id: str
    user_input_id: str
    parent_model_invocation_id: str | None
    model: str | None = None
    input_tokens: int
    output_tokens: int
    reasoning_tokens: int | None = None
    """The part of output_tokens that was reasoning; None when not reported."""
    cache_read_tokens: int
    cache_write_tokens: int
    cache_write_1h_tokens: int | None = None
    """The part of cache_write_tokens written with the 1-hour TTL; None when not reported."""
    total_tokens: int
    token_basis: TokenBasis | None = None
    speed: str | None = None
    stop_reason: str | None = None
    started_at: datetime | None = None


_FIELDS = ModelInvocation.__struct_fields__
#: The fields of an invocation its reported usage fills, in order: a response's usage grows as it streams, so
#: the most complete copy of an invocation gives them to every other (the importer's ledger), and a copy with a
#: larger total replaces them where the invocation is stored (the session graph's table).
USAGE_FIELDS: Final = _FIELDS[_FIELDS.index("input_tokens") : _FIELDS.index("stop_reason") + 1]


class AssistantMessage(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One block of model-visible output from one model invocation (§3.5)."""

    id: str
    session_id: str
    user_input_id: str
    model_invocation_id: str
    text: str | None = None
    content: msgspec.Raw | None = None
    timestamp: datetime | None = None


class ToolUse(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One tool call issued by a model invocation (§3.6)."""

    id: str
    session_id: str
    user_input_id: str
    model_invocation_id: str
    name: str
    verb: ToolVerb
    input: msgspec.Raw
    status: ToolStatus
    metadata: msgspec.Raw
    timestamp: datetime | None = None


class ToolResult(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The outcome of one tool use (§3.7); at most one per tool use, status equal to the use's."""

    id: str
    tool_use_id: str
    session_id: str
    user_input_id: str
    status: ToolStatus
    output_text: str | None = None
    output: msgspec.Raw | None = None
    error_text: str | None = None
    timestamp: datetime | None = None


class Hunk(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One patch hunk recorded against a file touch."""

    old_start: int
    old_lines: int
    new_start: int
    new_lines: int
    lines: list[str] | None = None


class FileTouch(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One file path read or edited, from structured evidence (§3.8)."""

    id: str
    tool_use_id: str | None
    user_input_id: str
    session_id: str
    path: str
    kind: TouchKind
    start_line: int | None = None
    end_line: int | None = None
    hunks: list[Hunk] | None = None


class TokenUsage(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Lossless aggregate usage that cannot be attributed to one model invocation (§3.12).

    ``None`` counters were not reported by the vendor.
    """

    id: str
    session_id: str
    user_input_id: str | None
    scope: UsageScope
    model: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    total_tokens: int | None = None
    api_call_count: int | None = None
    token_basis: TokenBasis | None = None
    speed: str | None = None


class VendorID(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Maps one of our entities to one vendor identifier (§6), to trace a row to its transcript."""

    our_id: str
    our_type: EntityType
    session_id: str
    vendor: str
    vendor_id_kind: str
    vendor_id: str
    source_ref: str | None = None


class Graph(msgspec.Struct, frozen=True, kw_only=True):
    """One whole session tree: a top-level session, every session nested under it, and their contents.

    Sessions are ordered parent-before-child and model invocations parent-before-child along
    ``parent_model_invocation_id``, so a straight pass over each list never references a row
    that does not exist yet.
    """

    sessions: list[Session] = msgspec.field(default_factory=list)
    attributes: list[SessionAttribute] = msgspec.field(default_factory=list, name="session_attributes")
    user_inputs: list[UserInput] = msgspec.field(default_factory=list)
    model_invocations: list[ModelInvocation] = msgspec.field(default_factory=list)
    assistant_messages: list[AssistantMessage] = msgspec.field(default_factory=list)
    tool_uses: list[ToolUse] = msgspec.field(default_factory=list)
    tool_results: list[ToolResult] = msgspec.field(default_factory=list)
    file_touches: list[FileTouch] = msgspec.field(default_factory=list)
    token_usage: list[TokenUsage] = msgspec.field(default_factory=list)
    vendor_ids: list[VendorID] = msgspec.field(default_factory=list)

    def root(self) -> Session | None:
        """Return the top-level session of the tree, or None for an empty graph."""
        return next((s for s in self.sessions if s.top_level()), None)


#: The graph's lists, in insertion order (parents first): the fields of `Graph`.
GRAPH_LISTS: Final[tuple[str, ...]] = tuple(Graph.__struct_fields__)


def with_subagent_detail(metadata: bytes | msgspec.Raw | None, detail: SubagentDetail) -> bytes:
    """Return ``metadata`` (a JSON object, or empty/null) with SUBAGENT_DETAIL_KEY set to ``detail``.

    Other keys are kept in their order; a non-object ``metadata`` raises ValueError because
    merging a key into it would silently drop what it held.
    """
    raw = bytes(metadata) if metadata is not None else b""
    existing: Any = msgspec.json.decode(raw) if raw.strip() else None
    if existing is None:
        existing = {}
    if not isinstance(existing, dict):
        raise ValueError(f"tool-use metadata must be a JSON object, got {type(existing).__name__}")
    existing[SUBAGENT_DETAIL_KEY] = detail.value
    return msgspec.json.encode(existing)
