"""Argument checks shared by the collector and its env resolution, so that their errors read alike."""

from __future__ import annotations

from typing import Any


def check_int(name: str, value: Any, minimum: int) -> int:
    """``value`` if it is an int (not a bool) ``>= minimum``; else a ``ValueError`` naming ``name``.

    Examples:
        >>> check_int("num_envs", 4, 1)
        4
        >>> check_int("num_envs", 0, 1)
        Traceback (most recent call last):
        ...
        ValueError: num_envs must be an int >= 1, got 0
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value
