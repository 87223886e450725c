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
from commonos.proto.config_files import key_path, one_line
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
            assert len(str(exc).splitlines()) == 1, "the message is one line"
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


# --- unknown keys ------------------------------------------------------------------------------------------

#: Every key some config file knows (an unknown key drawn must not collide with one at its level).
KNOWN_KEYS = frozenset(
    {
        *("price", "provider", "model", "effective_from", "input_mtok", "output_mtok"),
        *("cache_read_mtok", "cache_write_5m_mtok", "cache_write_1h_mtok"),
        *("budget", "metrics", "tag", "limit_usd", "period", "name"),
        *("tag_label_keys", "max_tag_values", "max_models", "max_providers"),
        *("tags", "system_prompt", "system_prompt_file", "tools", "max_steps", "max_delegation_depth"),
        *("workspace", "provider_options", "approval", "timeout_s", "script", "max_tokens", "hooks", "compaction"),
    }
)
UNKNOWN_KEYS = (
    st.sampled_from(["unknown", "Model", "input-mtok", "a b", "x\ny", "x\u2028y", "\x85", '"', "'", "[0]"])
    | fz.unicode_text.filter(bool)
).filter(lambda key: key not in KNOWN_KEYS)


def _unknown_key_message(file: str, *path: str | int) -> str:
    return one_line(f"{file}: {key_path(*path)}: unknown key")


@given(key=UNKNOWN_KEYS, entries=st.integers(1, 3), data=st.data())
def test_an_unknown_key_anywhere_in_a_price_file_is_named(key: str, entries: int, data: st.DataObject) -> None:
    tables: list[dict[str, object]] = [
        {"model": f"m{i}", "input_mtok": 1, "output_mtok": "2.5"} for i in range(entries)
    ]
    doc: dict[str, object] = {"price": fz.TableArray(tables)}
    where = data.draw(st.integers(-1, entries - 1))
    if where < 0:
        doc = {key: 1, **doc}
        path: tuple[str | int, ...] = (key,)
    else:
        tables[where][key] = "x"
        path = ("price", where, key)
    with pytest.raises(PriceFileError) as caught:
        parse_price_file(fz.toml_document(doc).encode(), name="prices.toml")
    assert str(caught.value) == _unknown_key_message("prices.toml", *path)


@given(key=UNKNOWN_KEYS, entries=st.integers(1, 3), data=st.data())
def test_an_unknown_key_anywhere_in_a_billing_config_is_named(key: str, entries: int, data: st.DataObject) -> None:
    tables: list[dict[str, object]] = [{"tag": f"client:c{i}", "limit_usd": "10"} for i in range(entries)]
    metrics: dict[str, object] = {"max_models": 5}
    doc: dict[str, object] = {"budget": fz.TableArray(tables), "metrics": fz.Table(metrics)}
    where = data.draw(st.sampled_from(["top", "metrics", *range(entries)]))
    if where == "top":
        doc = {key: 1, **doc}
        path: tuple[str | int, ...] = (key,)
    elif where == "metrics":
        metrics[key] = 1
        path = ("metrics", key)
    else:
        assert isinstance(where, int)
        tables[where][key] = 1
        path = ("budget", where, key)
    with pytest.raises(BillingConfigError) as caught:
        parse_billing_config(fz.toml_document(doc).encode(), name="billing.toml")
    assert str(caught.value) == _unknown_key_message("billing.toml", *path)


@settings(deadline=FILE_DEADLINE)
@given(key=UNKNOWN_KEYS, where=st.sampled_from(["top", "approval", "provider_options"]))
def test_an_unknown_key_anywhere_in_a_profile_is_named(key: str, where: str) -> None:
    approval: dict[str, object] = {"timeout_s": 5}
    options: dict[str, object] = {"script": "script.toml", "max_tokens": 100}
    doc: dict[str, object] = {"provider": "scripted", "approval": fz.Table(approval)}
    doc["provider_options"] = fz.Table(options)
    if where == "top":
        doc = {key: 1, **doc}
    else:
        (approval if where == "approval" else options)[key] = 1
    path = (key,) if where == "top" else (where, key)
    with tempfile.TemporaryDirectory(prefix="cos-fuzz-profiles-") as tmp:
        (Path(tmp) / "p").mkdir()
        config = Path(tmp) / "p" / "config.toml"
        config.write_text(fz.toml_document(doc), encoding="utf-8")
        with pytest.raises(ProfileError) as caught:
            load_profiles(Path(tmp))
    assert str(caught.value) == _unknown_key_message(str(config), *path)
