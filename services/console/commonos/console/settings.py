"""The console's own settings (`COS_CONSOLE_*`), beside the common ones of `commonos.runtime.settings`.

    COS_CONSOLE_HOST              address to listen on (default 127.0.0.1; 0.0.0.0 in a container)
    COS_CONSOLE_PORT              its port (default 8470); /metrics and /healthz are served on it too
    COS_CONSOLE_USERS             the people file (default config/console-users.toml): `cos console user add`
    COS_CONSOLE_SECRET[_FILE]     the key signing session cookies and CSRF tokens (default: a random key per
                                  process, so sessions end when it restarts; set it when running several)
    COS_CONSOLE_INSECURE_COOKIES  1: cookies without the Secure flag, for http://127.0.0.1 only (tests, demo)
    COS_CONSOLE_SESSION_HOURS     how long a sign-in lasts (default 12)
    COS_CONSOLE_TRUSTED_HEADER    a header naming the signed-in person, set by a reverse proxy (e.g.
                                  X-Forwarded-User); believed only from COS_CONSOLE_TRUSTED_PROXIES
    COS_CONSOLE_TRUSTED_PROXIES   comma-separated addresses or networks of those proxies (e.g. 10.0.0.0/8)
    COS_CONSOLE_STATEMENT_TIMEOUT_MS  the longest a page's query may run (default 10000)
    COS_CONSOLE_ORIGINS           comma-separated origins the browser may call from besides the request's own
                                  Host (e.g. https://console.example.com behind a proxy that rewrites Host)
    COS_CONSOLE_HOSTS             comma-separated host names the console answers to besides loopback names,
                                  address literals and the hosts of COS_CONSOLE_ORIGINS (e.g. `console`, a
                                  compose service); any other Host is 421 (a DNS-rebinding page's)
    COS_CONSOLE_MAX_BODY_BYTES    the largest request body of a signed-in person (default 1 MiB); without a
                                  sign-in at most 8 KiB (the sign-in forms). Past it: 413, before it is read
    COS_CONSOLE_HEADER_TIMEOUT_S  a connection that has not sent a whole request head within this is closed
                                  (default 10; slow-header clients hold no sockets)

COS_NATS_URL and COS_DATABASE_URL (and their credentials) are read as by every service.
"""

from __future__ import annotations

import ipaddress
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from commonos.proto.errors import ConfigError
from commonos.runtime.settings import Settings, env_float, env_int

DEFAULT_PORT: Final = 8470
DEFAULT_USERS_FILE: Final = Path("config/console-users.toml")
_HEADER: Final = re.compile(r"[A-Za-z0-9-]{1,64}")
_HOST: Final = re.compile(r"[a-z0-9_-]{1,63}(\.[a-z0-9_-]{1,63})*")
#: The largest request body without a sign-in: the sign-in forms (a name of 128, a password of 1,024 characters).
ANONYMOUS_BODY_BYTES: Final = 8 * 1024

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(raw: str, name: str = "COS_CONSOLE_TRUSTED_PROXIES") -> tuple[Network, ...]:
    out: list[Network] = []
    for part in (p.strip() for p in raw.split(",")):
        if not part:
            continue
        try:
            out.append(ipaddress.ip_network(part, strict=False))
        except ValueError:
            raise ConfigError(f"{name}: {part!r} is not an address or a network (10.0.0.0/8)") from None
    return tuple(out)


def _secret(env: Mapping[str, str]) -> str | None:
    direct = env.get("COS_CONSOLE_SECRET", "").strip()
    if direct:
        return direct
    file_name = env.get("COS_CONSOLE_SECRET_FILE", "").strip()
    if not file_name:
        return None
    try:
        return Path(file_name).read_text(encoding="utf-8").strip() or None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"COS_CONSOLE_SECRET_FILE={file_name!r}: {exc}") from None


