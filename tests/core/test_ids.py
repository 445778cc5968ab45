"""Ids: UUIDv7 that ascend within a process and differ across a fork; derived ids
that are uuid5 exactly (stored rows and journals name them: a different function
would copy a fork's messages twice)."""

from __future__ import annotations

import os
import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetstore.core.ids import derived_id, new_id


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40), st.lists(st.text(max_size=40), max_size=4))
def test_derived_id_is_uuid5_of_the_names(namespace: str, names: list[str]) -> None:
    name = "fleetstore:" + namespace + ":" + "/".join(names)
    try:
        expected = str(uuid.uuid5(uuid.NAMESPACE_URL, name))
    except UnicodeEncodeError:
        return  # a lone surrogate: neither can encode it (checked before it gets here)
    assert derived_id(namespace, *names) == expected


def test_new_ids_are_uuid7_and_ascend() -> None:
    ids = [new_id() for _ in range(20_000)]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    for text in ids[::997]:
        u = uuid.UUID(text)
        assert u.version == 7 and u.variant == uuid.RFC_4122
        assert str(u) == text


def test_a_forked_child_does_not_repeat_its_parents_ids() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its ids, at once, as the parent makes its own
        try:
            os.close(read)
            os.write(write, "\n".join(new_id() for _ in range(2000)).encode())
        finally:
            os._exit(0)
    os.close(write)
    mine = {new_id() for _ in range(2000)}
    chunks = []
    while chunk := os.read(read, 1 << 16):
        chunks.append(chunk)
    os.close(read)
    os.waitpid(pid, 0)
    theirs = set(b"".join(chunks).decode().split("\n"))
    assert len(theirs) == 2000
    # Same milliseconds and counters are likely; the 62 random bits must differ.
    assert not mine & theirs
    assert {t[20:] for t in theirs}.isdisjoint({m[20:] for m in mine})
