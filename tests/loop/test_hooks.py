"""Hooks in a profile's config.toml: built-in ones by name, third-party ones by entry point (`commonos.hooks`),
an unknown or repeated name a one-line error naming the file and the key, a hook that cannot be built an error
of its profile. (What hooks do in a turn: tests/contract/test_loop_hooks.py, through both journals.)"""

from __future__ import annotations

import dataclasses
import logging
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from commonos.loop import profiles as profiles_module
from commonos.loop.approvals import FixedApprover
from commonos.loop.hooks import Hook, HookSetup, Refusal
from commonos.loop.locks import MemorySessionLocks
from commonos.loop.loop import Loop, TurnRequest
from commonos.loop.memory import MemoryJournal
from commonos.loop.profiles import HOOKS_ENTRY_POINT_GROUP as ENTRY_POINT_GROUP
from commonos.loop.profiles import Profile, ProfileError, hook_names, load_profile
from commonos.loop.providers import build_provider
from commonos.proto.events import ApprovalDecided, ApprovalStatus, ToolCallRecorded, TurnStatus
from commonos.proto.identity import TurnInfo
from commonos.proto.messages import ToolCall
from tests.loop.helpers import PLAN_CONFIG, of_type, write_profile

SHELL_SCRIPT = """
[[conversations]]
[[conversations.steps]]
tool_calls = [{ name = "shell", args = { command = "echo hi" } }]
[[conversations.steps]]
text = "done"
"""


class NoShell(Hook):
    """Refuses every shell call."""

    async def before_tool_call(self, turn: TurnInfo, call: ToolCall) -> Refusal | None:
        if call.name == "shell":
            return Refusal(f"no shell for {turn.profile_id}")
        return None


class CannotBuild(Hook):
    def __init__(self, setup: HookSetup) -> None:
        raise RuntimeError("no licence key")


