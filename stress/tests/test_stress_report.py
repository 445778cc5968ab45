"""``fleetstore stress --compare --report``: one table for every target, and an HTML page
that a real browser (headless Chromium) renders without script errors."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest


def chromium() -> str:
    """Debian's chromium; installed here when missing (the test never skips)."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    if os.geteuid() != 0:
        pytest.fail("chromium is not installed and this is not root: apt-get install chromium")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, timeout=600)
    subprocess.run(["apt-get", "install", "-y", "-qq", "chromium"], check=True, env=env,
                   timeout=900)  # fmt: skip
    found = shutil.which("chromium")
    assert found, "apt-get install chromium did not install chromium"
    return found


def png_pixels(path: Path) -> tuple[int, int, bytes]:
    """Width, height and the decoded scanlines (filter bytes included) of an 8-bit PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    width = height = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    return width, height, zlib.decompress(idat)


@pytest.mark.fleet
def test_compare_report_renders_in_chromium(tmp_path: Path) -> None:
    browser = chromium()
    html_file = tmp_path / "report.html"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETSTORE_")}
    env["FLEETSTORE_DATA_DIR"] = str(tmp_path / "data")
    done = subprocess.run(
        [sys.executable, "-m", "fleetstore_stress", "--json", "--seed", "3", "--compare",
         "--agents", "2", "--duration", "2", "--workers", "1", "--external-lock", "0.5@0.3",
         "--dir", str(tmp_path / "run"), "--report", str(html_file)],
        capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip
    report = json.loads(done.stdout)
    assert done.returncode == 0, (report["problems"], done.stderr)
    names = [t["target"] for t in report["targets"]]
    assert names[:4] == ["fleetstore", "t3code", "opencode", "zcode"]
    assert "agents-sdk" in names and "langgraph" in names  # installed in the dev environment
    for t in report["targets"]:
        assert (tmp_path / "run" / t["target"]).is_dir()  # each in its own directory
        assert t["acknowledged"] > 0, t
    assert report["report"] == str(html_file)

    page = html_file.read_text()
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in page and "<link" not in page and " src=" not in page

    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    dom = subprocess.run(
        [browser, *flags, "--enable-logging=stderr", "--v=0", "--dump-dom",
         html_file.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "Uncaught" not in dom.stderr, dom.stderr[-2000:]
    assert 'id="js-errors"></div>' in dom.stdout  # the page's error box stayed empty
    n = len(report["targets"])
    outboxes = [t["target"] for t in report["targets"] if t.get("outbox")]
    assert outboxes == ["fleetstore", "t3code"]
    # The script ran to its end and counted the charts: latency, n lock-wait and n
    # fairness charts, an effects chart per outbox and the bytes per turn.
    assert f'data-rendered="{1 + 2 * n + len(outboxes) + 1}"' in dom.stdout
    assert "effects over time: t3code" in dom.stdout and "bytes per turn" in dom.stdout
    assert 'id="compare"' in dom.stdout

    shot = tmp_path / "shot.png"
    subprocess.run(
        [browser, *flags, f"--screenshot={shot}", "--window-size=1400,2000",
         html_file.as_uri()],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    width, height, raw = png_pixels(shot)
    assert (width, height) == (1400, 2000)
    assert shot.stat().st_size > 30_000
    # Not blank: the table and the coloured chart lines give many distinct byte values.
    assert len(set(raw)) > 64
    assert raw.count(255) < 0.97 * len(raw)
