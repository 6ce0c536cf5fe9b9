"""The schema-less protobuf reader: every wire type, paths, strings, and hostile input."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from protoenc import f, fixed32, fixed64, group, m, tag, varint

from addon.dialects import protowire
from addon.dialects.protowire import (
    LEN,
    MAX_DEPTH,
    VARINT,
    Field,
    encode_field,
    field_int,
    field_text,
    messages_at,
    parse,
    path,
    read_fields,
    readable,
    strings,
)


def test_every_wire_type_is_read_and_groups_are_skipped():
    data = (
        f(1, 150)
        + fixed64(2, 2**63 + 5)
        + f(3, "héllo")
        + group(4, f(1, 1), group(2, f(3, "inner")))
        + fixed32(5, 7)
        + f(6, 2**64 - 1)  # a 10-byte varint
    )
    fields, problem = read_fields(data)
    assert problem is None
    assert fields == [
        Field(1, VARINT, 150),
        Field(2, 1, 2**63 + 5),
        Field(3, LEN, "héllo".encode()),
        Field(5, 5, 7),
        Field(6, VARINT, 2**64 - 1),
    ]


def test_paths_follow_nested_and_repeated_messages():
    msg = parse(m(2, f(1, "first"), f(2, 1)) + m(2, f(1, "second"), f(2, 2)) + m(7, f(1, "gpt-4o")))
    assert path(msg, 2, 1) == [b"first", b"second"]
    assert path(msg, 2, 2) == [1, 2]
    # a singular field sent twice: the last value wins, as every protobuf parser reads it
    assert field_text(msg, 7, 1) == "gpt-4o" and field_int(msg, 2, 2) == 2 and field_text(msg, 2, 1) == "second"
    assert path(msg, 9, 1) == [] and field_text(msg, 9) is None and path(msg) == []
    assert [field_text(x, 1) for x in messages_at(msg, 2)] == ["first", "second"]


def test_a_path_through_a_string_that_is_no_message_leads_nowhere():
    msg = parse(f(1, "\x0aplain text is not a message"))
    assert path(msg, 1, 1) == []


def test_an_empty_nested_message_is_present():
    msg = parse(m(14))  # e.g. Cursor's turn_ended {}
    assert len(msg.messages(14)) == 1


def test_truncated_and_invalid_input_returns_what_it_could_and_a_problem():
    good = f(1, "ok")
    cases = {
        good + tag(2, 2) + varint(50) + b"short": "truncated length-delimited field 2",
        good + b"\x80": "truncated tag",
        good + tag(3, 0) + b"\xff\xff": "truncated varint of field 3",
        good + tag(4, 1) + b"1234": "truncated fixed-width field 4",
        good + tag(5, 6): "wire type 6 of field 5",
        good + tag(6, 4): "wire type 4 of field 6",  # an end-group with no group
        good + tag(7, 3) + f(1, 1): "unterminated group 7",
        good + b"\x00": "field number 0",
        good + b"\xff" * 11: "truncated tag",  # a varint of over 10 bytes
    }
    for data, problem in cases.items():
        msg = parse(data)
        assert msg.fields == [Field(1, LEN, b"ok")], data
        assert msg.problem is not None and problem in msg.problem, (data, msg.problem)


def test_the_number_of_fields_read_is_bounded():
    fields, problem = read_fields(f(1, 1) * 10, max_fields=4)
    assert len(fields) == 4 and problem is not None and "over 4 fields" in problem


def test_strings_collects_text_depth_first_bounded_and_skips_binary():
    msg = parse(
        f(1, "top")
        + m(2, f(1, "nested"), m(3, f(4, "deeper")), f(5, b"\x00\x01\xfe binary"))
        + f(3, 42)
        + f(4, "x" * 50)
    )
    assert strings(msg) == ["top", "nested", "deeper", "x" * 50]
    assert strings(msg, limit=2) == ["top", "nested"]
    assert strings(msg, max_chars=3)[-1] == "xxx"
    assert strings(msg, skip=frozenset({2})) == ["top", "x" * 50]
    assert readable(b"tabs\tand\nlines") == "tabs\tand\nlines" and readable(b"\x0a\x03abc") is None
    assert readable(b"\xff") is None and readable(b"") is None


def test_deep_nesting_is_bounded():
    data = f(1, "leaf")
    for _ in range(MAX_DEPTH * 4):
        data = m(1, data)
    assert strings(parse(data)) == []  # deeper than MAX_DEPTH: not followed (and no RecursionError)
    data = f(1, "leaf")
    for _ in range(MAX_DEPTH - 2):
        data = m(1, data)
    assert strings(parse(data)) == ["leaf"]


def test_deep_groups_are_bounded():
    data = f(1, 1)
    for _ in range(MAX_DEPTH * 3):
        data = group(2, data)
    msg = parse(f(9, "before") + data)
    assert msg.fields == [Field(9, LEN, b"before")] and msg.problem is not None


def test_the_writer_encodes_what_the_reader_reads():
    data = encode_field(1, 29) + encode_field(2, encode_field(1, "títle")) + encode_field(3, 2**40)
    assert data == f(1, 29) + m(2, f(1, "títle")) + f(3, 2**40)
    msg = parse(data)
    assert field_int(msg, 1) == 29 and field_text(msg, 2, 1) == "títle" and field_int(msg, 3) == 2**40


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_the_reader_never_raises_on_any_bytes(data):
    msg = parse(data)
    strings(msg)
    path(msg, 1, 2, 3)
    for field in msg.fields:
        assert field.number > 0


def test_strings_reads_nested_junk_within_a_budget_and_tells_what_it_left():
    data = f(1, "leaf")
    for _ in range(MAX_DEPTH - 2):
        data = m(1, data, f(2, b"\x00" * 20_000))  # each level drags its nested bytes along
    cut: list[str] = []
    assert strings(parse(data), max_chars=50_000, cut=cut)[0] == "leaf" and cut == []
    small = protowire.STRINGS_BUDGET
    try:
        protowire.STRINGS_BUDGET = 100
        many = m(1, *[f(3, 7)] * 150, m(4, f(1, "deep")))  # 151 fields: the budget runs out first
        cut = []
        assert strings(parse(m(1, many)), cut=cut) == []
        assert cut == ["values past the first 100 fields read"]
    finally:
        protowire.STRINGS_BUDGET = small


def test_strings_tells_each_bound_it_met():
    """Count, length, depth: each reason once, so that the reader can say the message was
    not read whole (finding strings_unread)."""
    cut: list[str] = []
    assert strings(parse(f(1, "a") + f(2, "b") + f(3, "c")), limit=2, cut=cut) == ["a", "b"]
    assert cut == ["strings past the first 2"]
    cut = []
    assert strings(parse(f(1, "abcdef")), max_chars=4, cut=cut) == ["abcd"]
    assert cut == ["characters of a string past the first 4"]
    deep = f(1, "bottom")
    for _ in range(MAX_DEPTH + 1):
        deep = m(1, deep)
    cut = []
    assert strings(parse(deep), cut=cut) == [] and cut == [f"messages nested deeper than {MAX_DEPTH} levels"]
    cut = []
    assert strings(parse(f(5, b"\x89PNG\r\n\x1a\n\x00\x00" + bytes(range(256)) * 40)), cut=cut) == []
    assert cut == []  # a blob that is no message is no text left out


def test_text_with_control_characters_that_is_no_message_is_still_text():
    """A prompt with an ANSI colour or a stray vertical tab is text the filters must see."""
    assert readable(b"please FORBIDDEN\x0b") == "please FORBIDDEN\x0b"
    assert strings(parse(m(1, f(1, "hidden \x0bFORBIDDEN")))) == ["hidden \x0bFORBIDDEN"]
    assert readable(m(1, f(1, "nested"))) is None  # a message is not taken for text


def test_one_messages_reading_parses_at_most_its_budget_in_all_and_says_so():
    """Paths, checks whether a value is text and string walks each had a bound of their
    own; together they parsed a message's fields several times over (1.8 MB of tiny
    fields: 1.3 s). Inside a budget they share one, cut where it runs out, and
    cut_short leaves that to whoever set it."""
    conversation = m(2, *(m(1, f(1, f"s{i}")) for i in range(3000)))
    data = f(1, "model") + conversation + m(7, f(1, "after"))
    with protowire.budget(5000) as reading:
        msg = parse(data)  # its 3 fields and one
        found = path(msg, 2, 1, 1)  # 3000 fields and one, then each nested message its field and one
        texts = strings(msg, 64, 2000, skip=frozenset({2}))
        assert msg.messages(7) == []  # nothing more is parsed
    assert reading.spent and reading.fields - reading.left == 5000
    assert len(found) == (5000 - 4 - 3001) // 2 and msg.cut_short() is None  # (the budget's cut is said by its owner)
    assert not reading.top_cut  # (the message itself was read whole)
    assert texts == []  # a walk once the budget is spent stops at once
    with protowire.budget(2) as reading:  # the message itself cut short: its reader could not read it
        parse(data)
    assert reading.top_cut
    with protowire.budget(100_000) as reading:  # room to spare: the same reading as without one
        roomy = parse(data)
        assert path(roomy, 2, 1, 1) == path(parse(data), 2, 1, 1) and not reading.spent
    assert len(path(parse(data), 2, 1, 1)) == 3000  # no budget outside it
