#!/usr/bin/env python
"""Transcribe many recordings on a Ray cluster (Ray Data): audio decoded in Ray tasks, transcribed by a pool of
actors that each load the artifact once, one row per recording written as JSON lines or Parquet.

    python -m tools.bulk recordings/ --output transcripts/
    python -m tools.bulk "calls/**/*.wav" table.parquet s3://bucket/audio/ --output s3://bucket/out --format parquet

INPUT is a file, a folder (searched recursively), a quoted glob, or a table of paths (.parquet, .jsonl, .json: a
``path`` or ``audio`` column, relative paths relative to the table, as the repository's manifest.jsonl has them);
any of them local or at a URI pyarrow's file systems reach (s3://, gs://, hdfs://, ...). A row holds path,
fingerprint (size and modification time), text, segments with their times, language, model, options (what shapes
the transcript, as the single-process command records it), the draft Medusa ran, audio and decode seconds, and
error (a file that cannot be decoded or transcribed gets a row with its error; the run goes on). A rerun skips the
recordings whose rows are already in OUTPUT with the same fingerprint and options (rows with an error are retried).
The text is the single-process command's (``python -m tools.transcribe``) on the same files and options.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np

from tools import audio_io, cli_args, runtime, transcribe

EPILOG = """\
Several machines: start Ray on each, then run the command on any of them (this repository at the same path on
every node, its workers import it from there; the inputs and OUTPUT reachable from every node: a shared folder or
object storage):
    head$    ray start --head --port 6379
    worker$  ray start --address HEAD_IP:6379          # each GPU machine; Ray counts its GPUs and CPUs
    any$     python -m tools.bulk s3://bucket/audio/ --output s3://bucket/transcripts --address auto \\
                 --device cuda --workers 8 --gpus-per-worker 1 --batch-size 16
Without --address, a Ray instance is started on this machine for the run.
"""

TABLE_SUFFIXES = (".parquet", ".jsonl", ".json")
PATH_COLUMNS = ("path", "audio")
# Decoding tasks reserve no CPU, so that actors holding every CPU never starve them; a few run at once.
DECODE_CPUS, DECODE_TASKS = 0, 4
EXIT_OK, EXIT_FILE_FAILED, EXIT_USER_ERROR = 0, 1, 2


class InputError(ValueError):
    """A problem with the command line's inputs or options (one line)."""


# --------------------------------------------------------------------------- inputs


def _filesystem(spec: str):
    """(pyarrow file system, path inside it) for a local path or any URI pyarrow reaches."""
    from pyarrow import fs

    if "://" in spec:
        return fs.FileSystem.from_uri(spec)
    return fs.LocalFileSystem(), str(Path(spec).expanduser().resolve())


def _uri(filesystem, path: str) -> str:
    return path if filesystem.type_name == "local" else f"{filesystem.type_name}://{path}"


def list_inputs(specs: list[str]) -> list[str]:
    """The recordings the specs name, as absolute local paths or URIs, in order, without duplicates."""
    found: list[str] = []
    for spec in specs:
        if spec.lower().endswith(TABLE_SUFFIXES):
            found += _table_paths(spec)
        elif "://" not in spec:
            sources, errors = audio_io.find_audio_files([spec])  # the single-process command's own expansion
            if errors:
                raise InputError(f"{errors[0]}; pass existing audio files, folders, globs or tables of paths")
            found += [str(s.path) for s in sources]
        else:
            found += _remote_paths(spec)
    return list(dict.fromkeys(found))


