"""A session's conversation, for people and for programs: ``fleetstore sessions show``.

Three renderings of the same walk: ``text`` (for a terminal), ``markdown`` (a file to
read or share) and ``json`` (one object: the session, its usage, every message with
every part, and with *tree* its subagents' transcripts).  Roles, text, reasoning, tool
calls with their arguments and outputs, files, usage, times, errors.  In text and
Markdown a tool call's arguments and a tool's output are cut to *width* characters
(saying how long they were); in JSON nothing is cut unless a width is given.

The messages are read through ``store.messages.iterate``: a page of rows at a time,
each message's blobs when it is reached, and written out at once, so a session of
100,000 messages or of outputs of many megabytes is rendered in bounded memory
(tests/cli/test_transcripts.py measures it).  A subagent's transcript is placed
where it was spawned: before the first message of its parent written after it.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime
import json
import os
import re
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import fleetstore
from fleetstore import errors
from fleetstore.admin.stats import known_as, known_name
from fleetstore.core.render import printable
from fleetstore.core.transcripts import DEFAULT_WIDTH, FORMATS
from fleetstore.models import File, Message, Part, Reasoning, Session, Text, ToolCall, ToolResult

#: Version of the JSON transcript; raised when a field changes meaning or goes away.
TRANSCRIPT_VERSION = 1


@dataclass(slots=True)
class Written:
    """What a transcript held."""

    sessions: int = 0
    messages: int = 0


def write_transcript(
    store: fleetstore.Store,
    session_id: str,
    out: TextIO,
    *,
    fmt: str = "text",
    width: int | None = None,
    tree: bool = False,
) -> Written:
    """Write the transcript of *session_id* (with *tree*, its subagents' too, each where
    it was spawned) to *out* as *fmt*.  *width*: characters of tool arguments and
    outputs kept (0: all; None: ``DEFAULT_WIDTH`` in text and Markdown, all in JSON).
    ``NotFound`` before anything is written if there is no such session."""
    if fmt not in FORMATS:
        raise errors.InvalidInput(f"format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    if width is None:
        width = 0 if fmt == "json" else DEFAULT_WIDTH
    if width < 0:
        raise errors.InvalidInput(f"width must be 0 (all) or more, not {width}")
    session = store.sessions.get(session_id)  # NotFound: nothing written
    renderer: _Renderer = {"text": _Text, "markdown": _Markdown, "json": _Json}[fmt](out, width)
    written = Written()
    _walk(store, session, renderer, tree, 0, None, written)
    renderer.close()
    return written


def write_transcript_file(
    store: fleetstore.Store,
    session_id: str,
    path: str | os.PathLike[str],
    **options: Any,
) -> Written:
    """``write_transcript`` to the file *path*: written to a temporary file beside it
    (mode 0600: sessions carry secrets), fsynced and renamed, so a failed or
    interrupted export leaves no file, and an existing one is replaced whole."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            written = write_transcript(store, session_id, fh, **options)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    return written


# -- the walk --------------------------------------------------------------------------------


def _walk(
    store: fleetstore.Store,
    session: Session,
    r: _Renderer,
    tree: bool,
    depth: int,
    after_seq: int | None,
    written: Written,
) -> None:
    written.sessions += 1
    children = (
        deque(sorted(store.sessions.children(session.id), key=lambda s: (s.created_at, s.id)))
        if tree
        else deque()
    )
    r.begin(session, store.sessions.usage(session.id), depth, after_seq)
    last: int | None = None
    nested: list[tuple[Session, int | None]] = []

    def spawn(child: Session) -> None:
        if r.inline_subagents:
            _walk(store, child, r, tree, depth + 1, last, written)
        else:
            nested.append((child, last))

    for m in store.messages.iterate(session.id):
        while children and children[0].created_at <= m.created_at:
            spawn(children.popleft())
        r.message(m, depth)
        written.messages += 1
        last = m.seq
    while children:
        spawn(children.popleft())
    r.end_messages(depth)
    for child, seq in nested:
        _walk(store, child, r, tree, depth + 1, seq, written)
    r.end(session, depth)


# -- values ----------------------------------------------------------------------------------


