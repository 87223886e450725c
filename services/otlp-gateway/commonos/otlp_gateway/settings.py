"""The gateway's own settings (`COS_OTLP_*`), beside the common ones of `commonos.runtime.settings`.

    COS_OTLP_HOST              address the OTLP/HTTP receiver listens on (default 127.0.0.1; 0.0.0.0 in a container)
    COS_OTLP_PORT              its port (default 4318, every OTLP/HTTP receiver's)
    COS_OTLP_GRPC_PORT         the OTLP/gRPC receiver's port, on the same address (default 4317, every OTLP/gRPC
                               receiver's)
    COS_OTLP_MAX_BODY_BYTES    largest request body, before and after gunzip (default 16 MiB): 413 above it
                               (and the largest gRPC message, inflated: RESOURCE_EXHAUSTED above it)
    COS_OTLP_TAG_ATTRIBUTES    bare resource attribute keys mapped to tags (default client,project,team)
    COS_OTLP_PUBLISH_TIMEOUT_S how long a request waits for JetStream's acknowledgements before 503 (default 5)
    COS_OTLP_RETRY_AFTER_S     the Retry-After of a 503 (default 5)
    COS_OTLP_HOSTS             the names the Host header may give, comma-separated (`*`: any); unset: loopback
                               names and the address when it listens on loopback, any name otherwise
    COS_OTLP_HEADER_TIMEOUT_S  a connection's time to send a request's headers, from its opening or its last
                               answer; an idle keep-alive connection is closed after it too (default 10)
    COS_OTLP_BODY_TIMEOUT_S    a request's time to send its whole body once its headers are in: 408 (default 30)
    COS_OTLP_TURN_IDLE_S       a Claude Code or Codex turn with no record for this long is ended (default 1800;
                               `commonos.otlp_gateway.turns`)

The service's `/metrics` `/healthz` `/readyz` port is COS_HTTP_PORT (default 9464), as for every service.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from commonos.proto.errors import ConfigError
from commonos.runtime.settings import env_float, env_int

#: Every OTLP/HTTP receiver's port.
DEFAULT_OTLP_PORT: Final = 4318
#: Every OTLP/gRPC receiver's port.
DEFAULT_OTLP_GRPC_PORT: Final = 4317
#: The gateway's `/metrics` `/healthz` `/readyz` port (COS_HTTP_PORT), beside the loop's 9461, the
#: journal-writer's 9462 and billing's 9463.
DEFAULT_HTTP_PORT: Final = 9464
DEFAULT_MAX_BODY_BYTES: Final = 16 * 1024 * 1024
DEFAULT_TAG_ATTRIBUTES: Final = ("client", "project", "team")
#: A Claude Code or Codex turn with no record for this long is over (COS_OTLP_TURN_IDLE_S): long enough for a
#: tool that runs for minutes or a permission prompt left a while, short enough for the live views.
DEFAULT_TURN_IDLE_S: Final = 1800.0
_ATTRIBUTE_KEY: Final = re.compile(r"[A-Za-z0-9_.\-]{1,128}")


def parse_tag_attributes(raw: str) -> tuple[str, ...]:
    """`client,project,team` -> the keys; an empty string means none (only `cos.tag.<key>` attributes map)."""
    keys = tuple(k.strip() for k in raw.split(",") if k.strip())
    for key in keys:
        if not _ATTRIBUTE_KEY.fullmatch(key):
            raise ConfigError(f"COS_OTLP_TAG_ATTRIBUTES: {key!r} is not an attribute key (letters, digits, _ . -)")
    return keys


@dataclass(frozen=True, kw_only=True)
class GatewaySettings:
    host: str = "127.0.0.1"
    port: int = DEFAULT_OTLP_PORT
    grpc_port: int = DEFAULT_OTLP_GRPC_PORT
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    tag_attributes: tuple[str, ...] = DEFAULT_TAG_ATTRIBUTES
    #: A request's events not all acknowledged by JetStream within this: 503 (the exporter retries).
    publish_timeout_s: float = 5.0
    retry_after_s: int = 5
    #: The Host header names both ports answer (None: by their listen address, `server.allowed_hosts`).
    hosts: tuple[str, ...] | None = None
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    #: A Claude Code or Codex turn with no record for this long is ended by the sweeper.
    turn_idle_s: float = DEFAULT_TURN_IDLE_S

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> GatewaySettings:
        env = os.environ if env is None else env
        raw_attributes = env.get("COS_OTLP_TAG_ATTRIBUTES")
        raw_hosts = (env.get("COS_OTLP_HOSTS") or "").strip()
        return cls(
            host=env.get("COS_OTLP_HOST", "").strip() or "127.0.0.1",
            port=env_int(env, "COS_OTLP_PORT", DEFAULT_OTLP_PORT, 0, 65535),
            grpc_port=env_int(env, "COS_OTLP_GRPC_PORT", DEFAULT_OTLP_GRPC_PORT, 0, 65535),
            max_body_bytes=env_int(env, "COS_OTLP_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES, 1024, 1024**3),
            tag_attributes=(DEFAULT_TAG_ATTRIBUTES if raw_attributes is None else parse_tag_attributes(raw_attributes)),
            publish_timeout_s=env_float(env, "COS_OTLP_PUBLISH_TIMEOUT_S", 5.0, 0.1, 300.0),
            retry_after_s=env_int(env, "COS_OTLP_RETRY_AFTER_S", 5, 1, 3600),
            hosts=tuple(h.strip() for h in raw_hosts.split(",") if h.strip()) or None,
            header_timeout_s=env_float(env, "COS_OTLP_HEADER_TIMEOUT_S", 10.0, 0.1, 3600.0),
            body_timeout_s=env_float(env, "COS_OTLP_BODY_TIMEOUT_S", 30.0, 0.1, 3600.0),
            turn_idle_s=env_float(env, "COS_OTLP_TURN_IDLE_S", DEFAULT_TURN_IDLE_S, 0.1, 30 * 86400.0),
        )
