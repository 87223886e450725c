"""Profiles: one folder per profile, `profiles/<id>/config.toml`.

```toml
tags = ["area:demo"]                 # copied onto every turn of the profile
provider = "scripted"                # scripted | anthropic | openai
model = "scripted-demo"
system_prompt = "You are ..."        # or system_prompt_file = "prompt.md"
tools = ["read_file", "shell"]       # the tools the model may call (default: all)
max_steps = 12                       # model calls per turn
max_delegation_depth = 1             # how deep `delegate` may go (0: no delegation)
workspace = "workspace"              # where the file and shell tools work, relative to the folder
hooks = ["log"]                      # loop hooks, run in this order (commonos.loop.hooks; default: none)

[provider_options]                   # the provider's own settings, below
script = "script.toml"

[approval]
timeout_s = 120                      # an unanswered approval is denied (timed_out)
tools = { shell = "ask", write_file = "ask" }   # auto | ask | deny; default: ask for high-risk tools

[compaction]                         # read by the `compaction` hook (commonos.loop.compaction), if listed
max_tokens = 100000                  # compact when the estimated request would be larger
context_window = 200000              # the model's context window, where known: the budget's ceiling
```

`provider_options` by provider (any other key is an error):

* every provider: `max_tokens` (the most output tokens of one model call; the loop's default otherwise);
* `scripted`: `script` (the replies, relative to the folder; default `script.toml`);
* `anthropic` and `openai`: `api_key_env` (the variable holding the key), `base_url`, `timeout_s`,
  `max_retries`; `openai` also `max_tokens_param` (`max_completion_tokens` or `max_tokens`) and
  `provider_name` (the provider name recorded for a compatible server).

Every profile is validated at start: config.toml is decoded into strict Structs (`forbid_unknown_fields`), so
a misspelt key is an error too. A problem is a `ProfileError`, one line naming the file and the key
(`approval.timeout_s: must be positive, got 0`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import StrEnum
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any, Final

import msgspec

from commonos.proto.config_files import ConfigProblem, convert, one_line, toml_document
from commonos.proto.errors import ConfigError
from commonos.proto.tags import InvalidProfileId, InvalidTag, check_profile_id, parse_tag

CONFIG_FILE: Final = "config.toml"
#: Every tool the loop has (commonos.loop.tools registers exactly these).
BUILTIN_TOOLS: Final = ("read_file", "list_dir", "write_file", "shell", "session_search", "delegate", "memory")
#: The hooks a profile names without installing anything (`commonos.loop.hooks`: `log`;
#: `commonos.loop.compaction`: `compaction`, found through its entry point).
BUILTIN_HOOKS: Final = ("log", "compaction")
#: The entry point group of hooks: `name = "package.module:HookClass"` (the built-in `compaction` is one).
HOOKS_ENTRY_POINT_GROUP: Final = "commonos.hooks"


def hook_entry_points() -> dict[str, EntryPoint]:
    """The installed hooks' entry points, by name."""
    return {ep.name: ep for ep in entry_points(group=HOOKS_ENTRY_POINT_GROUP)}


def hook_names() -> tuple[str, ...]:
    """Every hook name a profile may use: the built-in hooks', then the installed entry points' (sorted)."""
    return BUILTIN_HOOKS + tuple(sorted(set(hook_entry_points()) - set(BUILTIN_HOOKS)))


