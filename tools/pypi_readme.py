"""README.pypi.md, the package's long description: README.md with its relative links
made absolute.

README.md links docs/... relatively (GitHub renders them at the commit being read,
tests/test_docs.py checks they resolve); on a package index those links break, so
the package is described by this file instead (pyproject.toml's ``readme``), each
relative link pointing at the repository's copy on main (``[project.urls]
Repository``).  ``python tools/pypi_readme.py`` writes it (``make readme``);
``--check`` exits 1 if it is not what README.md gives (``make lint``,
tests/test_packaging.py).
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
OUTPUT = ROOT / "README.pypi.md"
NOTICE = (
    "<!-- Generated from README.md by tools/pypi_readme.py (make readme): edit README.md. -->\n"
)

# A Markdown link or image target: ](target) or ](target "title"), not a URL with a
# scheme and not an anchor on the same page.
LINK = re.compile(r"(\]\(\s*<?)(?![a-z][a-z0-9+.-]*:)(?!#)([^)\s>]+)")


def base_url() -> str:
    """Where a relative link points on the index: the repository's files on main."""
    with (ROOT / "pyproject.toml").open("rb") as fh:
        repository = tomllib.load(fh)["project"]["urls"]["Repository"]
    return f"{repository.rstrip('/')}/blob/main/"


def render(readme: str, base: str) -> str:
    """*readme* with every relative link target prefixed by *base*."""
    return NOTICE + LINK.sub(lambda m: f"{m[1]}{base}{m[2]}", readme)


def main(argv: list[str]) -> int:
    wanted = render(README.read_text(encoding="utf-8"), base_url())
    if argv[1:] == ["--check"]:
        if not OUTPUT.exists() or OUTPUT.read_text(encoding="utf-8") != wanted:
            print(f"{OUTPUT.name} is not README.md's: run `make readme`", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(wanted, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
