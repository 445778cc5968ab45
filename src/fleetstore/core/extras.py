"""The optional dependencies (extras) and the one error for a missing one.

Every module that imports an extra's package does it inside ``requires(EXTRA)``:
a ``ModuleNotFoundError`` for one of that extra's packages becomes
``MissingDependency`` naming the ``pip install`` to run, which the ``fleetstore``
command prints as one line (``fleetstore import --from langgraph-sqlite`` printed
a 25-line traceback without the extra: issue 28; tests/cli/test_extras.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from fleetstore.errors import MissingDependency

#: extra -> the top-level packages it installs that fleetstore imports (the names
#: of pyproject.toml's [project.optional-dependencies]).
EXTRAS: dict[str, tuple[str, ...]] = {
    "postgres": ("psycopg", "psycopg_pool"),
    "langgraph": ("langgraph", "langchain_core"),
    "openai-agents": ("agents",),
    "adk": ("google", "pydantic"),
    "encryption": ("cryptography",),
    # Not imported: the fleetstore command loads `fleetstore stress` from this
    # distribution's entry point (cli/util.LazyGroup).
    "stress": ("fleetstore_stress",),
}


def install_hint(extra: str) -> str:
    """``pip install 'fleetstore[EXTRA]'``."""
    if extra not in EXTRAS:
        raise ValueError(f"no extra {extra!r}: {', '.join(EXTRAS)}")
    return f"pip install 'fleetstore[{extra}]'"


@contextmanager
def requires(extra: str, what: str) -> Iterator[None]:
    """Imports inside the block are *extra*'s: a missing package of it raises
    ``MissingDependency`` ("*what* needs the 'EXTRA' extra (PACKAGE is not installed):
    pip install 'fleetstore[EXTRA]'");
    any other import error goes through unchanged."""
    hint = install_hint(extra)
    try:
        yield
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if isinstance(exc, MissingDependency) or missing.split(".")[0] not in EXTRAS[extra]:
            raise
        raise MissingDependency(
            f"{what} needs the {extra!r} extra ({missing} is not installed): {hint}", missing
        ) from None


__all__ = ["EXTRAS", "install_hint", "requires"]
