"""Text PostgreSQL can store: U+0000 stored as ␀, the original given back exactly."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from commonos.proto.text import (
    ESCAPE_SYMBOL,
    NUL,
    NUL_SYMBOL,
    escape_nul,
    escape_nul_in_json,
    unescape_nul,
    unescape_nul_json,
)

SPECIAL = (NUL, NUL_SYMBOL, ESCAPE_SYMBOL)
#: Text made mostly of the characters that matter, and anything else.
texts = st.text(st.sampled_from([*SPECIAL, "\\", "u", "0", "a", '"']) | st.characters(), max_size=40)
utf8_texts = st.text(st.sampled_from([*SPECIAL, "\\", "u", "0", "a", '"']) | st.characters(codec="utf-8"), max_size=30)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | utf8_texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(utf8_texts, inner, max_size=4),
    max_leaves=12,
)


@given(texts)
@example("\x00\x00")
@example("\u2400")
@example("\x00\u2400\u241b\u241b\u2400\x00")
@example("\u241bx")
def test_escaping_is_lossless_and_leaves_no_nul(text: str) -> None:
    stored = escape_nul(text)
    assert NUL not in stored
    assert unescape_nul(stored) == text
    if not any(c in text for c in SPECIAL):
        assert stored is text


@given(texts, texts)
def test_two_texts_are_never_stored_alike(a: str, b: str) -> None:
    assert (escape_nul(a) == escape_nul(b)) == (a == b)


@pytest.mark.parametrize(
    ("text", "stored"),
    [
        ("a\x00b", "a\u2400b"),
        ("\x00\x00", "\u2400\u2400"),
        ("\u2400", "\u241b\u2400"),  # not ␀␀: that is how two NULs are stored
        ("\u241b", "\u241b\u241b"),
        ("plain text, é 😀", "plain text, é 😀"),
    ],
)
def test_what_is_stored(text: str, stored: str) -> None:
    assert escape_nul(text) == stored
    assert unescape_nul(stored) == text


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (k, *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


@given(json_values)
@example({"\x00": ["\\u0000", "\\\x00", "\u2400\x00"]})
def test_json_documents_are_escaped_string_by_string(value: Any) -> None:
    for document in (
        msgspec.json.encode(value).decode(),
        json.dumps(value),  # ␀ and ␛ written as escapes
        json.dumps(value, ensure_ascii=False),
    ):
        stored = escape_nul_in_json(document)
        decoded = json.loads(stored)
        assert all(NUL not in s for s in _strings(decoded))
        assert unescape_nul_json(decoded) == value
        assert _strings(decoded) == [escape_nul(s) for s in _strings(value)]


def test_a_document_without_nul_or_symbols_is_unchanged() -> None:
    document = msgspec.json.encode({"path": "C:\\new", "text": "\x01 \\u0000 stays text", "n": [1, 2.5, None]}).decode()
    assert "\\\\u0000" in document
    assert escape_nul_in_json(document) == document
