"""Keyrings (fleetstore.core.keys): the file format, the checks on the key file (this
user's alone), rotation, and the setting that names it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from fleetstore import errors
from fleetstore.core.keys import Key, Keyring, write_keyring
from fleetstore.core.settings import Settings


def keyring_file(tmp_path: Path, *ids: str, mode: int = 0o600) -> tuple[Path, Keyring]:
    ring = Keyring(tuple(Key.generate(i) for i in ids))
    path = tmp_path / "keys"
    path.write_text(ring.format())
    path.chmod(mode)
    return path, ring


def test_a_keyring_file_is_read_back_as_written(tmp_path: Path) -> None:
    path, ring = keyring_file(tmp_path, "k2", "k1")
    loaded = Keyring.load(path)
    assert [(k.id, k.secret) for k in loaded] == [(k.id, k.secret) for k in ring]
    assert loaded.current.id == "k2"
    assert loaded.get("k1").secret == ring.get("k1").secret
    assert loaded.source == str(path)


def test_comments_and_blank_lines_are_ignored() -> None:
    secret = bytes(range(32))
    ring = Keyring.parse(f"# mine\n\n   k1   {secret.hex().upper()}  \n# old keys below\n")
    assert [(k.id, k.secret) for k in ring] == [("k1", secret)]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "holds no key"),
        ("# only a comment\n", "holds no key"),
        ("k1\n", "line 1"),
        ("k1 abcd\n", "line 1"),
        ("k1 " + "ab" * 32 + " extra\n", "line 1"),
        ("k1 " + "zz" * 32 + "\n", "line 1"),
        ("-bad " + "ab" * 32 + "\n", "key id"),
        ("k1 " + "ab" * 32 + "\nk1 " + "cd" * 32 + "\n", "used twice"),
        ("k1 " + "ab" * 32 + "\nk2 " + "ab" * 32 + "\n", "same key under two ids"),
    ],
)
def test_a_keyring_that_cannot_be_used_is_a_config_error(text: str, why: str) -> None:
    with pytest.raises(errors.ConfigError, match=why) as caught:
        Keyring.parse(text, "keys")
    assert "ab" * 16 not in str(caught.value), "a key was printed"


def test_a_missing_key_file_is_key_missing(tmp_path: Path) -> None:
    with pytest.raises(errors.KeyMissing, match="no such key file"):
        Keyring.load(tmp_path / "absent")
    assert not (tmp_path / "absent").exists()


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644, 0o602])
def test_a_key_file_others_can_use_is_refused(tmp_path: Path, mode: int) -> None:
    path, _ = keyring_file(tmp_path, "k1", mode=mode)
    with pytest.raises(errors.UnsafeKeyFile, match=f"{mode:04o}"):
        Keyring.load(path)
    assert stat.S_IMODE(path.stat().st_mode) == mode, "the check changed the file"


def test_a_key_file_that_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "keys.d"
    directory.mkdir(mode=0o700)
    with pytest.raises(errors.UnsafeKeyFile, match="not a regular file"):
        Keyring.load(directory)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(errors.UnsafeKeyFile, match="not a regular file"):
        Keyring.load(fifo)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_key_file_of_another_user_is_refused(tmp_path: Path) -> None:
    path, _ = keyring_file(tmp_path, "k1")
    os.chown(path, 12345, 12345)
    with pytest.raises(errors.UnsafeKeyFile, match="belongs to user 12345"):
        Keyring.load(path)


def test_a_symbolic_link_to_a_safe_key_file_is_followed(tmp_path: Path) -> None:
    """Secret mounts (Kubernetes, Docker) are links to the file; the file is checked."""
    path, ring = keyring_file(tmp_path, "k1")
    link = tmp_path / "link"
    link.symlink_to(path)
    assert Keyring.load(link).current.secret == ring.current.secret
    path.chmod(0o644)
    with pytest.raises(errors.UnsafeKeyFile):
        Keyring.load(link)


def test_a_file_of_raw_bytes_is_refused_with_how_to_write_it(tmp_path: Path) -> None:
    path = tmp_path / "raw.key"
    path.write_bytes(b"\xff" * 32)
    path.chmod(0o600)
    with pytest.raises(errors.ConfigError, match="one such line"):
        Keyring.load(path)


def test_rotation_keeps_the_old_keys_and_makes_the_new_one_current(tmp_path: Path) -> None:
    path, ring = keyring_file(tmp_path, "k1")
    new = Key.generate("k2")
    write_keyring(path, ring.rotated(new))
    loaded = Keyring.load(path)
    assert [k.id for k in loaded] == ["k2", "k1"]
    assert loaded.get("k1").secret == ring.current.secret
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["keys"], "a temporary file was left"
    dropped = loaded.without("k1")
    assert [k.id for k in dropped] == ["k2"]
    with pytest.raises(errors.KeyMissing, match="no key 'k1'"):
        dropped.get("k1")
    with pytest.raises(errors.ConfigError, match="current key"):
        loaded.without("k2")
    with pytest.raises(errors.ConfigError, match="used twice"):
        loaded.rotated(Key.generate("k1"))


def test_a_key_is_never_shown_and_its_fingerprint_names_it() -> None:
    key, other = Key.generate("k1"), Key.generate("k1")
    assert key.secret.hex() not in repr(key)
    assert key.fingerprint == Key("k1", key.secret).fingerprint
    assert key.fingerprint != other.fingerprint
    assert key.secret.hex()[:16] != key.fingerprint
    with pytest.raises(errors.ConfigError, match="32 raw bytes"):
        Key("k1", b"short")


# -- the setting ----------------------------------------------------------------------------


def test_the_setting_is_taken_by_keyword_and_by_variable(tmp_path: Path) -> None:
    """encryption_key_file names the keyring (tests/store/test_encryption.py: what it
    does); a path that cannot be one is a ConfigError."""
    path, _ = keyring_file(tmp_path, "k1")
    assert Settings().encryption_key_file == ""
    assert Settings(encryption_key_file=str(path)).encryption_key_file == str(path)
    loaded = Settings.load({"FLEETSTORE_ENCRYPTION_KEY_FILE": str(path)})
    assert loaded.encryption_key_file == str(path)
    with pytest.raises(errors.ConfigError, match="must be a file path"):
        Settings(encryption_key_file="a\x00b")
