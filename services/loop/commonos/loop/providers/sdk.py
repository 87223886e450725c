"""What the vendors' SDKs raise, as `ProviderError`: the status, whether trying again could help, one line.

Both SDKs retry by themselves (`max_retries`, with exponential backoff and the server's `retry-after`) on
connection errors, timeouts, 408, 409, 429 and 5xx, before the first byte of a streamed answer; an error
that reaches us after that has had its retries. An error in the middle of a stream is not retried by the
SDK: it is `retryable` (a new call could succeed) with no status.
"""

from __future__ import annotations

from commonos.loop.providers.base import ProviderError


def retried_status(status: int) -> bool:
    """Whether the SDKs retry an answer with this status (their policy: 408, 409, 429, 5xx)."""
    return status in (408, 409, 429) or status >= 500


def status_error(provider: str, status: int, message: str | None, max_retries: int) -> ProviderError:
    """An HTTP error answer (4xx/5xx) after the SDK's retries; a 2xx one is an error event inside the stream."""
    text = message or f"HTTP {status}"
    if status < 400:
        return ProviderError(provider, f"error in the stream: {text}", retryable=True)
    if retried_status(status):
        return ProviderError(
            provider, f"HTTP {status}: {text} (after {max_retries + 1} attempts)", status=status, retryable=True
        )
    return ProviderError(provider, f"HTTP {status}: {text}", status=status)


def connection_error(provider: str, *, timed_out: bool, max_retries: int, detail: str = "") -> ProviderError:
    what = "request timed out" if timed_out else f"connection failed{': ' + detail if detail else ''}"
    return ProviderError(provider, f"{what} (after {max_retries + 1} attempts)", retryable=True)


def stream_broken(provider: str, exc: BaseException, *, timed_out: bool) -> ProviderError:
    """The connection failed, or fell silent past the timeout, while the answer streamed (the SDK does not retry
    that: the answer had begun)."""
    if timed_out:
        return ProviderError(provider, "the stream stopped: nothing came within the timeout", retryable=True)
    return ProviderError(provider, f"the stream broke off: {type(exc).__name__}: {exc}".rstrip(": "), retryable=True)
