"""A search query: parsed once, then said in each engine's language and checked against
the text of each hit (docs/search.md, "Query syntax").

The syntax is FTS5's, made the same on every engine::

    error timeout            both words (AND is implied)
    "connection refused"     a phrase: the words one after the other
    conn*                    a prefix ("src/fleet*": a phrase whose last word is one)
    a OR b, a AND b, a NOT b, ( ... )

``AND``, ``OR`` and ``NOT`` are operators in capitals only; NOT binds tightest, then
AND, then OR.  A bare term is whatever runs up to a space, a quote or a parenthesis,
and in word mode it stands for the words in it (``parse_tool_output`` is the phrase
"parse tool output", ``src/a.py`` is "src a py").  In substring mode each term is a
piece of text to find as it is (case aside), anywhere, even inside a word: at least
three characters (the trigram index cannot look for less).

A query must find something by itself: a term only negated (``NOT a``, ``a OR NOT b``)
is refused, as FTS5 refuses it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from fleetstore import errors
from fleetstore.core.validate import check_str
from fleetstore.domain.search_text import SEP, WORD_CHAR, Folded, gram_fold, words

_SEPARATOR = re.compile(SEP)

#: The longest query accepted (characters), and the most terms in one.
MAX_QUERY = 4096
MAX_TERMS = 64
#: Fewest characters a substring may have (one trigram).
MIN_SUBSTRING = 3
MODES = ("words", "substring")


@dataclass(frozen=True, slots=True)
class Term:
    """Words in a row (one word, or a phrase), the last one a prefix if *prefix*; in
    substring mode, *text* is the piece to find and *words* is empty."""

    text: str
    words: tuple[str, ...]
    prefix: bool = False


@dataclass(frozen=True, slots=True)
class And:
    items: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Or:
    items: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Not:
    item: Node


Node = Term | And | Or | Not

_TOKEN = re.compile(
    r'\s*(?:(?P<open>\()|(?P<close>\))|"(?P<quoted>(?:[^"]|"")*)"(?P<star>\*?)|(?P<bare>[^\s()"]+))'
)


def _lex(text: str) -> Iterator[tuple[str, str, bool]]:
    """(kind, text, prefix) per token: ``(``, ``)``, ``op`` (AND/OR/NOT) or ``term``."""
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            return
        m = _TOKEN.match(text, pos)
        if m is None:
            raise errors.InvalidInput(f"search query: an unclosed quote at {pos}: {text!r:.80}")
        pos = m.end()
        if m.group("open"):
            yield "(", "(", False
        elif m.group("close"):
            yield ")", ")", False
        elif m.group("quoted") is not None:
            yield "term", m.group("quoted").replace('""', '"'), m.group("star") == "*"
        else:
            bare = m.group("bare")
            if bare in ("AND", "OR", "NOT"):
                yield "op", bare, False
            elif bare.endswith("*") and len(bare) > 1:
                yield "term", bare[:-1], True
            else:
                yield "term", bare, False


class _Parser:
    def __init__(self, text: str, mode: str) -> None:
        self.tokens = list(_lex(text))
        self.pos = 0
        self.mode = mode
        self.terms = 0
        self.text = text

    def _peek(self) -> tuple[str, str, bool] | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def _fail(self, why: str) -> errors.InvalidInput:
        return errors.InvalidInput(f"search query {self.text!r:.120}: {why}")

    def parse(self) -> Node | None:
        node = self._or()
        if self._peek() is not None:
            raise self._fail(f"unexpected {self._peek()[1]!r}")  # type: ignore[index]
        return node

    def _or(self) -> Node | None:
        items = [self._and()]
        while (tok := self._peek()) is not None and tok[:2] == ("op", "OR"):
            self.pos += 1
            items.append(self._and())
        kept = [i for i in items if i is not None]
        if len(kept) < len(items) and len(items) > 1:
            raise self._fail("OR needs something to find on each side")
        return kept[0] if len(kept) == 1 else (Or(tuple(kept)) if kept else None)

    def _and(self) -> Node | None:
        items: list[Node | None] = []
        while (tok := self._peek()) is not None and tok[0] != ")" and tok[:2] != ("op", "OR"):
            if tok[:2] == ("op", "AND"):
                # FTS5 rejects a dangling AND ('a AND', 'AND a', 'a AND OR b'): so do we
                self.pos += 1
                after = self._peek()
                if not items or after is None or after[0] == ")" or after[1] in ("AND", "OR"):
                    raise self._fail("AND needs something to find on each side")
                continue
            items.append(self._not())
        kept = [i for i in items if i is not None]
        return kept[0] if len(kept) == 1 else (And(tuple(kept)) if kept else None)

    def _not(self) -> Node | None:
        tok = self._peek()
        if tok is not None and tok[:2] == ("op", "NOT"):
            self.pos += 1
            item = self._unary()
            return None if item is None else Not(item)
        node = self._unary()
        while (tok := self._peek()) is not None and tok[:2] == ("op", "NOT"):
            self.pos += 1
            negated = self._unary()
            if negated is not None:
                node = Not(negated) if node is None else And((node, Not(negated)))
        return node

    def _unary(self) -> Node | None:
        tok = self._peek()
        if tok is None:
            raise self._fail("it ends where a term was expected")
        kind, text, prefix = tok
        self.pos += 1
        if kind == "(":
            node = self._or()
            if self._peek() is None or self._peek()[0] != ")":  # type: ignore[index]
                raise self._fail("a parenthesis is not closed")
            self.pos += 1
            return node
        if kind != "term":
            raise self._fail(f"{text!r} where a term was expected")
        self.terms += 1
        if self.terms > MAX_TERMS:
            raise self._fail(f"more than {MAX_TERMS} terms")
        if self.mode == "substring":
            if len(text) < MIN_SUBSTRING:
                raise self._fail(
                    f"a substring needs at least {MIN_SUBSTRING} characters, not {text!r}"
                )
            return Term(text + ("*" if prefix else ""), ())
        found = tuple(words(text))
        return Term(text, found, prefix) if found else None


def parse(text: object, mode: str = "words") -> Node:
    """The query *text* parsed (``InvalidInput`` if it is not a query, or finds nothing
    by itself)."""
    check_str(text, "a search query", limit=MAX_QUERY, empty=False)
    assert isinstance(text, str)
    if not text.strip():
        raise errors.InvalidInput("a search query must not be only spaces")
    if mode not in MODES:
        raise errors.InvalidInput(f"match must be one of {', '.join(MODES)}, not {mode!r:.40}")
    node = _Parser(text, mode).parse()
    if node is None:
        raise errors.InvalidInput(f"search query {text!r:.120}: it has no word to look for")
    _check_positive(node, text)
    return node


def _positive(node: Node) -> bool:
    """Whether *node* can match without a negated term matching (what FTS5 needs)."""
    if isinstance(node, Term):
        return True
    if isinstance(node, Not):
        return False
    if isinstance(node, Or):
        return all(_positive(i) for i in node.items)
    return any(_positive(i) for i in node.items)


def _check_positive(node: Node, text: str) -> None:
    if not _positive(node):
        raise errors.InvalidInput(
            f"search query {text!r:.120}: NOT needs something to find beside it "
            "('a NOT b'; not 'NOT b' or 'a OR NOT b')"
        )


# -- in each engine's language ------------------------------------------------------------


def _fts_string(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'


def fts5_words(node: Node) -> str:
    """The FTS5 query of *node* on the words index (column ``body``)."""
    if isinstance(node, Term):
        return _fts_string(" ".join(node.words)) + (" *" if node.prefix else "")
    if isinstance(node, Or):
        return "(" + " OR ".join(fts5_words(i) for i in node.items) + ")"
    if isinstance(node, Not):  # only under an And, with something positive (parse checks)
        raise AssertionError("a NOT alone")
    plus = [fts5_words(i) for i in node.items if not isinstance(i, Not)]
    minus = [fts5_words(i.item) for i in node.items if isinstance(i, Not)]
    text = "(" + " AND ".join(plus) + ")"
    for m in minus:
        text = f"({text} NOT {m})"
    return text


def _trigrams(text: str) -> list[str]:
    seen: dict[str, None] = {}
    for i in range(len(text) - 2):
        seen.setdefault(gram_fold(text[i : i + 3]), None)
    return list(seen)


def fts5_grams(node: Node) -> str | None:
    """The FTS5 query of *node* on the trigram index: every trigram of each substring.
    Negations are left out (a section holding every trigram of a substring need not
    hold the substring: only the check against the text may exclude it): None if
    nothing is left to narrow by."""
    if isinstance(node, Term):
        return "(" + " AND ".join(_fts_string(g) for g in _trigrams(node.text)) + ")"
    if isinstance(node, Not):
        return None
    parts = [fts5_grams(i) for i in node.items]
    if isinstance(node, Or):
        return None if any(p is None for p in parts) else "(" + " OR ".join(parts) + ")"  # type: ignore[arg-type]
    kept = [p for p in parts if p is not None]
    return "(" + " AND ".join(kept) + ")" if kept else None


def _lexeme(word: str) -> str:
    return "'" + word.replace("\\", "\\\\").replace("'", "''") + "'"


def pg_tsquery(node: Node) -> str:
    """The PostgreSQL tsquery text of *node* (cast with ``::tsquery``: no parser runs
    on it, the words are already FTS5's)."""
    if isinstance(node, Term):
        parts = [_lexeme(w) for w in node.words]
        if node.prefix:
            parts[-1] += ":*"
        return "(" + " <-> ".join(parts) + ")"
    if isinstance(node, Not):
        return "!" + pg_tsquery(node.item)
    joiner = " | " if isinstance(node, Or) else " & "
    return "(" + joiner.join(pg_tsquery(i) for i in node.items) + ")"


def _like(text: str) -> str:
    folded = gram_fold(text)
    return "%" + folded.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def pg_substring(node: Node, column: str, params: dict[str, object]) -> str:
    """A PostgreSQL condition on *column* (the section's text, trigram-folded) for
    *node* in substring mode; its values are added to *params* (``sub0``, ``sub1``...)."""
    if isinstance(node, Term):
        name = f"sub{len(params)}"
        params[name] = _like(node.text)
        return f"{column} LIKE :{name}"
    if isinstance(node, Not):
        return f"NOT ({pg_substring(node.item, column, params)})"
    joiner = " OR " if isinstance(node, Or) else " AND "
    return "(" + joiner.join(pg_substring(i, column, params) for i in node.items) + ")"


# -- checked against a text ---------------------------------------------------------------


class Matcher:
    """*node* checked against sections of text, finding where it matches."""

    def __init__(self, node: Node, mode: str) -> None:
        self.node = node
        self.mode = mode
        self._patterns: dict[Term, re.Pattern[str]] = {}
        if mode == "words":
            self._compile(node)

    def _compile(self, node: Node) -> None:
        if isinstance(node, Term):
            # The word first, its start checked after (a lookbehind first kept the regex
            # engine from searching for the word's letters: 185 µs a section, not 5).
            body = f"{SEP}+".join(re.escape(w) for w in node.words)
            tail = f"{WORD_CHAR}*" if node.prefix else f"(?!{WORD_CHAR})"
            self._patterns[node] = re.compile(body + tail)
        elif isinstance(node, Not):
            self._compile(node.item)
        else:
            for item in node.items:
                self._compile(item)

    def match(self, text: str) -> list[tuple[int, int]] | None:
        """The spans of *text* the query's terms match, in order (None: it does not
        match)."""
        spans: list[tuple[int, int]] = []
        if self.mode == "words":
            folded = Folded(text)
            found = self._eval(self.node, folded.text, spans)
            spans = [folded.span(s, e) for s, e in spans]
        else:
            found = self._eval(self.node, gram_fold(text), spans)
        if not found:
            return None
        return sorted(set(spans))

    def _eval(self, node: Node, text: str, spans: list[tuple[int, int]]) -> bool:
        if isinstance(node, Term):
            found = list(self._find(node, text))
            spans.extend(found)
            return bool(found)
        if isinstance(node, Not):
            return not self._eval(node.item, text, [])
        if isinstance(node, Or):
            results = [self._eval(i, text, spans) for i in node.items]
            return any(results)
        mine: list[tuple[int, int]] = []
        for item in node.items:
            if not self._eval(item, text, mine):
                return False
        spans.extend(mine)
        return True

    def _find(self, term: Term, text: str) -> Iterator[tuple[int, int]]:
        if self.mode == "words":
            pattern = self._patterns[term]
            at = 0
            while (m := pattern.search(text, at)) is not None:
                start = m.start()
                if start == 0 or _SEPARATOR.match(text, start - 1):
                    yield m.span()
                    at = m.end()
                else:
                    at = start + 1  # inside a word: look again from the next character
            return
        needle = gram_fold(term.text)
        at = text.find(needle)
        while at >= 0:
            yield at, at + len(needle)
            at = text.find(needle, at + 1)


__all__ = [
    "MAX_QUERY",
    "MIN_SUBSTRING",
    "MODES",
    "And",
    "Matcher",
    "Node",
    "Not",
    "Or",
    "Term",
    "fts5_grams",
    "fts5_words",
    "parse",
    "pg_substring",
    "pg_tsquery",
]