class ProfileError(ConfigError):
    """A profile that cannot be used; the message, one line, starts with the file at fault."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(one_line(f"{path}: {problem}"))
        self.path = path
        self.problem = problem


class Policy(StrEnum):
    AUTO = "auto"
    ASK = "ask"
    DENY = "deny"


class _ApprovalConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    timeout_s: float = 120.0
    tools: dict[str, Policy] = {}


class _ProviderOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """`[provider_options]` of every provider; checked only: the profile keeps the table as written."""

    max_tokens: int | None = None


class _ScriptedOptions(_ProviderOptions, forbid_unknown_fields=True, kw_only=True):
    script: str | None = None


class _HttpOptions(_ProviderOptions, forbid_unknown_fields=True, kw_only=True):
    api_key_env: str | None = None
    base_url: str | None = None
    timeout_s: float | None = None
    max_retries: int | None = None


class _OpenAIOptions(_HttpOptions, forbid_unknown_fields=True, kw_only=True):
    max_tokens_param: str | None = None
    provider_name: str | None = None


_PROVIDER_OPTIONS: Final[dict[str, type[_ProviderOptions]]] = {
    "scripted": _ScriptedOptions,
    "anthropic": _HttpOptions,
    "openai": _OpenAIOptions,
}
#: The providers a profile may name (`commonos.loop.providers.build_provider` builds each; a test keeps the two
#: in step).
PROVIDERS: Final = tuple(_PROVIDER_OPTIONS)


class _CompactionConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    max_tokens: int = 100_000
    context_window: int | None = None


class _ProfileConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    tags: list[str] = []
    provider: str = "scripted"
    model: str = "scripted"
    system_prompt: str | None = None
    system_prompt_file: str | None = None
    tools: list[str] | None = None
    max_steps: int = 12
    max_delegation_depth: int = 1
    workspace: str = "workspace"
    hooks: list[str] = []
    provider_options: dict[str, Any] = {}
    approval: _ApprovalConfig = msgspec.field(default_factory=_ApprovalConfig)
    compaction: _CompactionConfig = msgspec.field(default_factory=_CompactionConfig)


@dataclass(frozen=True)
class CompactionPolicy:
    """When the `compaction` hook compacts a session (`[compaction]` of config.toml)."""

    #: Compact when a model request's estimated size (`commonos.loop.compaction.estimate_tokens`) exceeds this.
    max_tokens: int = 100_000
    #: The model's context window, where known: the budget is never above it (less the call's output tokens).
    context_window: int | None = None


@dataclass(frozen=True)
class ApprovalPolicy:
    timeout_s: float = 120.0
    tools: dict[str, Policy] = field(default_factory=dict)

    def for_tool(self, name: str, high_risk: bool) -> Policy:
        """The profile's word for this tool, else: ask for a high-risk tool, run a low-risk one."""
        return self.tools.get(name, Policy.ASK if high_risk else Policy.AUTO)


@dataclass(frozen=True)
class Profile:
    id: str
    folder: Path
    tags: tuple[str, ...] = ()
    provider: str = "scripted"
    model: str = "scripted"
    system_prompt: str = ""
    tools: tuple[str, ...] = BUILTIN_TOOLS
    max_steps: int = 12
    max_delegation_depth: int = 1
    workspace: Path = Path("workspace")
    provider_options: dict[str, Any] = field(default_factory=dict)
    approval: ApprovalPolicy = field(default_factory=ApprovalPolicy)
    #: The names of the profile's loop hooks, in the order they run (`commonos.loop.hooks`).
    hooks: tuple[str, ...] = ()
    #: What the `compaction` hook reads, when the profile lists it.
    compaction: CompactionPolicy = field(default_factory=CompactionPolicy)

    @property
    def config_path(self) -> Path:
        return self.folder / CONFIG_FILE


