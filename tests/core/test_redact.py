"""Redaction (fleetstore.core.redact): every built-in kind is caught and replaced by its
marker, look-alikes are left alone, a stream gives what the whole text gives however it
is cut (at every character of every sample), JSON values are walked with their keys, and
a user's rules file adds, drops and allows."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetstore import errors
from fleetstore.core.redact import (
    LOOKAROUND,
    Redactor,
    Ruleset,
    default_redactor,
    fingerprint,
    preview,
)
from tests.secret_samples import LOOK_ALIKES, Sample, pem, samples

SAMPLES = samples()
R = default_redactor()


def stream_all(pieces: list[str], redactor: Redactor = R) -> tuple[str, Counter[str], int]:
    """The pieces through a stream redactor: its output, counts, and the most it held."""
    stream = redactor.stream()
    out, most = [], 0
    for piece in pieces:
        out.append(stream.feed(piece))
        most = max(most, stream.held)
    out.append(stream.finish())
    return "".join(out), stream.counts, most


def test_every_built_in_kind_has_a_sample() -> None:
    """A rule added without a sample here would be tested by nothing below."""
    assert sorted({s.kind for s in SAMPLES}) == Ruleset.builtin().kinds


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: s.kind)
def test_each_sample_is_replaced_by_its_marker(sample: Sample) -> None:
    result = R.redact(sample.text)
    assert result.text == sample.redacted
    assert result.counts == Counter({sample.kind: 1})
    assert sample.secret not in result.text


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: s.kind)
def test_a_sample_is_caught_wherever_it_sits(sample: Sample) -> None:
    """At the start of a text, after a newline, inside a JSON string (escaped, then read
    back), and twice in one text."""
    for text in (
        sample.text,
        "x\n" + sample.text,
        json.dumps({"output": sample.text}),
        sample.text + "\n" + sample.text,
    ):
        found = R.find(text)
        assert found, text[:120]
        assert all(f.kind == sample.kind for f in found)
    doubled = R.redact(sample.text + " | " + sample.text)
    assert doubled.counts[sample.kind] == 2


@pytest.mark.parametrize("text", LOOK_ALIKES)
def test_look_alikes_are_left_alone(text: str) -> None:
    assert R.find(text) == []
    assert R.redact(text).text == text


def test_hashes_ids_and_random_encodings_are_left_alone() -> None:
    """No entropy guessing: hex digests, uuids and base64 of random bytes are not secrets."""
    import base64
    import hashlib
    import os
    import uuid

    text = "\n".join(
        [hashlib.sha256(os.urandom(8)).hexdigest() for _ in range(200)]
        + [str(uuid.uuid4()) for _ in range(200)]
        + [base64.b64encode(os.urandom(3000)).decode()]
    )
    assert R.find(text) == []


def test_redacting_twice_changes_nothing() -> None:
    text = "\n".join(s.text for s in SAMPLES)
    once = R.redact(text)
    assert sum(once.counts.values()) == len(SAMPLES)
    twice = R.redact(once.text)
    assert twice.text == once.text
    assert twice.counts == Counter()


def test_a_key_name_before_the_value_names_the_kind_when_the_value_is_known() -> None:
    """GITHUB_TOKEN=<a GitHub token> is a github-token, not just an env-secret."""
    gh = next(s.secret for s in SAMPLES if s.kind == "github-token")
    assert R.redact(f"GITHUB_TOKEN={gh}\n").counts == Counter({"github-token": 1})
    assert R.redact("GITHUB_TOKEN=notatoken-but-secret\n").counts == Counter({"env-secret": 1})


@pytest.mark.parametrize(
    ("text", "kind", "secret"),
    [
        ("PGPASSWORD=hunter2hunter2 psql -h db", "env-secret", "hunter2hunter2"),
        ("export REDISPASSWORD=s3cr3tValue9", "env-secret", "s3cr3tValue9"),
        ("CLIENTSECRET=abcDEF123456", "env-secret", "abcDEF123456"),
        ("redis://:Sup3rSecretPw@cache:6379/0", "url-password", "Sup3rSecretPw"),
    ],
)
def test_names_and_urls_a_first_rule_missed_are_caught(text: str, kind: str, secret: str) -> None:
    """PGPASSWORD= (no "_" before PASSWORD) and a URL with a password and no user."""
    done = R.redact(text)
    assert done.counts == Counter({kind: 1}) and secret not in done.text, done.text


@pytest.mark.parametrize(
    "text", ["myToken=abcdefghijk1", "http://host:8080/path@x", "see https://:8080/a"]
)
def test_lower_case_names_and_ports_stay_as_they_are(text: str) -> None:
    assert R.redact(text).text == text


# -- streams --------------------------------------------------------------------------------


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda s: s.kind)
def test_a_secret_cut_at_every_character_is_still_caught(sample: Sample) -> None:
    """Two deltas (or two flushes), cut at each position of the text: the stream's
    output is the whole text's redaction, and the secret never comes out."""
    text = "before " + sample.text + " after"
    whole = R.redact(text)
    for cut in range(len(text) + 1):
        out, counts, _ = stream_all([text[:cut], text[cut:]])
        assert out == whole.text, cut
        assert counts == whole.counts, cut


