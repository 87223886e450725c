"""Writing transcripts for importer tests: copies of the corpus, and synthesized valid lines to append.

The synthesized lines follow the shapes the corpus holds (Claude Code 1.0.x lines, Codex rollout
items) so that the adapters read them as a real agent's next exchange.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import corpus_dir

CORPUS = corpus_dir()
needs_corpus = pytest.mark.skipif(not (CORPUS / "claude").is_dir(), reason=f"corpus missing at {CORPUS}")


def copy_corpus(into: Path) -> Path:
    """A writable copy of the corpus (the original is read-only); file times are kept, so it reads as old."""
    target = into / "corpus"
    shutil.copytree(CORPUS, target)
    for folder, _dirs, files in os.walk(target):
        os.chmod(folder, 0o755)
        for name in files:
            os.chmod(Path(folder) / name, 0o644)
    return target


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def append_lines(path: Path, lines: list[dict[str, Any]]) -> None:
    with path.open("a") as handle:
        for line in lines:
            handle.write(json.dumps(line) + "\n")


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def last_time(lines: list[dict[str, Any]]) -> datetime:
    times = [datetime.fromisoformat(x["timestamp"].replace("Z", "+00:00")) for x in lines if "timestamp" in x]
    return max(times) if times else datetime(2025, 1, 1, tzinfo=UTC)


class ClaudeWriter:
    """Claude Code lines continuing a session: ids unique per writer, times after the file's last line."""

    def __init__(self, path: Path, session_id: str | None = None, seed: str = "synth") -> None:
        existing = read_lines(path) if path.exists() else []
        self.path = path
        self.session_id = session_id or next(
            (str(x["sessionId"]) for x in existing if isinstance(x.get("sessionId"), str)), path.stem
        )
        self.parent: str | None = next((x["uuid"] for x in reversed(existing) if isinstance(x.get("uuid"), str)), None)
        self.cwd = next((x["cwd"] for x in reversed(existing) if isinstance(x.get("cwd"), str)), "/work/demo")
        self.clock = last_time(existing) + timedelta(minutes=5)
        self.seed = seed
        self.count = 0

    def _id(self, kind: str) -> str:
        self.count += 1
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{self.seed}:{self.session_id}:{kind}:{self.count}"))

    def _base(self, kind: str) -> dict[str, Any]:
        self.clock += timedelta(seconds=3)
        line_id = self._id("line")
        line = {
            "parentUuid": self.parent,
            "isSidechain": False,
            "userType": "external",
            "cwd": self.cwd,
            "sessionId": self.session_id,
            "version": "1.0.17",
            "gitBranch": "main",
            "type": kind,
            "uuid": line_id,
            "timestamp": _iso(self.clock),
        }
        self.parent = line_id
        return line

    def prompt(self, text: str) -> dict[str, Any]:
        return {**self._base("user"), "message": {"role": "user", "content": text}}

    def response(
        self,
        message_id: str,
        content: list[dict[str, Any]],
        *,
        output_tokens: int,
        stop_reason: str | None,
        model: str = "claude-sonnet-4-20250514",
    ) -> dict[str, Any]:
        usage = {
            "input_tokens": 4,
            "cache_creation_input_tokens": 300,
            "cache_read_input_tokens": 12000,
            "output_tokens": output_tokens,
            "service_tier": "standard",
        }
        message = {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": usage,
        }
        return {**self._base("assistant"), "message": message, "requestId": f"req_{message_id}"}

    def tool_result(self, tool_use_id: str, text: str) -> dict[str, Any]:
        block = {"tool_use_id": tool_use_id, "type": "tool_result", "content": text, "is_error": False}
        return {**self._base("user"), "message": {"role": "user", "content": [block]}}

    def exchange(self, prompt: str, file_path: str = "/work/demo/README.md") -> list[dict[str, Any]]:
        """A prompt, a streamed response (two lines) that reads a file, its result and a final answer."""
        first = f"msg_{self._id('msg').replace('-', '')[:24]}"
        tool = f"toolu_{self._id('tool').replace('-', '')[:24]}"
        final = f"msg_{self._id('msg').replace('-', '')[:24]}"
        return [
            self.prompt(prompt),
            self.response(first, [{"type": "text", "text": "Reading it first."}], output_tokens=2, stop_reason=None),
            self.response(
                first,
                [{"type": "tool_use", "id": tool, "name": "Read", "input": {"file_path": file_path}}],
                output_tokens=57,
                stop_reason="tool_use",
            ),
            self.tool_result(tool, "# Demo\n"),
            self.response(final, [{"type": "text", "text": "Done."}], output_tokens=9, stop_reason="end_turn"),
        ]


