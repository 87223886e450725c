"""Checking a graph against every invariant of the session model (`validate`).

Each entity list has its own named check, run in the graph's order (parents first), so that a check
finds the rows a reference names already indexed by the checks before it. Every violation is reported,
in that order, in one `GraphInvalid`.
"""

from __future__ import annotations

from commonos.proto.errors import DataError
from commonos.proto.graph.model import (
    EntityType,
    Graph,
    InputKind,
    InputOrigin,
    ModelInvocation,
    Outcome,
    Session,
    TokenBasis,
    ToolStatus,
    ToolUse,
    ToolVerb,
    TouchKind,
    UsageScope,
    UserInput,
    VendorID,
    speed_valid,
)


class GraphInvalid(DataError):
    """A graph broke invariants of the session model; ``violations`` lists every one found."""

    def __init__(self, violations: list[str]) -> None:
        super().__init__(f"{len(violations)} graph violation(s): " + "; ".join(violations[:20]))
        self.violations = violations


class _Checker:
    """Collects violations while walking a graph once per entity list.

    It indexes the rows it has checked (sessions, user inputs, invocations, tool uses) so that the
    checks after it can follow references to them. With ``partial``, a reference to a row that is not
    in the graph is allowed (see `validate`).
    """

    def __init__(self, graph: Graph, *, partial: bool) -> None:
        self.graph = graph
        self.partial = partial
        self.violations: list[str] = []
        self.all_ids: dict[str, str] = {}
        self.session_by_id: dict[str, Session] = {}
        self.input_by_id: dict[str, UserInput] = {}
        self.invocation_by_id: dict[str, ModelInvocation] = {}
        self.tool_use_by_id: dict[str, ToolUse] = {}
        self.results_per_use: dict[str, int] = {}

    # --- primitives ---

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

    def session_ref(self, entity: str, entity_id: str, session_id: str) -> None:
        if session_id not in self.session_by_id and not self.partial:
            self.fail(f"{entity} {entity_id}: session {session_id} does not exist")

    def input_ref(self, entity: str, entity_id: str, user_input_id: str, session_id: str) -> None:
        found = self.input_by_id.get(user_input_id)
        if found is None:
            if not self.partial:
                self.fail(f"{entity} {entity_id}: user input {user_input_id} does not exist")
        elif found.session_id != session_id:
            self.fail(f"{entity} {entity_id}: user input {user_input_id} belongs to another session")

    def invocation_ref(self, entity: str, entity_id: str, invocation_id: str, session_id: str) -> None:
        found = self.invocation_by_id.get(invocation_id)
        if found is None:
            if not self.partial:
                self.fail(f"{entity} {entity_id}: model invocation {invocation_id} does not exist")
        elif found.session_id != session_id:
            self.fail(f"{entity} {entity_id}: model invocation {invocation_id} belongs to another session")

    # --- one check per entity list, in the graph's order ---

    def sessions(self) -> None:
        """Ids, outcomes, both parent links or neither, parents first, one top-level session (first)."""
        graph, partial = self.graph, self.partial
        session_ids = {s.id for s in graph.sessions}
        for index, session in enumerate(graph.sessions):
            self.claim("session", session.id)
            if not Outcome.valid(session.outcome):
                self.fail(f"session {session.id}: unknown outcome {session.outcome!r}")
            if (session.parent_session_id is None) != (session.spawned_by_tool_use_id is None):
                self.fail(f"session {session.id}: parent session and spawning tool use must be set together")
            parent = session.parent_session_id
            if parent is not None and parent not in self.session_by_id:
                later = parent in session_ids
                if later or not partial:
                    where = "later" if later else "nowhere"
                    self.fail(f"session {session.id}: parent session {parent} is {where} in the graph")
            if index == 0 and not session.top_level() and not partial:
                self.fail(f"session {session.id}: the first session must be the top-level one")
            self.session_by_id.setdefault(session.id, session)
        top_level = [s.id for s in graph.sessions if s.top_level()]
        if partial:
            if len(top_level) > 1:
                self.fail(f"graph has {len(top_level)} top-level sessions, want at most 1")
        elif graph.sessions and len(top_level) != 1:
            self.fail(f"graph has {len(top_level)} top-level sessions, want exactly 1")

    def attributes(self) -> None:
        for attribute in self.graph.attributes:
            self.claim("session_attribute", attribute.id)
            self.session_ref("session_attribute", attribute.id, attribute.session_id)
            if not attribute.key:
                self.fail(f"session_attribute {attribute.id}: empty key")

    def user_inputs(self) -> None:
        ordinals: set[tuple[str, int]] = set()
        for user_input in self.graph.user_inputs:
            self.claim("user_input", user_input.id)
            self.session_ref("user_input", user_input.id, user_input.session_id)
            if not InputKind.valid(user_input.kind):
                self.fail(f"user_input {user_input.id}: unknown kind {user_input.kind!r}")
            if not InputOrigin.valid(user_input.origin):
                self.fail(f"user_input {user_input.id}: unknown origin {user_input.origin!r}")
            if (user_input.session_id, user_input.ordinal) in ordinals:
                self.fail(f"user_input {user_input.id}: ordinal {user_input.ordinal} repeats in its session")
            ordinals.add((user_input.session_id, user_input.ordinal))
            self.input_by_id.setdefault(user_input.id, user_input)

    def model_invocations(self) -> None:
        invocation_ids = {m.id for m in self.graph.model_invocations}
        for invocation in self.graph.model_invocations:
            self.claim("model_invocation", invocation.id)
            self.session_ref("model_invocation", invocation.id, invocation.session_id)
            self.input_ref("model_invocation", invocation.id, invocation.user_input_id, invocation.session_id)
            parent = invocation.parent_model_invocation_id
            if parent is not None and parent not in self.invocation_by_id:
                later = parent in invocation_ids
                if later or not self.partial:
                    where = "later" if later else "nowhere"
                    self.fail(f"model_invocation {invocation.id}: parent invocation {parent} is {where} in the graph")
            self.nonnegative(
                "model_invocation",
                invocation.id,
                input_tokens=invocation.input_tokens,
                output_tokens=invocation.output_tokens,
                reasoning_tokens=invocation.reasoning_tokens,
                cache_read_tokens=invocation.cache_read_tokens,
                cache_write_tokens=invocation.cache_write_tokens,
                cache_write_1h_tokens=invocation.cache_write_1h_tokens,
                total_tokens=invocation.total_tokens,
            )
            if (
                invocation.cache_write_1h_tokens is not None
                and invocation.cache_write_1h_tokens > invocation.cache_write_tokens
            ):
                self.fail(f"model_invocation {invocation.id}: cache_write_1h_tokens exceeds cache_write_tokens")
            if invocation.reasoning_tokens is not None and invocation.reasoning_tokens > invocation.output_tokens:
                self.fail(f"model_invocation {invocation.id}: reasoning_tokens exceeds output_tokens")
            if invocation.token_basis is not None and not TokenBasis.valid(invocation.token_basis):
                self.fail(f"model_invocation {invocation.id}: unknown token_basis {invocation.token_basis!r}")
            if invocation.speed is not None and not speed_valid(invocation.speed):
                self.fail(f"model_invocation {invocation.id}: unknown speed {invocation.speed!r}")
            self.invocation_by_id.setdefault(invocation.id, invocation)

    def assistant_messages(self) -> None:
        for message in self.graph.assistant_messages:
            self.claim("assistant_message", message.id)
            self.session_ref("assistant_message", message.id, message.session_id)
            self.input_ref("assistant_message", message.id, message.user_input_id, message.session_id)
            self.invocation_ref("assistant_message", message.id, message.model_invocation_id, message.session_id)
            if message.text is None and message.content is None:
                self.fail(f"assistant_message {message.id}: neither text nor content is set")

    def tool_uses(self) -> None:
        for tool_use in self.graph.tool_uses:
            self.claim("tool_use", tool_use.id)
            self.session_ref("tool_use", tool_use.id, tool_use.session_id)
            self.input_ref("tool_use", tool_use.id, tool_use.user_input_id, tool_use.session_id)
            self.invocation_ref("tool_use", tool_use.id, tool_use.model_invocation_id, tool_use.session_id)
            if not ToolVerb.valid(tool_use.verb):
                self.fail(f"tool_use {tool_use.id}: unknown verb {tool_use.verb!r}")
            if not ToolStatus.valid(tool_use.status):
                self.fail(f"tool_use {tool_use.id}: unknown status {tool_use.status!r}")
            self.tool_use_by_id.setdefault(tool_use.id, tool_use)

    def spawning_tool_uses(self) -> None:
        """A nested session's spawning tool use exists and is in its parent session."""
        for session in self.graph.sessions:
            spawner = session.spawned_by_tool_use_id
            if spawner is None:
                continue
            spawning = self.tool_use_by_id.get(spawner)
            if spawning is None:
                if not self.partial:
                    self.fail(f"session {session.id}: spawning tool use {spawner} does not exist")
            elif spawning.session_id != session.parent_session_id:
                self.fail(f"session {session.id}: spawning tool use {spawner} is not in the parent session")

    def tool_results(self) -> None:
        """At most one result per tool use, with the use's status and session."""
        results_per_use = self.results_per_use
        for result in self.graph.tool_results:
            self.claim("tool_result", result.id)
            self.session_ref("tool_result", result.id, result.session_id)
            self.input_ref("tool_result", result.id, result.user_input_id, result.session_id)
            if not ToolStatus.valid(result.status):
                self.fail(f"tool_result {result.id}: unknown status {result.status!r}")
            if result.status == ToolStatus.NO_RESULT:
                self.fail(f"tool_result {result.id}: a result cannot have status no_result")
            results_per_use[result.tool_use_id] = results_per_use.get(result.tool_use_id, 0) + 1
            if results_per_use[result.tool_use_id] == 2:
                self.fail(f"tool_result {result.id}: tool use {result.tool_use_id} has more than one result")
            used = self.tool_use_by_id.get(result.tool_use_id)
            if used is None:
                if not self.partial:
                    self.fail(f"tool_result {result.id}: tool use {result.tool_use_id} does not exist")
                continue
            if used.status != result.status:
                self.fail(f"tool_result {result.id}: status {result.status!r} differs from tool use's {used.status!r}")
            if used.session_id != result.session_id:
                self.fail(f"tool_result {result.id}: tool use {result.tool_use_id} belongs to another session")

    def tool_use_statuses(self) -> None:
        """A tool use has a result exactly when its status is not no_result (partial: when it has one here)."""
        for tool_use in self.graph.tool_uses:
            has_result = tool_use.id in self.results_per_use
            if tool_use.status != ToolStatus.NO_RESULT and not has_result and not self.partial:
                self.fail(f"tool_use {tool_use.id}: status {tool_use.status!r} but it has no result")
            if tool_use.status == ToolStatus.NO_RESULT and has_result:
                self.fail(f"tool_use {tool_use.id}: status no_result but it has a result")

    def file_touches(self) -> None:
        for touch in self.graph.file_touches:
            self.claim("file_touch", touch.id)
            self.session_ref("file_touch", touch.id, touch.session_id)
            self.input_ref("file_touch", touch.id, touch.user_input_id, touch.session_id)
            if not touch.path:
                self.fail(f"file_touch {touch.id}: empty path")
            if not TouchKind.valid(touch.kind):
                self.fail(f"file_touch {touch.id}: unknown kind {touch.kind!r}")
            if touch.tool_use_id is not None:
                toucher = self.tool_use_by_id.get(touch.tool_use_id)
                if toucher is None:
                    if not self.partial:
                        self.fail(f"file_touch {touch.id}: tool use {touch.tool_use_id} does not exist")
                elif not (ToolVerb.valid(toucher.verb) and ToolVerb(toucher.verb).file_verb()):
                    self.fail(f"file_touch {touch.id}: tool use verb {toucher.verb!r} cannot touch files")
                elif toucher.session_id != touch.session_id:
                    self.fail(f"file_touch {touch.id}: tool use {touch.tool_use_id} belongs to another session")
            self.nonnegative("file_touch", touch.id, start_line=touch.start_line, end_line=touch.end_line)
            if touch.start_line is not None and touch.end_line is not None and touch.end_line < touch.start_line:
                self.fail(f"file_touch {touch.id}: end_line before start_line")
            for hunk in touch.hunks or []:
                self.nonnegative(
                    "file_touch",
                    touch.id,
                    old_start=hunk.old_start,
                    old_lines=hunk.old_lines,
                    new_start=hunk.new_start,
                    new_lines=hunk.new_lines,
                )

    def token_usage(self) -> None:
        for usage in self.graph.token_usage:
            self.claim("token_usage", usage.id)
            self.session_ref("token_usage", usage.id, usage.session_id)
            if not UsageScope.valid(usage.scope):
                self.fail(f"token_usage {usage.id}: unknown scope {usage.scope!r}")
            if usage.user_input_id is not None:
                self.input_ref("token_usage", usage.id, usage.user_input_id, usage.session_id)
            elif usage.scope == UsageScope.INPUT:
                self.fail(f"token_usage {usage.id}: scope input without a user input")
            self.nonnegative(
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
                self.fail(f"token_usage {usage.id}: unknown token_basis {usage.token_basis!r}")
            if usage.speed is not None and not speed_valid(usage.speed):
                self.fail(f"token_usage {usage.id}: unknown speed {usage.speed!r}")

    def _owners(self) -> dict[str, tuple[str, str]]:
        """Every row's id -> (its entity type, its session), the first row of an id winning."""
        graph = self.graph
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
        return owners

    def vendor_ids(self) -> None:
        """Each maps a row of the graph, of its type and session, once."""
        owners = self._owners()
        seen_vendor_rows: set[tuple[str, str, str, str]] = set()
        for row in self.graph.vendor_ids:
            if not EntityType.valid(row.our_type):
                self.fail(f"{_label(row)}: unknown our_type {row.our_type!r}")
            owner = owners.get(row.our_id)
            if owner is None:
                if not self.partial:
                    self.fail(f"{_label(row)}: entity {row.our_id} does not exist")
            elif owner[0] != row.our_type:
                self.fail(f"{_label(row)}: entity {row.our_id} is a {owner[0]}, not a {row.our_type}")
            elif owner[1] != row.session_id:
                self.fail(f"{_label(row)}: session_id {row.session_id} is not the entity's session {owner[1]}")
            if row.session_id not in self.session_by_id and not self.partial:
                self.fail(f"{_label(row)}: session {row.session_id} does not exist")
            key = (str(row.our_type), row.vendor, row.vendor_id_kind, row.vendor_id)
            if key in seen_vendor_rows:
                self.fail(f"{_label(row)}: mapped twice for {row.our_type}")
            seen_vendor_rows.add(key)


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
    check = _Checker(graph, partial=partial)
    check.sessions()
    check.attributes()
    check.user_inputs()
    check.model_invocations()
    check.assistant_messages()
    check.tool_uses()
    check.spawning_tool_uses()
    check.tool_results()
    check.tool_use_statuses()
    check.file_touches()
    check.token_usage()
    check.vendor_ids()
    if check.violations:
        raise GraphInvalid(check.violations)


def _label(row: VendorID) -> str:
    return f"vendor_id {row.vendor}/{row.vendor_id_kind}/{row.vendor_id}"
