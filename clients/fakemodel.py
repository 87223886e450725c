"""A local model endpoint the real CLIs talk to: Anthropic Messages and OpenAI Responses, scripted; and OpenAI
Chat Completions, which the loop's `openai` provider speaks (tests/loop/test_providers.py).

Each model call is answered from the running scenario's script (`Step`s, in order; a call past the
end of the script gets a plain text answer) with usage the server chooses: distinct numbers per
call, derived from the scenario's number and the call's index, so a call counted twice or matched to
the wrong line shows. Every call is written to the usage log, one JSON line each, with the ids the
server returned and every usage field it reported. Request bodies are never stored (they hold the
vendors' system prompts) unless a test asks for them (`keep_requests`); OTLP payloads are kept in memory
for the recorder to redact and write. `fail_next` answers the next model calls with an error status, as
the vendor would (its error body, `retry-after-ms`), to see a client retry or give up.
"""

from __future__ import annotations

import asyncio
import json
import socket
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

#: The model names the fake endpoint reports.
CLAUDE_MODEL = "claude-sonnet-4-5"
CODEX_MODEL = "gpt-5-codex"


@dataclass
class Step:
    """One scripted model reply.

    ``blocks`` are the reply's content: ``("text", str)``, ``("thinking", str)``, or
    ``("tool", name, input_dict)`` (a tool call; Codex's function call arguments are its JSON).
    ``stall`` makes the server stop mid-stream (after the first block's start) and hang until the
    client goes away: the interrupted turn. ``usage`` overrides parts of the chosen usage.
    """

    blocks: list[tuple[Any, ...]]
    stall: bool = False
    usage: dict[str, int] = field(default_factory=dict)


@dataclass
class Script:
    cli: str
    scenario: str
    number: int
    steps: list[Step]
    calls: int = 0


