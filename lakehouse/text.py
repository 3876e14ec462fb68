"""Text tables for the commands that print them (status, state, sql)."""

from __future__ import annotations

from collections.abc import Collection, Sequence


def aligned(
    header: Sequence[str],
    rows: Sequence[Sequence],
    right: Collection[int] = (),
    sep: str = "  ",
    rule: str | None = None,
) -> list[str]:
    """The lines of a table: each column as wide as its widest cell, the columns in ``right``
    aligned right; with ``rule`` (e.g. ``"-+-"``) a line of dashes under the header."""
    cells = [[str(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(header)]

    def line(values: Sequence[str]) -> str:
        return sep.join(
            v.rjust(w) if i in right else v.ljust(w)
            for i, (v, w) in enumerate(zip(values, widths, strict=True))
        ).rstrip()

    lines = [line(header)]
    if rule:
        lines.append(rule.join("-" * w for w in widths))
    return lines + [line(row) for row in cells]