def _remote_paths(spec: str) -> list[str]:
    from pyarrow import fs

    filesystem, path = _filesystem(spec)
    pattern = None
    if set("*?[") & set(path):
        parts = PurePosixPath(path).parts
        fixed = next(i for i, part in enumerate(parts) if set("*?[") & set(part))
        path, pattern = str(PurePosixPath(*parts[:fixed])), PurePosixPath(*parts).as_posix()
    info = filesystem.get_file_info(path)
    if info.type == fs.FileType.File:
        return [_uri(filesystem, path)]
    if info.type != fs.FileType.Directory:
        raise InputError(f"{spec}: no such file or folder; pass existing audio files, folders, globs or tables")
    listed = filesystem.get_file_info(fs.FileSelector(path, recursive=True))
    paths = sorted(i.path for i in listed if i.type == fs.FileType.File
                   and PurePosixPath(i.path).suffix.lower() in audio_io.SUPPORTED_EXTENSIONS
                   and (pattern is None or fnmatch.fnmatch(i.path, pattern)))
    if not paths:
        raise InputError(f"{spec}: no supported audio files there")
    return [_uri(filesystem, p) for p in paths]


def _table_paths(spec: str) -> list[str]:
    """The paths in a table's ``path`` (else ``audio``) column; relative ones relative to the table's folder."""
    import pyarrow.json as pa_json
    import pyarrow.parquet as pq

    filesystem, path = _filesystem(spec)
    try:
        with filesystem.open_input_file(path) as handle:
            table = pq.read_table(handle) if path.endswith(".parquet") else pa_json.read_json(handle)
    except (OSError, ValueError) as error:
        raise InputError(f"{spec}: cannot read the table ({' '.join(str(error).split())})") from error
    column = next((c for c in PATH_COLUMNS if c in table.column_names), None)
    if column is None:
        raise InputError(f"{spec}: no {' or '.join(PATH_COLUMNS)} column of audio paths (columns: "
                         f"{', '.join(table.column_names)})")
    folder = PurePosixPath(path).parent
    return [p if "://" in p or PurePosixPath(p).is_absolute() else _uri(filesystem, str(folder / p))
            for p in table.column(column).to_pylist() if p]


def fingerprints(paths: list[str]) -> dict[str, str]:
    """Per path its ``size:mtime_ns`` ("" where it cannot be read: its row will say why)."""
    from pyarrow import fs

    found = {}
    for path in paths:
        filesystem, inner = _filesystem(path)
        info = filesystem.get_file_info(inner)
        found[path] = f"{info.size}:{info.mtime_ns}" if info.type == fs.FileType.File else ""
    return found


# --------------------------------------------------------------------------- decoding (Ray tasks)


def decode_row(row: dict) -> dict:
    """The recording at ``row["path"]`` as 16 kHz mono samples (``tools.audio_io``'s decoding), or its error."""
    samples, error = np.zeros(0, np.float32), ""  # ("": a column Arrow types as text in every block)
    try:
        if not row["fingerprint"]:
            raise audio_io.AudioError(row["path"], "no such file")
        samples = _load(row["path"])
    except audio_io.AudioError as problem:
        error = f"{row['path']}: {problem.problem}"
    except Exception as problem:  # noqa: BLE001 - one file's failure is its row's error
        error = f"{row['path']}: cannot load audio ({' '.join(f'{type(problem).__name__}: {problem}'.split())})"
    return {**row, "samples": samples, "audio_seconds": audio_io.duration_seconds(samples), "error": error}


def _load(path: str) -> np.ndarray:
    if "://" not in path:
        return audio_io.load_audio(path)
    filesystem, inner = _filesystem(path)  # a remote file: its bytes into a local file of the same format
    with tempfile.TemporaryDirectory() as folder:
        local = Path(folder) / PurePosixPath(inner).name
        with filesystem.open_input_stream(inner) as source, open(local, "wb") as target:
            target.write(source.read())
        return audio_io.load_audio(local)


# --------------------------------------------------------------------------- transcribing (Ray actors)


def output_schema():
    import pyarrow as pa

    word = pa.struct([("word", pa.string()), ("start", pa.float64()), ("end", pa.float64())])
    segment = pa.struct([("start", pa.float64()), ("end", pa.float64()), ("text", pa.string()),
                         ("words", pa.list_(word))])
    return pa.schema([("path", pa.string()), ("fingerprint", pa.string()), ("text", pa.string()),
                      ("segments", pa.list_(segment)), ("language", pa.string()), ("model", pa.string()),
                      ("options", pa.string()), ("draft", pa.string()), ("audio_seconds", pa.float64()),
                      ("decode_seconds", pa.float64()), ("error", pa.string())])


