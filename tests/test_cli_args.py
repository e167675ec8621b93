"""Every numeric option of every command (tools/*.py, pipeline/*.py) declares its range with a ``tools.cli_args``
type, and argparse refuses a value outside it (exit 2, one line naming the option) before anything loads: the
parser is taken from each command's own ``main`` at the moment it parses, so nothing after that runs here."""

import argparse
import re
from importlib import import_module
from pathlib import Path

import pytest

from tools import cli_args
from tools.cli_args import Number, NumberList

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = sorted(f"{path.parent.name}.{path.stem}" for folder in ("tools", "pipeline")
                  for path in (ROOT / folder).glob("*.py") if "ArgumentParser(" in path.read_text())
NUMERIC_TEXT = re.compile(r"^-?[\d.]+(e-?\d+)?(,-?[\d.]+(e-?\d+)?)*$")


class Parsed(Exception):
    """Raised where a command's main parses its arguments, carrying its parser."""

    def __init__(self, parser):
        self.parser = parser


def command_parser(name: str, monkeypatch) -> argparse.ArgumentParser:
    def capture(parser, *args, **kwargs):
        raise Parsed(parser)

    module = import_module(name)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", capture)
    with pytest.raises(Parsed) as parsed:
        module.main([])
    monkeypatch.undo()
    return parsed.value.parser


def options(parser: argparse.ArgumentParser):
    """(parser, option string, action) of every option, subcommands' included."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from options(sub)
        elif action.option_strings and action.nargs != 0:
            yield parser, action.option_strings[-1], action


def out_of_range(number: Number) -> list[str]:
    """Values just outside ``number``'s range (and NaN for floats)."""
    step = 1 if number.kind is int else 0.5
    values = []
    if number.low is not None:
        values.append(number.low if number.open_low else number.low - step)
    if number.high is not None:
        values.append(number.high if number.open_high else number.high + step)
    return [str(number.kind(v)) for v in values] + (["nan"] if number.kind is float else [])


def test_the_walk_finds_the_commands():
    assert {"pipeline.collect", "pipeline.train", "pipeline.export", "tools.transcribe", "tools.benchmark"} \
        <= set(COMMANDS)


@pytest.mark.parametrize("name", COMMANDS)
def test_every_numeric_option_refuses_values_out_of_its_range(name, monkeypatch, capsys):
    parser = command_parser(name, monkeypatch)
    undeclared, checked = [], 0
    for owner, option, action in options(parser):
        kind = action.type
        if kind in (int, float) or (kind is None and (
                isinstance(action.default, (int, float)) and not isinstance(action.default, bool)
                or isinstance(action.default, str) and NUMERIC_TEXT.match(action.default))):
            undeclared.append(option)
            continue
        number = kind.item if isinstance(kind, NumberList) else kind
        if not isinstance(number, Number):
            continue
        for value in out_of_range(number):
            with pytest.raises(SystemExit) as exit_:
                owner.parse_args([option, value])
            err = capsys.readouterr().err.strip().splitlines()
            assert exit_.value.code == 2 and f"argument {option}" in err[-1] and "must be" in err[-1], (option, err)
            checked += 1
    assert not undeclared, f"{name}: numeric options without a tools.cli_args range: {undeclared}"


@pytest.mark.parametrize("name, argv", [
    ("pipeline.collect", ["--base", "B", "--audio", "A", "--skip", "-4", "--limit", "4"]),
    ("pipeline.collect", ["--base", "B", "--audio", "A", "--max-new-tokens", "0"]),
    ("pipeline.train", ["--base", "B", "--data", "D", "--val-fraction", "1.5"]),
    ("pipeline.train", ["--base", "B", "--data", "D", "--heads", "0"]),
    ("pipeline.train", ["--base", "B", "--data", "D", "--batch-size", "0"]),
    ("pipeline.train", ["--base", "B", "--data", "D", "--lr", "-1"]),
])
def test_the_issues_examples_are_refused_before_loading(name, argv, capsys):
    """The cases that slipped through (or failed after a minute of loading): exit 2 at parsing."""
    with pytest.raises(SystemExit) as exit_:
        import_module(name).main(argv)
    assert exit_.value.code == 2
    assert "must be" in capsys.readouterr().err.strip().splitlines()[-1]


def test_number_types_name_the_range():
    assert cli_args.fraction("1") == 1.0 and cli_args.positive_ints("1, 2") == [1, 2]
    with pytest.raises(argparse.ArgumentTypeError, match=r"must be > 0, got -1"):
        cli_args.positive_float("-1")
    with pytest.raises(ValueError):
        cli_args.positive_int("x")