def anthropic_usage(number: int, call: int, override: dict[str, int]) -> dict[str, Any]:
    """Distinct usage for call `call` of scenario `number` (Anthropic's shape)."""
    base = number * 100_000 + call * 1_000
    five = override.get("cache_5m", 300 + base // 100 + call)
    hour = override.get("cache_1h", 40 + call)
    thinking = override.get("thinking", 0)
    output = override.get("output", 20 + call * 7 + number) + thinking
    return {
        "input_tokens": override.get("input", 3 + call + number),
        "cache_creation_input_tokens": five + hour,
        "cache_read_input_tokens": override.get("cache_read", base + 17),
        "output_tokens": output,
        "cache_creation": {"ephemeral_5m_input_tokens": five, "ephemeral_1h_input_tokens": hour},
        "service_tier": "standard",
    }


def openai_usage(number: int, call: int, override: dict[str, int]) -> dict[str, Any]:
    """Distinct usage for call `call` of scenario `number` (OpenAI Responses' shape)."""
    cached = override.get("cache_read", number * 10_000 + call * 512)
    fresh = override.get("input", 900 + number * 10 + call)
    reasoning = override.get("reasoning", 0)
    output = override.get("output", 30 + call * 5 + number) + reasoning
    return {
        "input_tokens": cached + fresh,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": cached + fresh + output,
    }


def chat_usage(number: int, call: int, override: dict[str, int]) -> dict[str, Any]:
    """The same usage in Chat Completions' shape (prompt tokens include the cached ones; completion the reasoning)."""
    usage = openai_usage(number, call, override)
    return {
        "prompt_tokens": usage["input_tokens"],
        "completion_tokens": usage["output_tokens"],
        "total_tokens": usage["total_tokens"],
        "prompt_tokens_details": {"cached_tokens": usage["input_tokens_details"]["cached_tokens"], "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": usage["output_tokens_details"]["reasoning_tokens"],
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def text_pieces(text: str) -> list[str]:
    """A text in the pieces a vendor streams it in: a few words each (at least one piece)."""
    words = text.split(" ")
    pieces = [" ".join(words[i : i + 3]) + (" " if i + 3 < len(words) else "") for i in range(0, len(words), 3)]
    return pieces or [""]


def expected_tokens(kind: str, usage: dict[str, Any]) -> dict[str, int | None]:
    """The reported usage in the graph's convention (input excludes cache; output includes reasoning)."""
    if kind == "anthropic":
        creation = usage.get("cache_creation") or {}
        return {
            "input_tokens": usage["input_tokens"],
            "output_tokens": usage["output_tokens"],
            "cache_read_tokens": usage["cache_read_input_tokens"],
            "cache_write_tokens": usage["cache_creation_input_tokens"],
            "cache_write_1h_tokens": creation.get("ephemeral_1h_input_tokens"),
            "reasoning_tokens": None,
        }
    if kind == "openai_chat":
        usage = {
            "input_tokens": usage["prompt_tokens"],
            "input_tokens_details": usage["prompt_tokens_details"],
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": usage["completion_tokens_details"],
        }
    cached = usage["input_tokens_details"]["cached_tokens"]
    return {
        "input_tokens": usage["input_tokens"] - cached,
        "output_tokens": usage["output_tokens"],
        "cache_read_tokens": cached,
        "cache_write_tokens": 0,
        "cache_write_1h_tokens": None,
        "reasoning_tokens": usage["output_tokens_details"]["reasoning_tokens"],
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class FakeModel:
    """The server. `script` is swapped per scenario; `log` collects the usage lines."""

    def __init__(self) -> None:
        self.script = Script("none", "none", 0, [])
        self.log: list[dict[str, Any]] = []
        self.otlp: list[tuple[str, Any]] = []
        self.unknown: list[str] = []
        self.stalled = asyncio.Event()
        self.port = 0
        #: The model calls' paths, headers and bodies, kept only when a test sets `keep_requests`.
        self.keep_requests = False
        self.requests: list[tuple[str, dict[str, str], dict[str, Any]]] = []
        #: Statuses still to answer the next model calls with (`fail_next`), and those answered so far.
        self._failures: list[int] = []
        self.failed: list[int] = []
        self._runner: web.AppRunner | None = None
        self._release = asyncio.Event()

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> str:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_post("/v1/messages/count_tokens", self._count_tokens)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        app.router.add_post("/v1/logs", self._otlp)
        app.router.add_post("/v1/metrics", self._otlp)
        app.router.add_post("/v1/traces", self._otlp)
        app.router.add_route("*", "/{tail:.*}", self._other)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        self.port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return f"http://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        self._release.set()
        if self._runner is not None:
            await self._runner.cleanup()

    def use(self, script: Script) -> None:
        self.script = script
        self.log = []
        self.otlp = []
        self.requests = []
        self._failures = []
        self.failed = []
        self.stalled = asyncio.Event()
        self._release.set()
        self._release = asyncio.Event()

    def fail_next(self, *statuses: int) -> None:
        """Answer the next model calls with these statuses, one each, before the script goes on."""
        self._failures.extend(statuses)

    # --- shared ------------------------------------------------------------------------------

    async def _body(self, request: web.Request) -> dict[str, Any]:
        body: dict[str, Any] = await request.json()
        if self.keep_requests:
            self.requests.append((request.path, {k.lower(): v for k, v in request.headers.items()}, body))
        return body

    def _failure(self, api: str) -> web.Response | None:
        """The next scripted failure, in the vendor's error shape; None when there is none."""
        if not self._failures:
            return None
        status = self._failures.pop(0)
        self.failed.append(status)
        kind, message = {
            400: ("invalid_request_error", "max_tokens: too big"),
            401: ("authentication_error", "invalid x-api-key"),
            429: ("rate_limit_error", "slow down"),
            529: ("overloaded_error", "Overloaded"),
        }.get(status, ("api_error", f"upstream failed with {status}"))
        if api == "anthropic":
            body: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": message}}
            headers = {"request-id": f"req_failed{len(self.failed):03d}"}
        else:
            body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
            headers = {"x-request-id": f"req_failed{len(self.failed):03d}"}
        if status == 429:
            headers["retry-after-ms"] = "10"
        return web.json_response(body, status=status, headers=headers)

    def _next(self) -> tuple[int, Step]:
        call = self.script.calls
        self.script.calls += 1
        steps = self.script.steps
        step = steps[call] if call < len(steps) else Step([("text", f"Scenario {self.script.scenario}: done.")])
        return call, step

    def _ids(self, call: int, prefix: str) -> str:
        return f"{prefix}_fake{self.script.number:02d}{call:03d}{self.script.scenario.replace('-', '')}"

    def _record(
        self, kind: str, call: int, ids: dict[str, str], model: str, usage: dict[str, Any], **extra: Any
    ) -> None:
        self.log.append(
            {
                "cli": self.script.cli,
                "scenario": self.script.scenario,
                "call": call,
                "api": kind,
                **ids,
                "model": model,
                "usage": usage,
                "expected": expected_tokens(kind, usage),
                **extra,
            }
        )

    async def _stall(self) -> None:
        self.stalled.set()
        await self._release.wait()

    async def _other(self, request: web.Request) -> web.StreamResponse:
        self.unknown.append(f"{request.method} {request.path}")
        if request.method == "HEAD":
            return web.Response()
        if request.path.endswith("/models"):
            return web.json_response({"data": [{"id": CLAUDE_MODEL, "type": "model"}], "models": []})
        return web.json_response({})

    async def _otlp(self, request: web.Request) -> web.Response:
        body = await request.read()
        try:
            payload: Any = json.loads(body)
        except ValueError:
            payload = {"undecodable_bytes": len(body)}
        self.otlp.append((request.path.rsplit("/", 1)[-1], payload))
        return web.json_response({})

    async def _count_tokens(self, request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"input_tokens": 1234})

    # --- Anthropic Messages -------------------------------------------------------------------

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        failure = self._failure("anthropic")
        if failure is not None:
            return failure
        call, step = self._next()
        model = str(body.get("model") or CLAUDE_MODEL)
        thinking = sum(len(b[1]) // 4 + 1 for b in step.blocks if b[0] == "thinking")
        usage = anthropic_usage(self.script.number, call, {"thinking": thinking, **step.usage})
        if thinking:
            usage["output_tokens_details"] = {"thinking_tokens": thinking}
        message_id = self._ids(call, "msg")
        request_id = self._ids(call, "req")
        content = [self._anthropic_block(call, i, b) for i, b in enumerate(step.blocks)]
        stop = "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
        message = {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": usage,
        }
        ids = {"message_id": message_id, "request_id": request_id}
        headers = {"request-id": request_id}
        if not body.get("stream"):
            self._record("anthropic", call, ids, model, usage, stream=False)
            return web.json_response(message, headers=headers)
        response = web.StreamResponse(headers={**headers, "content-type": "text/event-stream"})
        await response.prepare(request)

        async def event(name: str, data: dict[str, Any]) -> None:
            await response.write(f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode())

        start_usage = {**usage, "output_tokens": 1}
        self._record(
            "anthropic", call, ids, model, start_usage if step.stall else usage, stream=True, stalled=step.stall
        )
        await event("message_start", {"message": {**message, "content": [], "stop_reason": None, "usage": start_usage}})
        for index, block in enumerate(content):
            await event("content_block_start", {"index": index, "content_block": self._opening(block)})
            if step.stall:
                await self._stall()
                return response
            for delta in self._deltas(block):
                await event("content_block_delta", {"index": index, "delta": delta})
            await event("content_block_stop", {"index": index})
        await event("message_delta", {"delta": {"stop_reason": stop, "stop_sequence": None}, "usage": usage})
        await event("message_stop", {})
        await response.write_eof()
        return response

    def _anthropic_block(self, call: int, index: int, block: tuple[Any, ...]) -> dict[str, Any]:
        if block[0] == "text":
            return {"type": "text", "text": block[1]}
        if block[0] == "thinking":
            return {"type": "thinking", "thinking": block[1], "signature": f"sig-fake-{call}-{index}"}
        return {"type": "tool_use", "id": self._ids(call * 10 + index, "toolu"), "name": block[1], "input": block[2]}

    @staticmethod
    def _opening(block: dict[str, Any]) -> dict[str, Any]:
        if block["type"] == "text":
            return {"type": "text", "text": ""}
        if block["type"] == "thinking":
            return {"type": "thinking", "thinking": "", "signature": ""}
        return {**block, "input": {}}

    @staticmethod
    def _deltas(block: dict[str, Any]) -> list[dict[str, Any]]:
        if block["type"] == "text":
            return [{"type": "text_delta", "text": piece} for piece in text_pieces(block["text"])]
        if block["type"] == "thinking":
            return [
                {"type": "thinking_delta", "thinking": block["thinking"]},
                {"type": "signature_delta", "signature": block["signature"]},
            ]
        return [{"type": "input_json_delta", "partial_json": json.dumps(block["input"])}]

    # --- OpenAI Responses ---------------------------------------------------------------------

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        call, step = self._next()
        model = str(body.get("model") or CODEX_MODEL)
        reasoning = sum(len(b[1]) // 4 + 1 for b in step.blocks if b[0] == "thinking")
        usage = openai_usage(self.script.number, call, {"reasoning": reasoning, **step.usage})
        response_id = self._ids(call, "resp")
        items = [self._openai_item(call, i, b) for i, b in enumerate(step.blocks)]
        base = {"id": response_id, "object": "response", "model": model, "created_at": 1_700_000_000 + call}
        stream = web.StreamResponse(headers={"content-type": "text/event-stream", "x-request-id": response_id})
        await stream.prepare(request)
        sequence = 0

        async def event(name: str, data: dict[str, Any]) -> None:
            nonlocal sequence
            sequence += 1
            payload = {"type": name, "sequence_number": sequence, **data}
            await stream.write(f"event: {name}\ndata: {json.dumps(payload)}\n\n".encode())

        self._record("openai", call, {"response_id": response_id}, model, usage, stream=True, stalled=step.stall)
        await event("response.created", {"response": {**base, "status": "in_progress", "output": []}})
        for index, item in enumerate(items):
            opening = {**item, "status": "in_progress"}
            if item["type"] == "message":
                opening["content"] = []
            await event("response.output_item.added", {"output_index": index, "item": opening})
            if step.stall:
                await self._stall()
                return stream
            if item["type"] == "message":
                text = item["content"][0]["text"]
                part = {"item_id": item["id"], "output_index": index, "content_index": 0}
                await event("response.content_part.added", {**part, "part": {"type": "output_text", "text": ""}})
                await event("response.output_text.delta", {**part, "delta": text})
                await event("response.output_text.done", {**part, "text": text})
                await event("response.content_part.done", {**part, "part": item["content"][0]})
            await event("response.output_item.done", {"output_index": index, "item": item})
        await event(
            "response.completed", {"response": {**base, "status": "completed", "output": items, "usage": usage}}
        )
        await stream.write_eof()
        return stream

    def _openai_item(self, call: int, index: int, block: tuple[Any, ...]) -> dict[str, Any]:
        item_id = self._ids(call * 10 + index, "item")
        if block[0] == "text":
            return {
                "type": "message",
                "id": item_id,
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": block[1], "annotations": []}],
            }
        if block[0] == "thinking":
            return {
                "type": "reasoning",
                "id": item_id,
                "summary": [{"type": "summary_text", "text": block[1]}],
                "encrypted_content": f"enc-fake-{call}-{index}",
            }
        return {
            "type": "function_call",
            "id": item_id,
            "call_id": self._ids(call * 10 + index, "call"),
            "name": block[1],
            "arguments": json.dumps(block[2]),
            "status": "completed",
        }

    # --- OpenAI Chat Completions --------------------------------------------------------------

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        """Chat Completions, streamed (`stream: true`; usage in a last chunk when `stream_options.include_usage`)
        or not. Thinking blocks are not shown (as OpenAI does); they count as reasoning tokens."""
        body = await self._body(request)
        failure = self._failure("openai")
        if failure is not None:
            return failure
        call, step = self._next()
        model = str(body.get("model") or CODEX_MODEL)
        reasoning = sum(len(b[1]) // 4 + 1 for b in step.blocks if b[0] == "thinking")
        usage = chat_usage(self.script.number, call, {"reasoning": reasoning, **step.usage})
        completion_id = self._ids(call, "chatcmpl")
        request_id = self._ids(call, "req")
        text = "".join(b[1] for b in step.blocks if b[0] == "text") or None
        calls: list[dict[str, Any]] = [
            {
                "id": self._ids(call * 10 + i, "call"),
                "type": "function",
                "function": {"name": b[1], "arguments": json.dumps(b[2])},
            }
            for i, b in enumerate(step.blocks)
            if b[0] == "tool"
        ]
        finish = "tool_calls" if calls else "stop"
        base = {"id": completion_id, "created": 1_700_000_000 + call, "model": model, "system_fingerprint": "fp_fake"}
        headers = {"x-request-id": request_id}
        ids = {"completion_id": completion_id, "request_id": request_id}
        if not body.get("stream"):
            self._record("openai_chat", call, ids, model, usage, stream=False)
            message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None, "annotations": []}
            if calls:
                message["tool_calls"] = calls
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
            answer = {**base, "object": "chat.completion", "choices": [choice], "usage": usage}
            return web.json_response({**answer, "service_tier": "default"}, headers=headers)
        stream = web.StreamResponse(headers={**headers, "content-type": "text/event-stream"})
        await stream.prepare(request)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        self._record("openai_chat", call, ids, model, usage, stream=True, stalled=step.stall)

        async def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> None:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            data = {**base, "object": "chat.completion.chunk", "service_tier": "default", "choices": [choice]}
            if include_usage:
                data["usage"] = None
            await stream.write(f"data: {json.dumps(data)}\n\n".encode())

        await chunk({"role": "assistant", "content": "", "refusal": None})
        if step.stall:
            await self._stall()
            return stream
        for piece in text_pieces(text) if text else []:
            await chunk({"content": piece})
        for index, tool in enumerate(calls):
            opening = {"index": index, "id": tool["id"], "type": "function"}
            await chunk({"tool_calls": [{**opening, "function": {"name": tool["function"]["name"], "arguments": ""}}]})
            arguments = tool["function"]["arguments"]
            half = len(arguments) // 2
            for part in (arguments[:half], arguments[half:]):
                await chunk({"tool_calls": [{"index": index, "function": {"arguments": part}}]})
        await chunk({}, finish)
        if include_usage:
            last = {**base, "object": "chat.completion.chunk", "service_tier": "default", "choices": [], "usage": usage}
            await stream.write(f"data: {json.dumps(last)}\n\n".encode())
        await stream.write(b"data: [DONE]\n\n")
        await stream.write_eof()
        return stream