@pytest.mark.parametrize("kind", ["github-token", "url-password", "authorization-header"])
def test_a_secret_cut_in_three_anywhere_is_still_caught(kind: str) -> None:
    sample = next(s for s in SAMPLES if s.kind == kind)
    text = sample.text
    whole = R.redact(text).text
    for a in range(len(text) + 1):
        for b in range(a, len(text) + 1):
            assert stream_all([text[:a], text[a:b], text[b:]])[0] == whole, (a, b)


def test_a_stream_of_single_characters_gives_the_whole_texts_redaction() -> None:
    text = "\n".join(s.text for s in SAMPLES)
    out, counts, most = stream_all(list(text))
    assert out == R.redact(text).text
    assert sum(counts.values()) == len(SAMPLES)
    assert most <= R.max_reach + LOOKAROUND


def test_a_stream_holds_back_only_a_possible_start() -> None:
    """Prose streams through at once; only a prefix cut at the end waits."""
    stream = R.stream()
    assert stream.feed("The build passed. ") == "The build passed. "
    assert stream.held == 0
    assert stream.feed("Next: run gh") == "Next: run "
    assert stream.held == 2  # "gh" may begin "ghp_"
    assert stream.feed("ost mode.") == "ghost mode."
    assert stream.finish() == ""


def test_what_a_stream_holds_is_bounded() -> None:
    """A private key's header with no END line keeps the stream waiting, but never more
    than the rule's longest match: then the text is let through, its key lines redacted
    by the rule for a key cut before its END."""
    stream = R.stream()
    out = [stream.feed("-----" + "BEGIN RSA PRIVATE KEY-----\n")]
    for _ in range(2000):
        out.append(stream.feed("QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo=\n"))
        assert stream.held <= R.max_reach + LOOKAROUND
    out.append(stream.feed(". and then plain words " * 50))
    out.append(stream.finish())
    text = "".join(out)
    assert "[REDACTED:private-key]" in text
    assert text.endswith("plain words ")


_PIECES = [s.text for s in SAMPLES[::3]] + [
    "sk-an", "-----BEGIN RSA", "Bearer ", "://", "eyJ", "AKIA", "?access_tok",
    "Authorization", ": ", "\\n", "\n", " ", "x", "İ", "K", "é", "[REDACTED:jwt]",
    "DB_PASSWORD=", "--password ", "gh", "p_", "0123456789", "AbCdEfGhIj",
]  # fmt: skip


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.sampled_from(_PIECES), min_size=1, max_size=25),
    st.lists(st.integers(min_value=0, max_value=4000), max_size=12),
)
def test_any_text_cut_anywhere_streams_to_its_whole_redaction(
    parts: list[str], cuts: list[int]
) -> None:
    text = "".join(parts)
    points = sorted({min(c, len(text)) for c in cuts})
    pieces = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
    whole = R.redact(text)
    out, counts, most = stream_all(pieces)
    assert out == whole.text
    assert counts == whole.counts
    assert most <= R.max_reach + LOOKAROUND


