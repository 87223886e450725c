"""Configuration from `COS_*` environment variables; a bad value is a one-line `ConfigError`."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final
from urllib.parse import urlparse

from commonos.proto.errors import ConfigError

PREFIX: Final = "COS_"
#: Default of COS_MAX_MESSAGE_BYTES: a quarter of nats-server's default max_payload.
DEFAULT_MAX_MESSAGE_BYTES: Final = 256 * 1024


__all__ = ["DEFAULT_MAX_MESSAGE_BYTES", "PREFIX", "ConfigError", "Settings", "env_float", "env_int", "env_path"]


def env_int(env: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    """The whole number in variable `name` (`default` when unset or blank); ConfigError naming it otherwise."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a whole number") from None
    if not lo <= value <= hi:
        raise ConfigError(f"{name}={value} is out of range ({lo} to {hi})")
    return value


def env_float(env: Mapping[str, str], name: str, default: float, lo: float, hi: float) -> float:
    """The number in variable `name` (`default` when unset or blank); ConfigError naming it otherwise."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if not lo <= value <= hi:
        raise ConfigError(f"{name}={value:g} is out of range ({lo:g} to {hi:g})")
    return value


def _int(env: Mapping[str, str], name: str, default: int, lo: int, hi: int) -> int:
    return env_int(env, PREFIX + name, default, lo, hi)


def _float(env: Mapping[str, str], name: str, default: float, lo: float, hi: float) -> float:
    return env_float(env, PREFIX + name, default, lo, hi)


_DURATION_UNITS: Final = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
_SIZE_UNITS: Final = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
#: The shortest retention of COS_EVENTS JetStream accepts: its duplicate window (Nats-Msg-Id), 10 minutes.
MIN_EVENTS_MAX_AGE_S: Final = 600.0
MIN_EVENTS_MAX_BYTES: Final = 1024 * 1024


def _duration(env: Mapping[str, str], name: str, lo: float) -> float | None:
    """Seconds, from `3600`, `90s`, `15m`, `36h` or `30d`; 0 means unbounded; unset is None."""
    raw = env.get(PREFIX + name, "").strip()
    if not raw:
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhd]?)", raw)
    if match is None:
        raise ConfigError(f"{PREFIX}{name}={raw!r} is not a duration (seconds, or a number ending in s, m, h or d)")
    value = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    if value != 0 and value < lo:
        raise ConfigError(f"{PREFIX}{name}={raw!r} is shorter than {lo:.0f}s (0 means unbounded)")
    return value


def _size(env: Mapping[str, str], name: str, lo: int) -> int | None:
    """Bytes, from `1048576`, `512M`, `20G` or `1T` (powers of 1024, an optional `iB`/`B`); 0 means
    unbounded; unset is None."""
    raw = env.get(PREFIX + name, "").strip()
    if not raw:
        return None
    match = re.fullmatch(r"(\d+)\s*([KMGT]?)(?:i?B)?", raw, flags=re.IGNORECASE)
    if match is None:
        raise ConfigError(f"{PREFIX}{name}={raw!r} is not a size (bytes, or a number ending in K, M, G or T)")
    value = int(match.group(1)) * _SIZE_UNITS[match.group(2).upper()]
    if value != 0 and value < lo:
        raise ConfigError(f"{PREFIX}{name}={raw!r} is smaller than {lo} bytes (0 means unbounded)")
    return value


def _url(env: Mapping[str, str], name: str, schemes: tuple[str, ...]) -> str | None:
    raw = env.get(PREFIX + name)
    if not raw:
        return None
    for part in raw.split(","):
        try:
            parsed = urlparse(part.strip())
        except ValueError as exc:
            raise ConfigError(f"{PREFIX}{name}={part.strip()!r} is not a URL: {exc}") from None
        if parsed.scheme not in schemes or not parsed.hostname:
            raise ConfigError(f"{PREFIX}{name}={part.strip()!r} is not a URL of the form {schemes[0]}://host:port")
        try:
            _ = parsed.port
        except ValueError:
            raise ConfigError(f"{PREFIX}{name}={part.strip()!r} has a bad port") from None
    return raw


def env_path(env: Mapping[str, str], name: str) -> Path | None:
    """The path in variable `name`, `~` expanded (None when unset or empty); ConfigError naming it otherwise."""
    raw = env.get(name)
    if not raw:
        return None
    try:
        return Path(raw).expanduser()
    except RuntimeError as exc:  # ~user of a user that does not exist
        raise ConfigError(f"{name}={raw!r}: {exc}") from None


def _path(env: Mapping[str, str], name: str) -> Path | None:
    return env_path(env, PREFIX + name)


def _secret_or_file(env: Mapping[str, str], name: str) -> str | None:
    """A secret from `COS_<NAME>` or from the file named by `COS_<NAME>_FILE`."""
    direct = env.get(PREFIX + name)
    if direct:
        return direct
    file_name = env.get(PREFIX + name + "_FILE")
    if not file_name:
        return None
    try:
        return Path(file_name).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"{PREFIX}{name}_FILE={file_name!r}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{PREFIX}{name}_FILE={file_name!r}: not UTF-8 text") from None
    except ValueError as exc:  # a NUL in the name
        raise ConfigError(f"{PREFIX}{name}_FILE={file_name!r}: {exc}") from None


@dataclass(frozen=True, kw_only=True)
class Settings:
    """What every service reads from its environment (URLs left unset mean "embedded"). A setting that one
    service alone reads lives with that service (`commonos.billing.settings`, `commonos.loop.settings`,
    `commonos.otlp_gateway.settings`, `commonos.console.settings`)."""

    nats_url: str | None = None
    database_url: str | None = None
    #: A streaming replica of `database_url` that the read-only consumers read (the console's pages, `cos report
    #: cost`, the loop's session_search); None: they read `database_url`. Writes never go there.
    database_read_url: str | None = None
    nats_creds: Path | None = None
    nats_user: str | None = None
    nats_password: str | None = field(default=None, repr=False)
    nats_tls_ca: Path | None = None
    nats_tls_cert: Path | None = None
    nats_tls_key: Path | None = None
    stream_replicas: int = 1
    http_host: str = "127.0.0.1"
    http_port: int = 0
    data_dir: Path = Path(".cos")
    profiles_dir: Path = Path("profiles")
    batch_size: int = 1000
    batch_timeout_s: float = 0.005
    drain_timeout_s: float = 10.0
    partitions: int = 1
    partition: int | None = None
    #: The largest message (its `message_appended` event, encoded) the loop records; chat text over it
    #: is rejected, a tool result over it is truncated with a marker. Never more than the server allows.
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    #: max_payload of the nats-server `cos up` starts (None: nats-server's default, 1 MiB).
    nats_max_payload: int | None = None
    #: Retention of COS_EVENTS, applied by `cos streams ensure` and `cos up` (0: unbounded; None: not
    #: configured, which leaves the stream's own as they are, unbounded when it is created).
    events_max_age_s: float | None = None
    events_max_bytes: int | None = None
    log_level: str = "INFO"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, http_port: int = 0) -> Settings:
        env = os.environ if env is None else env
        level = env.get(PREFIX + "LOG_LEVEL", "INFO").upper()
        if level not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
            raise ConfigError(f"{PREFIX}LOG_LEVEL={level!r} is not DEBUG, INFO, WARNING or ERROR")
        partitions = _int(env, "PARTITIONS", 1, 1, 1024)
        raw_partition = env.get(PREFIX + "PARTITION")
        partition = None if not raw_partition else _int(env, "PARTITION", 0, 0, partitions - 1)
        return cls(
            nats_url=_url(env, "NATS_URL", ("nats", "tls", "ws", "wss")),
            database_url=_url(env, "DATABASE_URL", ("postgresql", "postgres")),
            database_read_url=_url(env, "DATABASE_READ_URL", ("postgresql", "postgres")),
            nats_creds=_path(env, "NATS_CREDS"),
            nats_user=env.get(PREFIX + "NATS_USER") or None,
            nats_password=_secret_or_file(env, "NATS_PASSWORD"),
            nats_tls_ca=_path(env, "NATS_TLS_CA"),
            nats_tls_cert=_path(env, "NATS_TLS_CERT"),
            nats_tls_key=_path(env, "NATS_TLS_KEY"),
            stream_replicas=_int(env, "STREAM_REPLICAS", 1, 1, 5),
            http_host=env.get(PREFIX + "HTTP_HOST", "127.0.0.1"),
            http_port=_int(env, "HTTP_PORT", http_port, 0, 65535),
            data_dir=_path(env, "DATA_DIR") or Path(".cos"),
            profiles_dir=_path(env, "PROFILES_DIR") or Path("profiles"),
            batch_size=_int(env, "BATCH_SIZE", 1000, 1, 10000),
            batch_timeout_s=_float(env, "BATCH_TIMEOUT_S", 0.005, 0.0, 60.0),
            drain_timeout_s=_float(env, "DRAIN_TIMEOUT_S", 10.0, 0.1, 600.0),
            partitions=partitions,
            partition=partition,
            max_message_bytes=_int(env, "MAX_MESSAGE_BYTES", DEFAULT_MAX_MESSAGE_BYTES, 1024, 64 * 1024 * 1024),
            nats_max_payload=(
                _int(env, "NATS_MAX_PAYLOAD", 1024 * 1024, 4096, 64 * 1024 * 1024)
                if env.get(PREFIX + "NATS_MAX_PAYLOAD")
                else None
            ),
            events_max_age_s=_duration(env, "EVENTS_MAX_AGE", MIN_EVENTS_MAX_AGE_S),
            events_max_bytes=_size(env, "EVENTS_MAX_BYTES", MIN_EVENTS_MAX_BYTES),
            log_level=level,
        )

    @property
    def read_database_url(self) -> str | None:
        """Where the read-only consumers read: the replica (COS_DATABASE_READ_URL), else the primary."""
        return self.database_read_url or self.database_url

    def require_urls(self) -> tuple[str, str]:
        if not self.nats_url:
            raise ConfigError(f"{PREFIX}NATS_URL is not set (or run everything embedded with `cos up`)")
        if not self.database_url:
            raise ConfigError(f"{PREFIX}DATABASE_URL is not set (or run everything embedded with `cos up`)")
        return self.nats_url, self.database_url
