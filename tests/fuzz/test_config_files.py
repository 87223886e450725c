"""Fuzz targets of the operator's files: profile configs, price files and billing configs."""

from __future__ import annotations

import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from commonos.accounting.pricing import PriceFileError, Pricer, load_price_file, parse_price_file
from commonos.accounting.usage import TokenUsage
from commonos.billing.config import BillingConfigError, load_billing_config, parse_billing_config
from commonos.loop.profiles import ProfileError, load_profiles
from tests.fuzz import strategies as fz

#: These targets write a folder per example; the deadline allows for the file system.
FILE_DEADLINE = timedelta(seconds=1)

PROMPTS = st.sampled_from([b"You are terse.", b"", "é😀".encode(), b"caf\xe9"]) | st.binary(max_size=16)


@settings(deadline=FILE_DEADLINE)
@given(
    config=fz.profile_configs(),
    folder_name=fz.profile_id_strings.filter(lambda n: n not in ("", ".", "..") and "/" not in n and "\x00" not in n),
    prompt=PROMPTS,
)
def test_load_profiles_returns_profiles_or_raises_profile_error(config: bytes, folder_name: str, prompt: bytes) -> None:
    with tempfile.TemporaryDirectory(prefix="cos-fuzz-profiles-") as tmp:
        root = Path(tmp)
        try:
            folder = root / folder_name
            folder.mkdir()
        except (OSError, UnicodeEncodeError):  # a name the file system refuses: not the loader's input
            return
        (folder / "config.toml").write_bytes(config)
        (folder / "prompt.md").write_bytes(prompt)
        (folder / "sub").mkdir()
        try:
            profiles = load_profiles(root)
        except ProfileError as exc:
            assert str(exc).startswith(str(root)), "a profile error names the file at fault"
            event("ProfileError")
            return
    event("loaded")
    assert list(profiles) == [folder_name]
    profile = profiles[folder_name]
    assert profile.max_steps >= 1 and profile.max_delegation_depth >= 0 and profile.approval.timeout_s > 0


#: One usage for every bucket the price of an entry covers.
USAGE = TokenUsage(
    input_tokens=1000,
    output_tokens=500,
    cache_read_tokens=300,
    cache_write_5m_tokens=200,
    cache_write_1h_tokens=100,
    reasoning_tokens=50,
)
CALL_TIMES = (datetime(2026, 6, 1, tzinfo=UTC), datetime(1, 1, 2, tzinfo=UTC), datetime(9999, 12, 30, tzinfo=UTC))


@given(fz.price_files())
def test_parse_price_file_returns_a_price_file_or_raises_price_file_error(raw: bytes) -> None:
    try:
        price_file = parse_price_file(raw, name="prices.toml")
    except PriceFileError as exc:
        assert str(exc).startswith("prices.toml: ")
        assert len(str(exc).splitlines()) == 1, "the message is one line"
        event("PriceFileError")
        return
    event("parsed")
    # An accepted file must price every call it matches: `Pricer.price` promises never to raise.
    pricer = Pricer(price_file)
    for entry in price_file.entries:
        for at in CALL_TIMES:
            result = pricer.price(entry.provider or "anthropic", entry.model, USAGE, at)
            assert result.cost_usd is None or result.cost_usd >= 0


def test_load_price_file_reads_any_file_or_raises_price_file_error(tmp_path: Path) -> None:
    """Reading is separate from parsing: a folder, a missing file and no permission are typed errors too."""
    (tmp_path / "dir").mkdir()
    for path in (tmp_path / "missing.toml", tmp_path / "dir"):
        with pytest.raises(PriceFileError):
            load_price_file(path)


@given(fz.billing_configs())
def test_parse_billing_config_returns_a_config_or_raises_a_one_line_error(raw: bytes) -> None:
    try:
        config = parse_billing_config(raw, name="billing.toml")
    except BillingConfigError as exc:
        assert str(exc).startswith("billing.toml: ")
        assert len(str(exc).splitlines()) == 1, "the message is one line"
        event("BillingConfigError")
        return
    event("parsed")
    assert all(b.limit_usd > 0 and b.limit_usd.is_finite() for b in config.budgets)
    assert len({b.name for b in config.budgets}) == len(config.budgets)


def test_load_billing_config_reads_any_file_or_raises_billing_config_error(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    for path in (tmp_path / "missing.toml", tmp_path / "dir"):
        with pytest.raises(BillingConfigError):
            load_billing_config(path)
