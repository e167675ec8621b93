"""Markdown tables (GitHub flavour) for the benchmark reports and the model cards, through ``tabulate``."""

from __future__ import annotations

from tabulate import tabulate


def markdown_table(header: list, rows: list[list]) -> str:
    """A GitHub Markdown table; each cell is ``str(value)`` with ``|`` escaped and newlines flattened.

    Callers format their numbers themselves: tabulate's number parsing would reformat them ("0.050" -> "0.05")."""
    return tabulate([[_cell(v) for v in row] for row in rows], [_cell(h) for h in header],
                    tablefmt="github", disable_numparse=True)


def _cell(value) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def number_cell(value, digits: int = 2, suffix: str = "") -> str:
    """``value`` with ``digits`` decimals and ``suffix`` (e.g. "x"), or an empty cell for None."""
    return "" if value is None else f"{value:.{digits}f}{suffix}"
