"""Options every command spells alike: argparse types that refuse an out-of-range number before anything loads
(argparse then exits 2 with one line naming the option), and ``--trust-base-code``.

Commands in ``tools`` and ``pipeline`` import these; this module imports nothing of either."""

from __future__ import annotations

import argparse

TRUST_BASE_CODE_HELP = ("run the base model's own Python code where its family has some (MERaLiON-2; Whisper never "
                        "does), for a --base other than the one the heads name: only for a base you trust")


def add_trust_base_code(parser: argparse.ArgumentParser) -> None:
    """``--trust-base-code``: the consent ``MedusaForASR.from_pretrained/from_base(trust_base_remote_code=True)``
    asks for before a base named at run time runs its own code."""
    parser.add_argument("--trust-base-code", action="store_true", help=TRUST_BASE_CODE_HELP)
