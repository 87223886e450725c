"""A service's life: run under asyncio (uvloop where available), SIGTERM sets a stop event."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Awaitable, Callable

from commonos.runtime.settings import ConfigError

log = logging.getLogger(__name__)


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def install_stop_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


def run(main: Callable[[], Awaitable[int | None]]) -> int:
    """Run `main` to completion; configuration errors are one line on stderr and exit code 2."""
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency on every supported platform
        pass

    async def _main() -> int | None:
        return await main()

    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            code = runner.run(_main())
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return int(code or 0)
