import msgspec
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from commonos.proto import events as ev
from commonos.proto.tags import MAX_TAG_LENGTH, InvalidTag, is_valid_tag, parse_tag, resolve_tags


@pytest.mark.parametrize(
    ("tag", "valid", "rule"),
    [
        # Every row of the seed's table.
        ("area:household", True, None),
        ("client:acme", True, None),
        ("project:Site-v2.1", True, None),
        ("Area:x", False, "upper case in the key"),
        ("area:has space", False, "no spaces"),
        ("a:b:c", False, "exactly one ':'"),
        ("area", False, "no value"),
        # Edges of the same rules.
        ("k_1-x:v_.-9", True, None),
        ("area:", False, "no value"),
        (":value", False, "empty key"),
        ("ar.ea:x", False, "bad character in the key"),
        ("area:x/y", False, "bad character in the value"),
        ("area:\tx", False, "no spaces"),
        ("área:x", False, "bad character in the key"),
        ("k:" + "v" * 254, True, None),  # 256 characters
        ("k:" + "v" * 255, False, "longer than 256 characters"),
        ("k:" + "v" * 10_000, False, "longer than 256 characters"),
    ],
)
def test_tag_format(tag: str, valid: bool, rule: str | None) -> None:
    assert is_valid_tag(tag) is valid
    if valid:
        assert parse_tag(tag) == tag
    else:
        with pytest.raises(InvalidTag) as err:
            parse_tag(tag)
        assert rule is not None and rule in err.value.rule
        # the tag is quoted whole, or its first 40 characters and its length
        assert repr(tag) in str(err.value) or f"{tag[:40] + '…'!r} ({len(tag)} characters)" in str(err.value)


def test_resolution_follows_the_seed_example() -> None:
    profile = ["area:work", "team:core"]
    session = ["project:site", "area:work"]
    assert resolve_tags(profile, session) == ["area:work", "project:site", "team:core"]


def test_resolution_rejects_a_bad_session_tag() -> None:
    with pytest.raises(InvalidTag, match=r"two|exactly one"):
        resolve_tags(["area:work"], ["a:b:c"])


def test_an_over_long_tag_is_quoted_in_part() -> None:
    with pytest.raises(InvalidTag) as err:
        parse_tag("client:" + "a" * 1_000_000)
    assert str(err.value) == f"invalid tag 'client:{'a' * 33}…' (1000007 characters): longer than 256 characters"


class _Tagged(msgspec.Struct):
    tag: ev.Tag


_tag_like = st.text(st.sampled_from("az09_-.:AZ \n\x00é"), max_size=MAX_TAG_LENGTH + 3) | st.builds(
    lambda key, value: f"{key}:{value}",
    st.text(st.sampled_from("abc_-"), min_size=1, max_size=200),
    st.text(st.sampled_from("AZaz09_.-"), min_size=1, max_size=200),
)


@given(_tag_like)
@example("k:" + "v" * 254)
@example("k:" + "v" * 255)
@example("k:v\n")
def test_one_definition_of_a_tag_for_parsing_and_for_events(tag: str) -> None:
    """What `parse_tag` accepts (CLI, profiles, requests) is exactly what an event may carry."""
    try:
        msgspec.json.decode(msgspec.json.encode({"tag": tag}), type=_Tagged)
        in_events = True
    except msgspec.ValidationError:
        in_events = False
    assert is_valid_tag(tag) is in_events
    try:
        parse_tag(tag)
        parsed = True
    except InvalidTag:
        parsed = False
    assert parsed is in_events
