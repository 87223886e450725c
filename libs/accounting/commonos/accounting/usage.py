"""Token usage in CommonOS' own convention, and converters from each vendor's usage shape.

This is the convention of the ``model_call_completed`` event and of the ``model_calls`` table:

* The four input buckets are disjoint; the total input of a call is
  ``input_tokens + cache_read_tokens + cache_write_5m_tokens + cache_write_1h_tokens``.

  - ``input_tokens``: uncached input only. It EXCLUDES cache-read and cache-write tokens
    (Anthropic's convention; OpenAI's ``prompt_tokens`` and genai-prices' ``input_tokens`` include them).
  - ``cache_read_tokens``: input served from the prompt cache.
  - ``cache_write_5m_tokens``: input written to the cache at the standard (5 minute) cache-write rate.
    Vendors with a single cache-write price (OpenAI) report their writes here.
  - ``cache_write_1h_tokens``: input written to Anthropic's 1 hour cache (a dearer rate).

* ``output_tokens`` INCLUDES reasoning ("thinking") tokens. ``reasoning_tokens`` says how much of the output
  was reasoning; it is informational and never priced on top of ``output_tokens``.

* ``usage_estimated`` is set when the counts were estimated (e.g. a stream cut off before the vendor sent
  its usage); a cost computed from such counts is marked ``estimated``.

* ``service_tier`` and ``speed`` are the vendor's words for the price tier of the call (``"batch"``,
  ``"priority"``, ``"flex"``, ``"fast"``...); they select price variants in genai-prices.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from commonos.proto.errors import DataError

__all__ = ["TokenUsage", "UsageError", "from_anthropic_usage", "from_codex_usage", "from_openai_usage"]


class UsageError(DataError):
    """A usage record that cannot be put in our convention (negative counts, parts larger than wholes)."""


class TokenUsage(msgspec.Struct, frozen=True, kw_only=True):
    """Token counts of one model call, in the convention described in the module docstring."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_5m_tokens: int = 0
    cache_write_1h_tokens: int = 0
    reasoning_tokens: int = 0
    usage_estimated: bool = False
    service_tier: str | None = None
    speed: str | None = None

    def __post_init__(self) -> None:
        # Checked here, not only on decode, so a converter bug cannot produce a negative bill.
        for name in (
            "input_tokens",
            "output_tokens",
            "cache_read_tokens",
            "cache_write_5m_tokens",
            "cache_write_1h_tokens",
            "reasoning_tokens",
        ):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise UsageError(f"{name} must be a non-negative int, got {value!r}")
        if self.reasoning_tokens > self.output_tokens:
            raise UsageError(
                f"reasoning_tokens ({self.reasoning_tokens}) cannot exceed "
                f"output_tokens ({self.output_tokens}) which includes it"
            )

    @property
    def total_input_tokens(self) -> int:
        """All input tokens: uncached + cache read + both cache writes."""
        return self.input_tokens + self.cache_read_tokens + self.cache_write_5m_tokens + self.cache_write_1h_tokens


def _count(data: Mapping[str, Any] | None, *path: str) -> int:
    """An integer count at ``path``; absent or null counts are 0 (vendors omit zero details)."""
    value: Any = data
    for key in path:
        if not isinstance(value, Mapping):
            return 0
        value = value.get(key)
    if value is None:
        return 0
    if type(value) is not int or value < 0:
        raise UsageError(f"usage field {'.'.join(path)} must be a non-negative int, got {value!r}")
    return value