def load_profile(folder: Path) -> Profile:
    """Read and validate `folder/config.toml`; the folder's name is the profile id."""
    path = folder / CONFIG_FILE
    try:
        profile_id = check_profile_id(folder.name)
    except InvalidProfileId as exc:
        raise ProfileError(path, str(exc)) from None
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ProfileError(path, f"cannot read: {exc.strerror}") from None
    try:
        config = convert(toml_document(raw), _ProfileConfig)
    except ConfigProblem as exc:
        raise ProfileError(path, str(exc)) from None

    try:
        tags = tuple(parse_tag(t) for t in config.tags)
    except InvalidTag as exc:
        raise ProfileError(path, f"tags: {exc}") from None
    if len(set(tags)) != len(tags):
        raise ProfileError(path, "tags: a tag is listed twice")
    if config.provider not in PROVIDERS:
        raise ProfileError(path, f"provider: unknown provider {config.provider!r} (one of {', '.join(PROVIDERS)})")
    if not config.model:
        raise ProfileError(path, "model: must not be empty")
    try:
        # Lenient like the providers reading it (a timeout of "30" is 30.0), strict about unknown keys.
        convert(config.provider_options, _PROVIDER_OPTIONS[config.provider], prefix="provider_options", strict=False)
    except ConfigProblem as exc:
        raise ProfileError(path, str(exc)) from None
    tools = tuple(config.tools) if config.tools is not None else BUILTIN_TOOLS
    for key, names in (("tools", tools), ("approval.tools", tuple(config.approval.tools))):
        for name in names:
            if name not in BUILTIN_TOOLS:
                raise ProfileError(path, f"{key}: unknown tool {name!r} (one of {', '.join(BUILTIN_TOOLS)})")
    _check_hooks(path, config.hooks)
    if config.max_steps < 1:
        raise ProfileError(path, f"max_steps: must be at least 1, got {config.max_steps}")
    if config.max_delegation_depth < 0:
        raise ProfileError(path, f"max_delegation_depth: must be 0 or more, got {config.max_delegation_depth}")
    for key, value in (
        ("compaction.max_tokens", config.compaction.max_tokens),
        ("compaction.context_window", config.compaction.context_window),
    ):
        if value is not None and value < 1:
            raise ProfileError(path, f"{key}: must be at least 1, got {value}")
    if not config.approval.timeout_s > 0:
        raise ProfileError(path, f"approval.timeout_s: must be positive, got {config.approval.timeout_s}")
    if config.system_prompt is not None and config.system_prompt_file is not None:
        raise ProfileError(path, "system_prompt_file: give system_prompt or system_prompt_file, not both")
    system_prompt = config.system_prompt or ""
    if config.system_prompt_file is not None:
        prompt_path = folder / config.system_prompt_file
        try:
            system_prompt = prompt_path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ProfileError(path, f"system_prompt_file: {prompt_path}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise ProfileError(path, f"system_prompt_file: {prompt_path}: not UTF-8 text") from None
        except ValueError as exc:  # a NUL in the file name
            raise ProfileError(path, f"system_prompt_file: {config.system_prompt_file!r}: {exc}") from None
    workspace = Path(os.path.expanduser(config.workspace))
    return Profile(
        id=profile_id,
        folder=folder,
        tags=tags,
        provider=config.provider,
        model=config.model,
        system_prompt=system_prompt,
        tools=tools,
        max_steps=config.max_steps,
        max_delegation_depth=config.max_delegation_depth,
        workspace=workspace if workspace.is_absolute() else folder / workspace,
        provider_options=dict(config.provider_options),
        approval=ApprovalPolicy(timeout_s=config.approval.timeout_s, tools=dict(config.approval.tools)),
        hooks=tuple(config.hooks),
        compaction=CompactionPolicy(
            max_tokens=config.compaction.max_tokens, context_window=config.compaction.context_window
        ),
    )


def _check_hooks(path: Path, names: list[str]) -> None:
    """Every hook name known (built in, or an entry point of `commonos.hooks`), none twice."""
    if not names:
        return
    known = hook_names()
    for i, name in enumerate(names):
        if name not in known:
            raise ProfileError(path, f"hooks[{i}]: unknown hook {name!r} (one of {', '.join(known)})")
        if name in names[:i]:
            raise ProfileError(path, f"hooks[{i}]: hook {name!r} is listed twice")


def load_profiles(root: Path) -> dict[str, Profile]:
    """Every profile under `root` (each sub-folder with a config.toml), all validated."""
    if not root.is_dir():
        raise ProfileError(root, "no such profiles folder (set COS_PROFILES_DIR)")
    profiles: dict[str, Profile] = {}
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if (folder / CONFIG_FILE).exists():
            profile = load_profile(folder)
            profiles[profile.id] = profile
    if not profiles:
        raise ProfileError(root, f"no profiles: expected {root}/<id>/{CONFIG_FILE}")
    return profiles
