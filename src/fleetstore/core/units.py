"""Figures for people: byte sizes in reports and command output."""

from __future__ import annotations


def size(n: float) -> str:
    """Bytes for people: ``512 B``, ``49.0 KB``, ``10.5 MB`` (powers of 1000).

    >>> size(512), size(49_000), size(10_500_000)
    ('512 B', '49.0 KB', '10.5 MB')
    """
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{n} B"


__all__ = ["size"]
