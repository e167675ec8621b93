"""Synthetic English training speech: Jane Austen sentences read by several flite voices (and optionally
festival's HTS voice) at varied speaking rates.

    python -m pipeline.synth_speech --out work_data/synth_speech --num-utterances 10000 --workers 2

Output: OUT/shard_XXXX/<id>.wav (16 kHz mono, 16-bit) and OUT/manifest.jsonl with rows
{"id", "audio" (relative to OUT), "text", "voice", "rate", "duration", "source", "licence"}.
Re-running with the same settings resumes: finished clips are kept, partial files are never visible
(written to dot-prefixed temp names, then renamed). Clips outside 3-20 s are dropped and remembered.

Text: the six Jane Austen novels shipped by the Debian package r-cran-janeaustenr (fetched with
``apt-get download``, not installed; see LICENSE_NOTES), minus "Sense and Sensibility", whose LibriVox
recordings are part of the evaluation speech. ``--text-file`` reads any UTF-8 text instead, and
``--export-sentences`` writes the cleaned sentence list, e.g. to carry it to a machine without apt.

flite elsewhere: ``--make-flite-bundle DIR`` copies the flite binary and its shared libraries into DIR;
on the other machine pass ``--flite-bin DIR/bin/flite`` (DIR/lib is added to LD_LIBRARY_PATH, which is
passed through). Debian packages used here: flite (required), festival + festvox-us-slt-hts (optional).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import unicodedata
import zlib
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SAMPLE_RATE = 16000
MIN_SECONDS, MAX_SECONDS = 3.0, 20.0
MIN_WORDS, MAX_WORDS = 9, 42  # ~3-20 s at the rates and voices below; clips are re-checked after synthesis
RATES = (0.8, 0.85, 0.9, 0.95, 1.0, 1.05, 1.1, 1.15, 1.2, 1.25)  # flite duration_stretch (>1 = slower)
DEFAULT_VOICES = "slt:3,rms:2,awb:2,kal16:2"
FESTIVAL_VOICE = "festival-slt-hts"

AUSTEN_PACKAGE = "r-cran-janeaustenr"
AUSTEN_EXCLUDED = ("sense and sensibility",)  # its LibriVox recordings are evaluation speech

LICENSE_NOTES = {
    "text": {
        "source": "Debian package r-cran-janeaustenr (data/Rdata.rdb): Jane Austen's six novels as "
                  "Project Gutenberg text lines",
        "version": "1.0.0-1 (Debian bookworm); the version actually used is written to OUT/plan.json",
        "licence": "novels: public domain (Jane Austen, 1811-1818); package: MIT (Julia Silge)",
        "used": "Emma, Mansfield Park, Northanger Abbey, Persuasion, Pride and Prejudice "
                "(Sense and Sensibility left out: it overlaps the evaluation speech)",
    },
    "flite": {
        "source": "Debian package flite 2.2 (voices cmu_us_slt, cmu_us_rms, cmu_us_awb, cmu_us_kal16)",
        "licence": "BSD-style (Carnegie Mellon University / Edinburgh); generated audio carries no extra terms",
    },
    "festival": {
        "source": "Debian packages festival 2.5 + festvox-us-slt-hts (cmu_us_slt_arctic_hts)",
        "licence": "festival: BSD-style (University of Edinburgh); voice: BSD-style (CMU / HTS working group)",
    },
}
TEXT_SOURCE = "Jane Austen novels (Debian r-cran-janeaustenr)"
TEXT_LICENCE = "public domain text; synthetic audio (flite/festival, BSD-style)"


class SynthError(RuntimeError):
    pass


# ============================================================================= text corpus


def cache_root() -> Path:
    from modeling_medusa import cache_dir  # the project's one cache folder

    return cache_dir()


def fetch_deb(package: str, dest: Path) -> Path:
    """``apt-get download`` one Debian package into ``dest`` (kept as a cache); no installation."""
    found = sorted(dest.glob(f"{package}_*.deb"))
    if found:
        return found[-1]
    dest.mkdir(parents=True, exist_ok=True)
    if shutil.which("apt-get") is None:
        raise SynthError(f"apt-get not found to fetch {package}; fix: pass --text-file (e.g. a file "
                         f"written by --export-sentences on a machine with apt)")
    proc = subprocess.run(["apt-get", "download", package], cwd=dest, capture_output=True, text=True)
    found = sorted(dest.glob(f"{package}_*.deb"))
    if not found:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        raise SynthError(f"`apt-get download {package}` failed ({tail[0]}); fix: run `apt-get update` "
                         f"first, or pass --text-file")
    return found[-1]


def _ar_members(data: bytes) -> dict[str, bytes]:
    if not data.startswith(b"!<arch>\n"):
        raise SynthError("not a Debian package (ar archive)")
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
        raise SynthError(f"{deb.name}: no data.tar member")
    try:
        tar = tarfile.open(fileobj=io.BytesIO(members[name]), mode="r:*")
    except tarfile.ReadError:  # e.g. zstd: let dpkg-deb unpack it
        raw = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True).stdout
        tar = tarfile.open(fileobj=io.BytesIO(raw), mode="r:")
    return {m.name: tar.extractfile(m).read() for m in tar.getmembers()
            if m.isfile() and m.name.endswith(suffixes)}


def _r_character_vector(payload: bytes) -> list[str]:
    """Decode one R-serialised (XDR, version 2/3) character vector: the format of a lazy-load record."""
    if payload[:2] != b"X\n":
        raise SynthError("R data record is not in XDR format")
    pos = 2
    version = int.from_bytes(payload[pos:pos + 4], "big")
    pos += 12
    if version == 3:
        pos += 4 + int.from_bytes(payload[pos:pos + 4], "big")  # native encoding name
    flags = int.from_bytes(payload[pos:pos + 4], "big")
    if flags & 0xFF != 16:  # STRSXP
        raise SynthError(f"R data record is type {flags & 0xFF}, not a character vector")
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
            raise SynthError("corrupt R lazy-load record")
        records.append(_r_character_vector(payload))
        pos = len(rdb) - len(inflater.unused_data)
    return records


def austen_books(cache: Path) -> tuple[dict[str, list[str]], str]:
    """{title: lines} for the novels in r-cran-janeaustenr, and the package file name used."""
    installed = Path("/usr/lib/R/site-library/janeaustenr/data/Rdata.rdb")
    if installed.is_file():
        rdb, origin = installed.read_bytes(), f"{AUSTEN_PACKAGE} (installed)"
    else:
        deb = fetch_deb(AUSTEN_PACKAGE, cache / "debs")
        files = deb_files(deb, ("janeaustenr/data/Rdata.rdb",))
        if not files:
            raise SynthError(f"{deb.name} has no janeaustenr/data/Rdata.rdb")
        rdb, origin = next(iter(files.values())), deb.name
    books = {}
    for lines in read_rdata_db(rdb):
        title = next((line.strip() for line in lines if line.strip()), "untitled")
        books[title.lower()] = lines
    return books, origin


# ----------------------------------------------------------------------------- cleaning and splitting

ABBREVIATIONS = {"mr", "mrs", "dr", "st", "col", "capt", "gen", "lt", "rev", "messrs", "sgt", "no", "vol"}
HEADING = re.compile(r"^(chapter|volume|book|part)\b.*$|^[\divxlc]+\.?$|^by\b.*$|^\(?\d{4}\)?$|^(the )?(end|finis)\.?$",
                     re.IGNORECASE)


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
    """Plain speakable text, or None for headings and non-prose."""
    short = len(text.split()) <= 8
    if (short and HEADING.match(text.strip())) or (text.isupper() and len(text.split()) < 12):
        return None
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"\[[^\]]*\]", " ", text)  # footnote markers
    text = text.replace("_", "").replace('"', " ").replace("`", "'")
    text = re.sub(r"\s*--+\s*", ", ", text)
    text = re.sub(r"&c\.?", "et cetera", text)
    text = re.sub(r"(^|\s)'+|'+(?=\s|$|[,.;:!?])", r"\1", text)  # quote marks, not apostrophes
    text = re.sub(r"\s+([,.;:!?])", r"\1", text)
    text = re.sub(r"([.!?]),", r"\1", text)  # "said he.--Then" -> "said he. Then"
    text = re.sub(r"([,;:])(?:\s*[,;:])+", r"\1", text)
    text = re.sub(r"\s+", " ", text).strip(" ,;:")
    if not re.search(r"[a-z]", text) or re.search(r"[^A-Za-z0-9\s.,;:!?'()-]", text):
        return None
    return text


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


def _finish(text: str) -> str:
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
    return [_finish(p) for p in out if _n_words(p) <= max_words]


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
    return [_finish(s) for s in out]


def sentences_from_lines(lines: list[str]) -> list[str]:
    out = []
    for paragraph in paragraphs(lines):
        cleaned = clean_paragraph(paragraph)
        if cleaned:
            out.extend(fit_lengths(split_sentences(cleaned)))
    return out


def corpus_sentences(text_file: Path | None = None, cache: Path | None = None) -> tuple[list[str], dict]:
    """Deduplicated cleaned sentences and a description of where they came from."""
    if text_file is not None:
        lines = Path(text_file).read_text(encoding="utf-8").splitlines()
        sidecar = Path(f"{text_file}.source.json")  # written by --export-sentences: already clean
        if sidecar.is_file():
            sentences = [line.strip() for line in lines if line.strip()]
            origin = json.loads(sidecar.read_text(encoding="utf-8"))
        else:
            sentences = sentences_from_lines(lines)  # blank lines separate paragraphs
            origin = {"text_source": f"text file {Path(text_file).name}", "licence": None}
    else:
        books, package = austen_books(cache or cache_root())
        used = {title: lines for title, lines in books.items() if title not in AUSTEN_EXCLUDED}
        sentences = [s for lines in used.values() for s in sentences_from_lines(lines)]
        origin = {"text_source": TEXT_SOURCE, "licence": TEXT_LICENCE, "package": package, "books": sorted(used)}
    unique = list(dict.fromkeys(sentences))
    if not unique:
        raise SynthError("the text source yielded no usable sentences")
    return unique, origin


# ============================================================================= synthesis


@dataclass
class Job:
    index: int
    id: str
    text: str
    voice: str
    rate: float
    shard: str


def parse_voices(spec: str) -> list[tuple[str, float]]:
    voices = []
    for part in spec.split(","):
        name, _, weight = part.strip().partition(":")
        voices.append((name, float(weight or 1.0)))
    if not voices or any(w <= 0 for _, w in voices):
        raise SynthError(f"bad --voices {spec!r}; expected e.g. slt:3,rms:2,awb:2,kal16:2")
    return voices


def plan_job(index: int, sentences: list[str], order: list[int], seed: int, voices: list[tuple[str, float]],
             festival_fraction: float, shard_size: int) -> Job:
    """Deterministic choice of text, voice and rate for utterance number ``index``."""
    rng = random.Random(f"{seed}:{index}")
    text = sentences[order[index % len(order)]]
    if festival_fraction > 0 and rng.random() < festival_fraction:
        voice = FESTIVAL_VOICE
    else:
        voice = rng.choices([v for v, _ in voices], weights=[w for _, w in voices])[0]
    rate = rng.choice(RATES)
    return Job(index, f"syn{index:07d}", text, voice, rate, f"shard_{index // shard_size:04d}")


class Synthesizer:
    def __init__(self, flite_bin: str | None, text2wave_bin: str | None = None):
        self.flite = flite_bin or shutil.which("flite")
        if not self.flite or not (os.path.isfile(self.flite) and os.access(self.flite, os.X_OK)):
            raise SynthError(f"flite not found ({flite_bin or 'PATH'}); fix: `apt-get install flite` or "
                             f"pass --flite-bin DIR/bin/flite from --make-flite-bundle")
        self.env = dict(os.environ)
        lib = Path(self.flite).resolve().parent.parent / "lib"
        if lib.is_dir():  # a bundle made by --make-flite-bundle
            self.env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(lib), self.env.get("LD_LIBRARY_PATH")]))
        self.text2wave = text2wave_bin or shutil.which("text2wave")
        self.text_source, self.text_licence = TEXT_SOURCE, TEXT_LICENCE

    def check(self, voices: list[str]) -> None:
        proc = subprocess.run([self.flite, "-lv"], capture_output=True, text=True, env=self.env)
        if proc.returncode != 0:
            raise SynthError(f"{self.flite} -lv failed: {(proc.stderr or proc.stdout).strip()[:200]}")
        available = set(proc.stdout.split(":", 1)[-1].split())
        missing = [v for v in voices if v != FESTIVAL_VOICE and v not in available]
        if missing:
            raise SynthError(f"flite lacks voices {missing} (has {sorted(available)})")
        if FESTIVAL_VOICE in voices and not self.text2wave:
            raise SynthError("festival fraction > 0 but text2wave not found; fix: `apt-get install festival "
                             "festvox-us-slt-hts` or --festival-fraction 0")

    def synthesize(self, job: Job, wav_path: Path, workdir: Path) -> None:
        text_path = workdir / f".{job.id}.text-{os.getpid()}.txt"
        text_path.write_text(job.text + "\n", encoding="utf-8")
        try:
            if job.voice == FESTIVAL_VOICE:
                cmd = [self.text2wave, "-eval", "(voice_cmu_us_slt_arctic_hts)", "-eval",
                       f'(set! hts_engine_params (append hts_engine_params (list (list "-r" {1.0 / job.rate:.4f}))))',
                       "-o", str(wav_path), str(text_path)]
            else:
                cmd = [self.flite, "-voice", job.voice, "--setf", f"duration_stretch={job.rate}",
                       "-f", str(text_path), "-o", str(wav_path)]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=300)
            if proc.returncode != 0 or not wav_path.is_file():
                raise SynthError(f"{job.id}: {Path(cmd[0]).name} failed: {(proc.stderr or proc.stdout).strip()[:200]}")
        finally:
            text_path.unlink(missing_ok=True)


def to_16k_mono_file(src: Path, dst: Path) -> float:
    """Convert ``src`` to 16 kHz mono PCM16 at ``dst`` (atomic); returns the duration in seconds."""
    import soundfile as sf

    info = sf.info(src)
    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    if info.samplerate == SAMPLE_RATE and info.channels == 1 and info.subtype == "PCM_16" \
            and info.format == "WAV":
        os.replace(src, tmp)
        frames = info.frames
    else:
        audio, sr = sf.read(src, dtype="float32", always_2d=True)
        audio = audio.mean(axis=1)
        if sr != SAMPLE_RATE:
            import soxr

            audio = soxr.resample(audio, sr, SAMPLE_RATE, quality="HQ")
        sf.write(tmp, np.clip(audio, -1, 1), SAMPLE_RATE, subtype="PCM_16", format="WAV")
        src.unlink(missing_ok=True)
        frames = len(audio)
    os.replace(tmp, dst)
    return frames / SAMPLE_RATE


def run_job(job: Job, out: Path, synth: Synthesizer) -> dict:
    shard_dir = out / job.shard
    shard_dir.mkdir(parents=True, exist_ok=True)
    raw = shard_dir / f".{job.id}.raw-{os.getpid()}.wav"
    try:
        try:
            synth.synthesize(job, raw, shard_dir)
        except (SynthError, subprocess.TimeoutExpired) as exc:  # one bad sentence must not stop a long run
            return {"id": job.id, "text": job.text, "voice": job.voice, "rate": job.rate,
                    "rejected": f"synthesis failed: {exc}"[:300]}
        final = shard_dir / f"{job.id}.wav"
        import soundfile as sf

        duration = sf.info(raw).frames / sf.info(raw).samplerate
        row = {"id": job.id, "audio": f"{job.shard}/{job.id}.wav", "text": job.text, "voice": job.voice,
               "rate": job.rate, "duration": round(duration, 3), "source": synth.text_source,
               "licence": synth.text_licence,
               "engine": "festival" if job.voice == FESTIVAL_VOICE else "flite"}
        if not MIN_SECONDS <= duration <= MAX_SECONDS:
            row["rejected"] = f"duration {duration:.2f} s outside {MIN_SECONDS}-{MAX_SECONDS} s"
            return row
        row["duration"] = round(to_16k_mono_file(raw, final), 3)
        return row
    finally:
        raw.unlink(missing_ok=True)


# ============================================================================= state (resume) and manifest

TEMP_NAME = re.compile(r"^\..+\.(?:raw|text|tmp)-(\d+)")  # .<name>.<kind>-<pid>...: a temp file of process <pid>


def remove_stale_temp_files(out: Path) -> int:
    """Delete the temporary files of runs that were killed before they could (kill -9): those whose
    process is gone. Returns how many."""
    stale = [path for path in (*out.glob(".*"), *out.glob("shard_*/.*"))
             if (match := TEMP_NAME.match(path.name)) and path.is_file() and not _process_alive(int(match.group(1)))]
    for path in stale:
        path.unlink(missing_ok=True)
    return len(stale)


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True



def rows_path(out: Path, shard: str) -> Path:
    return out / shard / ".rows.jsonl"


def load_rows(out: Path) -> dict[str, dict]:
    """Finished rows (kept and rejected) from every shard's append-only log; torn lines are ignored."""
    rows = {}
    for log in sorted(out.glob("shard_*/.rows.jsonl")):
        for line in log.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "rejected" in row or (out / row["audio"]).is_file():
                rows[row["id"]] = row
    return rows