def _time(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _cut(text: str, width: int) -> str:
    """*text*, or its first *width* characters and how long it was."""
    if not width or len(text) <= width:
        return text
    return f"{text[:width]}… [{len(text):,} characters, cut to {width:,}]"


def _output_text(output: str | bytes) -> str | None:
    """A tool's output as text, or None for bytes that are not UTF-8."""
    if isinstance(output, str):
        return output
    try:
        return output.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _arguments(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _usage_line(u: fleetstore.Usage) -> str:
    figures = [
        f"{u.input_tokens:,} in",
        f"{u.output_tokens:,} out",
    ]
    if u.cache_read_tokens or u.cache_write_tokens:
        figures.append(f"{u.cache_read_tokens:,} cache read, {u.cache_write_tokens:,} cache write")
    if u.reasoning_tokens:
        figures.append(f"{u.reasoning_tokens:,} reasoning")
    if u.cost:
        figures.append(f"cost {u.cost:g}")
    return ", ".join(figures)


def _session_lines(session: Session, usage: fleetstore.Usage) -> Iterator[str]:
    """The facts of a session's header, one line each."""
    known = known_name(known_as(session.metadata))
    if known:
        yield f"known as {known}"
    yield (
        f"project {session.project or '-'}, status {session.status}, created "
        f"{_time(session.created_at)}, last written {_time(session.updated_at)}"
    )
    if session.parent_id:
        yield f"subagent of {session.parent_id} (tree {session.root_id})"
    if session.forked_from:
        yield f"forked from {session.forked_from} at message {session.fork_seq}"
    yield f"usage: {_usage_line(usage)}"


def _message_head(m: Message) -> str:
    head = [f"#{m.seq} {m.role}", _time(m.created_at)]
    if m.model:
        head.append(f"model {m.model}")
    if m.usage is not None:
        head.append(_usage_line(m.usage))
    if m.status == fleetstore.MessageStatus.streaming:
        head.append("still streaming (what was flushed so far)")
    elif m.status == fleetstore.MessageStatus.error:
        head.append(f"ended in error: {m.error or '?'}")
    return " · ".join(head)


# -- renderers -------------------------------------------------------------------------------


class _Renderer:
    #: Whether subagents are rendered where they were spawned (else after the messages).
    inline_subagents = True

    def __init__(self, out: TextIO, width: int) -> None:
        self.out = out
        self.width = width

    def begin(
        self, session: Session, usage: fleetstore.Usage, depth: int, after_seq: int | None
    ) -> None:
        raise NotImplementedError

    def message(self, m: Message, depth: int) -> None:
        raise NotImplementedError

    def end_messages(self, depth: int) -> None:
        pass

    def end(self, session: Session, depth: int) -> None:
        pass

    def close(self) -> None:
        pass


class _Text(_Renderer):
    """For a terminal: a header, then each message with its parts indented; a
    subagent's transcript ruled off at the left where it was spawned."""

    def _line(self, depth: int, text: str = "") -> None:
        self.out.write(("│ " * depth + printable(text)).rstrip() + "\n")

    def _block(self, depth: int, text: str, indent: str = "    ") -> None:
        for line in text.splitlines() or [""]:
            self._line(depth, indent + line)

    def begin(
        self, session: Session, usage: fleetstore.Usage, depth: int, after_seq: int | None
    ) -> None:
        if depth:
            self._line(depth - 1, "")
            self._line(depth - 1, f"┌ subagent {session.id}  {session.title or ''}".rstrip())
        else:
            self._line(0, f"session {session.id}  {session.title or ''}".rstrip())
        for line in _session_lines(session, usage):
            self._line(depth, f"  {line}")

    def message(self, m: Message, depth: int) -> None:
        self._line(depth)
        self._line(depth, _message_head(m))
        for part in m.parts:
            self._part(part, depth)

    def _part(self, part: Part, depth: int) -> None:
        if isinstance(part, Text):
            self._block(depth, part.text, "  ")
        elif isinstance(part, Reasoning):
            self._line(depth, "  [reasoning]")
            self._block(depth, part.text, "  │ ")
        elif isinstance(part, ToolCall):
            args = _cut(_arguments(part.arguments), self.width)
            self._line(depth, f"  → tool call {part.name} ({part.call_id})")
            self._block(depth, args)
        elif isinstance(part, ToolResult):
            error = ", error" if part.is_error else ""
            self._line(depth, f"  ← tool result {part.name} ({part.call_id}{error})")
            text = _output_text(part.output)
            if text is None:
                self._line(depth, f"    [{len(part.output):,} bytes of binary output]")
            else:
                self._block(depth, _cut(text, self.width))
        elif isinstance(part, File):
            self._line(
                depth, f"  [file {part.name or '-'} ({part.mime_type}), {len(part.data):,} bytes]"
            )

    def end(self, session: Session, depth: int) -> None:
        if depth:
            self._line(depth - 1, f"└ end of subagent {session.id}")


_FENCE = re.compile(r"`{3,}")


def _fenced(text: str, info: str = "") -> str:
    """*text* in a code fence longer than any run of backticks in it."""
    longest = max((len(m) for m in _FENCE.findall(text)), default=2)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{text}\n{fence}\n"


class _Markdown(_Renderer):
    """A Markdown document: a heading per session and per message (a subagent's one
    level deeper, where it was spawned), text as written, reasoning quoted, tool
    arguments and outputs fenced."""

    def _heading(self, level: int, text: str) -> None:
        self.out.write(f"\n{'#' * min(level, 6)} {text}\n\n")

    def begin(
        self, session: Session, usage: fleetstore.Usage, depth: int, after_seq: int | None
    ) -> None:
        what = "Subagent" if depth else "Session"
        title = f": {session.title}" if session.title else ""
        self._heading(1 + 2 * depth, f"{what} `{session.id}`{title}")
        for line in _session_lines(session, usage):
            self.out.write(f"- {line}\n")

    def message(self, m: Message, depth: int) -> None:
        self._heading(2 + 2 * depth, _message_head(m))
        for part in m.parts:
            self._part(part)

    def _part(self, part: Part) -> None:
        out = self.out
        if isinstance(part, Text):
            out.write(part.text + "\n\n")
        elif isinstance(part, Reasoning):
            quoted = "\n".join(f"> {line}" for line in part.text.splitlines() or [""])
            out.write(f"> *reasoning*\n>\n{quoted}\n\n")
        elif isinstance(part, ToolCall):
            out.write(f"**Tool call** `{part.name}` (`{part.call_id}`)\n\n")
            out.write(_fenced(_cut(_arguments(part.arguments), self.width), "json") + "\n")
        elif isinstance(part, ToolResult):
            error = ", **error**" if part.is_error else ""
            out.write(f"**Tool result** `{part.name}` (`{part.call_id}`{error})\n\n")
            text = _output_text(part.output)
            if text is None:
                out.write(f"*{len(part.output):,} bytes of binary output*\n\n")
            else:
                out.write(_fenced(_cut(text, self.width)) + "\n")
        elif isinstance(part, File):
            out.write(
                f"*File* `{part.name or '-'}` ({part.mime_type}), {len(part.data):,} bytes\n\n"
            )

    def end(self, session: Session, depth: int) -> None:
        if depth:
            self.out.write(f"\n*End of subagent `{session.id}`.*\n")


class _Json(_Renderer):
    """One JSON object on one line (the shape of every ``--json`` object: docs/cli.md),
    written as it is read: the session, its usage, ``messages``, then ``subagents``,
    each a transcript of the same shape with ``after_seq``, the parent's message it
    follows (None: before the first)."""

    inline_subagents = False

    def __init__(self, out: TextIO, width: int) -> None:
        super().__init__(out, width)
        #: Per open session: has a message / a subagent been written yet?
        self._firsts: list[list[bool]] = []

    def begin(
        self, session: Session, usage: fleetstore.Usage, depth: int, after_seq: int | None
    ) -> None:
        out = self.out
        if depth:
            parent = self._firsts[-1]
            out.write("[" if parent[1] else ",")
            parent[1] = False
        head: dict[str, Any] = {}
        if depth:
            head["after_seq"] = after_seq
        else:
            head["transcript_version"] = TRANSCRIPT_VERSION
        head["session"] = {**dataclasses.asdict(session), "status": str(session.status)}
        head["known_as"] = known_as(session.metadata)
        head["usage"] = dataclasses.asdict(usage)
        out.write(json.dumps(head, ensure_ascii=False)[:-1] + ', "messages": [')
        self._firsts.append([True, True])

    def message(self, m: Message, depth: int) -> None:
        first = self._firsts[-1]
        if not first[0]:
            self.out.write(",")
        first[0] = False
        self.out.write(json.dumps(self._message(m), ensure_ascii=False))

    def _message(self, m: Message) -> dict[str, Any]:
        return {
            "id": m.id,
            "seq": m.seq,
            "role": m.role,
            "status": str(m.status),
            "model": m.model,
            "created_at": m.created_at,
            "completed_at": m.completed_at,
            "error": m.error,
            "usage": dataclasses.asdict(m.usage) if m.usage is not None else None,
            "metadata": dict(m.metadata),
            "parts": [self._part(p) for p in m.parts],
        }

    def _value(self, record: dict[str, Any], field: str, value: str | bytes) -> None:
        """*value* as *field*: text as a string, bytes as ``{"base64": ...}``, cut to
        the width if there is one (``cut``: its whole length, in characters or bytes)."""
        if isinstance(value, str):
            record[field] = _cut_json(value, self.width, record)
            return
        data = bytes(value)
        if self.width and len(data) > self.width:
            record["cut"] = len(data)
            data = data[: self.width]
        record[field] = {"base64": base64.b64encode(data).decode("ascii")}

    def _part(self, part: Part) -> dict[str, Any]:
        record: dict[str, Any] = {"kind": part.kind}
        if isinstance(part, Text | Reasoning):
            record["text"] = part.text
        elif isinstance(part, ToolCall):
            record.update(name=part.name, call_id=part.call_id)
            if self.width and len(args := _arguments(part.arguments)) > self.width:
                record["arguments_text"] = _cut_json(args, self.width, record)
            else:
                record["arguments"] = part.arguments
        elif isinstance(part, ToolResult):
            record.update(name=part.name, call_id=part.call_id, is_error=part.is_error)
            self._value(record, "output", part.output)
        elif isinstance(part, File):
            record.update(name=part.name, mime_type=part.mime_type, bytes=len(part.data))
            self._value(record, "data", part.data)
        return record

    def end_messages(self, depth: int) -> None:
        self.out.write('], "subagents": ')

    def end(self, session: Session, depth: int) -> None:
        first = self._firsts.pop()
        self.out.write("[]}" if first[1] else "]}")

    def close(self) -> None:
        self.out.write("\n")


def _cut_json(text: str, width: int, record: dict[str, Any]) -> str:
    if width and len(text) > width:
        record["cut"] = len(text)
        return text[:width]
    return text


__all__ = [
    "DEFAULT_WIDTH",
    "FORMATS",
    "TRANSCRIPT_VERSION",
    "Written",
    "write_transcript",
    "write_transcript_file",
]
