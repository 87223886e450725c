"""Numbers in the services' own variables (`COS_OTLP_*`, `COS_CONSOLE_*`) are read like the common ones
(`commonos.runtime.settings.env_int` / `env_float`): a bad value is a ConfigError naming the variable."""

from __future__ import annotations

import pytest

from commonos.console.settings import ConsoleSettings
from commonos.otlp_gateway.settings import GatewaySettings
from commonos.proto.errors import ConfigError
from commonos.runtime.settings import Settings, env_float, env_int


def test_whole_numbers_and_numbers() -> None:
    assert env_int({}, "COS_X", 7, 0, 10) == 7
    assert env_int({"COS_X": " "}, "COS_X", 7, 0, 10) == 7
    assert env_int({"COS_X": " 9 "}, "COS_X", 7, 0, 10) == 9
    assert env_float({"COS_X": "0.5"}, "COS_X", 1.0, 0.1, 2.0) == 0.5
    with pytest.raises(ConfigError, match=r"^COS_X='9\.5' is not a whole number$"):
        env_int({"COS_X": "9.5"}, "COS_X", 7, 0, 10)
    with pytest.raises(ConfigError, match=r"^COS_X=11 is out of range \(0 to 10\)$"):
        env_int({"COS_X": "11"}, "COS_X", 7, 0, 10)
    with pytest.raises(ConfigError, match=r"^COS_X='fast' is not a number$"):
        env_float({"COS_X": "fast"}, "COS_X", 1.0, 0.1, 2.0)
    with pytest.raises(ConfigError, match=r"^COS_X=3 is out of range \(0\.1 to 2\)$"):
        env_float({"COS_X": "3"}, "COS_X", 1.0, 0.1, 2.0)


def test_the_gateways_numbers() -> None:
    settings = GatewaySettings.from_env(
        {"COS_OTLP_PORT": "4319", "COS_OTLP_PUBLISH_TIMEOUT_S": "2.5", "COS_OTLP_RETRY_AFTER_S": "3"}
    )
    assert (settings.port, settings.publish_timeout_s, settings.retry_after_s) == (4319, 2.5, 3)
    with pytest.raises(ConfigError, match=r"COS_OTLP_PORT='4318\.5' is not a whole number"):
        GatewaySettings.from_env({"COS_OTLP_PORT": "4318.5"})
    with pytest.raises(ConfigError, match=r"COS_OTLP_MAX_BODY_BYTES=10 is out of range"):
        GatewaySettings.from_env({"COS_OTLP_MAX_BODY_BYTES": "10"})


def test_the_consoles_numbers() -> None:
    common = Settings.from_env({})
    settings = ConsoleSettings.from_env({"COS_CONSOLE_SESSION_HOURS": "0.5"}, common)
    assert settings.session_max_age_s == 1800
    with pytest.raises(ConfigError, match="COS_CONSOLE_PORT='http' is not a whole number"):
        ConsoleSettings.from_env({"COS_CONSOLE_PORT": "http"}, common)
    with pytest.raises(ConfigError, match=r"COS_CONSOLE_STATEMENT_TIMEOUT_MS=5 is out of range \(100 to 600000\)"):
        ConsoleSettings.from_env({"COS_CONSOLE_STATEMENT_TIMEOUT_MS": "5"}, common)


def test_the_read_url() -> None:
    primary = "postgresql://cos@db:5432/commonos"
    replica = "postgresql://cos@db-replica:5432/commonos"
    unset = Settings.from_env({"COS_DATABASE_URL": primary})
    assert unset.database_read_url is None and unset.read_database_url == primary
    both = Settings.from_env({"COS_DATABASE_URL": primary, "COS_DATABASE_READ_URL": replica})
    assert both.database_url == primary and both.read_database_url == replica
    with pytest.raises(ConfigError) as bad:
        Settings.from_env({"COS_DATABASE_URL": primary, "COS_DATABASE_READ_URL": "mysql://db-replica/commonos"})
    assert str(bad.value) == (
        "COS_DATABASE_READ_URL='mysql://db-replica/commonos' is not a URL of the form postgresql://host:port"
    )