@dataclass(frozen=True, kw_only=True)
class ConsoleSettings:
    """Everything the console reads from its environment."""

    common: Settings = field(default_factory=Settings)
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    users_file: Path = DEFAULT_USERS_FILE
    #: Signs the session cookie and derives CSRF tokens; random when not configured.
    secret: str = field(default_factory=lambda: secrets.token_urlsafe(32), repr=False)
    secure_cookies: bool = True
    session_max_age_s: int = 12 * 3600
    trusted_header: str | None = None
    trusted_proxies: tuple[Network, ...] = ()
    statement_timeout_ms: int = 10_000
    pool_max_size: int = 8
    #: Origins (scheme://host[:port]) accepted besides the request's Host, for the CSRF and WebSocket checks.
    origins: tuple[str, ...] = ()
    #: True when no COS_CONSOLE_SECRET was given (a random key: sign-ins end with the process).
    secret_is_random: bool = True
    #: Host names served besides loopback names, address literals and the hosts of `origins` (lower case).
    hosts: tuple[str, ...] = ()
    #: The largest request body of a signed-in person; without a sign-in, ANONYMOUS_BODY_BYTES.
    max_body_bytes: int = 1024 * 1024
    #: Seconds a connection may take to send a whole request head.
    header_timeout_s: float = 10.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, common: Settings | None = None) -> ConsoleSettings:
        env = os.environ if env is None else env
        header = env.get("COS_CONSOLE_TRUSTED_HEADER", "").strip() or None
        if header is not None and not _HEADER.fullmatch(header):
            raise ConfigError(f"COS_CONSOLE_TRUSTED_HEADER={header!r} is not a header name")
        proxies = parse_networks(env.get("COS_CONSOLE_TRUSTED_PROXIES", ""))
        if header is not None and not proxies:
            raise ConfigError("COS_CONSOLE_TRUSTED_HEADER is set but COS_CONSOLE_TRUSTED_PROXIES is empty")
        secret = _secret(env)
        if secret is not None and len(secret) < 16:
            raise ConfigError("COS_CONSOLE_SECRET is shorter than 16 characters")
        insecure = env.get("COS_CONSOLE_INSECURE_COOKIES", "").strip().lower()
        if insecure not in {"", "0", "1", "false", "true", "no", "yes"}:
            raise ConfigError(f"COS_CONSOLE_INSECURE_COOKIES={insecure!r} is not 0 or 1")
        origins = tuple(
            o.strip().rstrip("/").lower() for o in env.get("COS_CONSOLE_ORIGINS", "").split(",") if o.strip()
        )
        for origin in origins:
            if not re.fullmatch(r"https?://[a-z0-9.\-\[\]:]+", origin):
                raise ConfigError(f"COS_CONSOLE_ORIGINS: {origin!r} is not an origin (https://host[:port])")
        hosts = tuple(h.strip().lower().rstrip(".") for h in env.get("COS_CONSOLE_HOSTS", "").split(",") if h.strip())
        for host in hosts:
            if not _HOST.fullmatch(host):
                raise ConfigError(f"COS_CONSOLE_HOSTS: {host!r} is not a host name (letters, digits, . and -)")
        values: dict[str, object] = {
            "origins": origins,
            "hosts": hosts,
            "max_body_bytes": env_int(env, "COS_CONSOLE_MAX_BODY_BYTES", 1024 * 1024, ANONYMOUS_BODY_BYTES, 1 << 30),
            "header_timeout_s": env_float(env, "COS_CONSOLE_HEADER_TIMEOUT_S", 10.0, 0.1, 3600.0),
            "common": common if common is not None else Settings.from_env(env),
            "host": env.get("COS_CONSOLE_HOST", "").strip() or "127.0.0.1",
            "port": env_int(env, "COS_CONSOLE_PORT", DEFAULT_PORT, 0, 65535),
            "users_file": Path(env.get("COS_CONSOLE_USERS", "").strip() or DEFAULT_USERS_FILE).expanduser(),
            "secure_cookies": insecure not in {"1", "true", "yes"},
            "session_max_age_s": int(env_float(env, "COS_CONSOLE_SESSION_HOURS", 12, 0.01, 24 * 90) * 3600),
            "trusted_header": header,
            "trusted_proxies": proxies,
            "statement_timeout_ms": env_int(env, "COS_CONSOLE_STATEMENT_TIMEOUT_MS", 10_000, 100, 600_000),
        }
        if secret is not None:
            values["secret"] = secret
            values["secret_is_random"] = False
        return cls(**values)  # type: ignore[arg-type]
