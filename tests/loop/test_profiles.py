"""Profiles are validated at start; every mistake names its file."""

from __future__ import annotations

from pathlib import Path

import pytest

from commonos.loop.profiles import BUILTIN_TOOLS, Policy, ProfileError, load_profile, load_profiles
from commonos.loop.providers import ScriptedProvider, build_provider
from commonos.loop.tools import builtin_tools
from tests.conftest import REPO


def write(root: Path, profile_id: str, config: str) -> Path:
    folder = root / profile_id
    folder.mkdir(parents=True)
    (folder / "config.toml").write_text(config)
    return folder


def test_the_sample_profile_loads_and_its_script_parses() -> None:
    profiles = load_profiles(REPO / "profiles")
    default = profiles["default"]
    assert default.tags == ("area:demo", "client:acme", "team:core")
    assert default.tools == BUILTIN_TOOLS
    assert default.approval.for_tool("shell", high_risk=True) is Policy.ASK
    assert default.approval.for_tool("write_file", high_risk=True) is Policy.DENY
    assert isinstance(build_provider(default), ScriptedProvider)
    assert tuple(builtin_tools()) == BUILTIN_TOOLS


def test_the_default_profile_bills_its_turns_to_a_client() -> None:
    """Issue 32: under `cos up` the default profile had no `client:` tag, so the README's cost per client showed
    only "(none)"; its turns now carry one, which `cos report cost --group-by tag:client` groups by."""
    default = load_profiles(REPO / "profiles")["default"]
    assert [tag for tag in default.tags if tag.startswith("client:")] == ["client:acme"]


def test_defaults_and_a_prompt_file(tmp_path: Path) -> None:
    folder = write(tmp_path, "p1", 'system_prompt_file = "prompt.md"\n')
    (folder / "prompt.md").write_text("Hi.")
    profile = load_profile(folder)
    assert (profile.id, profile.provider, profile.system_prompt, profile.max_steps) == ("p1", "scripted", "Hi.", 12)
    assert profile.workspace == folder / "workspace"
    # unnamed tools: high risk asks, low risk runs
    assert profile.approval.for_tool("write_file", high_risk=True) is Policy.ASK
    assert profile.approval.for_tool("read_file", high_risk=False) is Policy.AUTO


@pytest.mark.parametrize(
    ("profile_id", "config", "problem"),
    [
        ("ok", 'tags = ["Area:x"]\n', "invalid tag 'Area:x': upper case in the key"),
        ("ok", 'tags = ["a:b:c"]\n', "invalid tag 'a:b:c': exactly one ':' allowed, found 2"),
        ("ok", 'tags = ["area"]\n', "invalid tag 'area': no value"),
        (
            "ok",
            f'tags = ["client:{"a" * 250}"]\n',
            f"invalid tag 'client:{'a' * 33}…' (257 characters): longer than 256 characters",
        ),
        ("Bad", "", "invalid profile id 'Bad'"),
        ("ok", 'provider = "cohere"\n', "unknown provider 'cohere'"),
        ("ok", 'tools = ["shell", "rm"]\n', "unknown tool 'rm'"),
        ("ok", '[approval]\ntools = { shell = "maybe" }\n', "approval.tools[...]: invalid enum value 'maybe'"),
        ("ok", "max_steps = 0\n", "max_steps: must be at least 1, got 0"),
        ("ok", "colour = 1\n", "colour: unknown key"),
        ("ok", "[approval]\ntimeout = 5\n", "approval.timeout: unknown key"),
        ("ok", '[provider_options]\nscirpt = "s.toml"\n', "provider_options.scirpt: unknown key"),
        (
            "ok",
            'provider = "anthropic"\n[provider_options]\nscript = "s.toml"\n',
            "provider_options.script: unknown key",
        ),
        (
            "ok",
            "[provider_options]\nmax_tokens = []\n",
            "provider_options.max_tokens: expected an integer, got an array",
        ),
        ("ok", "max_steps = '3'\n", "max_steps: expected an integer, got a string"),
        ("ok", "max_steps = \n", "invalid TOML"),
        ("ok", 'tags = ["a:b", "a:b"]\n', "a tag is listed twice"),
    ],
)
def test_a_bad_profile_is_an_error_naming_the_file(tmp_path: Path, profile_id: str, config: str, problem: str) -> None:
    folder = write(tmp_path, profile_id, config)
    with pytest.raises(ProfileError) as failure:
        load_profiles(tmp_path)
    assert failure.value.path == folder / "config.toml"
    assert str(failure.value).startswith(f"{folder / 'config.toml'}: ")
    assert problem in failure.value.problem


def test_no_profiles_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="no profiles"):
        load_profiles(tmp_path)
    with pytest.raises(ProfileError, match="no such profiles folder"):
        load_profiles(tmp_path / "missing")


def test_a_bad_script_is_an_error_naming_the_profile(tmp_path: Path) -> None:
    folder = write(tmp_path, "s", "")
    (folder / "script.toml").write_text("[[conversations]]\n[[conversations.steps]]\nwords = 1\n")
    with pytest.raises(ProfileError) as failure:
        build_provider(load_profile(folder))
    assert (
        failure.value.path == folder / "config.toml"
        and "conversations[0].steps[0].words: unknown key" in failure.value.problem
    )
