"""FilterSet and OutputGuard: rules and user filters together, failures under both policies."""

import itertools
import random

import pytest
from fixtures.filters.samples import SECRETS

from addon.filters.api import ALLOW, BLOCK, FLAG, BaseFilter, OutputPiece, RequestContext, Verdict, match_hash
from addon.filters.engine import FILTER_ERROR, USER_PIECE, FilterSet, Release
from addon.filters.rules import parse_rules
from addon.filters.window import MAX_HITS_PER_RULE

RULES = parse_rules("""
[[rule]]
id = "creds"
kind = "secrets"
action = "block"

[[rule]]
id = "mail"
kind = "pii"
types = ["email"]
action = "flag"
scope = "request"

[[rule]]
id = "cards"
kind = "pii"
types = ["card"]
action = "flag"
scope = "response"
""")
KEY = SECRETS["github_token"][0][0]


def ctx(*texts: str) -> RequestContext:
    return RequestContext.from_body("openai-chat", {"messages": [{"role": "user", "content": t} for t in texts]})


def NO_TIME() -> float:
    """A clock that never moves: a test about what filters see must not turn into a test
    of the machine's speed (a check over the time budget is a failed filter, not called
    again; on a loaded machine a 5000-piece test crossed it now and then)."""
    return 0.0


class Recorder(BaseFilter):
    """Answers with a fixed verdict and remembers what it saw."""

    def __init__(self, name="recorder", verdict=None, window=0):
        self.name, self.verdict, self.window = name, verdict, window
        self.pieces: list[tuple[str, str, int, bool]] = []

    def check_request(self, ctx):
        return self.verdict

    def check_output(self, piece: OutputPiece):
        self.pieces.append((piece.text, piece.accumulated, piece.end, piece.final))
        return self.verdict


class Raises(BaseFilter):
    def check_request(self, ctx):
        raise KeyError("boom")

    def check_output(self, piece):
        raise RuntimeError("output\nboom")


# -- requests ------------------------------------------------------------------------------


def test_request_rules_check_every_message_with_their_scope():
    fs = FilterSet(RULES, failure="open")
    verdicts = fs.check_request(ctx("mail bob@example.com", "card 4111 1111 1111 1111", f"key {KEY}"))
    assert [(v.rule_id, v.action, v.location, v.position) for v in verdicts] == [
        ("creds", BLOCK, "messages[2]", 4),
        ("mail", FLAG, "messages[0]", 5),
    ]  # the card rule is for responses only
    assert verdicts[0].match_hash == match_hash(KEY) and verdicts[0].filter == "rules"


def test_one_hit_is_enough_for_a_blocking_request_rule():
    verdicts = FilterSet(RULES, failure="open").check_request(ctx(f"{KEY} {KEY}", KEY))
    assert [v.rule_id for v in verdicts] == ["creds"]


def test_user_filter_verdicts_are_named_after_the_filter_and_allow_is_dropped():
    flagger = Recorder("flagger", Verdict(FLAG, "x", "because", filter="impostor"))
    allower = Recorder("allower", Verdict(ALLOW, "ok"))
    silent = Recorder("silent")
    verdicts = FilterSet(filters=[flagger, allower, silent], failure="closed", clock=NO_TIME).check_request(ctx("hi"))
    assert verdicts == [Verdict(FLAG, "x", "because", filter="flagger", location="request")]


@pytest.mark.parametrize(("failure", "action"), [("open", FLAG), ("closed", BLOCK)])
def test_a_filter_that_raises_gives_a_filter_error_per_the_policy(failure, action):
    (verdict,) = FilterSet(filters=[Raises()], failure=failure).check_request(ctx("hi"))
    assert (verdict.action, verdict.rule_id, verdict.filter, verdict.reason) == (
        action,
        FILTER_ERROR,
        "Raises",
        "KeyError: 'boom'",
    )


def test_a_filter_that_returns_something_else_fails():
    class Wrong(BaseFilter):
        def check_request(self, ctx):
            return "block"

    (verdict,) = FilterSet(filters=[Wrong()], failure="open").check_request(ctx("hi"))
    assert verdict.rule_id == FILTER_ERROR and "returned str" in verdict.reason


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.mark.parametrize(("failure", "action"), [("open", FLAG), ("closed", BLOCK)])
def test_a_slow_filter_keeps_its_verdict_and_gets_a_filter_error(failure, action):
    clock = FakeClock()

    class Slow(BaseFilter):
        def check_request(self, ctx):
            clock.now += 0.050
            return Verdict(FLAG, "seen")

    fs = FilterSet(filters=[Slow()], failure=failure, time_budget=0.010, clock=clock)
    seen, late = fs.check_request(ctx("hi"))
    assert (seen.rule_id, late.rule_id, late.action) == ("seen", FILTER_ERROR, action)
    assert late.reason == "took 50.0 ms, over the 10 ms budget"


