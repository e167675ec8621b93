"""Word error rate as Whisper's evaluations report it: transformers' ``EnglishTextNormalizer`` on both sides
(case, punctuation, fillers, contractions, numbers and currencies to digits, and Whisper's table of British to
American spellings), then jiwer's corpus-level WER.

The spelling table is Whisper's own ``english.json`` (MIT, the file the Hub's Whisper repositories ship as
``normalizer.json``), taken from the openai-whisper sdist on PyPI into the project cache on first use; where
PyPI cannot be reached the normaliser runs without it, with a warning.

    python -m tools.text_normalizer "Mr. Smith paid $3.50 for twenty-one apples."
"""

from __future__ import annotations

import functools
import json
import sys
import tarfile
import warnings
from pathlib import Path

__all__ = ["normalize", "wer"]

SPELLING_SOURCE = ("openai_whisper", "20250625", "whisper/normalizers/english.json")
SPELLING_FILE = "whisper-english-spelling.json"


def spelling_table_path() -> Path:
    from medusa_options import cache_dir

    return cache_dir() / SPELLING_FILE


def fetch_spelling_table(path: Path) -> None:
    """Whisper's spelling table from the openai-whisper sdist into ``path`` (written whole or not at all)."""
    from tools.pypi import Sdist, download_sdist
    from tools.files import write_atomic_with

    name, version, member = SPELLING_SOURCE
    sdist = Sdist(name, version)
    archive = download_sdist(sdist, path.parent / "wheels")
    with tarfile.open(archive) as tar:
        table = json.load(tar.extractfile(sdist.prefix + member))
    write_atomic_with(path, lambda temp_name: Path(temp_name).write_text(json.dumps(table), encoding="utf-8"))


@functools.cache
def spelling_table() -> dict[str, str]:
    path = spelling_table_path()
    if not path.is_file():
        try:
            fetch_spelling_table(path)
        except Exception as exc:  # no PyPI here: the rest of the normaliser still applies
            warnings.warn(f"WER without Whisper's spelling table ({exc}); fix: put {SPELLING_SOURCE[2]} of "
                          f"{SPELLING_SOURCE[0]}=={SPELLING_SOURCE[1]} at {path}", stacklevel=2)
            return {}
    return json.loads(path.read_text(encoding="utf-8"))


@functools.cache
def english_normalizer():
    from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

    return EnglishTextNormalizer(spelling_table())


def normalize(text: str) -> str:
    """One transcript as Whisper's evaluations score it."""
    return english_normalizer()(text)


def wer(references: list[str], hypotheses: list[str]) -> float:
    """Corpus-level word error rate after ``normalize``: total word edits / total reference words."""
    import jiwer

    if len(references) != len(hypotheses):
        raise ValueError(f"{len(references)} references but {len(hypotheses)} hypotheses")
    pairs = [(normalize(r), normalize(h)) for r, h in zip(references, hypotheses)]
    scored = [(r, h) for r, h in pairs if r.split()]  # jiwer refuses an empty reference: its words are insertions
    if not scored:
        raise ValueError("references contain no words")
    output = jiwer.process_words([r for r, _ in scored], [h for _, h in scored])
    insertions = sum(len(h.split()) for r, h in pairs if not r.split())
    edits = output.substitutions + output.deletions + output.insertions + insertions
    return edits / sum(len(r.split()) for r, _ in scored)

if __name__ == "__main__":
    for line in sys.argv[1:] or sys.stdin:
        print(normalize(line))
