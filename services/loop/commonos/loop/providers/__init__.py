"""Model providers: `scripted` (a file of replies), `anthropic` (Messages API), `openai` (Chat Completions)."""

from __future__ import annotations

from commonos.loop.profiles import Profile, ProfileError
from commonos.loop.providers.anthropic import AnthropicProvider
from commonos.loop.providers.base import ModelRequest, ModelResponse, Provider, ProviderError, ToolSpec
from commonos.loop.providers.openai import OpenAIProvider
from commonos.loop.providers.scripted import ScriptedProvider, ScriptError

__all__ = [
    "AnthropicProvider",
    "ModelRequest",
    "ModelResponse",
    "OpenAIProvider",
    "Provider",
    "ProviderError",
    "ScriptedProvider",
    "ToolSpec",
    "build_provider",
]


def build_provider(profile: Profile) -> Provider:
    """The provider a profile names, configured from its `provider_options`; `ProfileError` if it cannot be."""
    options = profile.provider_options
    try:
        if profile.provider == "scripted":
            script = profile.folder / str(options.get("script", "script.toml"))
            return ScriptedProvider.from_file(script)
        if profile.provider == "anthropic":
            return AnthropicProvider.from_options(options)
        if profile.provider == "openai":
            return OpenAIProvider.from_options(options)
    except (ScriptError, ValueError, TypeError) as exc:
        raise ProfileError(profile.config_path, f"provider {profile.provider}: {exc}") from None
    raise ProfileError(profile.config_path, f"unknown provider {profile.provider!r}")
