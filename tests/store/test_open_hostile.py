"""What ``fleetstore.open`` refuses before it creates or uses anything: an empty path
in a URL, and sidecars (blob directory, spool journals, gate) that someone other than
the store's owner planted or can write."""

from __future__ import annotations

import os

import pytest

import fleetstore
from fleetstore import errors


@pytest.mark.parametrize("url", ["sqlite:///", "sqlite:////", "sqlite+sharded:///"])
def test_an_empty_path_in_a_url_is_refused(url: str) -> None:
    before = set(os.listdir("/"))
    with pytest.raises(errors.ConfigError, match="empty store path"):
        fleetstore.open(url)
    assert set(os.listdir("/")) == before
    assert not os.path.exists("/fleetstore.db")
