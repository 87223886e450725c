"""The vendor-neutral session graph: the shape an adapter emits and a store writes.

This mirrors the Go package ``session`` (v0.1.0-rc.2) field for field and JSON name for JSON name.
Every id in a Graph is one of ours (see :func:`mint_id`); vendor identifiers live only in
:class:`VendorID` rows. The module does no I/O and knows no vendor.

JSON-valued fields (``content``, ``input``, ``metadata``, ``output``, ``value``) are
:class:`msgspec.Raw`: the bytes are carried verbatim, so a graph decoded and encoded again is
byte-identical in those fields (a decoded ``dict`` would re-order nothing but would re-format
numbers and escapes). Fields the Go struct writes without ``omitempty`` have no default here, so
they are always written (``null`` when ``None``) and a reader sees the same keys Go would write.
An ``omitempty`` JSON field (``content``, ``output``) is ``None`` when unset and left out of the
encoding, as Go leaves out a nil ``json.RawMessage``. msgspec cannot decode ``Raw | None``, so
decode graphs with :func:`decode_graph`, which reads those two fields through wire twins.
"""

from __future__ import annotations

import hashlib
import uuid
from datetime import datetime
from enum import StrEnum
from typing import Any, Final

import msgspec

__all__ = [
    "JSON_NULL",
    "SPEED_FAST",
    "SPEED_STANDARD",
    "SPEED_ULTRAFAST",
    "SUBAGENT_DETAIL_KEY",
    "AssistantMessage",
    "EntityType",
    "FileTouch",
    "Graph",
    "GraphInvalid",
    "Hunk",
    "InputKind",
    "InputOrigin",
    "ModelInvocation",
    "Outcome",
    "Session",
    "SessionAttribute",
    "SpawnLink",
    "SubagentDetail",
    "TokenBasis",
    "TokenUsage",
    "ToolResult",
    "ToolStatus",
    "ToolUse",
    "ToolVerb",
    "TouchKind",
    "UsageScope",
    "UserInput",
    "VendorID",
    "decode_graph",
    "encode_graph",
    "mint_id",
    "speed_valid",
    "validate",
    "with_subagent_detail",
]

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
    cache_read_tokens: int
    cache_write_tokens: int
    cache_write_1h_tokens: int | None = None
    """The part of cache_write_tokens written with the 1-hour TTL; None when not reported."""
    total_tokens: int
    token_basis: TokenBasis | None = None
    speed: str | None = None
    stop_reason: str | None = None
    started_at: datetime | None = None


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


class _WireAssistantMessage(AssistantMessage, frozen=True, kw_only=True):
    content: msgspec.Raw = msgspec.Raw()


class _WireToolResult(ToolResult, frozen=True, kw_only=True):
    output: msgspec.Raw = msgspec.Raw()


def _raw_or_none(raw: msgspec.Raw) -> msgspec.Raw | None:
    return raw if len(raw) and bytes(raw) != b"null" else None


class _WireGraph(msgspec.Struct, kw_only=True):
    """Decoding shape: accepts Go's ``null`` for a nil slice and raw JSON in omitempty fields."""

    sessions: list[Session] | None = None
    session_attributes: list[SessionAttribute] | None = None
    user_inputs: list[UserInput] | None = None
    model_invocations: list[ModelInvocation] | None = None
    assistant_messages: list[_WireAssistantMessage] | None = None
    tool_uses: list[ToolUse] | None = None
    tool_results: list[_WireToolResult] | None = None
    file_touches: list[FileTouch] | None = None
    token_usage: list[TokenUsage] | None = None
    vendor_ids: list[VendorID] | None = None


_graph_encoder = msgspec.json.Encoder()
_graph_decoder = msgspec.json.Decoder(_WireGraph)


#: The graph's lists, in insertion order (parents first): the fields of `Graph`.
GRAPH_LISTS: Final[tuple[str, ...]] = tuple(Graph.__struct_fields__)


def encode_graph(graph: Graph) -> bytes:
    """Encode a graph to JSON with the Go package's field names."""
    return _graph_encoder.encode(graph)


