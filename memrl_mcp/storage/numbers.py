"""Floats as the Qdrant engines give them back.

Qdrant keeps a payload as JSON text and reads it with serde_json's fast number parser, which is not correctly
rounded: it reads the shortest digits of the float as an integer and multiplies or divides that by a power of ten,
so a float of 16 or 17 significant digits, or one far from 1, can come back a unit or a few in the last place
away (timestamps, Q values, tiny and huge numbers: docs/storage.md, "Numbers read back as written"). A write
whose result differs from the next read is a lie a client can see (an ``updated_at`` or a ``q`` that changed by
itself), and a value that moves at every rewrite drifts. So the stores write, and the tools return, the nearest
float that the parser reads back as itself: :func:`kept_float`. The move is a few units in the last place (tens at
worst, near 1e-12), far below anything the algorithm can see."""

from __future__ import annotations

import functools
import math
from typing import Annotated, Any

from pydantic import AfterValidator

_POWERS_OF_TEN = [float(f"1e{k}") for k in range(309)]
_SEARCH_ULPS = 256


def _as_parsed(x: float) -> float:
    """What serde_json's fast parser reads from the shortest digits of ``x`` (positive, finite, not 0)."""
    mantissa, _, exponent_text = repr(x).partition("e")
    whole, _, fraction = mantissa.partition(".")
    value = float(int(whole + fraction))
    exponent = int(exponent_text or 0) - len(fraction)
    while exponent < -308:  # as the parser does; a finite float's exponent is never above 308 here
        value /= 1e308
        exponent += 308
    return value * _POWERS_OF_TEN[exponent] if exponent >= 0 else value / _POWERS_OF_TEN[-exponent]


def _nearest_kept(x: float) -> float:
    if _as_parsed(x) == x:
        return x
    below = above = x
    for _ in range(_SEARCH_ULPS):
        below, above = math.nextafter(below, 0.0), math.nextafter(above, math.inf)
        for candidate in (below, above):
            if _as_parsed(candidate) == candidate:
                return candidate
    return x  # met by no float tried; kept as it is rather than moved far


@functools.lru_cache(maxsize=1 << 16)  # the same floats recur from write to write (a Q, a time, a reward)
def _kept_nonzero(x: float) -> float:
    return math.copysign(_nearest_kept(abs(x)), x) if math.isfinite(x) else x


def kept_float(x: float) -> float:
    """The float nearest ``x`` that the engines keep exactly."""
    return _kept_nonzero(x) if x else x  # 0.0 and -0.0 are kept, and equal as cache keys


def kept(value: Any) -> Any:
    """A JSON value with each float replaced by :func:`kept_float` (a payload, before it is written; its cost:
    perf/write_costs.py)."""
    if type(value) is float:
        return kept_float(value)
    if isinstance(value, dict):
        return {key: kept(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [kept(item) for item in value]
    return value


KeptFloat = Annotated[float, AfterValidator(kept_float)]
"""A float a tool returns that is also stored: the number the next read of it will show."""

KeptJson = Annotated[dict[str, Any], AfterValidator(kept)]
"""Metadata a tool returns that is also stored, with its floats as the next read will show them."""


def finite(value: Any) -> float | None:
    """A stored value as a number a read can compute with: a finite float, or None for anything else (text, null, a
    boolean, NaN, an infinity, an integer too large for a float). A payload may come from another version of this
    server or another replica, or be damaged: what a read computes with is never taken on trust."""
    if type(value) is not float and type(value) is not int:
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None
