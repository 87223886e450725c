"""JSON over HTTP with timeouts and retries with backoff on 408/409/429/5xx and connection errors."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from commonos.loop.providers.base import ProviderError

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504, 529})
MAX_RETRY_AFTER_S = 60.0


@dataclass(frozen=True)
class HttpReply:
    status: int
    headers: Mapping[str, str]
    body: dict[str, Any]
    latency_s: float


def _retry_after_s(headers: Mapping[str, str]) -> float | None:
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        raw = headers.get(name)
        if raw is not None:
            try:
                return min(max(float(raw) * scale, 0.0), MAX_RETRY_AFTER_S)
            except ValueError:
                return None
    return None


def _error_text(body: Any, fallback: str) -> str:
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
    return fallback


class JsonClient:
    """One aiohttp session per provider, created on first use (it needs a running loop)."""

    def __init__(
        self,
        provider: str,
        *,
        timeout_s: float = 120.0,
        max_retries: int = 4,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 8.0,
    ) -> None:
        self.provider = provider
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _backoff_s(self, attempt: int) -> float:
        delay: float = min(self.backoff_base_s * 2**attempt, self.backoff_max_s)
        return delay * (0.5 + random.random() / 2)

    async def post(self, url: str, headers: Mapping[str, str], body: Mapping[str, Any]) -> HttpReply:
        attempt = 0
        while True:
            started = time.monotonic()
            retry_after: float | None = None
            try:
                async with self._client().post(url, json=body, headers=dict(headers)) as resp:
                    try:
                        payload: Any = await resp.json(content_type=None)
                    except ValueError:
                        payload = None
                    latency_s = time.monotonic() - started
                    if resp.status < 300 and isinstance(payload, dict):
                        return HttpReply(resp.status, resp.headers, payload, latency_s)
                    message = _error_text(payload, f"HTTP {resp.status}")
                    if resp.status < 300:
                        raise ProviderError(self.provider, f"response is not a JSON object (HTTP {resp.status})")
                    if resp.status not in RETRY_STATUSES:
                        raise ProviderError(self.provider, f"HTTP {resp.status}: {message}", status=resp.status)
                    failure = ProviderError(
                        self.provider, f"HTTP {resp.status}: {message}", status=resp.status, retryable=True
                    )
                    retry_after = _retry_after_s(resp.headers)
            except (TimeoutError, aiohttp.ClientError) as exc:
                kind = "timed out" if isinstance(exc, asyncio.TimeoutError) else f"{type(exc).__name__}: {exc}"
                failure = ProviderError(self.provider, f"request {kind}", retryable=True)
            if attempt >= self.max_retries:
                raise ProviderError(
                    self.provider,
                    f"{failure.detail} (after {attempt + 1} attempts)",
                    status=failure.status,
                    retryable=True,
                ) from failure
            delay = retry_after if retry_after is not None else self._backoff_s(attempt)
            log.warning("%s: %s; retry %d in %.1fs", self.provider, failure, attempt + 1, delay)
            await asyncio.sleep(delay)
            attempt += 1