def decode_graph(data: bytes) -> Graph:
    """Decode a graph from JSON; a ``null`` list (Go's nil slice) decodes as empty."""
    try:
        wire = _graph_decoder.decode(data)
    except RecursionError:
        raise msgspec.DecodeError("JSON nested too deeply") from None
    return Graph(
        sessions=wire.sessions or [],
        attributes=wire.session_attributes or [],
        user_inputs=wire.user_inputs or [],
        model_invocations=wire.model_invocations or [],
        assistant_messages=[
            AssistantMessage(**{**msgspec.structs.asdict(m), "content": _raw_or_none(m.content)})
            for m in wire.assistant_messages or []
        ],
        tool_uses=wire.tool_uses or [],
        tool_results=[
            ToolResult(**{**msgspec.structs.asdict(r), "output": _raw_or_none(r.output)})
            for r in wire.tool_results or []
        ],
        file_touches=wire.file_touches or [],
        token_usage=wire.token_usage or [],
        vendor_ids=wire.vendor_ids or [],
    )


# A fixed namespace for our ids; changing it would change every id ever minted.
_ID_NAMESPACE = uuid.UUID("6f1c3b52-2d1e-5a8e-9c57-0c0a7e5e3d10")
_ID_NAMESPACE_BYTES = _ID_NAMESPACE.bytes


