"""The export file format, shared by export, import and merge.

An export file is zstd-compressed JSON lines (one record a line)::

    {"format": "fleetstore-export", "version": 1, ...}                header
    {"blob": SHA, "size": N, "stored_size": M, "offset": O, "data": B64}  a piece of a blob
    {"op": "import_session", "id": OP_ID, "args": {...}}              an operation
    ...
    {"end": {"records": R, "blobs": B, "ops": K, "sha256": HEX}}      trailer

A blob's pieces (its zstd bytes as stored, at most 1 MiB a piece) come before the
first operation that refers to it; a session comes before its subagents, messages
and state.  The trailer counts the records and hashes every line before it, so a
truncated or edited file is detected.

Writing is ``transfer/export.py``; reading and checking a file,
``transfer/reader.py``; importing one, ``transfer/importing.py``; merging stores,
``transfer/merge.py``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import IO

import zstandard

FORMAT = "fleetstore-export"
VERSION = 1
#: Longest line an import accepts (a hostile file cannot make it hold more).
MAX_LINE = 64 * 1024 * 1024
#: Most decompressed bytes an import reads from one file.
MAX_TOTAL = 1 << 40

BLOB_PIECE = 1024 * 1024  # stored bytes of a blob per record, at most
WINDOW = 1 << 27  # largest zstd window accepted (128 MiB, zstd's own default)

#: ``progress(stage, done, total)``; stages: export, check, import.
Progress = Callable[[str, int, int], None]


def record_bytes(obj: object) -> bytes:
    """One record as its line: compact JSON, UTF-8, ending in a newline."""
    return (
        json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False) + "\n"
    ).encode("utf-8")


def check_packed(packed: IO[bytes], sha: str, size: int) -> str | None:
    """None if *packed* (zstd) decompresses to *size* bytes hashing to *sha*, else
    what is wrong.  Streams: a hostile blob cannot make it hold more than 1 MiB."""
    packed.seek(0)
    digest = hashlib.sha256()
    seen = 0
    try:
        dctx = zstandard.ZstdDecompressor(max_window_size=WINDOW)
        with dctx.stream_reader(packed, closefd=False) as reader:
            while chunk := reader.read(1 << 20):
                seen += len(chunk)
                if seen > size:
                    return f"decompresses to more than its size ({size:,} bytes)"
                digest.update(chunk)
    except zstandard.ZstdError as exc:
        return f"not valid zstd data ({exc})"
    if seen != size:
        return f"decompresses to {seen:,} bytes, not its size {size:,}"
    if digest.hexdigest() != sha:
        return "its bytes do not match its hash"
    return None


__all__ = [
    "FORMAT",
    "MAX_LINE",
    "MAX_TOTAL",
    "VERSION",
    "Progress",
    "check_packed",
    "record_bytes",
]
