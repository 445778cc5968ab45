"""The payload codec: how a value (text, bytes, JSON, a message part) becomes an
operation's JSON and comes back from its row.

A payload of at least ``blob_threshold`` bytes becomes a blob (written, compressed
and durable, before any transaction) and the operation carries only its hash; a
smaller one travels inline.  Every part is checked before the first blob is
written, so a rejected write leaves no file behind.

This is also where content is redacted (``redaction``, on by default): every payload
the API writes (a part's text, a tool call's arguments, a tool's output, a file, a
state value, an effect's payload and result, the frameworks' bodies) passes here once,
before its blob file or operation is made.  One regex search (``screen``) per payload
decides; only a payload where a rule's prefix occurs is redacted (``_redacted``).
Streamed text is redacted where a stream writes it (``history.Stream``).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fleetstore import errors
from fleetstore.core.redact import WriteRedaction
from fleetstore.core.validate import (
    MAX_INLINE,
    MAX_MODEL,
    MAX_PART_META,
    MAX_SHORT,
    STATE_KEY_MAX,
    STATE_NAMESPACE_MAX,
    arg_int,
    check_id,
    check_str,
    check_text,
    dump_json,
    to_json,
)
from fleetstore.domain.blobs import CODEC, check_sha
from fleetstore.domain.operations import Args, Queries
from fleetstore.domain.ports import StorePort
from fleetstore.engine.base import Tx
from fleetstore.models import PART_TYPES, File, Part, Reasoning, Text, ToolCall, ToolResult

#: The encodings of a payload: text, JSON text, bytes (base64 in an operation).
ENCODINGS = ("str", "json", "bytes")


@dataclass(frozen=True, slots=True)
class Prepared:
    """A payload checked and ready to write: nothing is written until ``write_payload``
    (so that a call checks every argument before its first blob file)."""

    head: dict[str, Any]  # a part's kind and meta ({} for a bare payload)
    raw: bytes
    value: str | bytes
    enc: str
    #: A part: redaction changed its value or its name (what is stored differs).
    redacted: bool = False


def prepare_payload(store: StorePort, value: str | bytes, enc: str) -> Prepared:
    """*value* checked (valid text, at most ``max_payload_bytes``) and redacted;
    nothing written."""
    redaction = store.redaction
    if redaction is not None:
        value = _redacted(redaction, value, enc)
    return Prepared({}, _raw(store, value), value, enc)


def _redacted(redaction: WriteRedaction, value: str | bytes, enc: str) -> str | bytes:
    """*value* (of encoding *enc*) with its secrets replaced."""
    if not isinstance(value, str):
        return redaction.data(bytes(value))
    if redaction.screen(value) is None:
        return value
    return redaction.json_text(value) if enc == "json" else redaction.text(value)


def redacted_copy(store: StorePort, text: str | None) -> str | None:
    """A text an adapter keeps beside a body it wrote (an ADK event's plain text, a view
    of its JSON) redacted as the body was, and not counted again: it was counted there
    (test_redaction.py, the frameworks' bodies)."""
    redaction = store.redaction
    if text is None or redaction is None or redaction.screen(text) is None:
        return text
    return redaction.redactor.redact(text).text


def write_payload(store: StorePort, prepared: Prepared) -> dict[str, Any]:
    """``{"enc", "body"}`` inline, or ``{"enc", "blob"}`` after writing the blob file."""
    return {**prepared.head, **_encoded(store, prepared.raw, prepared.value, prepared.enc)}


def encode_payload(store: StorePort, value: str | bytes, enc: str) -> dict[str, Any]:
    """``{"enc", "body"}`` inline, or ``{"enc", "blob"}`` after writing the blob file."""
    return write_payload(store, prepare_payload(store, value, enc))


def _encoded(store: StorePort, raw: bytes, value: str | bytes, enc: str) -> dict[str, Any]:
    if len(raw) >= store.settings.blob_threshold:
        ref = store.blobs.put(raw)
        return {
            "enc": enc,
            "blob": {"sha256": ref.sha256, "size": ref.size, "stored_size": ref.stored_size},
        }
    if isinstance(value, str):
        return {"enc": enc, "body": value, "size": len(raw)}
    return {"enc": enc, "body": base64.b64encode(raw).decode("ascii"), "size": len(raw)}


def _raw(store: StorePort, value: str | bytes) -> bytes:
    if isinstance(value, str):
        try:
            raw = value.encode("utf-8")
        except UnicodeEncodeError:
            check_text(value, "text")  # raises InvalidInput
            raise
    else:
        raw = bytes(value)
    limit = store.settings.max_payload_bytes
    if len(raw) > limit:
        raise errors.PayloadTooLarge(
            f"payload of {len(raw):,} bytes is over max_payload_bytes ({limit:,})"
        )
    return raw


def _prepare_part(store: StorePort, part: object) -> Prepared:
    """*part* with every check done (its fields' types, its names' lengths), nothing
    written."""
    if isinstance(part, Text | Reasoning):
        _check_type(part, "text", str)
        head: dict[str, Any] = {"kind": part.kind, "meta": {}}
        value: str | bytes = part.text
        enc = "str"
    elif isinstance(part, ToolCall):
        _check_name(part, "name")
        _check_name(part, "call_id")
        value = dump_json(part.arguments, f"arguments of tool call {part.name!r}")
        head = {"kind": part.kind, "meta": {"name": part.name, "call_id": part.call_id}}
        enc = "json"
    elif isinstance(part, ToolResult):
        _check_name(part, "call_id")
        _check_name(part, "name")
        _check_type(part, "is_error", bool)
        _check_type(part, "output", str | bytes)
        meta = {"call_id": part.call_id, "is_error": part.is_error, "name": part.name}
        head = {"kind": part.kind, "meta": meta}
        value = part.output
        enc = "str" if isinstance(part.output, str) else "bytes"
    elif isinstance(part, File):
        _check_type(part, "data", bytes)
        _check_name(part, "mime_type", MAX_MODEL)
        _check_name(part, "name")
        head = {"kind": part.kind, "meta": {"mime_type": part.mime_type, "name": part.name}}
        value = part.data
        enc = "bytes"
    else:
        kinds = ", ".join(t.__name__ for t in PART_TYPES.values())
        raise errors.InvalidInput(f"not a message part: {type(part).__name__} (parts are {kinds})")
    dump_json(head["meta"], f"the meta of a {part.kind} part", MAX_PART_META)
    redaction = store.redaction
    if redaction is None:
        return Prepared(head, _raw(store, value), value, enc)
    changed = False
    meta = head["meta"]
    if "name" in meta and meta["name"] and redaction.screen(meta["name"]) is not None:
        meta["name"] = redaction.text(meta["name"])  # a file or tool named after a token
        changed = True
    if value.__class__ is not str or redaction.screen(value):
        given, value = value, _redacted(redaction, value, enc)
        changed = changed or value != given
    return Prepared(head, _raw(store, value), value, enc, changed)


def prepare_parts(store: StorePort, parts: Sequence[object]) -> list[Prepared | dict[str, Any]]:
    """*parts* checked, nothing written (``write_parts`` writes their blobs).  Short
    ASCII text (most parts) is encoded here at once: the general way was a dozen
    Python calls a part (issue 24)."""
    limit = store.settings.blob_threshold
    redaction = store.redaction
    out: list[Prepared | dict[str, Any]] = []
    for p in parts:
        cls = p.__class__
        if cls is Text or cls is Reasoning:
            text = p.text  # type: ignore[attr-defined]
            if (
                text.__class__ is str
                and text.isascii()
                and len(text) < limit
                and (redaction is None or redaction.screen(text) is None)
            ):
                out.append(
                    {"kind": cls.kind, "meta": {}, "enc": "str", "body": text, "size": len(text)}
                )
                continue
        out.append(_prepare_part(store, p))
    return out


def stored_parts(
    store: StorePort, parts: Sequence[Part], prepared: Sequence[Prepared | dict[str, Any]]
) -> tuple[Part, ...]:
    """*parts* as *prepared* stores them: a part redaction changed comes back as
    stored (a call returned the secret it had just kept out of the store)."""
    found: list[Part] = []
    for part, p in zip(parts, prepared, strict=True):
        if p.__class__ is Prepared and p.redacted:
            h = p.head
            row = (None, 0, h["kind"], json.dumps(h["meta"]), p.enc, p.value, None, 0, None)
            part = decode_part(store, row)
        found.append(part)
    return tuple(found)


def write_parts(
    store: StorePort, prepared: Sequence[Prepared | dict[str, Any]]
) -> list[dict[str, Any]]:
    """The operation JSON of prepared parts, their blob files written."""
    return [p if p.__class__ is dict else write_payload(store, p) for p in prepared]  # type: ignore[arg-type]


def encode_parts(store: StorePort, parts: Sequence[object]) -> list[dict[str, Any]]:
    """The operation JSON of *parts*.  Every part is checked before any blob file
    is written, so a rejected write leaves no file behind."""
    return write_parts(store, prepare_parts(store, parts))


def encode_part(store: StorePort, part: object) -> dict[str, Any]:
    """An operation's JSON for *part* (a ``Text``, ``ToolCall``...)."""
    return encode_parts(store, [part])[0]


def _check_name(part: object, name: str, limit: int = MAX_SHORT) -> None:
    check_str(getattr(part, name), f"{type(part).__name__}.{name}", limit=limit)


def _check_type(part: object, name: str, kind: Any) -> None:
    value = getattr(part, name)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise errors.InvalidInput(
            f"{type(part).__name__}.{name} has the wrong type: {type(value).__name__}"
        )


def decode_value(store: StorePort, enc: str, body: Any, blob_sha: str | None, size: int) -> Any:
    """The stored value: ``str`` for 'str'/'chunks', ``bytes``, or parsed JSON."""
    if blob_sha is not None:
        raw = store.blobs.get(blob_sha, size)
        if enc == "bytes":
            return raw
        body = raw.decode("utf-8")
    if enc == "bytes":
        return bytes(body) if body is not None else b""
    if isinstance(body, bytes | memoryview):
        # A column that holds text and bytes alike is BYTEA on PostgreSQL: text
        # bodies come back as their UTF-8 bytes (SQLite gives back the str stored).
        body = bytes(body).decode("utf-8")
    if enc == "json":
        return json.loads(body)
    return body if body is not None else ""


def damaged_row(what: str, row_id: object, exc: Exception) -> Exception:
    """The error for a row read back that does not decode (edited by hand or by another
    program: metadata that is not JSON, an unknown status): ``CorruptStore`` naming the
    row, where a raw ``JSONDecodeError`` came out before.  A fleetstore error raised
    while decoding (a blob's file damaged) is kept as it is."""
    if isinstance(exc, errors.FleetstoreError):
        return exc
    return errors.CorruptStore(f"stored {what} {str(row_id)[:80]!r} does not decode: {exc!r:.200}")


def stored_json(text: str, what: str, row_id: object) -> Any:
    """*text*, a JSON column read back; ``CorruptStore`` naming its row if it is not."""
    try:
        return json.loads(text)
    except (ValueError, TypeError) as exc:
        raise damaged_row(what, row_id, exc) from exc


def decode_part(store: StorePort, row: Sequence[Any]) -> Part:
    """A part from its row; ``CorruptStore`` naming it if the row does not decode."""
    mid, seq, kind, meta_text, enc, body, blob_sha, size, chunk_text = row
    try:
        meta = json.loads(meta_text)
        if enc == "chunks":
            value: Any = chunk_text or ""
        else:
            value = decode_value(store, enc, body, blob_sha, size)
        if kind == "text":
            return Text(value)
        if kind == "reasoning":
            return Reasoning(value)
        if kind == "tool_call":
            return ToolCall(meta["name"], value, meta["call_id"])
        if kind == "tool_result":
            return ToolResult(
                meta["call_id"], value, meta.get("is_error", False), meta.get("name", "")
            )
        if kind == "file":
            return File(
                value, meta.get("mime_type", "application/octet-stream"), meta.get("name", "")
            )
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise damaged_row(f"part {seq} of message", mid, exc) from exc
    raise errors.CorruptStore(f"part of unknown kind {kind!r} in message {mid}")


def value_payload(store: StorePort, value: Any, what: str) -> dict[str, Any]:
    """The encoded payload of a JSON value or bytes (a state value, an effect's payload),
    checked; a blob file written if it is large.  One function for the common case
    (prepare_payload, _raw and write_payload were 7 Python calls a write)."""
    if isinstance(value, bytes | bytearray | memoryview):
        return write_payload(store, prepare_payload(store, bytes(value), "bytes"))
    try:
        text = to_json(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise errors.InvalidInput(f"{what} is not JSON-serialisable: {exc}") from None
    redaction = store.redaction
    if redaction is not None and redaction.screen(text) is not None:
        text = redaction.json_text(text)
    if text.isascii():
        size = len(text)
    else:
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise errors.InvalidInput(
                f"{what} is not valid Unicode text (a lone surrogate at position {exc.start})"
            ) from None
    settings = store.settings
    if size >= settings.blob_threshold:
        if size > settings.max_payload_bytes:
            raise errors.PayloadTooLarge(
                f"payload of {size:,} bytes is over max_payload_bytes ({settings.max_payload_bytes:,})"
            )
        ref = store.blobs.put(text.encode("utf-8"))
        blob = {"sha256": ref.sha256, "size": ref.size, "stored_size": ref.stored_size}
        return {"enc": "json", "blob": blob}
    return {"enc": "json", "body": text, "size": size}


def prepare_state(
    store: StorePort, session_id: object, key: object, value: Any, namespace: object
) -> tuple[dict[str, Any], Prepared]:
    """The arguments of a state put of *value* (JSON-serialisable, or bytes) under
    *namespace*/*key* of *session_id*, and its payload, every check done and nothing
    written (``write_payload`` writes it)."""
    check_id(session_id, "session_id")
    check_str(key, "a state key", limit=STATE_KEY_MAX, empty=False)
    check_str(namespace, "a state namespace", limit=STATE_NAMESPACE_MAX, empty=False)
    if isinstance(value, bytes | bytearray | memoryview):
        payload = prepare_payload(store, bytes(value), "bytes")
    else:
        payload = prepare_payload(store, dump_json(value, f"state value {key!r}"), "json")
    return {"namespace": namespace, "key": key}, payload


def encode_state(
    store: StorePort, session_id: object, key: object, value: Any, namespace: object
) -> dict[str, Any]:
    """The arguments of a state put: every check first, then the payload (a blob
    file written here if it is large)."""
    head, payload = prepare_state(store, session_id, key, value, namespace)
    return {**head, "value": write_payload(store, payload)}


def redact_text(store: StorePort, text: Any) -> Any:
    """A short text kept as given (a session's title, an effect's error or traceback)
    redacted and counted; anything not a string is passed on for its own check."""
    redaction = store.redaction
    if text.__class__ is not str or redaction is None or redaction.screen(text) is None:
        return text
    return redaction.text(text)


def redact_value(store: StorePort, value: Any, text: str) -> Any:
    """A JSON value kept as given (a session's or a message's metadata) redacted and
    counted; *text* is its JSON, screened first (nothing more when no prefix is in it)."""
    redaction = store.redaction
    if redaction is None or redaction.screen(text) is None:
        return value
    return redaction.value(value)


def redact_json(store: StorePort, text: str) -> str:
    """JSON *text* (an effect's result) redacted as the value it encodes."""
    redaction = store.redaction
    if redaction is None or redaction.screen(text) is None:
        return text
    return redaction.json_text(text)


# -- inside the transaction: an encoded payload's columns -------------------------------


def check_encoded(item: object, what: str, encs: tuple[str, ...] = ENCODINGS) -> dict[str, Any]:
    """An encoded payload from outside (a spool journal, a file, another process),
    checked: ``{"enc", "body", "size"}`` inline or ``{"enc", "blob": {"sha256", "size",
    "stored_size"}}``, its encoding one of *encs* (``InvalidInput`` otherwise).  The
    payloads the API makes are checked where they are made (``_encoded``)."""
    if not isinstance(item, dict):
        raise errors.InvalidInput(f"{what}: must be an encoded payload")
    enc = item.get("enc")
    if enc not in ENCODINGS:
        raise errors.InvalidInput(f"{what}: unknown encoding {enc!r}")
    if enc not in encs:
        raise errors.InvalidInput(f"{what}: {' or '.join(encs)}, not {enc}")
    if "blob" in item:
        ref = item["blob"]
        if not isinstance(ref, dict):
            raise errors.InvalidInput("blob reference must be an object")
        blob = {
            "sha256": check_sha(ref.get("sha256")),
            "size": arg_int(ref, "size", optional=False),
            "stored_size": arg_int(ref, "stored_size", optional=False),
        }
        return {"enc": enc, "blob": blob}
    body = item.get("body")
    if not isinstance(body, str):
        raise errors.InvalidInput(f"{what}: body must be a string")
    # At most MAX_INLINE bytes inline (base64 makes 4 characters of 3 bytes).
    if len(body) > (MAX_INLINE + 2) // 3 * 4 or (
        enc != "bytes" and (len(body) > MAX_INLINE or len(body.encode("utf-8")) > MAX_INLINE)
    ):
        raise errors.InvalidInput(
            f"{what}: an inline body is at most {MAX_INLINE:,} bytes (larger ones are blobs)"
        )
    check_text(body, what)
    if enc == "bytes":
        try:
            raw = base64.b64decode(body, validate=True)
        except ValueError:
            raise errors.InvalidInput(f"{what}: body is not base64") from None
        if len(raw) > MAX_INLINE:
            raise errors.InvalidInput(f"{what}: an inline body is at most {MAX_INLINE:,} bytes")
        return {"enc": enc, "body": body, "size": len(raw)}
    if enc == "json":
        try:
            json.loads(body)
        except ValueError:
            raise errors.InvalidInput(f"{what}: body is not JSON") from None
    return {"enc": enc, "body": body, "size": len(body.encode("utf-8"))}


def columns(tx: Tx, q: Queries, item: Args, now: float) -> tuple[str, Any, str | None, int]:
    """(enc, inline body, blob sha, size) of a checked encoded payload; a blob's row is
    inserted (it refers to a file written before the transaction).  Trusts *item*."""
    enc = item["enc"]
    blob = item.get("blob")
    if blob is not None:
        sha, size = blob["sha256"], blob["size"]
        tx.execute(q["blob_insert"], (sha, size, blob["stored_size"], CODEC, now))
        return enc, None, sha, size
    body = item["body"]
    if enc == "bytes":
        raw = base64.b64decode(body)
        return enc, raw, None, len(raw)
    if "\x00" in body:
        # PostgreSQL text cannot hold NUL (the body column is BYTEA there): such a body
        # goes as its UTF-8 bytes on both engines, and reads decode it (decode_value).
        return enc, body.encode("utf-8"), None, item["size"]
    return enc, body, None, item["size"]


def encoded_body(
    tx: Tx, q: Queries, item: Args, what: str, now: float
) -> tuple[str, Any, str | None, int]:
    """``columns`` of an encoded payload not checked yet (``check_encoded``)."""
    return columns(tx, q, check_encoded(item, what), now)


__all__ = [
    "ENCODINGS",
    "Prepared",
    "check_encoded",
    "redact_json",
    "redact_text",
    "redact_value",
    "columns",
    "encode_state",
    "value_payload",
    "encoded_body",
    "decode_part",
    "stored_parts",
    "decode_value",
    "encode_part",
    "encode_parts",
    "encode_payload",
    "prepare_parts",
    "prepare_state",
    "prepare_payload",
    "write_parts",
    "write_payload",
]