def _text(data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    return value if isinstance(value, str) and value else None


def _part_of(part_name: str, part: int, whole_name: str, whole: int) -> int:
    """``whole - part``, refusing a part larger than the whole it is said to be included in."""
    if part > whole:
        raise UsageError(f"{part_name} ({part}) cannot exceed {whole_name} ({whole}) which includes it")
    return whole - part


def from_anthropic_usage(usage: Mapping[str, Any], *, estimated: bool = False) -> TokenUsage:
    """Convert an Anthropic Messages API ``usage`` object.

    Anthropic already reports ``input_tokens`` without cache reads and writes. The cache-write total
    ``cache_creation_input_tokens`` is split by ``cache_creation.ephemeral_1h_input_tokens``; what is not
    1 hour is 5 minutes (the default TTL, and the only one older responses know).
    """
    cache_write_total = (
        _count(usage, "cache_creation_input_tokens")
        if usage.get("cache_creation_input_tokens") is not None
        else _count(usage, "cache_creation", "ephemeral_5m_input_tokens")
        + _count(usage, "cache_creation", "ephemeral_1h_input_tokens")
    )
    cache_write_1h = _count(usage, "cache_creation", "ephemeral_1h_input_tokens")
    cache_write_5m = _part_of(
        "cache_creation.ephemeral_1h_input_tokens",
        cache_write_1h,
        "cache_creation_input_tokens",
        cache_write_total,
    )
    return TokenUsage(
        input_tokens=_count(usage, "input_tokens"),
        output_tokens=_count(usage, "output_tokens"),
        cache_read_tokens=_count(usage, "cache_read_input_tokens"),
        cache_write_5m_tokens=cache_write_5m,
        cache_write_1h_tokens=cache_write_1h,
        reasoning_tokens=_count(usage, "output_tokens_details", "thinking_tokens"),
        usage_estimated=estimated,
        service_tier=_text(usage, "service_tier"),
        speed=_text(usage, "speed"),
    )


def from_openai_usage(
    usage: Mapping[str, Any], *, service_tier: str | None = None, estimated: bool = False
) -> TokenUsage:
    """Convert an OpenAI ``usage`` object from Chat Completions or the Responses API.

    Chat Completions: ``prompt_tokens`` includes ``prompt_tokens_details.cached_tokens`` (and
    ``cache_write_tokens``); ``completion_tokens`` includes ``completion_tokens_details.reasoning_tokens``.
    Responses: the same with ``input_tokens``/``input_tokens_details`` and
    ``output_tokens``/``output_tokens_details``. ``service_tier`` sits on the response, not in ``usage``,
    so the caller passes it.
    """
    if "prompt_tokens" in usage:
        input_key, input_details, output_key, output_details = (
            "prompt_tokens",
            "prompt_tokens_details",
            "completion_tokens",
            "completion_tokens_details",
        )
    else:
        input_key, input_details, output_key, output_details = (
            "input_tokens",
            "input_tokens_details",
            "output_tokens",
            "output_tokens_details",
        )
    total_input = _count(usage, input_key)
    cached = _count(usage, input_details, "cached_tokens")
    cache_write = _count(usage, input_details, "cache_write_tokens")
    output = _count(usage, output_key)
    return TokenUsage(
        input_tokens=_part_of(f"{input_details} cached + cache-write", cached + cache_write, input_key, total_input),
        output_tokens=output,
        cache_read_tokens=cached,
        cache_write_5m_tokens=cache_write,
        reasoning_tokens=_count(usage, output_details, "reasoning_tokens"),
        usage_estimated=estimated,
        service_tier=service_tier or _text(usage, "service_tier"),
    )


def from_codex_usage(usage: Mapping[str, Any], *, estimated: bool = False) -> TokenUsage:
    """Convert a Codex ``token_count`` event's ``last_token_usage``.

    ``input_tokens`` includes ``cached_input_tokens``; ``output_tokens`` includes ``reasoning_output_tokens``.
    Use ``last_token_usage`` (this call), never ``total_token_usage`` (the running session total).
    """
    total_input = _count(usage, "input_tokens")
    cached = _count(usage, "cached_input_tokens")
    return TokenUsage(
        input_tokens=_part_of("cached_input_tokens", cached, "input_tokens", total_input),
        output_tokens=_count(usage, "output_tokens"),
        cache_read_tokens=cached,
        reasoning_tokens=_count(usage, "reasoning_output_tokens"),
        usage_estimated=estimated,
    )