def test_a_finished_stream_takes_no_more_text() -> None:
    stream = R.stream()
    stream.finish()
    with pytest.raises(errors.InvalidInput):
        stream.feed("x")


def test_the_stream_matcher_reports_offsets_of_the_whole_text() -> None:
    text = "a " * 5000 + SAMPLES[5].text + " b" * 5000
    matcher = R.matcher()
    found = []
    for at in range(0, len(text), 999):
        found += matcher.feed(text[at : at + 999])
    found += matcher.finish()
    assert [(f.kind, f.start, f.end) for f in found] == [
        (f.kind, f.start, f.end) for f in R.find(text)
    ]
    assert text[found[0].start : found[0].end] == SAMPLES[5].secret


# -- JSON values ----------------------------------------------------------------------------


def test_json_values_are_walked_and_keys_give_context() -> None:
    gh = next(s.secret for s in SAMPLES if s.kind == "github-token")
    aws = next(s.secret for s in SAMPLES if s.kind == "aws-secret-access-key")
    value = {
        "cmd": ["curl", "-H", "Authorization: Bearer 9abcdefghijklmnopqrst"],
        "headers": {"Authorization": "Bearer 9abcdefghijklmnopqrst", "Accept": "json"},
        "env": {"GITHUB_TOKEN": gh, "HOME": "/root"},
        "creds": {"SecretAccessKey": aws, "Expiration": "2030-01-01"},
        "blob": gh.encode(),
        "n": 3,
        "ok": True,
        "none": None,
        "nested": [[{"t": "with " + gh}]],
    }
    out, counts = R.redact_value(value)
    assert counts == Counter(
        {"authorization-header": 2, "github-token": 3, "aws-secret-access-key": 1}
    )
    assert out["headers"] == {
        "Authorization": "Bearer [REDACTED:authorization-header]",
        "Accept": "json",
    }
    assert out["env"] == {"GITHUB_TOKEN": "[REDACTED:github-token]", "HOME": "/root"}
    assert out["blob"] == b"[REDACTED:github-token]"
    assert out["n"] == 3 and out["ok"] is True and out["none"] is None
    assert value["env"]["GITHUB_TOKEN"] == gh, "the input was changed"
    paths = sorted(path for path, _, _ in R.find_in_value(value))
    assert paths == [
        "$.cmd[2]", "$.creds.SecretAccessKey", "$.env.GITHUB_TOKEN",
        "$.headers.Authorization", "$.nested[0][0].t",
    ]  # fmt: skip


def test_binary_bytes_are_left_as_they_are() -> None:
    data = b"\xff\xfe" + b"ghp_" + b"x" * 40
    out, counts = R.redact_value(data)
    assert out is data and not counts


def test_a_value_nested_too_deep_is_refused() -> None:
    value: list[object] = []
    for _ in range(300):
        value = [value]
    with pytest.raises(errors.InvalidInput):
        R.redact_value(value)


# -- a user's rules -------------------------------------------------------------------------