class CodexWriter:
    """Codex rollout lines continuing a rollout: a prompt, its token count, a shell call and an answer."""

    def __init__(self, path: Path, seed: str = "synth") -> None:
        existing = read_lines(path) if path.exists() else []
        self.path = path
        self.clock = last_time(existing) + timedelta(minutes=5)
        totals = [
            x["payload"]["info"]["total_token_usage"]
            for x in existing
            if x.get("type") == "event_msg"
            and x.get("payload", {}).get("type") == "token_count"
            and isinstance(x["payload"].get("info"), dict)
        ]
        self.total = dict(totals[-1]) if totals else {"input_tokens": 0, "cached_input_tokens": 0, "output_tokens": 0}
        self.seed = seed
        self.count = 0

    def _line(self, kind: str, payload: dict[str, Any]) -> dict[str, Any]:
        self.clock += timedelta(seconds=2)
        return {"timestamp": _iso(self.clock), "type": kind, "payload": payload}

    def exchange(self, prompt: str) -> list[dict[str, Any]]:
        self.count += 1
        call_id = f"call_{self.seed}_{self.count}"
        last = {"input_tokens": 9000, "cached_input_tokens": 8000, "output_tokens": 120, "reasoning_output_tokens": 64}
        for key in ("input_tokens", "cached_input_tokens", "output_tokens"):
            self.total[key] = int(self.total.get(key, 0)) + last[key]
        self.total["total_tokens"] = self.total["input_tokens"] + self.total["output_tokens"]
        info = {"total_token_usage": dict(self.total), "last_token_usage": {**last, "total_tokens": 9120}}
        output = json.dumps({"output": "README.md\n", "metadata": {"exit_code": 0, "duration_seconds": 0.1}})
        return [
            self._line("event_msg", {"type": "user_message", "message": prompt, "images": []}),
            self._line("event_msg", {"type": "token_count", "info": info, "rate_limits": None}),
            self._line(
                "response_item",
                {"type": "function_call", "name": "shell", "arguments": '{"command":["ls"]}', "call_id": call_id},
            ),
            self._line("response_item", {"type": "function_call_output", "call_id": call_id, "output": output}),
            self._line(
                "response_item",
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]},
            ),
        ]


def small_claude_home(into: Path, sessions: int = 2) -> Path:
    """A ``~/.claude`` folder of synthesized sessions, for tests that must not depend on the corpus."""
    home = into / "claude-home"
    project = home / "projects" / "-work-demo"
    project.mkdir(parents=True)
    for number in range(sessions):
        session_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"demo-session-{number}"))
        path = project / f"{session_id}.jsonl"
        writer = ClaudeWriter(path, session_id=session_id, seed=f"demo{number}")
        append_lines(path, writer.exchange(f"Describe the project ({number})"))
    old = datetime(2025, 1, 1, tzinfo=UTC).timestamp()
    for path in project.glob("*.jsonl"):
        os.utime(path, (old, old))
    return home


#: Models a long synthesized session alternates between, so a per-model report has more than one line.
LONG_SESSION_MODELS = ("claude-sonnet-4-20250514", "claude-opus-4-1-20250805")


def _filler(size: int, label: str) -> str:
    """About `size` characters of readable, varied text (a tool's output, say)."""
    if size <= 0:
        return ""
    chunks: list[str] = []
    total = 0
    number = 0
    while total < size:
        chunk = f"{label} line {number}: the quick brown fox jumps over the lazy dog\n"
        chunks.append(chunk)
        total += len(chunk)
        number += 1
    return "".join(chunks)[:size]