class BulkTranscriber:
    """A Ray Data actor: loads the artifact once, then transcribes each batch of decoded rows in batched
    ``generate`` calls; rows that could not be decoded pass through with their error."""

    def __init__(self, model_options: dict, decode_options: dict, batch_size: int, options_json: str):
        from tools.speech_batch import DecodeOptions, ModelOptions, SpeechBatcher

        self.batcher = SpeechBatcher(ModelOptions(**model_options), batch_size)
        self.options = self.batcher.check(DecodeOptions(**decode_options))
        self.options_json = options_json

    def __call__(self, batch: dict):
        import pyarrow as pa

        count = len(batch["path"])
        ok = [i for i in range(count) if not batch["error"][i]]
        results = dict(zip(ok, self.batcher.transcribe([np.asarray(batch["samples"][i], np.float32) for i in ok],
                                                       self.options)))
        rows = []
        for i in range(count):
            result = results.get(i)
            error = str(batch["error"][i]) or (result.error and f"{batch['path'][i]}: {result.error}")
            rows.append({
                "path": str(batch["path"][i]), "fingerprint": str(batch["fingerprint"][i]),
                "text": None if error else result.text,
                "segments": [] if error else [{**s, "words": s.get("words", [])}
                                              for s in result.segment_rows(self.options.word_timestamps)],
                "language": None if error else result.language, "model": self.batcher.model_name,
                "options": self.options_json, "draft": None if error else result.draft,
                "audio_seconds": round(float(batch["audio_seconds"][i]), 3),
                "decode_seconds": None if error else round(result.decode_seconds, 3), "error": error or None,
            })
        return pa.Table.from_pylist(rows, schema=output_schema())


# --------------------------------------------------------------------------- output and resuming


def read_rows(output: str, files: set[str] | None = None) -> list[dict]:
    """The rows in the output folder (JSON lines or Parquet files; a torn line or file is left out), or in those
    of its ``files``."""
    import pyarrow.parquet as pq

    filesystem, _ = _filesystem(output)
    rows = []
    for path in sorted(_files_in(output) if files is None else files):
        name = PurePosixPath(path).name
        if name.startswith((".", "_")):
            continue
        try:
            with filesystem.open_input_file(path) as handle:
                if name.endswith(".parquet"):
                    rows += pq.read_table(handle, columns=["path", "fingerprint", "options", "error"]).to_pylist()
                elif name.endswith((".json", ".jsonl")):
                    rows += _json_lines(handle.read().decode("utf-8", errors="replace"))
        except (OSError, ValueError, KeyError):
            continue
    return rows


def _json_lines(text: str) -> list[dict]:
    rows = []
    for line in text.splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def done_keys(rows: list[dict]) -> set[tuple]:
    """(path, fingerprint, options) of the rows that hold a transcript."""
    return {(r.get("path"), r.get("fingerprint"), r.get("options")) for r in rows if not r.get("error")}


def options_record(model_options: dict, decode_options: dict) -> str:
    """What shapes a transcript (Medusa on or off does not: its output is the base's), as one JSON string."""
    model = model_options["model"]
    local = Path(model).expanduser()
    record = {"model": str(local.resolve()) if local.is_dir() else model, "base": model_options.get("base"),
              "dtype": model_options.get("dtype"),
              **{k: v for k, v in decode_options.items() if v not in (None, False)}}
    return json.dumps(record, sort_keys=True)


# --------------------------------------------------------------------------- the run


@dataclass
class BulkSummary:
    inputs: int = 0
    transcribed: int = 0
    errors: int = 0
    skipped: int = 0  # already in the output with the same fingerprint and options
    wall_seconds: float = 0.0
    output: str = ""

    def line(self) -> str:
        return (f"Summary: {self.inputs} inputs: {self.transcribed} transcribed, {self.errors} errors (rows with "
                f"'error' in the output), {self.skipped} skipped (up to date); wall {self.wall_seconds:.1f} s; "
                f"output {self.output}")


