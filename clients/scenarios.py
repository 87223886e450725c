"""The scripted scenarios each CLI is run through: the prompts we type and the replies the fake model gives.

A scenario is one or more CLI runs in one home and one working directory (later runs continue or
resume the first one's session) and the script the fake model answers them from. ``{cwd}`` in a
prompt or a tool input is the scenario's working directory. Every text here is ours: the redaction
keeps exactly these (and the tool outputs listed in ``outputs``) and replaces the rest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from clients.fakemodel import Step

CLAUDE = "claude-code"
CODEX = "codex"


@dataclass
class Run:
    """One CLI invocation. ``follow`` is "" (a new session), "continue" (the last one) or "resume"
    (the first run's session by its id). ``interrupt``: send SIGINT once the server stalls."""

    prompt: str
    follow: str = ""
    interrupt: bool = False


@dataclass
class Scenario:
    name: str
    number: int
    runs: list[Run]
    steps: list[Step]
    outputs: list[str] = field(default_factory=list)
    """Tool outputs our scenario produces (shell output, file contents), kept verbatim."""
    about: str = ""


def _text(value: str) -> Step:
    return Step([("text", value)])


NOTE_PATH = "{cwd}/notes.txt"


def claude_scenarios() -> list[Scenario]:
    return [
        Scenario(
            "plain",
            1,
            [Run("Scenario plain: reply with one short line.")],
            [_text("Plain answer from the fake model.")],
            about="one prompt, one text reply",
        ),
        Scenario(
            "tools",
            2,
            [Run("Scenario tools: write notes.txt, edit it, then run a shell command.")],
            [
                Step(
                    [("text", "Writing the file."), ("tool", "Write", {"file_path": NOTE_PATH, "content": "alpha\n"})]
                ),
                Step([("tool", "Edit", {"file_path": NOTE_PATH, "old_string": "alpha", "new_string": "beta"})]),
                Step([("tool", "Bash", {"command": "cat notes.txt; echo shell-ran", "description": "show notes"})]),
                _text("The file says beta and the shell ran."),
            ],
            outputs=["beta\nshell-ran", "alpha\n", "beta\n"],
            about="Write, Edit and Bash tool calls and their results",
        ),
        Scenario(
            "turns",
            3,
            [
                Run("Scenario turns: first turn."),
                Run("Scenario turns: second turn.", follow="continue"),
                Run("Scenario turns: third turn.", follow="continue"),
            ],
            [_text("First answer."), _text("Second answer."), _text("Third answer.")],
            about="three prompts in one session (--continue)",
        ),
        Scenario(
            "resume",
            4,
            [Run("Scenario resume: start a session."), Run("Scenario resume: back again.", follow="resume")],
            [_text("Started."), _text("Resumed and answered.")],
            about="a second run resuming the first session by its id (--resume)",
        ),
        Scenario(
            "subagent",
            5,
            [Run("Scenario subagent: delegate a small task to a subagent.")],
            [
                Step(
                    [
                        (
                            "tool",
                            "Agent",
                            {
                                "description": "Fake subagent task",
                                "prompt": "Subagent task: answer with the word sub-ok.",
                                "subagent_type": "general-purpose",
                            },
                        )
                    ]
                ),
                _text("sub-ok"),
                _text("The subagent answered sub-ok."),
            ],
            about="the Agent tool spawning a subagent whose own call is answered by the fake model",
        ),
        Scenario(
            "compaction",
            6,
            [
                Run("Scenario compaction: remember the word heron."),
                Run("/compact", follow="continue"),
                Run("Scenario compaction: which word?", follow="continue"),
            ],
            [
                _text("Remembered heron."),
                _text("<summary>The user asked to remember the word heron.</summary>"),
                _text("The word was heron."),
            ],
            about="/compact between two turns",
        ),
        Scenario(
            "interrupted",
            7,
            [
                Run("Scenario interrupted: this turn is cut off.", interrupt=True),
                Run("Scenario interrupted: after the interruption.", follow="continue"),
            ],
            [Step([("text", "This answer never finishes.")], stall=True), _text("Answered after the interruption.")],
            about="the server stalls mid-stream and the harness sends SIGINT; then the session continues",
        ),
        Scenario(
            "cache",
            8,
            [
                Run("Scenario cache: first call writes the 5 minute cache."),
                Run("Scenario cache: 1 hour.", follow="continue"),
            ],
            [
                Step([("text", "Cached for five minutes.")], usage={"cache_5m": 4096, "cache_1h": 0}),
                Step([("text", "Cached for one hour.")], usage={"cache_5m": 0, "cache_1h": 8192}),
            ],
            about="cache writes with the 5 minute and the 1 hour TTL",
        ),
        Scenario(
            "reasoning",
            9,
            [Run("Scenario reasoning: think first.")],
            [Step([("thinking", "Fake thinking about the answer."), ("text", "Answer after thinking.")])],
            about="a thinking block before the text",
        ),
    ]


def codex_scenarios() -> list[Scenario]:
    patch = "*** Begin Patch\n*** Add File: notes.txt\n+alpha\n*** End Patch\n"
    return [
        Scenario(
            "plain",
            11,
            [Run("Scenario plain: reply with one short line.")],
            [_text("Plain answer from the fake model.")],
            about="one prompt, one text reply",
        ),
        Scenario(
            "tools",
            12,
            [Run("Scenario tools: add notes.txt with a patch, then run a shell command.")],
            [
                Step([("tool", "exec_command", {"cmd": f"apply_patch <<'PATCH'\n{patch}PATCH\n"})]),
                Step([("tool", "exec_command", {"cmd": "cat notes.txt; echo shell-ran"})]),
                _text("The file says alpha and the shell ran."),
            ],
            outputs=["alpha\nshell-ran", "alpha\n"],
            about="exec_command running apply_patch (a file added), then a shell command",
        ),
        Scenario(
            "turns",
            13,
            [
                Run("Scenario turns: first turn."),
                Run("Scenario turns: second turn.", follow="continue"),
                Run("Scenario turns: third turn.", follow="continue"),
            ],
            [_text("First answer."), _text("Second answer."), _text("Third answer.")],
            about="three prompts in one session (exec, then exec resume --last twice)",
        ),
        Scenario(
            "resume",
            14,
            [Run("Scenario resume: start a session."), Run("Scenario resume: back again.", follow="resume")],
            [_text("Started."), _text("Resumed and answered.")],
            about="exec resume SESSION_ID",
        ),
        Scenario(
            "compaction",
            16,
            [
                Run("Scenario compaction: remember the word heron."),
                Run("Scenario compaction: which word?", follow="continue"),
            ],
            [
                Step([("text", "Remembered heron.")], usage={"cache_read": 0, "input": 150_000}),
                _text("The word was heron."),
            ],
            about="a context past model_auto_compact_token_limit, so Codex compacts",
        ),
        Scenario(
            "interrupted",
            17,
            [
                Run("Scenario interrupted: this turn is cut off.", interrupt=True),
                Run("Scenario interrupted: after the interruption.", follow="continue"),
            ],
            [Step([("text", "This answer never finishes.")], stall=True), _text("Answered after the interruption.")],
            about="the server stalls mid-stream and the harness sends SIGINT; then exec resume --last",
        ),
        Scenario(
            "reasoning",
            19,
            [Run("Scenario reasoning: think first.")],
            [Step([("thinking", "Fake thinking about the answer."), ("text", "Answer after thinking.")])],
            about="a reasoning item with reasoning_tokens before the message",
        ),
    ]


SCENARIOS = {CLAUDE: claude_scenarios, CODEX: codex_scenarios}


def fill(value: Any, cwd: str) -> Any:
    """``value`` with ``{cwd}`` replaced in every string."""
    if isinstance(value, str):
        return value.replace("{cwd}", cwd)
    if isinstance(value, list):
        return [fill(v, cwd) for v in value]
    if isinstance(value, tuple):
        return tuple(fill(v, cwd) for v in value)
    if isinstance(value, dict):
        return {k: fill(v, cwd) for k, v in value.items()}
    return value


def our_texts(cwd: str) -> set[str]:
    """Every text the scenarios of both CLIs contribute, with ``{cwd}`` as ``cwd``: prompts, replies,
    tool inputs (also as the JSON the fake model sends as function call arguments), tool outputs."""
    texts: set[str] = set()

    def add(value: Any) -> None:
        if isinstance(value, str):
            texts.add(value)
        elif isinstance(value, (list, tuple)):
            for v in value:
                add(v)
        elif isinstance(value, dict):
            for v in value.values():
                add(v)

    for make in SCENARIOS.values():
        for scenario in make():
            for run in scenario.runs:
                add(fill(run.prompt, cwd))
            for step in scenario.steps:
                for raw in step.blocks:
                    block = fill(raw, cwd)
                    add(block[1:])
                    if block[0] == "tool":
                        texts.add(json.dumps(block[2]))
            add(fill(scenario.outputs, cwd))
    for make in SCENARIOS.values():
        texts.update(f"Scenario {s.name}: done." for s in make())
    return texts