def test_the_failure_policy_must_be_chosen():
    with pytest.raises(TypeError):
        FilterSet()
    with pytest.raises(ValueError, match="failure must be"):
        FilterSet(failure="maybe")


# -- output --------------------------------------------------------------------------------


def feed_all(guard, pieces, **where):
    out = [guard.feed(p, **where) for p in pieces]
    return out + [guard.flush(**where)]


def released(releases):
    return "".join(r.text for r in releases)


def test_without_output_checks_a_guard_releases_everything_at_once():
    fs = FilterSet(parse_rules('[[rule]]\nid = "m"\nkind = "pii"\naction = "flag"\nscope = "request"'), failure="open")
    assert not fs.checks_output
    guard = fs.output_guard()
    assert [r.text for r in feed_all(guard, ["a", "b"])] == ["a", "b", ""]


def test_the_hold_is_the_largest_of_blocking_rules_and_user_windows():
    assert FilterSet(RULES, failure="open").hold == 167  # the flag rules hold nothing
    assert FilterSet(RULES[1:], [Recorder(window=500)], failure="open").hold == 500
    release_first = parse_rules('[[rule]]\nid = "c"\nkind = "secrets"\naction = "block"\nwindow = 0')
    assert FilterSet(release_first, [Recorder()], failure="open").hold == 0


def test_a_secret_split_across_pieces_is_blocked_before_any_of_it_leaves():
    guard = FilterSet(RULES, failure="open").output_guard()
    text = f"Here you go: {KEY} and more text after it."
    releases = feed_all(guard, [text[i : i + 3] for i in range(0, len(text), 3)])
    assert guard.blocked is not None and guard.blocked.rule_id == "creds"
    assert guard.blocked.location == "output.choices[0].text" and guard.blocked.position == 13
    assert len(released(releases)) <= 13
    assert guard.feed("more").text == "" and guard.flush_all() == {(0, "text", None): Release()}


def test_streams_are_separate_and_each_has_its_location():
    guard = FilterSet(RULES, failure="open").output_guard()
    fed = [
        guard.feed("card 4111 ", choice=0),
        guard.feed("1111 1111 1111 ", choice=1),  # not the same number
        guard.feed("pay 5555 5555 5555 4444 ", kind="reasoning"),
        guard.feed('{"card": "4111111111111111"}', kind="tool_arguments", tool_key="call_1"),
    ]
    ends = guard.flush_all()
    assert guard.blocked is None
    locations = sorted(v.location for r in fed + list(ends.values()) for v in r.verdicts)
    assert locations == ["output.choices[0].reasoning", "output.tool_calls[call_1].arguments"]
    # (Released as soon as nothing there can still become a credential: with the feed or the flush.)
    assert fed[0].text + ends[(0, "text", None)].text == "card 4111 "
    assert fed[1].text + ends[(1, "text", None)].text == "1111 1111 1111 "


def test_user_filters_see_each_piece_with_the_text_so_far_and_a_final_call():
    recorder = Recorder()
    guard = FilterSet(filters=[recorder], failure="open", clock=NO_TIME).output_guard()
    releases = feed_all(guard, ["Hel", "lo", " you"])
    assert recorder.pieces == [
        ("Hel", "Hel", 3, False),
        ("lo", "Hello", 5, False),
        (" you", "Hello you", 9, False),
        ("", "Hello you", 9, True),
    ]
    assert [r.text for r in releases] == ["Hel", "lo", " you", ""]  # window 0: nothing held


def test_a_long_piece_reaches_user_filters_in_slices_within_their_budget():
    """One answer string of megabytes (read whole) was one call: over a time budget the
    same filter keeps within on a stream of that text. It is handed over in slices of
    USER_PIECE characters, each with the text so far; the rules still read it whole."""
    recorder = Recorder()
    guard = FilterSet(filters=[recorder], failure="open", clock=NO_TIME).output_guard()
    text = "".join(chr(0x61 + i % 26) for i in range(2 * USER_PIECE + 5))
    assert guard.feed(text).text == text
    assert [(len(t), end, final) for t, _, end, final in recorder.pieces] == [
        (USER_PIECE, USER_PIECE, False),
        (USER_PIECE, 2 * USER_PIECE, False),
        (5, 2 * USER_PIECE + 5, False),
    ]
    assert "".join(t for t, *_ in recorder.pieces) == text == recorder.pieces[-1][1]

    blocker = Recorder(verdict=Verdict(BLOCK, "no"))
    guard = FilterSet(filters=[blocker], failure="open", clock=NO_TIME).output_guard()
    assert guard.feed(text).text == "" and len(blocker.pieces) == 1  # (the first slice blocks: no more calls)


