"""Every error class of the project is one of the kinds of `commonos.proto.errors`, and the operator's
configuration files refuse an unknown key with one line naming the file and the key."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path
from types import ModuleType

import pytest

import commonos
from commonos.proto.errors import BugError, ConfigError, CosError, DataError, OperationalError


def _project_modules() -> list[ModuleType]:
    modules = []
    for info in pkgutil.walk_packages(commonos.__path__, "commonos."):
        if info.name.rsplit(".", 1)[-1] == "__main__":
            continue  # runs a command when imported
        modules.append(importlib.import_module(info.name))
    return modules


def _project_errors() -> dict[str, type[BaseException]]:
    """Every exception class defined in the project, by "module.Class"."""
    errors: dict[str, type[BaseException]] = {}
    for module in _project_modules():
        for name, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == module.__name__:
                errors[f"{module.__name__}.{name}"] = value
    return errors


def test_every_package_is_found() -> None:
    names = {module.__name__ for module in _project_modules()}
    for package in ("proto", "accounting", "runtime", "journal_writer", "billing", "loop", "importer", "cli"):
        assert f"commonos.{package}" in names


def test_every_error_class_is_a_cos_error() -> None:
    errors = _project_errors()
    assert len(errors) > 40
    stray = sorted(name for name, cls in errors.items() if not issubclass(cls, CosError))
    assert stray == [], "derive these from DataError, ConfigError, OperationalError or BugError"


def test_every_cos_error_but_the_base_has_one_kind() -> None:
    kinds = (DataError, OperationalError, BugError)
    for name, cls in _project_errors().items():
        if issubclass(cls, CosError) and cls is not CosError:
            assert sum(issubclass(cls, kind) for kind in kinds) == 1, name


@pytest.mark.parametrize(
    ("name", "builtin"),
    [
        ("commonos.loop.loop.UnknownProfile", LookupError),
        ("commonos.loop.journal.SessionNotFound", LookupError),
        ("commonos.loop.journal.JournalError", RuntimeError),
        ("commonos.loop.providers.base.ProviderError", RuntimeError),
        ("commonos.proto.tags.InvalidTag", ValueError),
        ("commonos.accounting.price_file.PriceFileError", ValueError),
        ("commonos.billing.config.BillingConfigError", ConfigError),
        ("commonos.loop.profiles.ProfileError", ConfigError),
    ],
)
def test_callers_catching_a_builtin_still_catch_the_error(name: str, builtin: type[Exception]) -> None:
    assert issubclass(_project_errors()[name], builtin)


# --- unknown keys in configuration files -------------------------------------------------------------------


def _one_line_naming(error: BaseException, file: str, key: str) -> None:
    message = str(error)
    assert len(message.splitlines()) == 1, message
    assert message.startswith(f"{file}: "), message
    assert key in message, message


def test_an_unknown_key_in_a_price_file_is_one_line_naming_file_and_key() -> None:
    from commonos.accounting.pricing import PriceFileError, parse_price_file

    raw = b'[[price]]\nmodel = "a"\ninput_mtok = 1\noutput_mtok = 1\n[[price]]\nmodel = "b"\ninput_mtok = 1\n'
    raw += b"output_mtok = 1\ninput_mtoks = 2\n"
    with pytest.raises(PriceFileError) as caught:
        parse_price_file(raw, name="prices.toml")
    _one_line_naming(caught.value, "prices.toml", "price[1].input_mtoks")
    assert isinstance(caught.value, ConfigError)


def test_an_unknown_key_in_a_billing_config_is_one_line_naming_file_and_key() -> None:
    from commonos.billing.config import BillingConfigError, parse_billing_config

    raw = b'[[budget]]\ntag = "client:acme"\nlimit_usd = 1\n[metrics]\nmax_model = 3\n'
    with pytest.raises(BillingConfigError) as caught:
        parse_billing_config(raw, name="billing.toml")
    _one_line_naming(caught.value, "billing.toml", "metrics.max_model")
    assert isinstance(caught.value, ConfigError)


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ("colour = 1\n", "colour"),
        ("[approval]\ntimeout = 3\n", "approval.timeout"),
        ('[provider_options]\nscript = "script.toml"\nscirpt = "x.toml"\n', "provider_options.scirpt"),
    ],
)
def test_an_unknown_key_in_a_profile_config_is_one_line_naming_file_and_key(
    tmp_path: Path, config: str, key: str
) -> None:
    from commonos.loop.profiles import ProfileError, load_profiles

    (tmp_path / "p").mkdir()
    path = tmp_path / "p" / "config.toml"
    path.write_text(config)
    with pytest.raises(ProfileError) as caught:
        load_profiles(tmp_path)
    _one_line_naming(caught.value, str(path), key)
    assert isinstance(caught.value, ConfigError)
