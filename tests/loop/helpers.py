"""Profiles, scripts and small helpers for the loop's tests."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable
from pathlib import Path
from typing import TypeVar

from commonos.loop.profiles import Profile, load_profile

#: A conversation that uses every path of a turn: a plain tool call, an approved risky call, a call
#: denied by policy, one nobody answers in time, a delegation, then an answer.
PLAN_SCRIPT = """
[[conversations]]
match = "plan"

[[conversations.steps]]
text = "Looking around."
tool_calls = [{ name = "list_dir", args = { path = "." } }]
usage = { input_tokens = 100, output_tokens = 10, cache_read_tokens = 50, cache_write_5m_tokens = 5 }

[[conversations.steps]]
tool_calls = [{ name = "shell", args = { command = "echo approved" } }]
usage = { input_tokens = 110, output_tokens = 11 }

[[conversations.steps]]
tool_calls = [{ name = "write_file", args = { path = "x.txt", content = "x" } }]
usage = { input_tokens = 120, output_tokens = 12 }

[[conversations.steps]]
tool_calls = [{ name = "shell", args = { command = "echo unanswered" } }]
usage = { input_tokens = 130, output_tokens = 13 }

[[conversations.steps]]
tool_calls = [{ name = "delegate", args = { goal = "Find the answer" } }]
usage = { input_tokens = 140, output_tokens = 14 }

[[conversations.steps]]
text = "Done: 42."
usage = { input_tokens = 150, output_tokens = 15, reasoning_tokens = 5 }

[[conversations]]
match = "find the answer"

[[conversations.steps]]
text = "42"
usage = { input_tokens = 20, output_tokens = 2 }

[[conversations]]
match = "wait"

[[conversations.steps]]
tool_calls = [{ name = "shell", args = { command = "echo waited" } }]

[[conversations.steps]]
text = "waited"

[[conversations]]

[[conversations.steps]]
text = "hello"
"""

PLAN_CONFIG = """
tags = ["team:core", "area:work"]
provider = "scripted"
model = "scripted-test"
system_prompt = "Be brief."
max_steps = 10
max_delegation_depth = 1

[provider_options]
script = "script.toml"

[approval]
timeout_s = {timeout_s}
tools = {{ shell = "ask", write_file = "deny" }}
"""


def write_profile(
    root: Path,
    profile_id: str = "demo",
    *,
    config: str | None = None,
    script: str = PLAN_SCRIPT,
    timeout_s: float = 0.5,
) -> Profile:
    folder = root / profile_id
    folder.mkdir(parents=True, exist_ok=True)
    body = config if config is not None else PLAN_CONFIG.format(timeout_s=timeout_s)
    (folder / "config.toml").write_text(textwrap.dedent(body))
    (folder / "script.toml").write_text(textwrap.dedent(script))
    return load_profile(folder)


T = TypeVar("T")


def of_type(events: Iterable[object], kind: type[T]) -> list[T]:
    return [e for e in events if isinstance(e, kind)]
