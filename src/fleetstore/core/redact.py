"""Secrets found by high-specificity rules and replaced by a marker naming their kind.

The rules are data: ``redact_rules.toml`` beside this module, and a user's file of the
same form (``Ruleset.load``), which adds rules, drops built-in ones by kind and allows
strings.  A rule is a kind, literal *prefixes* every match starts with, and a *body*
regex of bounded length.  A rule is tried only where one of its prefixes occurs, so a
scan is linear in the text (each try is bounded by the rule's width; bodies use
possessive repeats so a failed try does not backtrack), and a match is replaced by
``[REDACTED:<kind>]`` (only its ``secret`` group, for rules that match a key name before
the value).

Where matches start at the same place, the rule listed first wins; a match consumes its
text, so matches never overlap.  ``find`` decides left to right; ``StreamMatcher`` makes
the same decisions on text that arrives in pieces, holding back only text that a later
piece could still make part of a match (a prefix cut at the end of a piece, or a prefix
whose rule's longest match could reach past it), so ``stream`` output equals ``redact``
of the whole text however it was cut (tests/core/test_redact.py cuts at every byte).

This module knows nothing of what the text is (a message, a tool output, a database
column): the write path (issue 29, wired later), ``fleetstore scan`` and the tests use it.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
import os
import re
import threading
import tomllib
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetstore import errors

#: What a secret becomes.
MARKER = "[REDACTED:{kind}]"
#: Characters a rule may look at around its match (its lookbehind before the prefix,
#: lookaheads after the match): a stream keeps this much context on both sides.
LOOKAROUND = 64
#: The longest match a rule may make (characters): a stream holds back at most this much.
MAX_WIDTH = 20_000
MAX_PREFIX = 32
#: The rules shipped with fleetstore.
BUILTIN_RULES = Path(__file__).with_name("redact_rules.toml")

_KIND = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
_SIMPLE_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_BOUNDARIES = {
    # No letter, digit, "_" or "-" right before the prefix (a token starts there), or a
    # JSON escape (a token at the start of a line of an escaped string).
    "word": r"(?:(?<![A-Za-z0-9_-])|(?<=\\[nrt]))",
    # NAME_PREFIX= : the prefix ends a longer upper-case name (DB_PASSWORD=, and
    # PGPASSWORD=, which a rule wanting "_" before it missed), or starts one.
    "env": r"(?:(?<=[A-Z_])|(?<![A-Za-z0-9])|(?<=\\[nrt]))",
    "none": "",
}
_FLAGS = re.ASCII
_MARKER = re.compile(r"\[REDACTED(?::[a-z0-9][a-z0-9-]{0,63})?\]")
#: What a secret in bytes is overwritten within (WriteRedaction.data): printable ASCII,
#: tab, CR and LF (a private key's lines), never a byte a binary format frames with.
_IN_BYTES = re.compile(r"[\t\n\r\x20-\x7e]*")


@dataclass(frozen=True, slots=True)
class Finding:
    """A secret in a text: its kind and where it is (``text[start:end]``)."""

    kind: str
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Rule:
    """One token format (see redact_rules.toml for the fields).  ``ConfigError`` if it
    cannot be used: a bad kind or prefix, a body that does not compile, has no bound on
    its length, or looks further around it than ``LOOKAROUND``."""

    kind: str
    prefixes: tuple[str, ...]
    body: str
    secret: int = 0
    ignore_case: bool = False
    boundary: str = "word"
    regex: re.Pattern[str] = field(init=False, repr=False, compare=False)
    #: The longest match (characters, prefix included).
    width: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        where = f"redaction rule {self.kind!r:.80}"
        if not isinstance(self.kind, str) or not _KIND.fullmatch(self.kind):
            raise errors.ConfigError(
                f"{where}: a kind is 1 to 64 lower-case letters, digits and '-'"
            )
        if (
            not isinstance(self.prefixes, tuple)
            or not self.prefixes
            or not all(
                isinstance(p, str) and 0 < len(p) <= MAX_PREFIX and p.isascii() and p.isprintable()
                for p in self.prefixes
            )
        ):
            raise errors.ConfigError(
                f"{where}: prefixes must be a non-empty list of literal strings of 1 to "
                f"{MAX_PREFIX} printable ASCII characters (every match starts with one)"
            )
        if self.boundary not in _BOUNDARIES:
            raise errors.ConfigError(
                f"{where}: boundary must be one of {', '.join(_BOUNDARIES)}, "
                f"not {self.boundary!r:.40}"
            )
        if not isinstance(self.body, str) or not isinstance(self.ignore_case, bool):
            raise errors.ConfigError(f"{where}: body must be a string, ignore_case a boolean")
        alternatives = "|".join(re.escape(p) for p in sorted(self.prefixes, key=len, reverse=True))
        source = f"{_BOUNDARIES[self.boundary]}(?:{alternatives})(?:{self.body})"
        flags = _FLAGS | (re.IGNORECASE if self.ignore_case else 0)
        try:
            regex = re.compile(source, flags)
        except (re.error, RecursionError, OverflowError) as exc:
            raise errors.ConfigError(
                f"{where}: its body is not a regular expression: {exc}"
            ) from None
        width, looks = _widths(source, flags)
        if width > MAX_WIDTH:
            raise errors.ConfigError(
                f"{where}: a match could be {'unbounded' if width >= _UNBOUNDED else width} "
                f"characters long; bound every repeat ({{m,n}}, not * or +) to at most "
                f"{MAX_WIDTH:,} in all"
            )
        if looks > LOOKAROUND:
            raise errors.ConfigError(
                f"{where}: a lookahead or lookbehind spans {looks} characters, over {LOOKAROUND}"
            )
        if not isinstance(self.secret, int) or not 0 <= self.secret <= regex.groups:
            raise errors.ConfigError(
                f"{where}: secret must be 0 (the whole match) or one of its "
                f"{regex.groups} group(s), not {self.secret!r:.20}"
            )
        object.__setattr__(self, "regex", regex)
        object.__setattr__(self, "width", width)


_UNBOUNDED = 1 << 30


def _widths(source: str, flags: int) -> tuple[int, int]:
    """The longest match of *source* and the widest lookaround in it.  Read from the
    parse tree of ``re`` itself (re._parser: there is no public API for it)."""
    parser: Any = importlib.import_module("re._parser")
    tree = parser.parse(source, flags)
    widest = 0

    def walk(node: Any) -> None:
        nonlocal widest
        for op, av in node:
            if str(op) in ("ASSERT", "ASSERT_NOT"):
                widest = max(widest, min(av[1].getwidth()[1], _UNBOUNDED))
            stack = [av]
            while stack:
                item = stack.pop()
                if isinstance(item, tuple | list):
                    stack.extend(item)
                elif hasattr(item, "getwidth"):
                    walk(item)

    walk(tree)
    return min(tree.getwidth()[1], _UNBOUNDED), widest


@dataclass(frozen=True, slots=True)
class Ruleset:
    """The rules a redactor applies, in order, and what it leaves alone: ``allow``
    (exact strings) and ``allow_patterns`` (a secret that matches one whole)."""

    rules: tuple[Rule, ...]
    allow: frozenset[str] = frozenset()
    allow_patterns: tuple[re.Pattern[str], ...] = ()

    @staticmethod
    def builtin() -> Ruleset:
        """fleetstore's rules (redact_rules.toml)."""
        return _builtin()

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None) -> Ruleset:
        """The built-in rules, with the user's file at *path* (if given) applied: its
        ``disable`` (kinds) drops built-in rules, its rules come after the rest, its
        ``allow`` and ``allow_patterns`` add to the built-in ones.  ``ConfigError`` if the
        file cannot be read or used; ``NotFound`` if it does not exist."""
        base = _builtin()
        if path is None:
            return base
        return base.extend(_read_rules_file(Path(os.fspath(path))))

    def extend(self, data: Mapping[str, Any], source: str = "rules") -> Ruleset:
        """This ruleset with a user's rules *data* (the parsed TOML) applied."""
        parsed = _parse(data, source, user=True)
        disabled = set(parsed["disable"])
        unknown = disabled - {r.kind for r in self.rules}
        if unknown:
            raise errors.ConfigError(
                f"{source}: disable names no built-in kind: {', '.join(sorted(unknown))}"
            )
        return Ruleset(
            rules=tuple(r for r in self.rules if r.kind not in disabled) + parsed["rules"],
            allow=self.allow | parsed["allow"],
            allow_patterns=self.allow_patterns + parsed["allow_patterns"],
        )

    @property
    def kinds(self) -> list[str]:
        return sorted({r.kind for r in self.rules})