def mint_id(kind: str, *parts: str) -> str:
    """Derive a stable id from the identity of the thing being named.

    The id is the RFC 4122 name-based UUIDv5 (SHA-1) of the JSON array ``[kind, *parts]``
    (compact msgspec encoding, UTF-8) under the fixed namespace
    ``6f1c3b52-2d1e-5a8e-9c57-0c0a7e5e3d10``, rendered in lowercase hyphenated form. A JSON array
    keeps the tuple unambiguous whatever characters the parts hold, and nothing depends on the
    machine, the process or the time, so re-reading a transcript that has grown gives its earlier
    records the same ids. ``kind`` separates the entity types' id spaces; ``parts`` must be the
    tuple that uniquely identifies the entity (for a stored row, its uniqueness constraint).
    """
    # uuid.uuid5 spelled out, without building a UUID object: an import mints ~100,000 ids.
    digest = bytearray(hashlib.sha1(_ID_NAMESPACE_BYTES + msgspec.json.encode([kind, *parts])).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = digest.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


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


class GraphInvalid(Exception):
    """A graph broke invariants of the session model; ``violations`` lists every one found."""

    def __init__(self, violations: list[str]) -> None:
        super().__init__(f"{len(violations)} graph violation(s): " + "; ".join(violations[:20]))
        self.violations = violations


class _Checker:
    """Collects violations while walking a graph once per entity list."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.violations: list[str] = []
        self.all_ids: dict[str, str] = {}

    def fail(self, message: str) -> None:
        self.violations.append(message)

    def claim(self, entity: str, entity_id: str) -> None:
        if not entity_id:
            self.fail(f"{entity} with empty id")
            return
        if entity_id in self.all_ids:
            self.fail(f"{entity} {entity_id}: id already used by a {self.all_ids[entity_id]}")
        else:
            self.all_ids[entity_id] = entity

    def nonnegative(self, entity: str, entity_id: str, **counts: int | None) -> None:
        for name, count in counts.items():
            if count is not None and count < 0:
                self.fail(f"{entity} {entity_id}: {name} is negative ({count})")


def validate(graph: Graph, *, partial: bool = False) -> None:
    """Check a graph against every invariant of the session model, reporting all violations at once.

    Raises GraphInvalid whose ``violations`` lists each problem: duplicate ids (per entity type
    and across the graph), dangling or cross-session references, children before parents,
    a second result for one tool call or a result whose status differs from its call's, a file
    touch from a tool whose verb cannot name files, unknown enum values and negative counts.

    ``partial`` checks a fragment of a graph (a part of an import published in several messages,
    or the rows a watcher found new): a reference to an id that is not in the fragment is allowed,
    since the row it names belongs to another fragment (the store's foreign keys check it), and so
    is a tool use with a status whose result is not in the fragment. Everything the fragment holds
    is still checked: a reference to a row of the fragment must agree with that row (its session,
    its status, its verb), parents come before their children, ids and ordinals do not repeat, and
    the fragment has at most one top-level session.
    """
    check = _Checker(graph)
    session_ids = {s.id for s in graph.sessions}
    session_by_id: dict[str, Session] = {}
    for index, session in enumerate(graph.sessions):
        check.claim("session", session.id)
        if not Outcome.valid(session.outcome):
            check.fail(f"session {session.id}: unknown outcome {session.outcome!r}")
        if (session.parent_session_id is None) != (session.spawned_by_tool_use_id is None):
            check.fail(f"session {session.id}: parent session and spawning tool use must be set together")
        parent = session.parent_session_id
        if parent is not None and parent not in session_by_id:
            later = parent in session_ids
            if later or not partial:
                where = "later" if later else "nowhere"
                check.fail(f"session {session.id}: parent session {parent} is {where} in the graph")
        if index == 0 and not session.top_level() and not partial:
            check.fail(f"session {session.id}: the first session must be the top-level one")
        session_by_id.setdefault(session.id, session)
    top_level = [s.id for s in graph.sessions if s.top_level()]
    if partial:
        if len(top_level) > 1:
            check.fail(f"graph has {len(top_level)} top-level sessions, want at most 1")
    elif graph.sessions and len(top_level) != 1:
        check.fail(f"graph has {len(top_level)} top-level sessions, want exactly 1")

    def session_ref(entity: str, entity_id: str, session_id: str) -> None:
        if session_id not in session_by_id and not partial:
            check.fail(f"{entity} {entity_id}: session {session_id} does not exist")

    for attribute in graph.attributes:
        check.claim("session_attribute", attribute.id)
        session_ref("session_attribute", attribute.id, attribute.session_id)
        if not attribute.key:
            check.fail(f"session_attribute {attribute.id}: empty key")

    input_by_id: dict[str, UserInput] = {}
    ordinals: set[tuple[str, int]] = set()
    for user_input in graph.user_inputs:
        check.claim("user_input", user_input.id)
        session_ref("user_input", user_input.id, user_input.session_id)
        if not InputKind.valid(user_input.kind):
            check.fail(f"user_input {user_input.id}: unknown kind {user_input.kind!r}")
        if not InputOrigin.valid(user_input.origin):
            check.fail(f"user_input {user_input.id}: unknown origin {user_input.origin!r}")
        if (user_input.session_id, user_input.ordinal) in ordinals:
            check.fail(f"user_input {user_input.id}: ordinal {user_input.ordinal} repeats in its session")
        ordinals.add((user_input.session_id, user_input.ordinal))
        input_by_id.setdefault(user_input.id, user_input)

    def input_ref(entity: str, entity_id: str, user_input_id: str, session_id: str) -> None:
        found = input_by_id.get(user_input_id)
        if found is None:
            if not partial:
                check.fail(f"{entity} {entity_id}: user input {user_input_id} does not exist")
        elif found.session_id != session_id:
            check.fail(f"{entity} {entity_id}: user input {user_input_id} belongs to another session")

    invocation_ids = {m.id for m in graph.model_invocations}
    invocation_by_id: dict[str, ModelInvocation] = {}
    for invocation in graph.model_invocations:
        check.claim("model_invocation", invocation.id)
        session_ref("model_invocation", invocation.id, invocation.session_id)
        input_ref("model_invocation", invocation.id, invocation.user_input_id, invocation.session_id)
        parent = invocation.parent_model_invocation_id
        if parent is not None and parent not in invocation_by_id:
            later = parent in invocation_ids
            if later or not partial:
                where = "later" if later else "nowhere"
                check.fail(f"model_invocation {invocation.id}: parent invocation {parent} is {where} in the graph")
        check.nonnegative(
            "model_invocation",
            invocation.id,
            input_tokens=invocation.input_tokens,
            output_tokens=invocation.output_tokens,
            cache_read_tokens=invocation.cache_read_tokens,
            cache_write_tokens=invocation.cache_write_tokens,
            cache_write_1h_tokens=invocation.cache_write_1h_tokens,
            total_tokens=invocation.total_tokens,
        )
        if (
            invocation.cache_write_1h_tokens is not None
            and invocation.cache_write_1h_tokens > invocation.cache_write_tokens
        ):
            check.fail(f"model_invocation {invocation.id}: cache_write_1h_tokens exceeds cache_write_tokens")
        if invocation.token_basis is not None and not TokenBasis.valid(invocation.token_basis):
            check.fail(f"model_invocation {invocation.id}: unknown token_basis {invocation.token_basis!r}")
        if invocation.speed is not None and not speed_valid(invocation.speed):
            check.fail(f"model_invocation {invocation.id}: unknown speed {invocation.speed!r}")
        invocation_by_id.setdefault(invocation.id, invocation)

    def invocation_ref(entity: str, entity_id: str, invocation_id: str, session_id: str) -> None:
        found = invocation_by_id.get(invocation_id)
        if found is None:
            if not partial:
                check.fail(f"{entity} {entity_id}: model invocation {invocation_id} does not exist")
        elif found.session_id != session_id:
            check.fail(f"{entity} {entity_id}: model invocation {invocation_id} belongs to another session")

    for message in graph.assistant_messages:
        check.claim("assistant_message", message.id)
        session_ref("assistant_message", message.id, message.session_id)
        input_ref("assistant_message", message.id, message.user_input_id, message.session_id)
        invocation_ref("assistant_message", message.id, message.model_invocation_id, message.session_id)
        if message.text is None and message.content is None:
            check.fail(f"assistant_message {message.id}: neither text nor content is set")

    tool_use_by_id: dict[str, ToolUse] = {}
    for tool_use in graph.tool_uses:
        check.claim("tool_use", tool_use.id)
        session_ref("tool_use", tool_use.id, tool_use.session_id)
        input_ref("tool_use", tool_use.id, tool_use.user_input_id, tool_use.session_id)
        invocation_ref("tool_use", tool_use.id, tool_use.model_invocation_id, tool_use.session_id)
        if not ToolVerb.valid(tool_use.verb):
            check.fail(f"tool_use {tool_use.id}: unknown verb {tool_use.verb!r}")
        if not ToolStatus.valid(tool_use.status):
            check.fail(f"tool_use {tool_use.id}: unknown status {tool_use.status!r}")
        tool_use_by_id.setdefault(tool_use.id, tool_use)

    for session in graph.sessions:
        spawner = session.spawned_by_tool_use_id
        if spawner is None:
            continue
        spawning = tool_use_by_id.get(spawner)
        if spawning is None:
            if not partial:
                check.fail(f"session {session.id}: spawning tool use {spawner} does not exist")
        elif spawning.session_id != session.parent_session_id:
            check.fail(f"session {session.id}: spawning tool use {spawner} is not in the parent session")

    results_per_use: dict[str, int] = {}
    for result in graph.tool_results:
        check.claim("tool_result", result.id)
        session_ref("tool_result", result.id, result.session_id)
        input_ref("tool_result", result.id, result.user_input_id, result.session_id)
        if not ToolStatus.valid(result.status):
            check.fail(f"tool_result {result.id}: unknown status {result.status!r}")
        if result.status == ToolStatus.NO_RESULT:
            check.fail(f"tool_result {result.id}: a result cannot have status no_result")
        results_per_use[result.tool_use_id] = results_per_use.get(result.tool_use_id, 0) + 1
        if results_per_use[result.tool_use_id] == 2:
            check.fail(f"tool_result {result.id}: tool use {result.tool_use_id} has more than one result")
        used = tool_use_by_id.get(result.tool_use_id)
        if used is None:
            if not partial:
                check.fail(f"tool_result {result.id}: tool use {result.tool_use_id} does not exist")
            continue
        if used.status != result.status:
            check.fail(f"tool_result {result.id}: status {result.status!r} differs from tool use's {used.status!r}")
        if used.session_id != result.session_id:
            check.fail(f"tool_result {result.id}: tool use {result.tool_use_id} belongs to another session")
    for tool_use in graph.tool_uses:
        if tool_use.status != ToolStatus.NO_RESULT and tool_use.id not in results_per_use and not partial:
            check.fail(f"tool_use {tool_use.id}: status {tool_use.status!r} but it has no result")
        if tool_use.status == ToolStatus.NO_RESULT and tool_use.id in results_per_use:
            check.fail(f"tool_use {tool_use.id}: status no_result but it has a result")

    for touch in graph.file_touches:
        check.claim("file_touch", touch.id)
        session_ref("file_touch", touch.id, touch.session_id)
        input_ref("file_touch", touch.id, touch.user_input_id, touch.session_id)
        if not touch.path:
            check.fail(f"file_touch {touch.id}: empty path")
        if not TouchKind.valid(touch.kind):
            check.fail(f"file_touch {touch.id}: unknown kind {touch.kind!r}")
        if touch.tool_use_id is not None:
            toucher = tool_use_by_id.get(touch.tool_use_id)
            if toucher is None:
                if not partial:
                    check.fail(f"file_touch {touch.id}: tool use {touch.tool_use_id} does not exist")
            elif not (ToolVerb.valid(toucher.verb) and ToolVerb(toucher.verb).file_verb()):
                check.fail(f"file_touch {touch.id}: tool use verb {toucher.verb!r} cannot touch files")
            elif toucher.session_id != touch.session_id:
                check.fail(f"file_touch {touch.id}: tool use {touch.tool_use_id} belongs to another session")
        check.nonnegative("file_touch", touch.id, start_line=touch.start_line, end_line=touch.end_line)
        if touch.start_line is not None and touch.end_line is not None and touch.end_line < touch.start_line:
            check.fail(f"file_touch {touch.id}: end_line before start_line")
        for hunk in touch.hunks or []:
            check.nonnegative(
                "file_touch",
                touch.id,
                old_start=hunk.old_start,
                old_lines=hunk.old_lines,
                new_start=hunk.new_start,
                new_lines=hunk.new_lines,
            )

    for usage in graph.token_usage:
        check.claim("token_usage", usage.id)
        session_ref("token_usage", usage.id, usage.session_id)
        if not UsageScope.valid(usage.scope):
            check.fail(f"token_usage {usage.id}: unknown scope {usage.scope!r}")
        if usage.user_input_id is not None:
            input_ref("token_usage", usage.id, usage.user_input_id, usage.session_id)
        elif usage.scope == UsageScope.INPUT:
            check.fail(f"token_usage {usage.id}: scope input without a user input")
        check.nonnegative(
            "token_usage",
            usage.id,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cache_read_tokens=usage.cache_read_tokens,
            cache_write_tokens=usage.cache_write_tokens,
            total_tokens=usage.total_tokens,
            api_call_count=usage.api_call_count,
        )
        if usage.token_basis is not None and not TokenBasis.valid(usage.token_basis):
            check.fail(f"token_usage {usage.id}: unknown token_basis {usage.token_basis!r}")
        if usage.speed is not None and not speed_valid(usage.speed):
            check.fail(f"token_usage {usage.id}: unknown speed {usage.speed!r}")

    owners: dict[str, tuple[str, str]] = {}
    for entity, rows in (
        ("session", [(s.id, s.id) for s in graph.sessions]),
        ("session_attribute", [(a.id, a.session_id) for a in graph.attributes]),
        ("user_input", [(u.id, u.session_id) for u in graph.user_inputs]),
        ("model_invocation", [(m.id, m.session_id) for m in graph.model_invocations]),
        ("assistant_message", [(m.id, m.session_id) for m in graph.assistant_messages]),
        ("tool_use", [(t.id, t.session_id) for t in graph.tool_uses]),
        ("tool_result", [(r.id, r.session_id) for r in graph.tool_results]),
        ("file_touch", [(f.id, f.session_id) for f in graph.file_touches]),
        ("token_usage", [(u.id, u.session_id) for u in graph.token_usage]),
    ):
        for entity_id, session_id in rows:
            owners.setdefault(entity_id, (entity, session_id))
    seen_vendor_rows: set[tuple[str, str, str, str]] = set()
    for row in graph.vendor_ids:
        label = f"vendor_id {row.vendor}/{row.vendor_id_kind}/{row.vendor_id}"
        if not EntityType.valid(row.our_type):
            check.fail(f"{label}: unknown our_type {row.our_type!r}")
        owner = owners.get(row.our_id)
        if owner is None:
            if not partial:
                check.fail(f"{label}: entity {row.our_id} does not exist")
        elif owner[0] != row.our_type:
            check.fail(f"{label}: entity {row.our_id} is a {owner[0]}, not a {row.our_type}")
        elif owner[1] != row.session_id:
            check.fail(f"{label}: session_id {row.session_id} is not the entity's session {owner[1]}")
        if row.session_id not in session_by_id and not partial:
            check.fail(f"{label}: session {row.session_id} does not exist")
        key = (str(row.our_type), row.vendor, row.vendor_id_kind, row.vendor_id)
        if key in seen_vendor_rows:
            check.fail(f"{label}: mapped twice for {row.our_type}")
        seen_vendor_rows.add(key)

    if check.violations:
        raise GraphInvalid(check.violations)