def test_a_user_filters_window_holds_text_until_it_could_block():
    class BlockWord(BaseFilter):
        window = len("forbidden")

        def check_output(self, piece):
            tail = piece.recent(self.window + len(piece.text))
            if "forbidden" in tail:
                return Verdict(BLOCK, "word")

    guard = FilterSet(filters=[BlockWord()], failure="open", clock=NO_TIME).output_guard()
    releases = [guard.feed(c) for c in "this is forbidden text"]
    assert guard.blocked is not None and guard.blocked.filter == "BlockWord"
    assert "forb" not in released(releases)
    assert released(releases) == "this is "[: len(released(releases))]


def test_accumulated_text_of_many_pieces_is_not_rebuilt_each_time():
    recorder = Recorder()
    guard = FilterSet(filters=[recorder], failure="open", clock=NO_TIME).output_guard()
    for ch in itertools.islice(itertools.cycle("abc"), 5000):
        guard.feed(ch)
    assert recorder.pieces[-1][1] == ("abc" * 2000)[:5000]


@pytest.mark.parametrize(("failure", "blocked"), [("open", False), ("closed", True)])
def test_a_failing_output_filter_is_reported_once_and_not_called_again(failure, blocked):
    calls = []

    class Flaky(BaseFilter):
        def check_output(self, piece):
            calls.append(piece.text)
            raise RuntimeError("flaky")

    guard = FilterSet(filters=[Flaky()], failure=failure).output_guard()
    releases = feed_all(guard, ["a", "b", "c"])
    verdicts = [v for r in releases for v in r.verdicts]
    assert [(v.rule_id, v.location) for v in verdicts] == [(FILTER_ERROR, "output.choices[0].text")]
    assert calls == ["a"]
    assert (guard.blocked is not None) == blocked
    assert released(releases) == ("" if blocked else "abc")


def test_user_filters_and_rules_report_together():
    recorder = Recorder(verdict=Verdict(FLAG, "every-piece"))
    guard = FilterSet(RULES, [recorder], failure="open", clock=NO_TIME).output_guard()
    releases = feed_all(guard, ["card 4111 1111 1111 1111", " ok"])
    rule_ids = [v.rule_id for r in releases for v in r.verdicts]
    assert rule_ids.count("every-piece") == 3 and rule_ids.count("cards") == 1
    assert released(releases) == "card 4111 1111 1111 1111 ok"


def test_verdict_validation_and_record_form():
    with pytest.raises(ValueError, match="action must be one of"):
        Verdict("deny", "x")
    v = Verdict.for_match(BLOCK, "r", "why", "the secret", 3)
    assert v.match_hash == match_hash("the secret") and v.match_hash.startswith("sha256:") and len(v.match_hash) == 23
    assert v.as_dict() == {
        "action": "block",
        "rule_id": "r",
        "reason": "why",
        "position": 3,
        "match_hash": v.match_hash,
        "filter": "",
        "location": "",
    }


# -- requests: the gate sets change nothing ---------------------------------------------------

GATED_RULES = parse_rules(
    "\n".join(
        [
            '[[rule]]\nid = "kw"\nkind = "keywords"\nkeywords = ["Nightjar", "Kestrel-07", "blue fin"]\naction = "block"',
            '[[rule]]\nid = "kw-raw"\nkind = "keywords"\nkeywords = ["Osprey"]\nnormalize = false\naction = "flag"',
            '[[rule]]\nid = "kw-conf"\nkind = "keywords"\nkeywords = ["paypal"]\nconfusables = true\naction = "flag"',
            '[[rule]]\nid = "host"\nkind = "regex"\npattern = \'\\b[a-z0-9-]+\\.corp\\.example\\.com\\b\'\naction = "flag"',
            '[[rule]]\nid = "ticket"\nkind = "regex"\npattern = \'(?i)\\bINC-\\d{5}\\b\'\naction = "block"',
            '[[rule]]\nid = "digits"\nkind = "regex"\npattern = \'\\d{3}\'\naction = "flag"',
            '[[rule]]\nid = "creds"\nkind = "secrets"\naction = "block"',
            '[[rule]]\nid = "pii"\nkind = "pii"\naction = "flag"',
            '[[rule]]\nid = "pii-raw"\nkind = "pii"\nnormalize = false\naction = "block"',
        ]
    )
)


