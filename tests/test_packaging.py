"""What the package says about itself on an index (issue 28): a LICENSE file for the
Apache-2.0 its metadata names, project URLs and classifiers, a long description whose
links work off GitHub, extras named as users expect, and no published ``dev`` extra
(a PEP 735 dependency group that ``make venv`` installs)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def project() -> dict[str, Any]:
    with (ROOT / "pyproject.toml").open("rb") as fh:
        data: dict[str, Any] = tomllib.load(fh)
    return data


def test_the_license_file_is_the_apache_2_0_the_metadata_names() -> None:
    meta = project()["project"]
    assert meta["license"] == "Apache-2.0" and meta["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text  # the whole text, not a stub


def test_urls_and_classifiers() -> None:
    meta = project()["project"]
    assert {"Homepage", "Repository", "Documentation", "Issues"} <= set(meta["urls"])
    assert all(url.startswith("https://") for url in meta["urls"].values())
    classifiers = set(meta["classifiers"])
    minor = f"Programming Language :: Python :: 3.{sys.version_info.minor}"
    assert minor in classifiers and "Typing :: Typed" in classifiers
    # A license expression and a license classifier together are refused by the build.
    assert not any(c.startswith("License ::") for c in classifiers)


def test_extras_are_named_for_what_they_add_and_dev_is_a_group() -> None:
    data = project()
    extras = data["project"]["optional-dependencies"]
    assert set(extras) == {
        "postgres",
        "langgraph",
        "openai-agents",
        "agents",
        "adk",
        "stress",
        "encryption",
    }
    assert extras["agents"] == ["fleetstore[openai-agents]"]  # the old name, an alias
    assert "dev" in data["dependency-groups"]
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "--group dev" in makefile and "[dev]" not in makefile
    # rich draws the command's output, which every install has: a core dependency.
    assert any(re.match(r"rich\b", d) for d in data["project"]["dependencies"])


def test_the_long_description_is_the_readme_with_absolute_links() -> None:
    assert project()["project"]["readme"]["file"] == "README.pypi.md"
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "pypi_readme.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    text = (ROOT / "README.pypi.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(\s*<?([^)\s>]+)", text)
    assert len(targets) >= 20
    relative = [t for t in targets if not re.match(r"^(https://|#)", t)]
    assert relative == [], relative
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "](docs/quickstart.md)" in readme  # README itself keeps its relative links


def build_wheel(project: Path, tmp_path: Path) -> zipfile.ZipFile:
    """*project*'s wheel, built by its own build backend from a copy
    of the files a build reads (offline, without isolation: setuptools is in the dev
    group; a copy, so that no ``build/`` or ``*.egg-info`` left in the checkout by an
    earlier build can add to it)."""
    copy = tmp_path / project.name
    copy.mkdir()
    for name in ("pyproject.toml", "LICENSE", "README.md", "README.pypi.md"):
        if (project / name).exists():
            shutil.copyfile(project / name, copy / name)
    shutil.copytree(
        project / "src", copy / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__")
    )
    with (project / "pyproject.toml").open("rb") as fh:
        backend = tomllib.load(fh)["build-system"]["build-backend"]
    out = tmp_path / "dist"
    done = subprocess.run(
        [sys.executable, "-c", f"import {backend} as b; print(b.build_wheel({str(out)!r}))"],
        cwd=copy,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return zipfile.ZipFile(out / done.stdout.split()[-1])


def test_the_library_wheel_carries_neither_the_stress_harness_nor_the_peer_patterns(
    tmp_path: Path,
) -> None:
    """Issue 26: admin/stress, cli/stress.py and engine/peers*.py (4.3k lines, 12 % of
    the wheel) are fleetstore-stress's (stress/): the library's wheel has none of them."""
    with build_wheel(ROOT, tmp_path) as wheel:
        names = wheel.namelist()
    code = [n for n in names if n.startswith("fleetstore/")]
    assert "fleetstore/__init__.py" in code and "fleetstore/py.typed" in code
    assert any(n.startswith("fleetstore/sql/sqlite/") and n.endswith(".sql") for n in code)
    assert "fleetstore/sql/common/queries.sql" in code  # the queries both dialects share
    assert len(code) > 100  # the listing sees the package
    assert [n for n in names if "stress" in n or "peers" in n] == []


def test_the_library_and_the_harness_pin_each_other_to_one_release() -> None:
    """The harness uses fleetstore's internals: its version, its pin of fleetstore and
    the library's ``stress`` extra name one release (three numbers, kept equal here)."""
    harness = tomllib.loads((ROOT / "stress" / "pyproject.toml").read_text())["project"]
    lib = project()["project"]
    assert f"fleetstore=={lib['version']}" in harness["dependencies"]
    assert lib["optional-dependencies"]["stress"] == [f"fleetstore-stress=={harness['version']}"]
    assert harness["version"] == lib["version"]