def long_claude_session(
    project: Path,
    exchanges: int,
    *,
    seed: str = "long",
    result_bytes: int = 40,
    subagent_every: int = 0,
    big_result_bytes: int = 0,
    big_prompt_bytes: int = 0,
) -> Path:
    """A Claude Code session of `exchanges` prompt / tool call / answer exchanges, written to `project`.

    Every exchange is a prompt, a response streamed as two lines (text, then a Read tool call), the
    tool's result (`result_bytes` of text) and a final answer; the models alternate between
    `LONG_SESSION_MODELS`. Every `subagent_every`-th exchange calls a Task instead, whose subagent
    transcript is written under `<session>/subagents/`. `big_result_bytes` / `big_prompt_bytes` give
    one exchange halfway a tool result / a prompt of that size. Lines are written as they are made,
    and the files get an old modification time, so they read as settled.
    """
    project.mkdir(parents=True, exist_ok=True)
    session_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"long-session-{seed}"))
    path = project / f"{session_id}.jsonl"
    writer = ClaudeWriter(path, session_id=session_id, seed=seed)
    written: list[Path] = [path]
    with path.open("w") as out:

        def put(line: dict[str, Any]) -> None:
            out.write(json.dumps(line) + "\n")

        for number in range(exchanges):
            model = LONG_SESSION_MODELS[number % len(LONG_SESSION_MODELS)]
            middle = number == exchanges // 2
            prompt = f"Step {number}: look at the module and report"
            if middle and big_prompt_bytes:
                prompt += "\n" + _filler(big_prompt_bytes, "pasted")
            put(writer.prompt(prompt))
            first = f"msg_{writer._id('msg').replace('-', '')[:24]}"
            tool = f"toolu_{writer._id('tool').replace('-', '')[:24]}"
            final = f"msg_{writer._id('msg').replace('-', '')[:24]}"
            put(
                writer.response(
                    first,
                    [{"type": "text", "text": f"Looking ({number})."}],
                    output_tokens=2,
                    stop_reason=None,
                    model=model,
                )
            )
            if subagent_every and number % subagent_every == subagent_every - 1:
                agent_id = uuid.uuid5(uuid.NAMESPACE_URL, f"{seed}:agent:{number}").hex[:8]
                task = {"description": f"Sub task {number}", "prompt": f"Investigate part {number}"}
                put(
                    writer.response(
                        first,
                        [{"type": "tool_use", "id": tool, "name": "Task", "input": task}],
                        output_tokens=40,
                        stop_reason="tool_use",
                        model=model,
                    )
                )
                agent_path = project / session_id / "subagents" / f"agent-{agent_id}.jsonl"
                agent_path.parent.mkdir(parents=True, exist_ok=True)
                agent = ClaudeWriter(agent_path, session_id=session_id, seed=f"{seed}-agent-{number}")
                agent.clock = writer.clock
                agent_lines = [
                    agent.prompt(task["prompt"]),
                    agent.response(
                        f"msg_agent{agent_id}{number}",
                        [{"type": "text", "text": "Found it."}],
                        output_tokens=30,
                        stop_reason="end_turn",
                        model=model,
                    ),
                ]
                with agent_path.open("w") as handle:
                    for line in agent_lines:
                        handle.write(json.dumps({**line, "isSidechain": True, "agentId": agent_id}) + "\n")
                written.append(agent_path)
                result = writer.tool_result(tool, "Found it.")
                put({**result, "toolUseResult": {"agentId": agent_id, "status": "completed"}})
            else:
                read = {"file_path": f"/work/demo/src/module_{number % 50}.py"}
                put(
                    writer.response(
                        first,
                        [{"type": "tool_use", "id": tool, "name": "Read", "input": read}],
                        output_tokens=57,
                        stop_reason="tool_use",
                        model=model,
                    )
                )
                size = big_result_bytes if middle and big_result_bytes else result_bytes
                put(writer.tool_result(tool, _filler(size, f"module_{number % 50}.py")))
            put(
                writer.response(
                    final,
                    [{"type": "text", "text": f"Done ({number})."}],
                    output_tokens=9,
                    stop_reason="end_turn",
                    model=model,
                )
            )
    old = datetime(2025, 1, 1, tzinfo=UTC).timestamp()
    for item in written:
        os.utime(item, (old, old))
    return path