def _profile(tmp_path: Path, hooks: str, script: str = SHELL_SCRIPT) -> Profile:
    # `hooks` is a top-level key: put it before the first table
    config = PLAN_CONFIG.format(timeout_s=0.5).replace(
        'system_prompt = "Be brief."', f"system_prompt = 'x'\nhooks = {hooks}"
    )
    return write_profile(tmp_path / "profiles", config=config, script=script)


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two hooks installed as a package would install them (entry points of `commonos.hooks`)."""
    points = {
        "no-shell": EntryPoint("no-shell", f"{__name__}:NoShell", ENTRY_POINT_GROUP),
        "cannot-build": EntryPoint("cannot-build", f"{__name__}:CannotBuild", ENTRY_POINT_GROUP),
        "missing": EntryPoint("missing", "tests.loop.no_such_module:Hook", ENTRY_POINT_GROUP),
    }
    monkeypatch.setattr(profiles_module, "hook_entry_points", lambda: points)


def test_no_hooks_by_default_and_the_builtin_ones_by_name(tmp_path: Path) -> None:
    assert write_profile(tmp_path / "a").hooks == ()
    assert _profile(tmp_path / "b", '["log"]').hooks == ("log",)
    assert hook_names()[0] == "log"


@pytest.mark.parametrize(
    ("hooks", "problem"),
    [
        ('["log", "nope"]', "hooks[1]: unknown hook 'nope' (one of log, compaction)"),
        ('["log", "log"]', "hooks[1]: hook 'log' is listed twice"),
        ('"log"', "hooks: expected an array, got a string"),
    ],
)
def test_a_bad_hook_name_is_one_line_naming_the_file_and_the_key(tmp_path: Path, hooks: str, problem: str) -> None:
    with pytest.raises(ProfileError) as raised:
        _profile(tmp_path, hooks)
    path = tmp_path / "profiles" / "demo" / "config.toml"
    assert str(raised.value) == f"{path}: {problem}"
    assert "\n" not in str(raised.value)


def test_an_installed_hook_is_named_by_its_entry_point(tmp_path: Path, installed: None) -> None:
    assert hook_names() == ("log", "compaction", "cannot-build", "missing", "no-shell")
    profile = _profile(tmp_path, '["log", "no-shell"]')
    assert profile.hooks == ("log", "no-shell")


async def test_an_installed_hook_refuses_a_call(tmp_path: Path, installed: None) -> None:
    profile = _profile(tmp_path, '["no-shell"]')
    journal = MemoryJournal()
    approver = FixedApprover(None)
    loop = Loop(
        journal,
        {profile.id: profile},
        {profile.id: build_provider(profile)},
        locks=MemorySessionLocks(),
        approver=approver,
    )
    result = await loop.run_turn(TurnRequest(profile_id="demo", text="go"))
    assert (result.status, result.text) == (TurnStatus.COMPLETED, "done")
    [tool] = of_type(journal.events, ToolCallRecorded)
    assert (tool.approval, tool.result) == (
        ApprovalStatus.DENIED,
        "not run: refused by hook 'no-shell': no shell for demo",
    )
    [decision] = of_type(journal.events, ApprovalDecided)
    assert decision.decided_by == "hook:no-shell"
    assert approver.asked == []


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("cannot-build", "hooks: hook 'cannot-build': cannot be built: RuntimeError: no licence key"),
        ("missing", "hooks: hook 'missing': cannot load tests.loop.no_such_module:Hook: ModuleNotFoundError: "),
    ],
)
def test_a_hook_that_cannot_be_loaded_is_its_profiles_error(
    tmp_path: Path, installed: None, name: str, problem: str
) -> None:
    profile = _profile(tmp_path, f'["{name}"]')
    with pytest.raises(ProfileError) as raised:
        Loop(
            MemoryJournal(),
            {profile.id: profile},
            {profile.id: build_provider(profile)},
            locks=MemorySessionLocks(),
            approver=FixedApprover(None),
        )
    assert str(raised.value).startswith(f"{profile.config_path}: {problem}")
    assert "\n" not in str(raised.value)


async def test_the_builtin_log_hook_logs_each_point(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    profile = _profile(tmp_path, '["log"]', script='[[conversations]]\n[[conversations.steps]]\ntext = "hi"\n')
    loop = Loop(
        MemoryJournal(),
        {profile.id: profile},
        {profile.id: build_provider(profile)},
        locks=MemorySessionLocks(),
        approver=FixedApprover(None),
    )
    with caplog.at_level(logging.INFO, logger="commonos.loop.hooks"):
        result = await loop.run_turn(TurnRequest(profile_id="demo", text="hello"))
    assert result.status is TurnStatus.COMPLETED
    lines = [r.getMessage() for r in caplog.records if r.name == "commonos.loop.hooks"]
    assert lines[0].endswith("started (depth 0)") and lines[-1].endswith("finished completed")
    assert len(lines) == 6  # started, user message, model call, answered, answer appended, finished


def test_load_profile_reads_the_hooks_in_order(tmp_path: Path, installed: None) -> None:
    profile = _profile(tmp_path, '["no-shell", "log"]')
    assert load_profile(profile.folder).hooks == ("no-shell", "log")


def _docs_example() -> dict[str, object]:
    """What the example of the "Hooks" section of docs/loop.md defines."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "loop.md").read_text(encoding="utf-8")
    section = page[page.index("## Hooks") :]
    code = section[section.index("```python\n") + len("```python\n") :]
    namespace: dict[str, object] = {}
    exec(code[: code.index("```")], namespace)
    return namespace


async def test_the_docs_example_hook_refuses_rm(tmp_path: Path) -> None:
    namespace = _docs_example()
    script = SHELL_SCRIPT.replace("echo hi", "rm -rf x")
    profile = dataclasses.replace(_profile(tmp_path, "[]", script=script), hooks=("no-rm",))
    journal = MemoryJournal()
    loop = Loop(
        journal,
        {profile.id: profile},
        {profile.id: build_provider(profile)},
        locks=MemorySessionLocks(),
        approver=FixedApprover(None),
        hook_factories={"no-rm": namespace["NoRm"]},  # type: ignore[dict-item]
    )
    result = await loop.run_turn(TurnRequest(profile_id="demo", text="go"))
    assert result.status is TurnStatus.COMPLETED
    [tool] = of_type(journal.events, ToolCallRecorded)
    assert tool.result == "not run: refused by hook 'no-rm': demo does not remove files"
