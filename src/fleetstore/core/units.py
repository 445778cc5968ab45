"""Figures for people: byte sizes in reports and command output.

One unit system everywhere: IEC, powers of 1024 (KiB, MiB, GiB, TiB).  fleetstore's
own sizes are powers of two (the 64 KiB blob threshold, the 64 MiB WAL truncation
point, 1 MiB export pieces), so they print as the round numbers the docs give; the
command output used to mix ``49.0 KB`` (powers of 1000) with ``8 MiB``.
"""

from __future__ import annotations

_UNITS = ("KiB", "MiB", "GiB", "TiB")


def size(n: float) -> str:
    """Bytes for people: ``512 B``, ``47.9 KiB``, ``10.0 MiB`` (powers of 1024).

    >>> size(512), size(49_000), size(10 * 1024 * 1024), size(3 * 1024**5)
    ('512 B', '47.9 KiB', '10.0 MiB', '3072.0 TiB')
    """
    value = float(n)
    if abs(value) < 1024:
        return f"{value:.0f} B"
    for unit in _UNITS:
        value /= 1024
        if abs(value) < 1024 or unit == _UNITS[-1]:
            break
    return f"{value:.1f} {unit}"


__all__ = ["size"]
