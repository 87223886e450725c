import pytest

from commonos.proto.tags import InvalidTag, is_valid_tag, parse_tag, resolve_tags


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
        assert repr(tag) in str(err.value)


def test_resolution_follows_the_seed_example() -> None:
    profile = ["area:work", "team:core"]
    session = ["project:site", "area:work"]
    assert resolve_tags(profile, session) == ["area:work", "project:site", "team:core"]


def test_resolution_rejects_a_bad_session_tag() -> None:
    with pytest.raises(InvalidTag, match=r"two|exactly one"):
        resolve_tags(["area:work"], ["a:b:c"])
