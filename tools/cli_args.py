"""Options every command spells alike: argparse types that refuse an out-of-range number before anything loads
(argparse then exits 2 with one line naming the option and the range), and ``--trust-base-code``.

Commands in ``tools`` and ``pipeline`` import these; this module imports nothing of either. Every numeric option
of a command takes one of these types (``tests/test_cli_args.py`` walks every command's parser)."""

from __future__ import annotations

import argparse
import math

TRUST_BASE_CODE_HELP = ("run the base model's own Python code where its family has some (MERaLiON-2; Whisper never "
                        "does), for a --base other than the one the heads name: only for a base you trust")


def add_trust_base_code(parser: argparse.ArgumentParser) -> None:
    """``--trust-base-code``: the consent ``MedusaForASR.from_pretrained/from_base(trust_base_remote_code=True)``
    asks for before a base named at run time runs its own code."""
    parser.add_argument("--trust-base-code", action="store_true", help=TRUST_BASE_CODE_HELP)


class Number:
    """An argparse type: an int or float (``kind``) from ``low`` to ``high`` (None: unbounded); ``open_low`` /
    ``open_high`` leave that end out. Floats must be finite."""

    def __init__(self, kind: type, low: float | None = None, high: float | None = None, *,
                 open_low: bool = False, open_high: bool = False):
        self.kind, self.low, self.high, self.open_low, self.open_high = kind, low, high, open_low, open_high
        self.__name__ = kind.__name__  # argparse's "invalid int value: 'x'"

    def __call__(self, text: str):
        value = self.kind(text)  # ValueError: argparse says "invalid <kind> value"
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if not self.holds(value):
            raise argparse.ArgumentTypeError(f"must be {self.range_text()}, got {text}")
        return value

    def holds(self, value) -> bool:
        above = self.low is None or (value > self.low if self.open_low else value >= self.low)
        below = self.high is None or (value < self.high if self.open_high else value <= self.high)
        return above and below

    def range_text(self) -> str:
        low = None if self.low is None else f"{'>' if self.open_low else '>='} {self.low:g}"
        high = None if self.high is None else f"{'<' if self.open_high else '<='} {self.high:g}"
        return " and ".join(part for part in (low, high) if part) or "a number"

    def __repr__(self) -> str:
        return f"{self.kind.__name__} {self.range_text()}"


class NumberList:
    """An argparse type: comma-separated numbers (none: an empty list), each of type ``item`` (a ``Number``)."""

    def __init__(self, item: Number):
        self.item = item
        self.__name__ = f"list of {item.kind.__name__}"

    def __call__(self, text: str) -> list:
        try:
            return [self.item(part.strip()) for part in str(text).split(",") if part.strip()]
        except argparse.ArgumentTypeError as err:
            raise argparse.ArgumentTypeError(f"each {err}") from err


class AsText:
    """An argparse type: the text as given, once ``check`` (a ``Number`` or ``NumberList``) accepts it, for an
    option that a command passes on to another or splits itself."""

    def __init__(self, check: Number | NumberList):
        self.check = check
        self.item = check.item if isinstance(check, NumberList) else check
        self.__name__ = check.__name__

    def __call__(self, text: str) -> str:
        self.check(text)
        return text


positive_int = Number(int, 1)
non_negative_int = Number(int, 0)
any_int = Number(int)
positive_float = Number(float, 0, open_low=True)
non_negative_float = Number(float, 0)
any_float = Number(float)
fraction = Number(float, 0, 1)  # a share from 0 to 1, both ends included
seed = Number(int, 0, 2**32 - 1)  # numpy's and random's seeds
below_one = Number(float, 0, 1, open_high=True)  # a share that must leave something over
positive_ints = NumberList(positive_int)
fractions = NumberList(fraction)
positive_ints_text = AsText(positive_ints)  # e.g. "1,2,4": checked, kept as text
fractions_text = AsText(fractions)
