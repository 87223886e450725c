"""Model providers: `scripted` (a file of replies), `anthropic` (Messages API) and `openai` (Chat Completions), both
streamed through the vendors' official SDKs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from commonos.loop.profiles import Profile, ProfileError
from commonos.loop.providers.anthropic import AnthropicProvider
from commonos.loop.providers.base import (
    DeltaCallback,
    ModelDelta,
    ModelRequest,
    ModelResponse,
    Provider,
    ProviderError,
    StreamingProvider,
    ToolSpec,
    complete_with_deltas,
)
from commonos.loop.providers.openai import OpenAIProvider
from commonos.loop.providers.scripted import ScriptedProvider, ScriptError

__all__ = [
    "BUILDERS",
    "AnthropicProvider",
    "DeltaCallback",
    "ModelDelta",
    "ModelRequest",
    "ModelResponse",
    "OpenAIProvider",
    "Provider",
    "ProviderError",
    "ScriptedProvider",
    "StreamingProvider",
    "ToolSpec",
    "build_provider",
    "complete_with_deltas",
]


def _scripted(profile: Profile) -> Provider:
    return ScriptedProvider.from_file(profile.folder / str(profile.provider_options.get("script", "script.toml")))


#: How each provider a profile may name is built from the profile (its `provider_options` were checked against
#: the provider's Struct in `commonos.loop.profiles`).
BUILDERS: Final[dict[str, Callable[[Profile], Provider]]] = {
    "scripted": _scripted,
    "anthropic": lambda profile: AnthropicProvider.from_options(profile.provider_options),
    "openai": lambda profile: OpenAIProvider.from_options(profile.provider_options),
}


def build_provider(profile: Profile) -> Provider:
    """The provider a profile names, configured from its `provider_options`; `ProfileError` if it cannot be."""
    build = BUILDERS.get(profile.provider)
    if build is None:
        raise ProfileError(profile.config_path, f"unknown provider {profile.provider!r}")
    try:
        return build(profile)
    except (ScriptError, ValueError, TypeError) as exc:
        raise ProfileError(profile.config_path, f"provider {profile.provider}: {exc}") from None
