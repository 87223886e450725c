"""The agent loop: user message → model → assistant message → tools → tool results → … until the model
stops, within the profile's step limit, recording every step in the Journal.

One turn per session at a time (across processes: `SessionLocks`); a second is refused with
`SessionBusy`. A turn ends `completed`, `failed` (with the error), `cancelled` (its caller went away)
or `interrupted` (the service is shutting down) — always with a `turn_finished`, never lost.

Sizes: every message is one event of at most `Journal.message_limit` bytes. A text that cannot fit is
refused before anything of its turn is recorded (`MessageTooLarge`); a tool result is cut to fit,
saying so; a model's message that cannot fit ends its turn `failed`.

Hooks: each profile's hooks (`commonos.loop.hooks`, listed in its config.toml) are called at every step with
the turn's `TurnInfo`; one may refuse a tool call (recorded like a policy refusal) or replace a model call's
request and so the history the turn goes on from. A hook that raises fails its turn, naming the hook.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Final

import msgspec

from commonos.loop import metrics, tracing
from commonos.loop.approvals import Approver, new_request
from commonos.loop.budgets import BudgetGuard, BudgetRefused
from commonos.loop.hooks import HookFactory, HookFailed, HookLoadError, TurnHooks, build_hooks, record_model_call
from commonos.loop.journal import (
    ApprovalDecision,
    Journal,
    JournalError,
    MessageTooLarge,
    SessionNotFound,
    SessionRecord,
    ToolCallRecord,
)
from commonos.loop.locks import SessionBusy, SessionLease, SessionLocks, default_owner
from commonos.loop.profile_admin import delete_profile
from commonos.loop.profiles import Policy, Profile, ProfileError
from commonos.loop.providers.base import DeltaCallback, ModelRequest, Provider, ProviderError, complete_with_deltas
from commonos.loop.registry import NoRegistry, TurnRegistry
from commonos.loop.search import MessageSearch, NoSearch
from commonos.loop.tools import Tool, ToolContext, ToolFailed, ToolOutput, builtin_tools, fit_result, tool_specs
from commonos.proto.errors import DataError
from commonos.proto.events import ApprovalStatus, ProfileDeleted, Risk, TurnStatus, utcnow
from commonos.proto.identity import REQUEST_SOURCES, SUBAGENT_SOURCE, NewSession, TurnInfo, title_from_text
from commonos.proto.ids import new_id
from commonos.proto.messages import (
    Message,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    close_open_tool_calls,
)
from commonos.proto.profiles import ProfileStatus, deleted_when_by, describe_deletion
from commonos.proto.tags import check_profile_id, parse_tags, resolve_tags
from commonos.proto.text import NUL

log = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS: Final = 4096


class UnknownProfile(DataError, LookupError):
    def __init__(self, profile_id: str) -> None:
        super().__init__(f"no profile {profile_id!r} is loaded")
        self.profile_id = profile_id


class BadRequest(DataError):
    """A turn request refused before anything of it is recorded; the message says why, in one line."""


class ProfileDeletedError(BadRequest):
    """A chat of a deleted profile, or one continuing a session deleted with its profile."""


class TurnRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One chat message for a profile. Checked by `Loop.run_turn` before anything is recorded (`BadRequest`,
    `InvalidTag`): no U+0000 in its text, source or tags; tags and a parent only with a new session."""

    profile_id: str
    text: str
    #: Continue this session; None starts a new one.
    session_id: uuid.UUID | None = None
    #: Extra tags of a new session (a session's tags are fixed: a request continuing one brings none).
    tags: tuple[str, ...] = ()
    #: Where the request comes from: one of `REQUEST_SOURCES` (`subagent` sessions are made by delegation).
    source: str = "cli"
    #: The session a new session is started under: one of the profile's own.
    parent_session_id: uuid.UUID | None = None


class TurnResult(msgspec.Struct, frozen=True, kw_only=True):
    session_id: uuid.UUID
    turn_id: uuid.UUID
    status: TurnStatus
    #: The model's final answer (empty unless completed).
    text: str = ""
    error: str | None = None


