"""Sentences in several languages for synthetic speech, fetched at run time from packages:

  * ``--source django`` (default; the evaluation clips): Django's own translation catalogues (the admin's and
    the framework's messages, translated by its community; BSD-3-Clause), from the pinned PyPI wheel;
  * ``--source gnome-help`` (training): the GNOME desktop help (Mallard pages) in each language, Debian
    ``gnome-user-docs`` (CC-BY-SA-3.0); 2 500-2 900 sentences a language, less those left untranslated
    (equal to the English page's) and any equal to a Django sentence.

    python -m pipeline.multilingual_texts --out work_data/multilingual_texts --languages de,fr,es,it,pt,nl

Writes OUT/<language>.txt (one sentence a line) and OUT/<language>.txt.source.json, the sidecar
``pipeline.synth_speech --text-file`` reads (source, package, version, licence, sentence count), so e.g.
``python -m pipeline.synth_speech --text-file OUT/de.txt --voices espeak-de ...`` reads them in German.
Kept: whole messages of MIN_WORDS-MAX_WORDS words made of letters and ordinary punctuation only (no
placeholders, markup, URLs or symbols a voice would spell out). Interface text, not conversation: enough for
a few dozen evaluation clips per language, far too little to train on (gnome-help is the training text).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from pipeline import texts as tx

DJANGO = "django==5.2.8"
DJANGO_LICENCE = "BSD-3-Clause (Django Software Foundation and contributors; translations via Transifex)"
GNOME_HELP = "gnome-user-docs"
GNOME_HELP_LICENCE = "CC-BY-SA-3.0 (GNOME Documentation Project)"
MALLARD_P = "{http://projectmallard.org/1.0/}p"
MIN_WORDS, MAX_WORDS = 7, 42
# language code (Whisper's) -> the locale folder of Django's catalogues and of the GNOME help
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


def mallard_sentences(page: bytes) -> list[str]:
    """The speakable sentences of one Mallard help page's paragraphs (inline markup's text kept)."""
    try:
        root = ET.fromstring(page)
    except ET.ParseError:
        return []
    out = []
    for paragraph in root.iter(MALLARD_P):
        for sentence in re.split(r"(?<=[.!?])\s+", " ".join("".join(paragraph.itertext()).split())):
            if (kept := speakable(sentence)) is not None:
                out.append(kept)
    return out


def gnome_help_sentences(files: dict[str, bytes], locale: str, exclude: set[str] = frozenset()) -> list[str]:
    """The speakable sentences of the GNOME help in ``locale`` (package path -> bytes), each once, less the
    untranslated ones (also on the C locale's page) and ``exclude``."""
    def pages(code):
        pattern = re.compile(rf"/help/{re.escape(code)}/gnome-help/[^/]+\.page$")
        return [files[n] for n in sorted(files) if pattern.search(n)]

    english = {s for page in pages("C") for s in mallard_sentences(page)}
    seen: dict[str, None] = {}
    for page in pages(locale):
        for sentence in mallard_sentences(page):
            if sentence not in english and sentence not in exclude:
                seen.setdefault(sentence, None)
    return list(seen)


def source_info(language: str, sentences: list[str], source: str = "django", version: str | None = None) -> dict:
    """The --text-file sidecar (pipeline.synth_speech.file_sources) for one language's sentences."""
    if source == "django":
        package, _, version = DJANGO.partition("==")
        info = {"title": f"Django {version} translation catalogues ({language})", "registry": "pypi",
                "package": DJANGO, "version": version, "licence": DJANGO_LICENCE}
    else:
        info = {"title": f"GNOME help, {GNOME_HELP} {version} ({language})", "registry": "debian",
                "package": GNOME_HELP, "version": version, "licence": GNOME_HELP_LICENCE}
    entry = {"name": f"{source}-{language}", **info, "language": language, "sentences": len(sentences)}
    return {"texts": f"{entry['name']}:1", "sources": [entry], "language": language}


def write_language(out: Path, language: str, sentences: list[str], source: str = "django",
                   version: str | None = None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{language}.txt"
    path.write_text("".join(s + "\n" for s in sentences), encoding="utf-8")
    info = source_info(language, sentences, source, version)
    Path(f"{path}.source.json").write_text(json.dumps(info, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
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
    parser.add_argument("--source", choices=("django", "gnome-help"), default="django",
                        help="django: evaluation sentences; gnome-help: training sentences (less any Django one)")
    args = parser.parse_args(argv)
    try:
        django = tx.wheel_files(tx.fetch_wheel(DJANGO, tx.cache_root() / "texts"), (".po",))
        if args.source == "gnome-help":
            installed = tx.installed_deb_files(GNOME_HELP, (".page",))
            if installed is None:
                deb = tx.fetch_deb(GNOME_HELP, tx.cache_root() / "debs")
                installed = tx.deb_files(deb, (".page",)), tx.deb_version(deb)
            pages, version = installed
    except tx.TextError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for language in args.languages:
        sentences = django_sentences(django, LOCALES[language])
        if args.source == "gnome-help":
            sentences = gnome_help_sentences(pages, LOCALES[language], exclude=set(sentences))
        path = write_language(args.out, language, sentences, args.source,
                              version if args.source == "gnome-help" else None)
        print(f"{language}: {len(sentences)} sentences -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
