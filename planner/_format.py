"""Human formatting of counts, byte sizes, shapes and names for the CLI's tables."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["format_count", "format_bytes", "format_bytes_up", "format_shape", "printable"]

_PREFIXES = ("", "k", "M", "G", "T", "P", "E")


def _scaled(value: float) -> tuple[float, str]:
    v = float(value)
    i = 0
    while abs(v) >= 999.95 and i < len(_PREFIXES) - 1:
        v /= 1000.0
        i += 1
    return v, _PREFIXES[i]


def format_count(value: float) -> str:
    """``14719818`` -> ``"14.7 M"``; ``512`` -> ``"512"``; SI prefixes (k, M, G, T, ...)."""
    v, p = _scaled(value)
    if not p:
        return f"{v:.0f}" if float(v).is_integer() else f"{v:.3g}"
    return f"{v:.1f} {p}"


def format_bytes(value: float) -> str:
    """``15_400_000`` -> ``"15.4 MB"``; ``0`` -> ``"0 B"`` (decimal units, 1 MB = 10**6 B)."""
    v, p = _scaled(value)
    if not p:
        return f"{v:.0f} B"
    return f"{v:.1f} {p}B"


def format_bytes_up(nbytes: float) -> str:
    """Bytes in decimal units with two decimals, rounded *up* so that the size
    printed is enough (for a limit to give): ``8_922_601_651`` -> ``"8.93 GB"``."""
    import math

    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{math.ceil(nbytes / scale * 100) / 100:.2f} {unit}"
    return f"{math.ceil(nbytes):.0f} B"


def format_shape(shape: Sequence[int]) -> str:
    """``[64, 56, 56]`` -> ``"64×56×56"``."""
    return "×".join(str(int(d)) for d in shape)


# C0 controls (ESC among them), DEL and C1 controls (CSI U+009B among them): a terminal acts on them
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if chr(c) not in "\n\t"}


def printable(text: str) -> str:
    """``text`` as a terminal shows it without acting on it: every control
    character but newline and tab written as its ``\\x1b``-style escape,
    so that a layer or hardware name from a file cannot move the cursor,
    retitle the window or recolour the terminal."""
    return text.translate(_CONTROL)