def append_row(out: Path, shard: str, row: dict, lock: threading.Lock) -> None:
    with lock, open(rows_path(out, shard), "a", encoding="utf-8") as f:
        f.write(json.dumps(row, ensure_ascii=False) + "\n")
        f.flush()


def write_manifest(out: Path, rows: dict[str, dict]) -> int:
    kept = [rows[k] for k in sorted(rows) if "rejected" not in rows[k]]
    tmp = out / f".manifest.jsonl.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        for row in kept:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, out / "manifest.jsonl")
    return len(kept)


def check_plan(out: Path, plan: dict, resume_ok: bool) -> None:
    """Refuse to mix two different plans (seed, text, voices...) in one output folder."""
    path = out / "plan.json"
    if path.is_file():
        old = json.loads(path.read_text(encoding="utf-8"))
        keys = ("seed", "voices", "festival_fraction", "shard_size", "num_sentences", "text_source")
        changed = [k for k in keys if old.get(k) != plan.get(k)]
        if changed and not resume_ok:
            raise SynthError(f"{out} was made with different settings ({', '.join(changed)}); use another --out "
                             f"or --force-plan")
    tmp = out / f".plan.json.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(plan, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


# ============================================================================= flite bundle


def make_flite_bundle(dest: Path, flite_bin: str | None = None) -> Path:
    """Copy flite and the non-libc shared libraries it links into DEST/bin and DEST/lib."""
    flite = flite_bin or shutil.which("flite")
    if not flite:
        raise SynthError("flite not found; fix: apt-get install flite")
    ldd = subprocess.run(["ldd", flite], capture_output=True, text=True, check=True).stdout
    system = ("libc.so", "libm.so", "ld-linux", "linux-vdso", "libpthread", "libdl.so", "librt.so")
    (dest / "bin").mkdir(parents=True, exist_ok=True)
    (dest / "lib").mkdir(parents=True, exist_ok=True)
    shutil.copy2(flite, dest / "bin" / "flite")
    for match in re.finditer(r"^\s*(\S+) => (\S+)", ldd, re.MULTILINE):
        name, path = match.groups()
        if not name.startswith(system):
            shutil.copy2(path, dest / "lib" / name)  # follows symlinks: the real library under its soname
    return dest / "bin" / "flite"


