"""Tags: `key:value` labels copied onto every turn (seed: Turns, Sessions and Tags).

Key: lower-case letters, digits, `_` and `-`. Value: letters of either case, digits, `_`, `-`
and `.`. Exactly one `:`. No spaces. At most 256 characters in all.

This is the one definition of a valid tag: `TAG_PATTERN` and `MAX_TAG_LENGTH` are what the event
contract checks (`commonos.proto.events.Tag`), and `parse_tag` — used by `cos chat --tag`, profile
configs, chat requests and billing's config — accepts exactly the tags they accept.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

from commonos.proto.errors import DataError

#: A whole tag. `(?!\n)` before `$`: Python's `$` also matches before a final newline; ECMA regexes
#: (JSON Schema) agree.
TAG_PATTERN: Final = r"^[a-z0-9_-]+:[A-Za-z0-9_.-]+(?!\n)$"
#: The longest tag, in characters (a tag is ASCII: bytes alike).
MAX_TAG_LENGTH: Final = 256
#: How much of a tag an error message quotes.
_QUOTED = 40

_TAG = re.compile(TAG_PATTERN)
_KEY = re.compile(r"[a-z0-9_-]+")
_VALUE = re.compile(r"[A-Za-z0-9_.-]+")
# A profile id must also be one NATS subject token, so it follows the tag-key rule with a length cap.
_PROFILE_ID = re.compile(r"[a-z0-9_-]{1,64}")


class InvalidTag(DataError):
    """A tag that breaks one of the format rules; the message names the rule."""

    def __init__(self, tag: str, rule: str) -> None:
        quoted = repr(tag) if len(tag) <= _QUOTED else f"{tag[:_QUOTED] + '…'!r} ({len(tag)} characters)"
        super().__init__(f"invalid tag {quoted}: {rule}")
        self.tag = tag
        self.rule = rule


class InvalidProfileId(DataError):
    def __init__(self, profile_id: str) -> None:
        super().__init__(f"invalid profile id {profile_id!r}: use 1 to 64 lower-case letters, digits, _ or -")
        self.profile_id = profile_id


def parse_tag(tag: str) -> str:
    """Return `tag` unchanged if it is valid, else raise `InvalidTag` naming the broken rule."""
    if len(tag) > MAX_TAG_LENGTH:
        raise InvalidTag(tag, f"longer than {MAX_TAG_LENGTH} characters")
    if any(ch.isspace() for ch in tag):
        raise InvalidTag(tag, "no spaces allowed")
    colons = tag.count(":")
    if colons == 0:
        raise InvalidTag(tag, "no value: a tag is key:value with exactly one ':'")
    if colons > 1:
        raise InvalidTag(tag, f"exactly one ':' allowed, found {colons}")
    key, value = tag.split(":")
    if not key:
        raise InvalidTag(tag, "empty key")
    if not value:
        raise InvalidTag(tag, "no value: a tag is key:value with exactly one ':'")
    if not _KEY.fullmatch(key):
        if _KEY.fullmatch(key.lower()):
            raise InvalidTag(tag, "upper case in the key (key: lower-case letters, digits, _ and -)")
        raise InvalidTag(tag, "bad character in the key (key: lower-case letters, digits, _ and -)")
    if not _VALUE.fullmatch(value):
        raise InvalidTag(tag, "bad character in the value (value: letters, digits, _, - and .)")
    if not _TAG.match(tag):  # the rules above are the pattern's, said one by one
        raise InvalidTag(tag, f"does not match {TAG_PATTERN}")
    return tag


def is_valid_tag(tag: str) -> bool:
    return len(tag) <= MAX_TAG_LENGTH and _TAG.match(tag) is not None


def parse_tags(tags: Iterable[str]) -> list[str]:
    return [parse_tag(t) for t in tags]


def tag_key(tag: str) -> str:
    return tag.split(":", 1)[0]


def resolve_tags(profile_tags: Iterable[str], session_tags: Iterable[str]) -> list[str]:
    """A turn's tags: the profile's plus the session's own, sorted, without duplicates."""
    return sorted(set(parse_tags(profile_tags)) | set(parse_tags(session_tags)))


def check_profile_id(profile_id: str) -> str:
    if not _PROFILE_ID.fullmatch(profile_id):
        raise InvalidProfileId(profile_id)
    return profile_id