def bulk_transcribe(inputs: list[str], output: str, *, model: str | None = None, base: str | None = None,
                    device: str = "cpu", dtype: str = "auto", medusa: bool = True, language: str | None = None,
                    task: str | None = None, word_timestamps: bool = False, temperature_fallback: bool | None = None,
                    max_new_tokens: int | None = None, workers: int = 1, batch_size: int = 8,
                    gpus_per_worker: float = 0.0, cpus_per_worker: float = 1.0, output_format: str = "jsonl",
                    address: str | None = None, overwrite: bool = False) -> BulkSummary:
    """Transcribe ``inputs`` (files, folders, globs, tables of paths; local or URIs) into rows in the folder
    ``output`` on a Ray cluster (``address``; None: the one this process is connected to, else a local one). Raises
    ``InputError`` for a problem with the inputs or options."""
    import ray

    started = time.perf_counter()
    model_options = {"model": model or transcribe.default_model_path(), "base": base, "device": device,
                     "dtype": dtype, "medusa": medusa,
                     "threads": max(1, int(cpus_per_worker)) if not gpus_per_worker else None}
    decode_options = {"language": language, "task": task, "word_timestamps": word_timestamps,
                      "temperature_fallback": temperature_fallback, "max_new_tokens": max_new_tokens}
    options_json = options_record(model_options, decode_options)
    paths = list_inputs(inputs)
    prints = fingerprints(paths)
    done = set() if overwrite else done_keys(read_rows(output))
    pending = [{"path": p, "fingerprint": prints[p]} for p in paths if (p, prints[p], options_json) not in done]
    summary = BulkSummary(inputs=len(paths), skipped=len(paths) - len(pending), output=output)
    if pending:
        if not ray.is_initialized():
            start_ray(address)
        before = _files_in(output)
        dataset = (ray.data.from_items(pending)
                   .map(decode_row, num_cpus=DECODE_CPUS, compute=ray.data.TaskPoolStrategy(size=DECODE_TASKS))
                   .map_batches(BulkTranscriber, batch_size=batch_size, compute=ray.data.ActorPoolStrategy(size=workers),
                                num_gpus=gpus_per_worker or None, num_cpus=None if gpus_per_worker else cpus_per_worker,
                                fn_constructor_kwargs={"model_options": model_options,
                                                       "decode_options": decode_options,
                                                       "batch_size": batch_size, "options_json": options_json},
                                batch_format="numpy"))
        _write(dataset, output, output_format)
        written = read_rows(output, _files_in(output) - before)
        summary.errors = sum(1 for r in written if r.get("error"))
        summary.transcribed = len(written) - summary.errors
    summary.wall_seconds = time.perf_counter() - started
    return summary


def start_ray(address: str | None = None, **options) -> None:
    """Join the cluster at ``address`` (None: start one on this machine), its workers importing this repository."""
    import ray

    root = str(transcribe.REPO_ROOT)
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    local = {} if address else {"include_dashboard": False}
    ray.init(address=address, runtime_env={"env_vars": {"PYTHONPATH": path}}, log_to_driver=False, **local, **options)


def _write(dataset, output: str, output_format: str) -> None:
    filesystem, folder = _filesystem(output)
    if output_format == "parquet":
        dataset.write_parquet(folder, filesystem=filesystem)
    else:
        dataset.write_json(folder, filesystem=filesystem)


def _files_in(output: str) -> set[str]:
    from pyarrow import fs

    filesystem, folder = _filesystem(output)
    if filesystem.get_file_info(folder).type != fs.FileType.Directory:
        return set()
    return {i.path for i in filesystem.get_file_info(fs.FileSelector(folder, recursive=True))
            if i.type == fs.FileType.File}