def write_rules(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "rules.toml"
    path.write_text(text)
    return path


def test_a_users_rules_file_adds_rules_allows_strings_and_drops_kinds(tmp_path: Path) -> None:
    path = write_rules(
        tmp_path,
        """
version = 1
disable = ["jwt"]
allow = ["AKIAIOSFODNN7EXAMPLE"]
allow_patterns = ['ACME-TEST-\\d{6}']

[[rule]]
kind = "acme-token"
prefixes = ["ACME-"]
body = '[A-Z]{4}-\\d{6}'
""",
    )
    redactor = Redactor(Ruleset.load(path))
    jwt = next(s for s in SAMPLES if s.kind == "jwt")
    text = f"a ACME-PROD-123456 b ACME-TEST-123456 c {'AKIA' + 'IOSFODNN7EXAMPLE'} d {jwt.text}"
    result = redactor.redact(text)
    assert result.counts == Counter({"acme-token": 1})
    assert "ACME-TEST-123456" in result.text and "AKIAIOSFODNN7EXAMPLE" in result.text
    assert jwt.secret in result.text
    # Streams use the user's rules too.
    assert stream_all(list(text), redactor)[0] == result.text


@pytest.mark.parametrize(
    ("rule", "why"),
    [
        ("kind = 'Bad Kind'\nprefixes = ['x-']\nbody = 'a'", "kind"),
        ("kind = 'k'\nprefixes = []\nbody = 'a'", "prefixes"),
        ("kind = 'k'\nprefixes = ['x-']\nbody = '[a-z]+'", "unbounded"),
        ("kind = 'k'\nprefixes = ['x-']\nbody = 'a{1,30000}'", "bound every repeat"),
        ("kind = 'k'\nprefixes = ['x-']\nbody = 'a(?=b{100})'", "lookahead"),
        ("kind = 'k'\nprefixes = ['x-']\nbody = '(unclosed'", "not a regular expression"),
        ("kind = 'k'\nprefixes = ['x-']\nbody = 'a'\nsecret = 2", "secret must be"),
        ("kind = 'k'\nprefixes = ['x-']\nbody = 'a'\ncolor = 1", "only"),
        ("kind = 'k'\nprefixes = ['x-']\nbody = 'a'\nboundary = 'line'", "boundary"),
    ],
)
def test_a_rule_that_cannot_be_used_is_a_config_error(tmp_path: Path, rule: str, why: str) -> None:
    path = write_rules(tmp_path, f"[[rule]]\n{rule}\n")
    with pytest.raises(errors.ConfigError, match=why):
        Ruleset.load(path)


def test_a_bad_rules_file_is_a_config_error_and_a_missing_one_not_found(tmp_path: Path) -> None:
    with pytest.raises(errors.ConfigError, match="TOML"):
        Ruleset.load(write_rules(tmp_path, "[[rule]\n"))
    with pytest.raises(errors.ConfigError, match="unknown key"):
        Ruleset.load(write_rules(tmp_path, "rules = []\n"))
    with pytest.raises(errors.ConfigError, match="disable names no built-in kind"):
        Ruleset.load(write_rules(tmp_path, "disable = ['nope']\n"))
    with pytest.raises(errors.NotFound):
        Ruleset.load(tmp_path / "absent.toml")


def test_a_finding_is_named_without_showing_the_secret() -> None:
    secret = next(s.secret for s in SAMPLES if s.kind == "github-token")
    assert preview(secret) == secret[:4] + "…"
    assert preview("hunter2") == "…"
    assert fingerprint(secret) == fingerprint(secret)
    assert fingerprint(secret) != fingerprint(secret + "x")
    assert secret[4:] not in fingerprint(secret) + preview(secret)


def test_the_pem_sample_helper_builds_what_it_says() -> None:
    import random

    key = pem(random.Random(1), "EC", 2)
    assert key.startswith("-----BEGIN EC PRIVATE KEY-----\n")
    assert key.endswith("\n-----END EC PRIVATE KEY-----")


def test_bytes_are_redacted_in_place_their_framing_kept() -> None:
    """A serialized body (msgpack, a pickle) keeps its length and every byte that is not
    the secret's: a length header before the text stays true.  (A length byte that
    reads as a letter defeats a rule's boundary before a prefix: docs/secrets.md.)"""
    from fleetstore.core.redact import write_redaction

    w = write_redaction()
    for s in samples():
        data = b"\xd9\x90" + s.text.encode() + b"\x92\x07\xc3"
        out = w.data(data)
        assert len(out) == len(data) and out[:2] == data[:2] and out[-3:] == data[-3:], s.kind
        assert s.secret.encode() not in out and b"[REDACTED" in out, (s.kind, out)


def test_a_redacted_values_json_read_as_text_holds_no_secret() -> None:
    """Markers with JSON escapes after them (a redacted value stored as JSON, read by
    scan): TOKEN=[REDACTED:x]\\nHOME=... is no secret."""
    for s in samples():
        value, _ = R.redact_value({"out": f"a\n{s.text}\nHOME=/root\nb"})
        assert R.find(json.dumps(value)) == [], s.kind