def ungated(fs: FilterSet, context: RequestContext) -> list[Verdict]:
    """What check_request gave before the gate sets: every rule's own search of every message."""
    verdicts: list[Verdict] = []
    for rule in fs.request_rules:
        hits = ((i, hit) for i, message in enumerate(context.messages) for hit in rule.find(message.text))
        limit = 1 if rule.action == BLOCK else MAX_HITS_PER_RULE
        verdicts.extend(rule.verdict(hit, hit.start, f"messages[{i}]") for i, hit in itertools.islice(hits, limit))
    return verdicts


GATED_TEXTS = [
    "an ordinary prompt about birds and the weather",
    "the Nightjar sings; so does the n\u200bightjar and the ＮＩＧＨＴＪＡＲ",
    "Kestrel-07 and kestrel-07, blue  fin, Osprey and osprey, pаypal (Cyrillic a)",
    "build-7.corp.example.com is down: INC-12345, inc-54321, INC-1234",
    "mail bob@example.com or first.last+tag@mail.example.co.uk, not bob@localhost",
    "card 4111 1111 1111 1111, and 4111-1111-1111-1112 (no Luhn), IBAN DE89 3704 0044 0532 0130 00",
    "digits 1 22 333 4444 " + " ".join(str(n) for n in range(0, 3000, 7)),
    *[text for samples in SECRETS.values() for text, _ in samples],
    "",
]


@pytest.mark.parametrize("texts", [GATED_TEXTS, *([t] for t in GATED_TEXTS), GATED_TEXTS[::-1]])
def test_request_verdicts_are_those_of_every_rules_own_search(texts):
    fs = FilterSet(GATED_RULES, failure="open")
    context = ctx(*texts)
    assert fs.check_request(context) == ungated(fs, context)


def test_request_verdicts_of_many_messages_are_those_of_every_rules_own_search():
    """Messages are found by the gates each opens, then searched in their order: the same
    verdicts, in the same order, as searching every message for every rule."""
    rng = random.Random(3)
    texts = [rng.choice(GATED_TEXTS) for _ in range(300)]
    fs = FilterSet(GATED_RULES, failure="open")
    context = ctx(*texts)
    assert fs.check_request(context) == ungated(fs, context)


def test_request_verdicts_are_unchanged_where_the_gate_set_is_not_made():
    """One matcher per view (no set): every matcher runs, as before."""
    fs = FilterSet(GATED_RULES[4:5], failure="open")
    context = ctx(*GATED_TEXTS)
    assert fs.check_request(context) == ungated(fs, context) != []


def test_a_large_list_of_keywords_in_every_spelling_works_beside_every_other_kind_of_rule(caplog):
    """The keywords' gate joins every rule's gate in one RE2 set: a list of thousands of
    marked words, each letter in every spelling, with regex, secrets and PII rules beside
    it, loads, blocks a word written half composed, half decomposed wherever the stream is
    cut, and lets innocent text through."""
    import random
    import unicodedata

    rng = random.Random(7)
    letters = "aăâbcdđeêghiklmnoôơpqrstuưvxyàảãáạằẳẵắặầẩẫấậèẻẽéẹềểễếệìỉĩíịòỏõóọồổỗốộờởỡớợùủũúụừửữứựỳỷỹýỵ"
    words = sorted({"".join(rng.choice(letters) for _ in range(rng.randint(5, 10))) for _ in range(3000)})
    others = "".join(
        f'[[rule]]\nid = "r{i}"\nkind = "regex"\npattern = \'\\bproj{i}-[0-9]{{4}}\\b\'\naction = "block"\n\n'
        for i in range(40)
    )
    toml = (
        others
        + '[[rule]]\nid = "s"\nkind = "secrets"\naction = "block"\n\n'
        + '[[rule]]\nid = "p"\nkind = "pii"\naction = "block"\n\n'
        + '[[rule]]\nid = "v"\nkind = "keywords"\naction = "block"\nkeywords = ['
        + ", ".join(f'"{w}"' for w in words)
        + "]\n"
    )
    filters = FilterSet(parse_rules(toml), failure="closed")
    assert not caplog.records  # (every spelling, not the fallback to whole spellings)
    word = next(w for w in words if unicodedata.normalize("NFD", w[:3]) != w[:3])
    mixed = unicodedata.normalize("NFD", word[:3]) + word[3:]

    def blocked_by(text: str, step: int) -> list[str]:
        guard = filters.output_guard()
        found = [v.rule_id for i in range(0, len(text), step) for v in guard.feed(text[i : i + step]).verdicts]
        return found + [v.rule_id for r in guard.flush_all().values() for v in r.verdicts]

    for step in (1, 2, 5):
        assert blocked_by(f"so {mixed} it is.", step) == ["v"]
        assert blocked_by(f"call proj7-1234 now {unicodedata.normalize('NFD', word)}", step)[:1] == ["r7"]
    assert blocked_by("nothing to see in this sentence at all, " * 10, 7) == []