# --------------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tools.bulk", description=__doc__.split("\n\n")[0],
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("inputs", nargs="+", metavar="INPUT",
                        help="audio files, folders, quoted globs, or tables of paths (.parquet/.jsonl/.json); "
                        "local or URIs (s3://, gs://, hdfs://, ...)")
    parser.add_argument("--output", required=True, metavar="DIR",
                        help="folder (local or URI) the rows are written into; a rerun resumes from its rows")
    parser.add_argument("--format", default="jsonl", choices=("jsonl", "parquet"), help="row files (default: jsonl)")
    parser.add_argument("--model", default=None,
                        help=f"Hub repo id or local folder with the heads (default: {transcribe.DEFAULT_MODEL})")
    parser.add_argument("--base", default=None, help="base model folder or Hub id (default: the one the heads name)")
    parser.add_argument("--device", default="cpu", help="each worker's device: cpu or cuda (default: cpu)")
    parser.add_argument("--dtype", default="auto", type=runtime.dtype_name,
                        help="float32, bfloat16, float16 or auto (float32 on a CPU, bf16/fp16 on a GPU)")
    parser.add_argument("--workers", type=runtime.positive_int, default=1,
                        help="actors, each holding the model once (default: 1)")
    parser.add_argument("--gpus-per-worker", type=cli_args.positive_float, default=None,
                        help="GPUs each actor reserves (default: 1 with --device cuda, else 0)")
    parser.add_argument("--cpus-per-worker", type=cli_args.positive_float, default=1.0,
                        help="CPUs each actor reserves on a CPU device, and its torch threads (default: 1)")
    parser.add_argument("--batch-size", type=runtime.positive_int, default=8,
                        help="recordings per batched generate call (default: 8)")
    parser.add_argument("--no-medusa", action="store_true", help="plain greedy decoding, heads unused")
    parser.add_argument("--language", default=None, help="multilingual Whisper: the audio's language code")
    parser.add_argument("--task", default=None, choices=["transcribe", "translate"], help="multilingual Whisper")
    parser.add_argument("--word-timestamps", action="store_true", help="Whisper: each segment's words with times")
    parser.add_argument("--temperature-fallback", action=argparse.BooleanOptionalAction, default=None,
                        help="as in tools.transcribe (on by default for Whisper)")
    parser.add_argument("--max-new-tokens", type=runtime.positive_int, default=None, help="per window")
    parser.add_argument("--address", default=None,
                        help="Ray cluster to join (auto: the one `ray start` made here; default: a local one)")
    parser.add_argument("--overwrite", action="store_true", help="transcribe every input again")
    return parser


USER_ERRORS = (ValueError, OSError)  # what loading the model raises for options or a model it cannot take


def _user_error(error: BaseException) -> str | None:
    """The one-line message of an options problem raised where the model loads (inside an actor, which Ray
    reports as the actor's death with the worker's traceback as text), else None."""
    seen = error
    while seen is not None:
        if isinstance(seen, USER_ERRORS) and not isinstance(seen, InputError):
            return " ".join(str(seen).split())
        seen = getattr(seen, "cause", None) or seen.__cause__
    names = "|".join(kind.__name__ for kind in (*USER_ERRORS, FileNotFoundError))
    found = re.findall(rf"^(?:{names}): (.+)$", str(error), flags=re.MULTILINE)
    return found[-1].strip() if found else None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    gpus = args.gpus_per_worker if args.gpus_per_worker is not None else (1.0 if args.device.startswith("cuda")
                                                                           else 0.0)
    try:
        summary = bulk_transcribe(
            args.inputs, args.output, model=args.model, base=args.base, device=args.device, dtype=args.dtype,
            medusa=not args.no_medusa, language=args.language, task=args.task, word_timestamps=args.word_timestamps,
            temperature_fallback=args.temperature_fallback, max_new_tokens=args.max_new_tokens,
            workers=args.workers, batch_size=args.batch_size, gpus_per_worker=gpus,
            cpus_per_worker=args.cpus_per_worker, output_format=args.format, address=args.address,
            overwrite=args.overwrite)
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USER_ERROR
    except Exception as error:  # an actor that could not load the model or take the options
        message = _user_error(error)
        if message is None:
            raise
        print(f"error: cannot start the transcription workers: {message}", file=sys.stderr)
        return EXIT_USER_ERROR
    print(summary.line(), file=sys.stderr)
    return EXIT_FILE_FAILED if summary.errors else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