def system_prompt(snapshot: Mapping[str, Any]) -> str:
    """The system prompt a model sees: the frozen prompt and the memory entries of the snapshot."""
    parts = [str(snapshot.get("system_prompt") or "")]
    for key, title in (("memory", "Your memory"), ("user", "About the user")):
        entries = snapshot.get(key) or []
        if entries:
            parts.append(f"## {title}\n" + "\n".join(f"- {e}" for e in entries))
    return "\n\n".join(p for p in parts if p)


class _TurnFailed(DataError):
    """Ends a turn as failed with this message."""


class Loop:
    """Runs turns. Everything it touches is handed in, so tests can run it on memory adapters."""

    def __init__(
        self,
        journal: Journal,
        profiles: Mapping[str, Profile],
        providers: Mapping[str, Provider],
        *,
        locks: SessionLocks,
        approver: Approver,
        search: MessageSearch | None = None,
        tools: Mapping[str, Tool] | None = None,
        owner: str | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        registry: TurnRegistry | None = None,
        deletion_check_s: float = 1.0,
        hook_factories: Mapping[str, HookFactory] | None = None,
        deltas: Callable[[TurnInfo], DeltaCallback] | None = None,
        budgets: BudgetGuard | None = None,
    ) -> None:
        missing = set(profiles) - set(providers)
        if missing:
            raise ValueError(f"no provider for profiles {sorted(missing)}")
        self.journal = journal
        self.profiles = dict(profiles)
        self.providers = dict(providers)
        self.locks = locks
        self.approver = approver
        self.search: MessageSearch = search if search is not None else NoSearch()
        self.tools = dict(tools) if tools is not None else builtin_tools()
        self.owner = owner or default_owner()
        self.max_tokens = max_tokens
        self.registry: TurnRegistry = registry if registry is not None else NoRegistry()
        #: A turn's sink for its reply while the model produces it (`commonos.loop.deltas`); None: no deltas.
        self.deltas = deltas
        #: Refuses a model call under an exhausted enforced budget (`commonos.loop.budgets`); None: no budgets.
        self.budgets = budgets
        #: Set when the service stops: a turn cancelled from now on ends `interrupted`, not `cancelled`.
        self.shutting_down = False
        self._memory_locks: dict[str, asyncio.Lock] = {}
        #: A running turn reads its profile's status from the journal again before a model call when the
        #: status it holds is older than this (a turn's start always reads it).
        self.deletion_check_s = deletion_check_s
        self._statuses: dict[str, tuple[float, ProfileStatus]] = {}
        #: Each profile's hooks (`commonos.loop.hooks`), built once; `hook_factories` adds hooks by name.
        self.hooks: dict[str, TurnHooks] = {}
        for profile in self.profiles.values():
            try:
                self.hooks[profile.id] = TurnHooks(
                    build_hooks(profile, journal, hook_factories, self.providers[profile.id])
                )
            except HookLoadError as exc:
                raise ProfileError(profile.config_path, f"hooks: {exc}") from None

    def profile(self, profile_id: str) -> Profile:
        try:
            return self.profiles[check_profile_id(profile_id)]
        except KeyError:
            raise UnknownProfile(profile_id) from None

    # -- deleted profiles ---------------------------------------------------------------------------

    async def profile_status(self, profile_id: str, max_age_s: float = 0.0) -> ProfileStatus:
        """The profile's status as the journal says, read again unless the one held is younger than `max_age_s`."""
        held = self._statuses.get(profile_id)
        now = time.monotonic()
        if held is not None and now - held[0] < max_age_s:
            return held[1]
        status = await self.journal.profile_status(profile_id)
        self._statuses[profile_id] = (now, status)
        return status

    async def _check_alive(self, profile_id: str, session_id: uuid.UUID | None) -> ProfileStatus:
        """`ProfileDeletedError` for a deleted profile, or a session from before the profile's latest deletion."""
        status = await self.profile_status(profile_id)
        if status.deleted is not None:
            raise ProfileDeletedError(f"{describe_deletion(status.deleted)}: it takes no chats")
        if session_id is not None and await self._deleted_session(status, session_id):
            assert status.deletion is not None
            raise ProfileDeletedError(
                f"session {session_id} was deleted with profile {profile_id!r} {deleted_when_by(status.deletion)}"
            )
        return status

    async def _deleted_session(self, status: ProfileStatus, session_id: uuid.UUID) -> bool:
        """Whether the profile's session was created before the profile's latest deletion (which deleted it)."""
        if not status.deleted_position:
            return False
        created = await self.journal.session_position(session_id, status.profile_id)
        return created is not None and created < status.deleted_position

    async def _still_there(self, profile_id: str) -> None:
        """During a turn: end it (`_TurnFailed`) if its profile was deleted meanwhile."""
        status = await self.profile_status(profile_id, self.deletion_check_s)
        if status.deleted is not None:
            raise _TurnFailed(f"{describe_deletion(status.deleted)} during the turn")

    async def delete_profile(self, profile_id: str, deleted_by: str) -> ProfileDeleted:
        """Publish a profile's deletion (`ProfileAdminError` for an unknown or deleted profile); its chats are
        refused from then on, and its running turns end before their next model call."""
        event = await delete_profile(self.journal, profile_id, deleted_by)
        self._statuses.pop(profile_id, None)
        return event

    # -- entry points -----------------------------------------------------------------------------

    async def run_turn(self, request: TurnRequest, on_start: Callable[[TurnInfo], None] | None = None) -> TurnResult:
        """Run one turn. Raises `BadRequest`, `InvalidTag`, `SessionBusy`, `SessionNotFound`, `UnknownProfile`,
        `MessageTooLarge` before a turn starts (nothing of it recorded); `JournalError` when even the
        turn's end could not be recorded. `on_start` gets the turn's identity once it is recorded (so a
        caller can name a turn that is then cancelled)."""
        profile = self.profile(request.profile_id)
        session_tags = self._check_request(request)
        await self._check_alive(profile.id, request.session_id)
        # The turn's `invoke_agent` span when OpenTelemetry is on (`commonos.loop.tracing`).
        turn_id = new_id()
        provider = self.providers[profile.id].name
        with tracing.invoke_agent(profile.id, provider, profile.model, turn_id, request.session_id) as span:
            result = await self._start_turn(profile, request, session_tags, turn_id, span, on_start)
            span.finished(result.status.value, result.error)
            return result

    async def _start_turn(
        self,
        profile: Profile,
        request: TurnRequest,
        session_tags: tuple[str, ...],
        turn_id: uuid.UUID,
        span: tracing.TurnSpan,
        on_start: Callable[[TurnInfo], None] | None,
    ) -> TurnResult:
        """`run_turn` once the request is checked: its session (made or loaded), its lock, the turn."""
        record: SessionRecord | None = None
        history: list[Message] = []
        user = UserMessage(text=request.text)
        if request.session_id is None:
            self.journal.check_message(_provisional(profile.id), user, "the chat text")
            if request.parent_session_id is not None:
                await self._check_parent(profile.id, request.parent_session_id)
            session_id = await self.journal.create_session(
                NewSession(
                    profile_id=profile.id,
                    source=request.source,
                    title=title_from_text(request.text),
                    tags=session_tags,
                    parent_session_id=request.parent_session_id,
                )
            )
            record = SessionRecord(
                session_id=session_id,
                profile_id=profile.id,
                source=request.source,
                tags=session_tags,
                parent_session_id=request.parent_session_id,
            )
        else:
            session_id = request.session_id
        lease = await self._acquire(session_id)
        try:
            if record is None:
                # Read under the lock: what the previous turn (maybe another process's) left, as the
                # profile's own session (another profile's session is not found; its events are left out).
                record = await self.journal.load_session(session_id, profile.id)
                history = await self.journal.load_history(session_id, profile.id)
                self.journal.check_message(_provisional(profile.id, session_id), user, "the chat text")
            turn = TurnInfo(
                profile_id=profile.id,
                session_id=session_id,
                turn_id=turn_id,
                tags=tuple(resolve_tags(profile.tags, record.tags)),
            )
            span.started(turn)
            return await self._turn(profile, turn, record, history, request.text, lease, on_start)
        finally:
            await asyncio.shield(lease.release())

    @staticmethod
    def _check_request(request: TurnRequest) -> tuple[str, ...]:
        """What a request may carry (`BadRequest`, `InvalidTag` otherwise); the tags of its new session."""
        for what, text in (("the chat text", request.text), ("the source", request.source)):
            if NUL in text:
                raise BadRequest(f"{what} contains U+0000 (NUL), which cannot be stored")
        if any(NUL in tag for tag in request.tags):
            raise BadRequest("a tag contains U+0000 (NUL), which cannot be stored")
        if request.source not in REQUEST_SOURCES:
            allowed = ", ".join(repr(s) for s in REQUEST_SOURCES[:-1]) + f" or {REQUEST_SOURCES[-1]!r}"
            raise BadRequest(
                f"source {request.source!r} is not allowed: a chat request comes from {allowed} "
                f"({SUBAGENT_SOURCE} sessions are made by delegation only)"
            )
        tags = tuple(parse_tags(request.tags))
        if request.session_id is not None:
            if tags:
                raise BadRequest(
                    f"a session's tags are fixed when it starts: send no tags to continue session {request.session_id}"
                )
            if request.parent_session_id is not None:
                raise BadRequest(
                    "a session's parent is fixed when it starts: send no parent_session_id to continue session "
                    f"{request.session_id}"
                )
        return tags

    async def _check_parent(self, profile_id: str, parent_session_id: uuid.UUID) -> None:
        not_found = BadRequest(f"parent session {parent_session_id} not found for profile {profile_id!r}")
        try:
            await self.journal.load_session(parent_session_id, profile_id)
        except SessionNotFound:
            raise not_found from None
        if await self._deleted_session(await self.profile_status(profile_id, max_age_s=60.0), parent_session_id):
            raise not_found  # deleted with the profile, before it was re-created

    async def _acquire(self, session_id: uuid.UUID) -> SessionLease:
        try:
            return await self.locks.acquire(session_id, self.owner)
        except SessionBusy:
            metrics.SESSION_BUSY.inc()
            raise

    async def _run_child(self, parent: TurnInfo, goal: str) -> str:
        """`delegate`: a child turn for `goal` in a new session under the parent; its answer."""
        profile = self.profile(parent.profile_id)
        try:
            self.journal.check_message(_provisional(profile.id), UserMessage(text=goal), "the goal")
        except MessageTooLarge as exc:
            raise ToolFailed(f"not delegated: {exc}") from None
        try:
            await self._still_there(profile.id)
        except _TurnFailed as exc:
            raise ToolFailed(f"not delegated: {exc}") from None
        turn_id = new_id()
        with tracing.invoke_agent(profile.id, self.providers[profile.id].name, profile.model, turn_id) as span:
            result = await self._child_turn(profile, parent, goal, turn_id, span)
            span.finished(result.status.value, result.error)
        if result.status is not TurnStatus.COMPLETED:
            raise ToolFailed(f"the helper's turn {result.status.value}: {result.error or 'no answer'}")
        return result.text

    async def _child_turn(
        self, profile: Profile, parent: TurnInfo, goal: str, turn_id: uuid.UUID, span: tracing.TurnSpan
    ) -> TurnResult:
        """The child turn of `delegate`, in a new session under the parent's."""
        session_id = await self.journal.create_session(
            NewSession(
                profile_id=profile.id,
                source=SUBAGENT_SOURCE,
                title=goal,
                tags=parent.tags,
                parent_session_id=parent.session_id,
            )
        )
        record = SessionRecord(
            session_id=session_id,
            profile_id=profile.id,
            source=SUBAGENT_SOURCE,
            tags=parent.tags,
            parent_session_id=parent.session_id,
        )
        child = msgspec.structs.replace(parent.child(session_id), turn_id=turn_id)
        span.started(child)
        lease = await self._acquire(session_id)
        try:
            return await self._turn(profile, child, record, [], goal, lease)
        finally:
            await asyncio.shield(lease.release())

    # -- one turn ---------------------------------------------------------------------------------

    async def _turn(
        self,
        profile: Profile,
        turn: TurnInfo,
        record: SessionRecord,
        history: list[Message],
        text: str,
        lease: SessionLease,
        on_start: Callable[[TurnInfo], None] | None = None,
    ) -> TurnResult:
        snapshot = record.context_snapshot
        if snapshot is None:
            memory = await self.journal.load_memory(profile.id)
            snapshot = {
                "system_prompt": profile.system_prompt,
                "memory": list(memory.memory),
                "user": list(memory.user),
            }
            await self.journal.start_turn(turn, context_snapshot=snapshot)
        else:
            await self.journal.start_turn(turn)
        await self.registry.started(turn)
        if on_start is not None:
            on_start(turn)
        started = time.monotonic()
        metrics.TURNS_RUNNING.inc()
        status, answer, error = TurnStatus.COMPLETED, "", None
        hooks = self.hooks.get(profile.id) or TurnHooks()
        try:
            await hooks.turn_started(turn)
            answer = await self._steps(profile, turn, system_prompt(snapshot), history, text, lease)
        except asyncio.CancelledError:
            status = TurnStatus.INTERRUPTED if self.shutting_down else TurnStatus.CANCELLED
            error = "the service stopped during the turn" if self.shutting_down else "the turn was cancelled"
            try:
                await asyncio.shield(self._finish(turn, status, error, started))
            except JournalError as exc:
                log.error("turn %s ended %s but its end was not recorded: %s", turn.turn_id, status.value, exc)
            raise
        except (_TurnFailed, MessageTooLarge, HookFailed, BudgetRefused) as exc:
            status, error = TurnStatus.FAILED, str(exc)
        except ProviderError as exc:
            metrics.MODEL_ERRORS.labels(exc.provider).inc()
            status, error = TurnStatus.FAILED, f"model call failed: {exc}"
        except JournalError as exc:
            status, error = TurnStatus.FAILED, f"could not record the turn: {exc}"
        except Exception as exc:
            log.exception("turn %s failed", turn.turn_id)
            status, error = TurnStatus.FAILED, f"{type(exc).__name__}: {exc}"
        status, error = await self._finish(turn, status, error, started)
        return TurnResult(
            session_id=turn.session_id,
            turn_id=turn.turn_id,
            status=status,
            text=answer if status is TurnStatus.COMPLETED else "",
            error=error,
        )

    async def _finish(
        self, turn: TurnInfo, status: TurnStatus, error: str | None, started: float
    ) -> tuple[TurnStatus, str | None]:
        """Run the `turn_finished` hooks, record the turn's end; the status and error recorded."""
        hooks = self.hooks.get(turn.profile_id)
        if hooks:
            try:
                await hooks.turn_finished(turn, status, error)
            except HookFailed as exc:
                # A completing turn fails; one that already failed or was cut short keeps its status.
                if status is TurnStatus.COMPLETED:
                    status, error = TurnStatus.FAILED, str(exc)
                else:
                    error = f"{error}; and {exc}" if error else str(exc)
        metrics.TURNS_RUNNING.dec()
        metrics.TURNS.labels(status.value).inc()
        metrics.TURN_SECONDS.observe(time.monotonic() - started)
        await self.journal.finish_turn(turn, status, error)
        await self.registry.finished(turn)
        return status, error

    async def _steps(
        self, profile: Profile, turn: TurnInfo, system: str, history: list[Message], text: str, lease: SessionLease
    ) -> str:
        provider = self.providers[profile.id]
        hooks = self.hooks.get(profile.id) or TurnHooks()
        on_delta = self.deltas(turn) if self.deltas is not None else None
        offered = tuple(n for n in profile.tools if n != "delegate" or turn.depth < profile.max_delegation_depth)
        specs = tool_specs(self.tools, offered)
        messages = close_open_tool_calls(history)
        user = UserMessage(text=text)
        seq = await self.journal.append_message(turn, user)
        messages.append(user)
        await hooks.message_appended(turn, user, seq)
        for step in range(profile.max_steps):
            if lease.lost:
                raise _TurnFailed("lost the session lock to another process")
            if step:
                await self._still_there(profile.id)  # deleted meanwhile (the turn's start checked the first call)
            request = ModelRequest(
                model=profile.model,
                system=system,
                messages=tuple(messages),
                tools=specs,
                max_tokens=int(profile.provider_options.get("max_tokens", self.max_tokens)),
            )
            if hooks:
                request = await hooks.before_model_call(turn, request)
                messages = list(request.messages)  # a hook may replace the history the turn goes on from
            if self.budgets is not None:
                try:
                    await self.budgets.check(turn.tags)
                except BudgetRefused as exc:
                    await self.journal.record_model_call_refused(turn, exc.state, str(exc))
                    raise
            with tracing.chat(turn, provider.name, request) as chat:
                response = await complete_with_deltas(provider, request, on_delta)
                chat.completed(response)
                chat.recorded(await record_model_call(self.journal, turn, response, profile.model))
            await hooks.after_model_call(turn, request, response)
            assistant = response.message
            seq = await self.journal.append_message(turn, assistant)
            messages.append(assistant)
            await hooks.message_appended(turn, assistant, seq)
            if not assistant.tool_calls:
                return assistant.text or ""
            for call in assistant.tool_calls:
                result = await self._call_tool(profile, turn, call, hooks)
                seq = await self.journal.append_message(turn, result)
                messages.append(result)
                await hooks.message_appended(turn, result, seq)
        raise _TurnFailed(f"no final answer within max_steps={profile.max_steps} model calls")

    # -- tools ------------------------------------------------------------------------------------

    async def _decide(
        self, profile: Profile, turn: TurnInfo, tool: Tool, call: ToolCall, tool_call_id: uuid.UUID
    ) -> ApprovalDecision | None:
        """The approval of a call: None when none is needed (a low-risk tool the policy lets run)."""
        policy = profile.approval.for_tool(tool.name, tool.risk is Risk.HIGH)
        if policy is Policy.AUTO:
            if tool.risk is not Risk.HIGH:
                return None
            return ApprovalDecision(
                tool_call_id=tool_call_id, call_id=call.id, status=ApprovalStatus.APPROVED, decided_by="policy"
            )
        if policy is Policy.DENY:
            return ApprovalDecision(
                tool_call_id=tool_call_id, call_id=call.id, status=ApprovalStatus.DENIED, decided_by="policy"
            )
        request = new_request(
            approval_id=tool_call_id,
            profile_id=profile.id,
            session_id=turn.session_id,
            turn_id=turn.turn_id,
            call_id=call.id,
            tool=tool.name,
            args=call.args,
            risk=tool.risk,
            timeout_s=profile.approval.timeout_s,
        )
        answer = await self.approver.ask(request, profile.approval.timeout_s)
        return ApprovalDecision(
            tool_call_id=tool_call_id, call_id=call.id, status=answer.status, decided_by=answer.decided_by
        )

    async def _call_tool(
        self, profile: Profile, turn: TurnInfo, call: ToolCall, hooks: TurnHooks | None = None
    ) -> ToolResultMessage:
        """One tool call, in its `execute_tool` span when OpenTelemetry is on."""
        with tracing.execute_tool(turn, call) as span:
            return await self._tool_call(profile, turn, call, hooks, span)

    async def _tool_call(
        self, profile: Profile, turn: TurnInfo, call: ToolCall, hooks: TurnHooks | None, span: tracing.ToolSpan
    ) -> ToolResultMessage:
        hooks = hooks if hooks is not None else TurnHooks()
        started_at = utcnow()
        tool_call_id = new_id()
        tool = self.tools.get(call.name)
        decision: ApprovalDecision | None = None
        if tool is None or call.name not in profile.tools:
            output = ToolOutput(f"unknown tool {call.name!r}; the tools are: {', '.join(profile.tools)}", True)
            risk, outcome = Risk.LOW, "unknown"
        else:
            risk = tool.risk
            refused = await hooks.before_tool_call(turn, call)
            if refused is not None:
                # Refused by a hook: recorded as the policy's refusals are, the hook as the decider.
                decision = ApprovalDecision(
                    tool_call_id=tool_call_id,
                    call_id=call.id,
                    status=ApprovalStatus.DENIED,
                    decided_by=f"hook:{refused[0]}",
                )
            else:
                decision = await self._decide(profile, turn, tool, call, tool_call_id)
            if decision is not None:
                # Recorded before the tool runs: a risky action is never without its approval on record.
                await self.journal.record_approval(turn, decision)
                metrics.APPROVALS.labels(decision.status.value, _decider_kind(decision.decided_by)).inc()
            if decision is None or decision.status is ApprovalStatus.APPROVED:
                output = await self._run_tool(tool, profile, turn, call)
                outcome = "error" if output.is_error else "ok"
            elif refused is not None:
                output = ToolOutput(f"not run: refused by hook {refused[0]!r}: {refused[1].reason}", is_error=True)
                outcome = decision.status.value
            else:
                output = ToolOutput(_refusal(decision), is_error=True)
                outcome = decision.status.value
        metrics.TOOL_CALLS.labels(call.name if tool is not None else "unknown", outcome).inc()
        record = ToolCallRecord(
            tool_call_id=tool_call_id,
            call_id=call.id,
            name=call.name,
            args=call.args,
            result=output.content,
            is_error=output.is_error,
            risk=risk,
            started_at=started_at,
            finished_at=utcnow(),
            approval=decision.status if decision is not None else None,
        )
        record = self._fit_result(turn, record)
        await self.journal.record_tool_call(turn, record)
        span.tool_recorded(record, record.event_id, outcome)
        await hooks.after_tool_call(turn, call, record)
        return ToolResultMessage(call_id=call.id, content=record.result or "", is_error=output.is_error)

    def _fit_result(self, turn: TurnInfo, record: ToolCallRecord) -> ToolCallRecord:
        """The record with its result cut (see `fit_result`) so that the tool result message and the
        `tool_call_recorded` (which also holds the call's arguments) each fit one message."""
        limit = self.journal.message_limit
        whole = record.result or ""
        whole_bytes = len(whole.encode("utf-8", "surrogatepass"))

        def fits(text: str) -> bool:
            message = ToolResultMessage(call_id=record.call_id, content=text, is_error=record.is_error)
            if self.journal.message_bytes(turn, message) > limit:
                return False
            cut = msgspec.structs.replace(record, result=text, result_bytes=None if text == whole else whole_bytes)
            return self.journal.tool_call_bytes(turn, cut) <= limit

        text, full_bytes = fit_result(whole, fits)
        if full_bytes is None:
            return record
        log.debug("turn %s: result of %s cut from %d bytes", turn.turn_id, record.name, full_bytes)
        return msgspec.structs.replace(record, result=text, result_bytes=full_bytes)

    async def _run_tool(self, tool: Tool, profile: Profile, turn: TurnInfo, call: ToolCall) -> ToolOutput:
        ctx = ToolContext(
            turn=turn,
            profile=profile,
            journal=self.journal,
            search=self.search,
            delegate=self._run_child,
            memory_locks=self._memory_locks,
        )
        try:
            return await tool.run(ctx, call.args)
        except ToolFailed as exc:
            return ToolOutput(str(exc), is_error=True)
        except (JournalError, SessionBusy):
            raise
        except Exception as exc:
            log.exception("tool %s failed", call.name)
            return ToolOutput(f"the tool failed: {type(exc).__name__}: {exc}", is_error=True)


def _provisional(profile_id: str, session_id: uuid.UUID | None = None) -> TurnInfo:
    """A turn's identity for sizing its first message before anything of it is recorded."""
    return TurnInfo(profile_id=profile_id, session_id=session_id or new_id(), turn_id=new_id())


def _decider_kind(decided_by: str) -> str:
    if decided_by.startswith("hook:"):
        return "hook"
    return decided_by if decided_by in ("policy", "timeout") else "person"


def _refusal(decision: ApprovalDecision) -> str:
    if decision.status is ApprovalStatus.TIMED_OUT:
        return "not run: nobody approved the call in time"
    return f"not run: denied by {decision.decided_by}"
