"""Sealed files (fleetstore.core.sealed): what is sealed reads back, and nothing else
does: a byte changed anywhere, a file cut or extended, chunks swapped, a wrong key (a
typed error, told apart from damage), a key id the keyring lacks; old key ids still read
after a rotation; journals of records tolerate a torn last append; memory stays bounded
by a chunk; cryptography is loaded only when something is sealed."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetstore import errors
from fleetstore.core import sealed
from fleetstore.core.keys import Key, Keyring

MARKER = b"MARKER-plaintext-7f3e"
K1 = Keyring((Key.generate("k1"),))
DAMAGE = (errors.SealedCorrupt, errors.WrongKey, errors.KeyMissing)


@pytest.mark.parametrize("size", [0, 1, 15, 16, 17, 47, 48, 49, 1000])
def test_what_is_sealed_reads_back(size: int) -> None:
    data = (MARKER * (size // len(MARKER) + 1))[:size]
    box = sealed.seal(data, K1, chunk_size=16)
    assert sealed.unseal(box, K1) == data
    assert sealed.is_sealed(box)
    # Each 16-byte piece carries a 16-byte tag; an empty file is one empty last piece.
    header = sealed.read_header(io.BytesIO(box))
    assert len(box) == len(header.raw) + size + 16 * max(1, -(-size // 16))


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=3000), st.integers(min_value=1, max_value=700))
def test_any_data_in_any_chunk_size_reads_back(data: bytes, chunk: int) -> None:
    assert sealed.unseal(sealed.seal(data, K1, chunk_size=chunk), K1) == data


def test_the_plaintext_is_not_in_the_sealed_bytes(tmp_path: Path) -> None:
    data = MARKER * 100_000
    with (tmp_path / "plain").open("wb") as f:
        f.write(data)
    with (tmp_path / "plain").open("rb") as src, (tmp_path / "box").open("wb") as dst:
        sealed.seal_stream(src, dst, K1)
    box = (tmp_path / "box").read_bytes()
    assert MARKER not in box and MARKER[:8] not in box
    assert K1.current.secret not in box


def test_a_large_file_is_read_a_chunk_at_a_time(tmp_path: Path) -> None:
    """Memory stays bounded: each piece given is one chunk, checked before it is given."""
    data = os.urandom(1_000_003)
    box = sealed.seal(data, K1, chunk_size=64 * 1024)
    pieces = list(sealed.open_stream(io.BytesIO(box), K1))
    assert b"".join(pieces) == data
    assert max(len(p) for p in pieces) == 64 * 1024
    assert len(pieces) == 16


def test_a_byte_changed_anywhere_is_caught() -> None:
    data = MARKER * 5
    box = sealed.seal(data, K1, chunk_size=32)
    for at in range(len(box)):
        for bit in (0x01, 0x80):
            bad = bytearray(box)
            bad[at] ^= bit
            with pytest.raises(DAMAGE):
                sealed.unseal(bytes(bad), K1)


def test_a_file_cut_or_extended_is_caught() -> None:
    box = sealed.seal(MARKER * 5, K1, chunk_size=32)
    for length in range(len(box)):
        with pytest.raises(errors.SealedCorrupt):
            sealed.unseal(box[:length], K1)
    for extra in (b"\x00", b"x" * 16, b"x" * 48, box[-48:]):
        with pytest.raises(errors.SealedCorrupt):
            sealed.unseal(box + extra, K1)


def test_chunks_swapped_or_dropped_are_caught() -> None:
    box = sealed.seal(bytes(range(96)), K1, chunk_size=32)
    header = len(sealed.read_header(io.BytesIO(box)).raw)
    body = box[header:]
    c = [body[i : i + 48] for i in range(0, len(body), 48)]
    assert len(c) == 3
    for order in ([1, 0, 2], [0, 2, 1], [0, 2], [1, 2], [0, 1], [0, 1, 1, 2]):
        with pytest.raises(errors.SealedCorrupt):
            sealed.unseal(box[:header] + b"".join(c[i] for i in order), K1)


def test_a_wrong_key_is_wrong_key_not_damage() -> None:
    box = sealed.seal(MARKER, K1)
    impostor = Keyring((Key.generate("k1"),), "other-keys")
    with pytest.raises(errors.WrongKey, match="k1 of other-keys") as caught:
        sealed.unseal(box, impostor)
    assert impostor.current.secret.hex() not in str(caught.value)


def test_a_key_id_the_keyring_lacks_is_key_missing() -> None:
    box = sealed.seal(MARKER, K1)
    with pytest.raises(errors.KeyMissing, match="no key 'k1'"):
        sealed.unseal(box, Keyring((Key.generate("k2"),)))


def test_after_a_rotation_old_files_read_and_new_ones_use_the_new_key() -> None:
    old_box = sealed.seal(b"old", K1)
    rotated = K1.rotated(Key.generate("k2"))
    new_box = sealed.seal(b"new", rotated)
    assert sealed.read_header(io.BytesIO(old_box)).key_id == "k1"
    assert sealed.read_header(io.BytesIO(new_box)).key_id == "k2"
    assert sealed.unseal(old_box, rotated) == b"old"
    assert sealed.unseal(new_box, rotated) == b"new"
    with pytest.raises(errors.KeyMissing):
        sealed.unseal(old_box, rotated.without("k1"))


def test_each_file_has_its_own_salt() -> None:
    a, b = sealed.seal(MARKER, K1), sealed.seal(MARKER, K1)
    assert a != b
    ha, hb = (sealed.read_header(io.BytesIO(x)) for x in (a, b))
    assert ha.salt != hb.salt and ha.commit != hb.commit


def test_what_is_not_a_sealed_file_is_refused() -> None:
    for data in (b"", b"hello", b"SQLite format 3\x00" + b"\x00" * 100, os.urandom(200)):
        with pytest.raises(errors.SealedCorrupt, match="not a sealed file"):
            sealed.unseal(data, K1)
    box = bytearray(sealed.seal(MARKER, K1))
    box[8] = 2  # a version this one does not read
    with pytest.raises(errors.SealedCorrupt, match="version 2"):
        sealed.unseal(bytes(box), K1)


# -- journals of records --------------------------------------------------------------------


def journal(records: list[bytes], keyring: Keyring = K1) -> bytes:
    sealer = sealed.RecordSealer(keyring)
    return sealer.header + b"".join(sealer.seal(r) for r in records)


def test_records_read_back_in_order() -> None:
    records = [b"", MARKER, b"x" * 10_000, b'{"op": 3}']
    data = journal(records)
    got = sealed.open_records(data, K1)
    assert got.records == records and got.torn == 0
    assert MARKER not in data


def test_a_torn_last_record_is_reported_not_raised() -> None:
    """A crash in the middle of an append leaves part of a record: the ones before it
    are read, the rest counted as torn (as a spool journal's torn last line)."""
    data = journal([b"one", b"two"])
    full = sealed.open_records(data, K1)
    assert full.records == [b"one", b"two"]
    last = len(data) - (4 + 3 + 16)
    for length in range(last + 1, len(data)):
        got = sealed.open_records(data[:length], K1)
        assert got.records == [b"one"] and got.torn == length - last


def test_a_whole_record_changed_is_damage() -> None:
    data = journal([b"one", b"two", b"three"])
    header = len(sealed.read_header(io.BytesIO(data)).raw)
    for at in range(header + 4, len(data)):
        bad = bytearray(data)
        bad[at] ^= 0x01
        try:
            got = sealed.open_records(bytes(bad), K1)
        except errors.SealedCorrupt:
            continue
        # A changed length can only make the journal look torn, never give other data.
        assert got.torn and all(r in (b"one", b"two", b"three") for r in got.records), at


def test_a_journal_and_a_file_are_not_taken_for_each_other() -> None:
    with pytest.raises(errors.SealedCorrupt, match="journal of records"):
        sealed.unseal(journal([b"a"]), K1)
    with pytest.raises(errors.SealedCorrupt, match="not a journal"):
        sealed.open_records(sealed.seal(b"a", K1), K1)


# -- the dependency -------------------------------------------------------------------------


def run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout.strip()


def test_cryptography_is_loaded_only_when_something_is_sealed() -> None:
    """cryptography is an extra (fleetstore[encryption]): the package, a store and the
    CLI run without it."""
    code = (
        "import sys, tempfile, os, fleetstore, fleetstore.cli, fleetstore.core.sealed\n"
        "s = fleetstore.open(os.path.join(tempfile.mkdtemp(), 's.db'))\n"
        "s.sessions.create(title='t'); s.close()\n"
        "print('cryptography' in sys.modules)\n"
    )
    assert run(code) == "False"


def test_without_cryptography_sealing_is_encryption_unavailable() -> None:
    code = (
        "import sys\n"
        "sys.modules['cryptography'] = None\n"
        "from fleetstore import errors\n"
        "from fleetstore.core import sealed\n"
        "from fleetstore.core.keys import Key, Keyring\n"
        "try:\n"
        "    sealed.seal(b'x', Keyring((Key.generate('k1'),)))\n"
        "except errors.EncryptionUnavailable as exc:\n"
        "    print(type(exc).__name__, isinstance(exc, errors.ConfigError), exc)\n"
    )
    out = run(code)
    assert out.startswith("EncryptionUnavailable True")
    assert "fleetstore[encryption]" in out
