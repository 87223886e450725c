"""A deterministic provider: replies read from a script file, for demos and tests.

```toml
[[conversations]]
match = "umbrella"          # case-insensitive part of the conversation's first user message; omit: any
[[conversations.steps]]     # the n-th model call of the conversation plays the n-th step
text = "Let me look."
tool_calls = [{ name = "shell", args = { command = "echo rain" } }]
usage = { input_tokens = 812, output_tokens = 41, cache_read_tokens = 2048 }
```

summary = "The user asked about rain."   # top level: the reply to a compaction's summary call

The step is the number of assistant messages already in the conversation, so a reply depends only on
the conversation, not on what ran before in the process. A step without `usage` gets an estimate
(4 characters a token, `usage_estimated`). Past the last step the model says it has nothing scripted.
A compaction's summary call (its system prompt is `COMPACTION_SYSTEM`) is answered with `summary`, not by
a conversation; after a compaction, the conversation's first user message is the summary (`match` can name
a word of it) and its steps count the assistant messages the compaction kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from commonos.accounting.usage import TokenUsage
from commonos.loop.providers.base import COMPACTION_SYSTEM, ModelRequest, ModelResponse
from commonos.proto.config_files import ConfigProblem, convert, key_path, one_line, problem_of, toml_document
from commonos.proto.errors import ConfigError
from commonos.proto.messages import AssistantMessage, ToolCall, UserMessage, message_text

NAME = "scripted"


class ScriptError(ConfigError):
    """A script file that cannot be used; one line naming the file and the key (unknown keys included)."""


class _Call(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    name: str
    args: dict[str, Any] = {}
    id: str | None = None


class _Usage(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_5m_tokens: int = 0
    cache_write_1h_tokens: int = 0
    reasoning_tokens: int = 0


class Step(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    text: str | None = None
    tool_calls: list[_Call] = []
    usage: _Usage | None = None
    stop_reason: str | None = None


class Conversation(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    match: str | None = None
    steps: list[Step] = []


class Script(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    conversations: list[Conversation] = []
    #: The reply to a compaction's summary call.
    summary: str = "Nothing to summarise was scripted."


def load_script(path: Path) -> Script:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ScriptError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        if path.suffix == ".json":
            script = msgspec.json.decode(raw, type=Script)
        else:
            script = convert(toml_document(raw), Script)
    except msgspec.ValidationError as exc:
        raise ScriptError(f"{path}: {problem_of(exc)}") from None
    except (msgspec.DecodeError, ConfigProblem) as exc:
        raise ScriptError(one_line(f"{path}: {exc}")) from None
    for c, conversation in enumerate(script.conversations):
        for s, step in enumerate(conversation.steps):
            if step.usage is not None:
                try:
                    _usage(step.usage)
                except ValueError as exc:
                    where = key_path("conversations", c, "steps", s, "usage")
                    raise ScriptError(one_line(f"{path}: {where}: {exc}")) from None
    return script


def _usage(u: _Usage) -> TokenUsage:
    return TokenUsage(
        input_tokens=u.input_tokens,
        output_tokens=u.output_tokens,
        cache_read_tokens=u.cache_read_tokens,
        cache_write_5m_tokens=u.cache_write_5m_tokens,
        cache_write_1h_tokens=u.cache_write_1h_tokens,
        reasoning_tokens=u.reasoning_tokens,
    )


class ScriptedProvider:
    name = NAME

    def __init__(self, script: Script) -> None:
        self.script = script

    @classmethod
    def from_file(cls, path: Path) -> ScriptedProvider:
        return cls(load_script(path))

    def _conversation(self, first_user_text: str) -> Conversation | None:
        text = first_user_text.lower()
        fallback: Conversation | None = None
        for conversation in self.script.conversations:
            if conversation.match is None:
                fallback = fallback or conversation
            elif conversation.match.lower() in text:
                return conversation
        return fallback

    async def complete(self, request: ModelRequest) -> ModelResponse:
        first_user = next((m.text for m in request.messages if isinstance(m, UserMessage)), "")
        step_index = sum(isinstance(m, AssistantMessage) for m in request.messages)
        conversation = self._conversation(first_user)
        if request.system == COMPACTION_SYSTEM:
            step = Step(text=self.script.summary)
        elif conversation is not None and step_index < len(conversation.steps):
            step = conversation.steps[step_index]
        else:
            step = Step(text="I have nothing more scripted to say.")
        calls = tuple(
            ToolCall(id=c.id or f"call_{step_index}_{i}", name=c.name, args=c.args)
            for i, c in enumerate(step.tool_calls)
        )
        message = AssistantMessage(text=step.text, tool_calls=calls)
        if step.usage is not None:
            usage = _usage(step.usage)
        else:
            prompt_chars = len(request.system) + sum(len(message_text(m)) for m in request.messages)
            usage = TokenUsage(
                input_tokens=prompt_chars // 4 + 1,
                output_tokens=len(step.text or "") // 4 + 1,
                usage_estimated=True,
            )
        return ModelResponse(
            message=message,
            usage=usage,
            provider=NAME,
            model=request.model,
            stop_reason=step.stop_reason or ("tool_use" if calls else "end_turn"),
            latency_s=0.0,
        )

    async def close(self) -> None:
        return None
