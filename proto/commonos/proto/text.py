"""Text PostgreSQL can store: neither `text` nor `jsonb` can hold U+0000 (NUL).

What the loop cannot refuse (tool output, a model's arguments and answers) may carry NUL, so the
projections store every string escaped, and `unescape_nul` gives the original back exactly:

* U+0000 is stored as ␀ (U+2400, SYMBOL FOR NULL);
* a ␀ already in the text is stored as ␛␀ (U+241B SYMBOL FOR ESCAPE, then U+2400);
* a ␛ already in the text is stored doubled, ␛␛.

Text holding none of these three characters is stored unchanged. (Writing NUL as ␀ and a ␀ as ␀␀
alone would not do: "\\x00\\x00" and "␀" would both be stored as "␀␀".) In JSON, keys and string
values are escaped alike (`escape_nul_in_json`, read back with `unescape_nul_json`); numbers,
booleans and null are left as they are.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

NUL: Final = "\x00"
#: What a NUL is stored as.
NUL_SYMBOL: Final = "\u2400"
#: Marks a ␀ or ␛ that was in the text itself.
ESCAPE_SYMBOL: Final = "\u241b"

_ESCAPES: Final = {
    ord(NUL): NUL_SYMBOL,
    ord(NUL_SYMBOL): ESCAPE_SYMBOL + NUL_SYMBOL,
    ord(ESCAPE_SYMBOL): ESCAPE_SYMBOL * 2,
}
_STORED: Final = re.compile(f"{ESCAPE_SYMBOL}[{ESCAPE_SYMBOL}{NUL_SYMBOL}]|{NUL_SYMBOL}")
_ESCAPED: Final = re.compile(r"\\u(?:0000|2400|241[bB])")
#: In a JSON document: a NUL, ␀ or ␛ written as an escape (after an even run of backslashes), or raw.
_JSON_STORED: Final = re.compile(
    r"(?<!\\)((?:\\\\)*)(\\u(?:0000|2400|241[bB])|" + NUL_SYMBOL + "|" + ESCAPE_SYMBOL + ")"
)


def escape_nul(text: str) -> str:
    """`text` as stored: no NUL in it, and `unescape_nul` gives `text` back."""
    if NUL not in text and NUL_SYMBOL not in text and ESCAPE_SYMBOL not in text:
        return text
    return text.translate(_ESCAPES)


def _original(match: re.Match[str]) -> str:
    found = match[0]
    return NUL if found == NUL_SYMBOL else found[1]


def unescape_nul(stored: str) -> str:
    """The text `escape_nul` stored as `stored` (a ␛ followed by anything else is kept as it is)."""
    if NUL_SYMBOL not in stored and ESCAPE_SYMBOL not in stored:
        return stored
    return _STORED.sub(_original, stored)


def _stored_json(match: re.Match[str]) -> str:
    backslashes, found = match[1], match[2]
    if found in (NUL_SYMBOL, ESCAPE_SYMBOL):
        return backslashes + escape_nul(found)
    return backslashes + escape_nul(chr(int(found[2:], 16)))


def escape_nul_in_json(document: str) -> str:
    """A JSON document with every key and string escaped as `escape_nul` does, its structure untouched.

    Works on the text, so any depth costs the same: a NUL can only be the escape `\\u0000` (PostgreSQL's
    jsonb refuses it), a ␀ or ␛ only be in a string, raw or as an escape; each becomes its stored form.
    An escape counts only after an even number of backslashes (`\\\\u0000` is a backslash and "u0000").
    """
    if NUL_SYMBOL in document or ESCAPE_SYMBOL in document or ("\\u" in document and _ESCAPED.search(document)):
        return _JSON_STORED.sub(_stored_json, document)
    return document


def unescape_nul_json(value: Any) -> Any:
    """The JSON value (decoded) whose document `escape_nul_in_json` made: every key and string unescaped."""
    if isinstance(value, str):
        return unescape_nul(value)
    if isinstance(value, Mapping):
        return {unescape_nul(k) if isinstance(k, str) else k: unescape_nul_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [unescape_nul_json(v) for v in value]
    return value
