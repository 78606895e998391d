"""How the planner writes numbers and counts in prose, in one place so every section agrees.

A plan is read for its numbers, and a number next to a wrong word ("1 nodes", "a 8-token cap", "every
1 step(s)") makes a reader doubt the number. The text report, the dominant-phase summary and the
picture all write counts through `count`, decimals through `num`, and articles through `a`.
"""

from __future__ import annotations

import re


def num(x: float, nd: int = 1) -> str:
    """Fixed decimals, but never a bare 0.0 for a small non-zero value (tiny recipes)."""
    if x and abs(x) < 0.5 * 10**-nd:
        return f"{x:.2g}"
    return f"{x:,.{nd}f}"


def noun(n: float, singular: str, plural: str | None = None) -> str:
    """The noun's form for `n` things: singular for exactly one, else the plural (default: +s)."""
    return singular if n == 1 else plural or singular + "s"


def count(n: int, singular: str, plural: str | None = None) -> str:
    """`n` with thousands separators and the noun in the form it takes: "1 node", "1,024 sequences"."""
    return f"{n:,} {noun(n, singular, plural)}"


def a(spoken: str) -> str:
    """`spoken` with its indefinite article: "an 8-token cap", "a 16,384-token cap", "an 11-layer".

    A number takes "an" when it is said with a vowel first: its leading group of digits (before the
    first thousands separator or decimal point) is 8, 8x, 8xx, 11 or 18 (eight, eighty, eight hundred,
    eleven, eighteen, each maybe followed by "thousand" or "million")."""
    digits = re.match(r"\d*", spoken).group()  # the leading group: up to a separator, a point or a word
    if digits:
        vowel = digits.startswith("8") or digits in ("11", "18")
    else:
        vowel = spoken[:1].lower() in "aeiou"
    return f"{'an' if vowel else 'a'} {spoken}"


def every(n: int, singular: str) -> str:
    """ "every step" for one, "every 9 steps" for more."""
    return f"every {singular}" if n == 1 else f"every {count(n, singular)}"