@functools.cache
def _builtin() -> Ruleset:
    parsed = _parse(
        tomllib.loads(BUILTIN_RULES.read_text(encoding="utf-8")), "built-in", user=False
    )
    return Ruleset(parsed["rules"], parsed["allow"], parsed["allow_patterns"])


def _read_rules_file(path: Path) -> Mapping[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise errors.NotFound(f"{path}: no such rules file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise errors.ConfigError(f"{path}: cannot read the rules file: {exc}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise errors.ConfigError(f"{path}: not a TOML rules file: {exc}") from None


_RULE_KEYS = {"kind", "prefixes", "body", "secret", "ignore_case", "boundary"}


def _parse(data: Mapping[str, Any], source: str, *, user: bool) -> dict[str, Any]:
    known = {"version", "rule", "allow", "allow_patterns"} | ({"disable"} if user else set())
    extra = set(data) - known
    if extra:
        raise errors.ConfigError(
            f"{source}: unknown key(s) {', '.join(sorted(extra))}; known: {', '.join(sorted(known))}"
        )
    if data.get("version", 1) != 1:
        raise errors.ConfigError(f"{source}: version must be 1, not {data.get('version')!r:.20}")
    rules: list[Rule] = []
    raw_rules = data.get("rule", [])
    if not isinstance(raw_rules, list):
        raise errors.ConfigError(f"{source}: rules are [[rule]] tables")
    for i, raw in enumerate(raw_rules):
        if (
            not isinstance(raw, dict)
            or set(raw) - _RULE_KEYS
            or not {"kind", "prefixes", "body"} <= set(raw)
        ):
            raise errors.ConfigError(
                f"{source}: rule {i + 1} must have kind, prefixes and body, and only "
                f"{', '.join(sorted(_RULE_KEYS))}"
            )
        prefixes = raw["prefixes"]
        rules.append(
            Rule(
                kind=raw["kind"],
                prefixes=tuple(prefixes) if isinstance(prefixes, list) else prefixes,
                body=raw["body"],
                secret=raw.get("secret", 0),
                ignore_case=raw.get("ignore_case", False),
                boundary=raw.get("boundary", "word"),
            )
        )
    lists: dict[str, list[str]] = {}
    for key in ("allow", "allow_patterns", "disable"):
        value = data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise errors.ConfigError(f"{source}: {key} must be a list of strings")
        lists[key] = value
    patterns = []
    for text in lists["allow_patterns"]:
        try:
            patterns.append(re.compile(text, _FLAGS))
        except (re.error, RecursionError, OverflowError) as exc:
            raise errors.ConfigError(f"{source}: allow pattern {text!r:.80}: {exc}") from None
    return {
        "rules": tuple(rules),
        "allow": frozenset(lists["allow"]),
        "allow_patterns": tuple(patterns),
        "disable": lists["disable"],
    }


@dataclass(frozen=True, slots=True)
class Redaction:
    """A text with its secrets replaced, and how many of each kind were."""

    text: str
    counts: Counter[str]


class Redactor:
    """Finds and replaces the secrets a ``Ruleset`` describes.  Thread-safe (it holds no
    state of a text; ``stream()`` makes an object that does)."""

    def __init__(self, ruleset: Ruleset | None = None) -> None:
        self.ruleset = ruleset or Ruleset.builtin()
        rules = self.ruleset.rules
        if not rules:
            raise errors.ConfigError("a redactor needs at least one rule")
        #: prefix -> indexes of the rules it starts: case-sensitive prefixes, and the
        #: others in lower case (found in ``_fold(text)``).
        self._exact: dict[str, list[int]] = {}
        self._folded: dict[str, list[int]] = {}
        for index, rule in enumerate(rules):
            for prefix in rule.prefixes:
                if rule.ignore_case:
                    self._folded.setdefault(prefix.lower(), []).append(index)
                else:
                    self._exact.setdefault(prefix, []).append(index)
        self._exact_finder = _PrefixFinder(self._exact)
        self._folded_finder = _PrefixFinder(self._folded)
        # Every proper beginning of a prefix: text ending in one may be a prefix cut off.
        self._starts_exact = {p[:k] for p in self._exact for k in range(1, len(p))}
        self._starts_folded = {p[:k] for p in self._folded for k in range(1, len(p))}
        self._longest_start = max(
            (len(s) for s in self._starts_exact | self._starts_folded), default=0
        )
        #: How far past a prefix's position a rule's decision can look.
        self._reach = [rule.width + LOOKAROUND for rule in rules]
        self.max_reach = max(self._reach)
        self._allow = self.ruleset.allow
        self._allow_patterns = self.ruleset.allow_patterns
        self.screen = _screen(self._exact, self._folded)
        self.cut_prefix = _cut_prefix(rules)

    # -- the decisions ---------------------------------------------------------------------

    def find(self, text: str) -> list[Finding]:
        """The secrets in *text*, in order (spans of ``text``)."""
        return self._decide(text, 0, final=True)[1]

    def redact(self, text: str) -> Redaction:
        """*text* with each secret replaced by its marker."""
        counts: Counter[str] = Counter()
        return Redaction(_replace(text, self.find(text), counts), counts)

    def redact_value(self, value: Any) -> tuple[Any, Counter[str]]:
        """A JSON-like value (tool arguments, a state value, an effect payload) with the
        secrets in every string inside it replaced; mappings and lists are copied, other
        values returned as they are.  A string under a key is read as ``key=value``, so
        that ``{"Authorization": "Bearer X"}`` is caught as the header would be; keys
        themselves are kept.  Bytes are redacted if they are UTF-8 text."""
        counts: Counter[str] = Counter()
        return self._value(value, counts, 0), counts

    def _value(self, value: Any, counts: Counter[str], depth: int) -> Any:
        if depth > 200:
            raise errors.InvalidInput("a value nested over 200 levels deep cannot be redacted")
        if isinstance(value, str):
            return _replace(value, self.find(value), counts)
        if isinstance(value, Mapping):
            out = {}
            for key, item in value.items():
                if isinstance(item, str) and isinstance(key, str) and len(key) <= 64:
                    out[key] = self._keyed(key, item, counts)
                else:
                    out[key] = self._value(item, counts, depth + 1)
            return out
        if isinstance(value, list | tuple):
            items = [self._value(item, counts, depth + 1) for item in value]
            return items if isinstance(value, list) else tuple(items)
        if isinstance(value, bytes | bytearray):
            try:
                text = bytes(value).decode("utf-8")
            except UnicodeDecodeError:
                return value
            found = self.find(text)
            return _replace(text, found, counts).encode("utf-8") if found else value
        return value

    def _keyed(self, key: str, text: str, counts: Counter[str]) -> str:
        return _replace(text, self._find_keyed(key, text), counts)

    def _find_keyed(self, key: str, text: str) -> list[Finding]:
        """The secrets of *text*, a string under *key*, read as ``key=text``."""
        offset = len(key) + 1
        return [
            Finding(f.kind, f.start - offset, f.end - offset)
            for f in self.find(f"{key}={text}")
            if f.start >= offset
        ]

    def find_in_value(self, value: Any) -> Iterator[tuple[str, str, Finding]]:
        """(JSON path, the string, a finding in it) for every secret inside a JSON-like
        *value*, read as ``redact_value`` reads it."""
        stack: list[tuple[str, Any, Any]] = [("$", None, value)]
        while stack:
            where, key, item = stack.pop()
            if isinstance(item, str):
                found = (
                    self._find_keyed(key, item)
                    if isinstance(key, str) and len(key) <= 64
                    else self.find(item)
                )
                for f in found:
                    yield where, item, f
            elif isinstance(item, Mapping):
                for k, sub in reversed(list(item.items())):
                    name = str(k)
                    step = f".{name}" if _SIMPLE_KEY.fullmatch(name) else f"[{json.dumps(name)}]"
                    stack.append((where + step, k, sub))
            elif isinstance(item, list | tuple):
                for i in range(len(item) - 1, -1, -1):
                    stack.append((f"{where}[{i}]", None, item[i]))

    def stream(self) -> StreamRedactor:
        """A redactor for one text arriving in pieces (a streamed reply)."""
        return StreamRedactor(self)

    def matcher(self) -> StreamMatcher:
        """A finder for one text arriving in pieces (a large file, read in chunks)."""
        return StreamMatcher(self)

    def _allowed(self, secret: str) -> bool:
        return secret in self._allow or any(p.fullmatch(secret) for p in self._allow_patterns)

    def _candidates(self, text: str, start: int, limit: int) -> list[tuple[int, int]]:
        """(position, rule index) of every prefix occurrence starting in [start, limit)."""
        found: list[tuple[int, int]] = []
        self._exact_finder.find(text, start, limit, found)
        if self._folded:
            self._folded_finder.find(_fold(text), start, limit, found)
        found.sort()
        return found

    def _partial_limit(self, text: str, start: int) -> int:
        """Where a prefix cut off by the end of *text* may begin (``len(text)`` if none)."""
        n = len(text)
        for k in range(min(self._longest_start, n - start), 0, -1):
            tail = text[n - k :]
            if tail in self._starts_exact or _fold(tail) in self._starts_folded:
                return n - k
        return n

    def _kind_of(self, rule: Rule, secret: str) -> str:
        """The kind of a secret a rule found by its context (GITHUB_TOKEN=X): that of a
        rule matching the whole of it if there is one (X is a GitHub token), else the
        rule's own."""
        if rule.secret == 0:
            return rule.kind
        # Only the rules that match a token by itself, tried at its start: a rule by
        # context here would look inside again (PASSWORD=PASSWORD=... recursed).
        for pos, index in self._candidates(secret, 0, 1):
            inner = self.ruleset.rules[index]
            if inner.secret == 0:
                m = inner.regex.match(secret, pos)
                if m is not None and m.end() == len(secret):
                    return inner.kind
        return rule.kind

    def _decide(self, text: str, start: int, *, final: bool) -> tuple[int, list[Finding]]:
        """The secrets of *text* from *start*, decided left to right, and how far the
        decisions go: all of *text* if *final*, else up to the first place more text
        could change (see the module docstring)."""
        n = len(text)
        limit = n if final else self._partial_limit(text, start)
        found: list[Finding] = []
        consumed = start
        rules = self.ruleset.rules
        for pos, index in self._candidates(text, start, limit):
            if pos < consumed:
                continue
            if not final and pos + self._reach[index] > n:
                return pos, found
            rule = rules[index]
            m = rule.regex.match(text, pos)
            if m is None:
                continue
            s, e = m.span(rule.secret)
            if _MARKER.match(text, s):
                # A value redacted already, read as text from its JSON (TOKEN=[REDACTED:x]
                # then \nHOME=..., which the rule's body does not stop at): no secret, and
                # what follows is decided on its own (test_redaction.py, the state blob).
                continue
            consumed = m.end()
            # A secret ending in an escape's backslash (JSON text: TOKEN=x\") keeps it:
            # replaced with it, the quote after it would end the string.
            back = e
            while back > s and text[back - 1] == "\\":
                back -= 1
            if (e - back) % 2:
                e -= 1
            if e > s and not self._allowed(text[s:e]):
                found.append(Finding(self._kind_of(rule, text[s:e]), s, e))
        return limit, found


class _PrefixFinder:
    """Every position where one of *prefixes* starts, in one pass of ``re``: the prefixes
    as a trie-shaped pattern (``(?:A(?:KIA|SIA)|gh(?:p_|o_)...)``), searched again from
    the character after each hit so that overlapping prefixes are all found.  One
    ``str.find`` pass per prefix (96) cost 2-3 times more (benchmarks/bench_redact.py)."""

    def __init__(self, prefixes: Mapping[str, list[int]]) -> None:
        self._regex = re.compile(_trie_pattern(list(prefixes))) if prefixes else None
        self._by_first: dict[str, list[tuple[str, list[int]]]] = {}
        for prefix, indexes in prefixes.items():
            self._by_first.setdefault(prefix[0], []).append((prefix, indexes))

    def find(self, text: str, start: int, limit: int, found: list[tuple[int, int]]) -> None:
        if self._regex is None:
            return
        search = self._regex.search
        m = search(text, start)
        while m is not None and m.start() < limit:
            at = m.start()
            for prefix, indexes in self._by_first[text[at]]:
                if text.startswith(prefix, at):
                    found.extend((at, i) for i in indexes)
            m = search(text, at + 1)


def _trie_pattern(words: list[str]) -> str:
    trie: dict[str, Any] = {}
    for word in words:
        node = trie
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict[str, Any]) -> str:
        alternatives = [re.escape(ch) + emit(child) for ch, child in sorted(node.items()) if ch]
        if not alternatives:
            return ""
        body = alternatives[0] if len(alternatives) == 1 else f"(?:{'|'.join(alternatives)})"
        return f"(?:{body})?" if "" in node else body

    return emit(trie)


def _fold(text: str) -> str:
    """*text* in ASCII lower case, one character for one (every other character becomes
    "?"), so that positions in it are positions in *text*: the rules match case-folded
    ASCII only (``re.ASCII``)."""
    if text.isascii():
        return text.lower()
    return text.encode("ascii", "replace").decode("ascii").lower()


def _replace(text: str, found: list[Finding], counts: Counter[str]) -> str:
    if not found:
        return text
    pieces, at = [], 0
    for f in found:
        pieces.append(text[at : f.start])
        pieces.append(MARKER.format(kind=f.kind))
        counts[f.kind] += 1
        at = f.end
    pieces.append(text[at:])
    return "".join(pieces)


class StreamMatcher:
    """``Redactor.find`` for a text arriving in pieces: ``feed`` each piece, then
    ``finish``; each returns the findings decided so far, at offsets of the whole text.
    Holds back at most ``redactor.max_reach`` characters (plus ``LOOKAROUND`` of
    context before them)."""

    def __init__(self, redactor: Redactor) -> None:
        self.redactor = redactor
        self._buf = ""
        #: Offset in the whole text of ``_buf[0]``.
        self._base = 0
        #: Where in ``_buf`` the undecided text begins (what precedes it is context).
        self._start = 0
        self._finished = False

    def resume(self, context: str) -> None:
        """Go on from a text whose beginning (ending in *context*) was decided
        elsewhere, with nothing found in it: *context* is what rules look behind at."""
        if self._buf or self._base:
            raise errors.InvalidInput("resume() starts a stream, before anything is fed")
        self._buf = context[-LOOKAROUND:]
        self._start = len(self._buf)
        self._base = -self._start

    @property
    def decided(self) -> int:
        """How much of the whole text is decided (its offset)."""
        return self._base + self._start

    @property
    def held(self) -> int:
        """Characters received but not decided yet."""
        return len(self._buf) - self._start

    def feed(self, piece: str) -> list[Finding]:
        return self._step(piece, final=False)[1]

    def finish(self) -> list[Finding]:
        return self._step("", final=True)[1]

    def _step(self, piece: str, *, final: bool) -> tuple[str, list[Finding]]:
        """Decide what *piece* allows; the newly decided text and its findings (at
        offsets of the whole text)."""
        if self._finished:
            raise errors.InvalidInput("this stream was finished")
        if not isinstance(piece, str):
            raise errors.InvalidInput(f"a stream takes text, not {type(piece).__name__}")
        self._finished = final
        buf = self._buf + piece
        cut, found = self.redactor._decide(buf, self._start, final=final)
        decided = buf[self._start : cut]
        keep = max(cut - LOOKAROUND, 0)
        self._buf = buf[keep:]
        self._start = cut - keep
        base = self._base
        self._base += keep
        return decided, [Finding(f.kind, base + f.start, base + f.end) for f in found]


class StreamRedactor:
    """``Redactor.redact`` for a text arriving in pieces (streamed deltas, or flushes):
    ``feed`` returns the redacted text that can be written now, ``finish`` the rest.
    Their concatenation equals ``redact`` of the whole text.  ``counts`` grows as
    secrets are found; ``held`` says how many characters wait for more text."""

    def __init__(self, redactor: Redactor) -> None:
        self._matcher = StreamMatcher(redactor)
        self.counts: Counter[str] = Counter()

    @property
    def held(self) -> int:
        return self._matcher.held

    def feed(self, piece: str) -> str:
        return self._emit(piece, final=False)

    def finish(self) -> str:
        return self._emit("", final=True)

    def _emit(self, piece: str, *, final: bool) -> str:
        offset = self._matcher.decided
        decided, found = self._matcher._step(piece, final=final)
        local = [Finding(f.kind, f.start - offset, f.end - offset) for f in found]
        return _replace(decided, local, self.counts)


def _screen(exact: Mapping[str, Any], folded: Mapping[str, Any]) -> re.Pattern[str]:
    """One pattern that matches wherever any rule's prefix occurs (in any case for the
    rules that ignore it), and where a prefix ending in ``=`` occurs as a JSON object's
    key (``"DB_PASSWORD": ...``, which a JSON value's walk reads as ``DB_PASSWORD=``).
    No match: neither ``find`` on the text nor ``redact_value`` of the value it encodes
    finds anything (tests/core/test_redact.py), so the write path stops there."""
    keyed = [p[:-1] + '"' for p in exact if p.endswith("=") and len(p) > 1]
    keyed_folded = [p[:-1] + '"' for p in folded if p.endswith("=") and len(p) > 1]
    parts = [_trie_pattern(list(exact) + keyed)] if exact else []
    if folded:
        parts.append(f"(?i:{_trie_pattern(list(folded) + keyed_folded)})")
    return re.compile("|".join(parts) or "(?!)", _FLAGS)


def _cut_prefix(rules: tuple[Rule, ...]) -> re.Pattern[str]:
    """A pattern matching at the end of a text that ends in the beginning of a prefix
    where that rule's token could begin (``gh`` after a space may begin ``ghp_``; the
    ``n`` of ``written`` begins no token, as ``npm_`` must start a word): a stream
    must hold such an end back, and needs to hold nothing else."""
    groups: dict[tuple[str, bool], set[str]] = {}
    for rule in rules:
        starts = groups.setdefault((rule.boundary, rule.ignore_case), set())
        for prefix in rule.prefixes:
            starts.update(prefix[:k] for k in range(1, len(prefix)))
    parts = []
    for (boundary, fold), starts in sorted(groups.items()):
        if starts:
            words = sorted({w.lower() for w in starts} if fold else starts)
            body = f"(?i:{_trie_pattern(words)})" if fold else f"(?:{_trie_pattern(words)})"
            parts.append(_BOUNDARIES[boundary] + body)
    return re.compile(f"(?:{'|'.join(parts)})\\Z" if parts else "(?!)", _FLAGS)


class WriteRedaction:
    """What a store applies to content before it stores it (``redaction`` on): a
    screen (one compiled regex search; nothing more when it finds no prefix), the
    redactor when it does, and the counts by kind of what was replaced in this process.
    Knows nothing of what the content is; the write path decides what passes here."""

    def __init__(self, redactor: Redactor) -> None:
        self.redactor = redactor
        #: ``screen(text)``: None means nothing in *text* (or in the JSON value it
        #: encodes) can be a secret.
        self.screen = redactor.screen.search
        #: ``cut(text, len(text) - reach)``: not None when *text* ends in what could
        #: begin a prefix (a stream must hold that end back).
        self.cut = redactor.cut_prefix.search
        self.reach = redactor._longest_start
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def _count(self, counts: Counter[str]) -> None:
        if counts:
            with self._lock:
                self.counts.update(counts)

    def text(self, text: str) -> str:
        """*text* redacted."""
        done = self.redactor.redact(text)
        self._count(done.counts)
        return done.text

    def value(self, value: Any) -> Any:
        """A JSON-like value redacted (see ``Redactor.redact_value``)."""
        out, counts = self.redactor.redact_value(value)
        self._count(counts)
        return out

    def json_text(self, text: str) -> str:
        """JSON text redacted as the value it encodes (its form kept when nothing is
        found)."""
        try:
            value = json.loads(text)
        except ValueError:
            return self.text(text)
        out, counts = self.redactor.redact_value(value)
        if not counts:
            return text
        self._count(counts)
        return json.dumps(out, ensure_ascii=False, separators=(",", ":"))

    def data(self, data: bytes) -> bytes:
        """Bytes redacted: JSON as the value it encodes; any other bytes (UTF-8 text, or
        a serialized body: LangGraph's msgpack, a pickle) read a byte a character, each
        secret overwritten in place by a marker of its length, within its run of
        printable ASCII.  A length that frames the text (msgpack's str header) stays
        true: a shorter marker made LangGraph's checkpoints unreadable
        (test_redaction.py, the frameworks' bodies)."""
        text = data.decode("latin-1")
        if self.screen(text) is None:
            return data
        if text.lstrip()[:1] in ("{", "[", '"'):
            try:
                value = json.loads(data)
            except ValueError:
                pass
            else:
                out, found = self.redactor.redact_value(value)
                if not found:
                    return data
                self._count(found)
                return json.dumps(out, ensure_ascii=False, separators=(",", ":")).encode()
        buf = bytearray(data)
        counts: Counter[str] = Counter()
        for f in self.redactor.find(text):
            m = _IN_BYTES.match(text, f.start, f.end)
            n = m.end() - f.start if m is not None else 0
            if n:
                buf[f.start : f.start + n] = _fitted_marker(f.kind, n)
                counts[f.kind] += 1
        self._count(counts)
        return bytes(buf)

    def stream(self, context: str = "") -> CountedStream:
        """A stream redactor for a text whose beginning, ending in *context*, was
        written with nothing found in it."""
        return CountedStream(self, context)


class CountedStream:
    """A ``StreamRedactor`` whose counts go to its ``WriteRedaction``."""

    def __init__(self, owner: WriteRedaction, context: str) -> None:
        self._owner = owner
        self._stream = StreamRedactor(owner.redactor)
        if context:
            self._stream._matcher.resume(context)

    def feed(self, piece: str) -> str:
        before = Counter(self._stream.counts)
        out = self._stream.feed(piece)
        self._owner._count(self._stream.counts - before)
        return out

    def finish(self) -> str:
        before = Counter(self._stream.counts)
        out = self._stream.finish()
        self._owner._count(self._stream.counts - before)
        return out


def _fitted_marker(kind: str, n: int) -> bytes:
    """A marker of exactly *n* bytes: ``[REDACTED:kind]`` padded with ``*``, else
    ``[REDACTED]`` padded, else ``*`` (markers and ``*`` runs are never secrets)."""
    marker = MARKER.format(kind=kind)
    if n < len(marker):
        marker = "[REDACTED]" if n >= 10 else ""
    return (marker + "*" * (n - len(marker))).encode("ascii")


def write_redaction(rules_file: str = "") -> WriteRedaction:
    """The write path's redaction (a store's: counts of its own) with the built-in
    rules and the user's *rules_file* (its redactor built once per process and file)."""
    return WriteRedaction(_redactor_for(rules_file))


@functools.cache
def _redactor_for(rules_file: str) -> Redactor:
    return Redactor(Ruleset.load(rules_file or None))


@functools.cache
def default_redactor() -> Redactor:
    """A redactor with the built-in rules (built once per process)."""
    return Redactor()


def fingerprint(secret: str) -> str:
    """A short hash naming *secret* without showing it: the same secret found in two
    places has the same fingerprint, and a secret one holds can be checked against it."""
    return "sha256:" + hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def preview(secret: str) -> str:
    """At most the first 4 characters of *secret* (a long one: its provider's prefix,
    mostly), and none of a short one."""
    return (secret[:4] + "…") if len(secret) >= 16 else "…"


__all__ = [
    "BUILTIN_RULES",
    "LOOKAROUND",
    "MARKER",
    "Finding",
    "Redaction",
    "Redactor",
    "Rule",
    "Ruleset",
    "StreamMatcher",
    "StreamRedactor",
    "WriteRedaction",
    "default_redactor",
    "fingerprint",
    "preview",
    "write_redaction",
]