# ============================================================================= main


def synthesize_corpus(args: argparse.Namespace) -> dict:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    remove_stale_temp_files(out)
    sentences, origin = corpus_sentences(args.text_file)
    voices = parse_voices(args.voices)
    synth = Synthesizer(args.flite_bin, args.text2wave_bin)
    synth.text_source = origin["text_source"]
    synth.text_licence = origin.get("licence") or f"{args.text_licence}; synthetic audio (flite/festival, BSD-style)"
    synth.check([v for v, _ in voices] + ([FESTIVAL_VOICE] if args.festival_fraction > 0 else []))
    plan = {"seed": args.seed, "voices": args.voices, "festival_fraction": args.festival_fraction,
            "shard_size": args.shard_size, "num_sentences": len(sentences), "rates": list(RATES),
            "min_seconds": MIN_SECONDS, "max_seconds": MAX_SECONDS, **origin, "licence_notes": LICENSE_NOTES}
    check_plan(out, plan, args.force_plan)
    order = list(range(len(sentences)))
    random.Random(args.seed).shuffle(order)

    rows = load_rows(out)
    kept = sum(1 for r in rows.values() if "rejected" not in r)
    lock = threading.Lock()
    from tqdm import tqdm

    bar = tqdm(total=args.num_utterances, initial=min(kept, args.num_utterances), unit="utt",
               desc="synthesizing", disable=args.quiet)
    started = time.monotonic()
    made = {"utterances": 0, "audio_seconds": 0.0, "rejected": 0}
    index = 0
    try:
        with ThreadPoolExecutor(max_workers=args.workers) as pool:
            pending = {}
            while True:
                while kept + len(pending) < args.num_utterances and len(pending) < 2 * args.workers:
                    job = plan_job(index, sentences, order, args.seed, voices, args.festival_fraction,
                                   args.shard_size)
                    index += 1
                    if job.id not in rows:
                        pending[pool.submit(run_job, job, out, synth)] = job
                if not pending:
                    break
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    job = pending.pop(future)
                    row = future.result()
                    append_row(out, job.shard, row, lock)
                    rows[row["id"]] = row
                    if "rejected" in row:
                        made["rejected"] += 1
                        if made["rejected"] > 50 and made["rejected"] > 5 * (made["utterances"] + 1):
                            raise SynthError(f"{made['rejected']} clips rejected (length or synthesis errors), "
                                             f"{made['utterances']} kept: see {out}/shard_*/.rows.jsonl")
                    else:
                        kept += 1
                        made["utterances"] += 1
                        made["audio_seconds"] += row["duration"]
                        bar.update(1)
    finally:
        bar.close()
        total = write_manifest(out, rows)
    wall = time.monotonic() - started
    return {"manifest_rows": total, "new_utterances": made["utterances"], "rejected": made["rejected"],
            "new_audio_seconds": round(made["audio_seconds"], 1), "wall_seconds": round(wall, 1),
            "utterances_per_second": round(made["utterances"] / wall, 2) if wall else None,
            "audio_seconds_per_second": round(made["audio_seconds"] / wall, 1) if wall else None,
            "sentences_available": len(sentences)}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Synthesize English training speech with flite (and festival).")
    p.add_argument("--out", type=Path, default=Path("work_data/synth_speech"), help="output folder")
    p.add_argument("--num-utterances", type=int, default=10000, help="kept clips wanted in total")
    p.add_argument("--workers", type=int, default=2, help="parallel synthesis processes")
    p.add_argument("--shard-size", type=int, default=1000, help="clips per shard_XXXX folder")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--voices", default=DEFAULT_VOICES, help="flite voices with weights, e.g. slt:3,rms:2")
    p.add_argument("--festival-fraction", type=float, default=0.0,
                   help="share of clips read by festival's slt-hts voice (slower; needs festival)")
    p.add_argument("--flite-bin", default=None, help="flite binary (default: flite on PATH)")
    p.add_argument("--text2wave-bin", default=None, help="festival text2wave (default: on PATH)")
    p.add_argument("--text-file", type=Path, default=None,
                   help="UTF-8 text to read instead of the Jane Austen corpus")
    p.add_argument("--text-licence", default="unknown (user-supplied text)",
                   help="licence recorded in the manifest for --text-file text")
    p.add_argument("--export-sentences", type=Path, default=None,
                   help="write the cleaned sentences (one a line) to this file and exit")
    p.add_argument("--make-flite-bundle", type=Path, default=None,
                   help="copy flite + its shared libraries into this folder and exit")
    p.add_argument("--force-plan", action="store_true", help="allow resuming a folder made with other settings")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.make_flite_bundle:
            print(make_flite_bundle(args.make_flite_bundle, args.flite_bin))
            return 0
        if args.export_sentences:
            sentences, origin = corpus_sentences(args.text_file)
            args.export_sentences.parent.mkdir(parents=True, exist_ok=True)
            args.export_sentences.write_text("\n".join(sentences) + "\n", encoding="utf-8")
            Path(f"{args.export_sentences}.source.json").write_text(json.dumps(origin, indent=2) + "\n",
                                                                     encoding="utf-8")
            print(f"{len(sentences)} sentences from {origin['text_source']} -> {args.export_sentences}")
            return 0
        if args.num_utterances < 1 or args.workers < 1 or args.shard_size < 1:
            raise SynthError("--num-utterances, --workers and --shard-size must be positive")
        result = synthesize_corpus(args)
    except SynthError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
