"""The built-in `compaction` hook: keeps a session's history within a budget by summarising its older messages.

A profile that lists it (`hooks = ["compaction"]`) is compacted by it; a profile that does not list it never
is, and one that wants another policy lists its own hook instead (see docs/loop.md, "Compaction").

At every `before_model_call` the hook estimates the request's size: the characters of the system prompt, of
the tool specs and of every message as JSON, divided by 4 (`estimate_tokens`; no tokenizer, so it is an
estimate and the budget should leave a margin). The budget is `[compaction] max_tokens` of the profile's
config.toml, and at most `context_window - the call's max_tokens` when `[compaction] context_window` is given.
When the request is over it:

1. the session's active messages (`Journal.load_entries`) are split into the older and the recent: the recent
   are the longest tail that fits in half the budget (at least the newest message), starting at a user or
   assistant message, never at a tool result, so a tool call and its results are compacted together or kept
   together;
2. the model is asked for a summary of the older ones (one call with `COMPACTION_SYSTEM` and the transcript
   as text), recorded like every model call of the turn (`model_call_completed`, the turn's tags: billed);
3. the summary is appended to the session as a user message starting with `SUMMARY_PREFIX`, then the older
   messages are deactivated (`message_deactivated`): they stay for the history and search, `load_history`
   leaves them out;
4. the model call goes on with the summary followed by the recent messages.

The summary is the newest message of the session (its seq is after the recent ones); the hook puts every
summary first in each request it sees, so the model reads the summary, then what followed it. A second
compaction summarises the earlier summary with the rest.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Final

import msgspec

from commonos.loop.hooks import Hook, record_model_call
from commonos.loop.journal import HistoryEntry
from commonos.loop.providers.base import COMPACTION_SYSTEM, ModelRequest
from commonos.proto.identity import TurnInfo
from commonos.proto.messages import AssistantMessage, Message, ToolResultMessage, UserMessage, close_open_tool_calls

log = logging.getLogger(__name__)

#: The start of a compaction's summary message (how the hook knows its summaries).
SUMMARY_PREFIX: Final = "[Summary of the earlier conversation, compacted]\n"
#: Characters per token of the estimate.
CHARS_PER_TOKEN: Final = 4
#: Message ids per `message_deactivated` event.
DEACTIVATE_BATCH: Final = 500


def message_tokens(message: Message) -> int:
    return math.ceil(len(msgspec.json.encode(message)) / CHARS_PER_TOKEN)


def estimate_tokens(request: ModelRequest) -> int:
    """The request's size in tokens, estimated as its characters (messages and tools as JSON) / 4."""
    chars = len(request.system) + len(msgspec.json.encode(request.tools))
    return math.ceil(chars / CHARS_PER_TOKEN) + sum(message_tokens(m) for m in request.messages)


def is_summary(message: Message) -> bool:
    return isinstance(message, UserMessage) and message.text.startswith(SUMMARY_PREFIX)


def summaries_first(messages: Sequence[Message]) -> list[Message]:
    """The messages with every compaction summary moved to the front (their order kept)."""
    return [m for m in messages if is_summary(m)] + [m for m in messages if not is_summary(m)]


def transcript(messages: Sequence[Message]) -> str:
    """The messages as text for the summary call."""
    lines: list[str] = []
    for m in messages:
        if isinstance(m, UserMessage):
            lines.append(f"user: {m.text}")
        elif isinstance(m, AssistantMessage):
            if m.text:
                lines.append(f"assistant: {m.text}")
            for call in m.tool_calls:
                lines.append(f"assistant calls {call.name} ({call.id}): {msgspec.json.encode(call.args).decode()}")
        elif isinstance(m, ToolResultMessage):
            error = " (error)" if m.is_error else ""
            lines.append(f"tool result {m.call_id}{error}: {m.content}")
    return "\n".join(lines)


def split_point(entries: Sequence[HistoryEntry], keep_tokens: int) -> int | None:
    """Where the recent messages start: the smallest index of a user or assistant message (never a tool result)
    whose tail fits in `keep_tokens`, else the largest such index; None when there is none after the first."""
    safe = [i for i in range(1, len(entries)) if not isinstance(entries[i].message, ToolResultMessage)]
    if not safe:
        return None
    for i in safe:
        if sum(message_tokens(e.message) for e in entries[i:]) <= keep_tokens:
            return i
    return safe[-1]


class CompactionHook(Hook):
    """Built-in `compaction` (see the module's documentation)."""

    def budget(self, request: ModelRequest) -> int:
        policy = self.setup.profile.compaction
        budget = policy.max_tokens
        if policy.context_window is not None:
            budget = min(budget, policy.context_window - request.max_tokens)
        return max(budget, 1)

    async def before_model_call(self, turn: TurnInfo, request: ModelRequest) -> ModelRequest | None:
        ordered = summaries_first(request.messages)
        reordered = (
            None if ordered == list(request.messages) else msgspec.structs.replace(request, messages=tuple(ordered))
        )
        current = reordered or request
        budget = self.budget(request)
        if estimate_tokens(current) <= budget:
            return reordered
        compacted = await self.compact(turn, current, budget)
        return compacted or reordered

    async def compact(self, turn: TurnInfo, request: ModelRequest, budget: int) -> ModelRequest | None:
        journal = self.setup.journal
        entries = await journal.load_entries(turn.session_id, turn.profile_id)
        active = [e for e in entries if e.active]
        active = [e for e in active if is_summary(e.message)] + [e for e in active if not is_summary(e.message)]
        start = split_point(active, budget // 2)
        if start is None or (start == 1 and is_summary(active[0].message)):
            log.warning("turn %s: over the compaction budget (%d tokens) with nothing to compact", turn.turn_id, budget)
            return None
        older, recent = active[:start], active[start:]
        provider = self.setup.provider
        if provider is None:
            raise RuntimeError("the compaction hook was built without the profile's provider")
        response = await provider.complete(
            ModelRequest(
                model=request.model,
                system=COMPACTION_SYSTEM,
                messages=(UserMessage(text=transcript([e.message for e in older])),),
                max_tokens=request.max_tokens,
            )
        )
        await record_model_call(journal, turn, response, request.model)
        summary = UserMessage(text=SUMMARY_PREFIX + (response.message.text or "").strip())
        await journal.append_message(turn, summary)
        seqs = [e.seq for e in older]
        for i in range(0, len(seqs), DEACTIVATE_BATCH):
            await journal.deactivate_messages(turn, seqs[i : i + DEACTIVATE_BATCH])
        log.info(
            "turn %s: compacted %d messages into a summary, %d kept (budget %d tokens)",
            turn.turn_id,
            len(older),
            len(recent),
            budget,
        )
        messages = close_open_tool_calls([summary, *(e.message for e in recent)])
        return msgspec.structs.replace(request, messages=tuple(messages))
