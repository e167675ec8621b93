"""Stage 1: record the frozen base model's own greedy transcripts and hidden states.

    python -m pipeline.collect --base openai/whisper-tiny.en --audio clips/ --out work_data/collect

For every utterance the base model decodes greedily (``MedusaForASR.collect_hidden_states``);
we keep each generated token and the last-layer hidden state that produced it. These pairs are
what the Medusa heads are distilled on (self-distillation: no reference transcripts needed).

Output (``--out``): ``shard_00000.safetensors``, ... each holding

* ``hiddens`` bf16 [N_tokens, H]  -- ``hiddens[i]`` is the hidden whose argmax was ``tokens[i]``
* ``tokens``  int64 [N_tokens]     -- EOS included
* ``offsets`` int64 [n_utts + 1]   -- utterance ``u`` is ``offsets[u]:offsets[u+1]``

plus string metadata (``utterance_ids`` as JSON, ``base``, ``family``, ``dtype``, ...), and
``collect_info.json`` (provenance + throughput). Shards are written atomically; a rerun skips
the utterances already stored in finished shards, so an interrupted run simply resumes.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from tools import cli_args
from tools.files import remove_stale_temporaries, save_safetensors_atomic, write_json_atomic
from tools.runtime import (add_device_options, model_device, quiet_generate_notices, resolve_device, resolve_dtype,
                           to_model)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE_RATE = 16000
SHARD_PATTERN = re.compile(r"^shard_(\d{5,})\.safetensors$")
SHARD_FORMAT_VERSION = "1"
AUDIO_EXTENSIONS = (".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".aiff", ".aif", ".au",
                    ".m4a", ".aac", ".mp4")


# --------------------------------------------------------------------------- command line
EXIT_USER_ERROR, EXIT_INTERRUPTED = 2, 130


def run_cli(main, argv=None) -> int:
    """Run a pipeline command's ``main``: a user error (``SystemExit`` with a message) prints one
    ``error:`` line and exits 2; Ctrl-C prints one line and exits 130 (writes are atomic, so what is on
    disk is complete and a rerun resumes)."""
    try:
        main(argv)
    except SystemExit as exit_:
        if isinstance(exit_.code, str):
            print(f"error: {exit_.code}", file=sys.stderr)
            return EXIT_USER_ERROR
        return exit_.code or 0
    except KeyboardInterrupt:
        print("interrupted: finished files are kept; rerun the same command to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


# --------------------------------------------------------------------------- shards
def list_shards(folder: str) -> list[str]:
    """Finished shards in ``folder``, in index order."""
    if not os.path.isdir(folder):
        return []
    found = []
    for name in os.listdir(folder):
        m = SHARD_PATTERN.match(name)
        if m:
            found.append((int(m.group(1)), os.path.join(folder, name)))
    return [p for _, p in sorted(found)]


def read_shard_metadata(path: str) -> dict:
    """Shard metadata with ``utterance_ids`` decoded from JSON (tensors are not read)."""
    from safetensors import safe_open

    def read(path):
        with safe_open(path, framework="pt") as f:
            return dict(f.metadata() or {})

    meta = _read_shard(path, read)
    meta["utterance_ids"] = json.loads(meta.get("utterance_ids", "[]"))
    return meta


def load_shard(path: str):
    """-> (hiddens bf16 [N,H], tokens int64 [N], offsets int64 [U+1], metadata dict)."""
    t = _read_shard(path, lambda p: _tensors(p, ("hiddens", "tokens", "offsets")))
    return t["hiddens"], t["tokens"], t["offsets"], read_shard_metadata(path)


def load_shard_speech(path: str):
    """The shard's encoder outputs bf16 [U, L, H] (collected with --speech), or None."""
    return _read_shard(path, lambda p: _tensors(p, ("speech",))).get("speech")


def _tensors(path: str, names) -> dict:
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        present = set(f.keys())
        return {name: f.get_tensor(name) for name in names if name in present}


def _read_shard(path: str, read):
    """``read(path)``, or a one-line error naming a truncated or corrupt shard and how to redo it."""
    from safetensors import SafetensorError

    try:
        return read(path)
    except SafetensorError as err:
        raise SystemExit(f"{path} is truncated or corrupt ({err}); delete it and rerun pipeline.collect, "
                         "which collects its utterances again.") from err


def write_shard(path: str, rows: list, meta: dict) -> None:
    """rows: list of (utterance_id, tokens LongTensor[T], hiddens Tensor[T,H], speech Tensor[L,H] or None)."""
    import torch

    ids = [r[0] for r in rows]
    tokens = torch.cat([r[1].reshape(-1).to("cpu", torch.int64) for r in rows])
    hiddens = torch.cat([r[2].to("cpu", torch.bfloat16) for r in rows]).contiguous()
    lengths = torch.tensor([0] + [int(r[1].numel()) for r in rows], dtype=torch.int64)
    offsets = torch.cumsum(lengths, 0)
    tensors = {"hiddens": hiddens, "tokens": tokens, "offsets": offsets}
    if rows and len(rows[0]) > 3 and rows[0][3] is not None:
        tensors["speech"] = torch.stack([r[3].to("cpu", torch.bfloat16) for r in rows]).contiguous()
    metadata = {k: str(v) for k, v in meta.items()}
    metadata["utterance_ids"] = json.dumps(ids)
    metadata["format_version"] = SHARD_FORMAT_VERSION
    save_safetensors_atomic(path, tensors, metadata=metadata)


# --------------------------------------------------------------------------- audio
@dataclass
class Utterance:
    id: str
    load: Callable[[], np.ndarray]
    meta: dict = field(default_factory=dict)


def _summarise_entries(entries: list[dict]) -> dict:
    """Provenance summary of manifest rows: voices, licences, sources."""

    def distinct(*keys):
        vals = set()
        for e in entries:
            for k in keys:
                v = e.get(k)
                if isinstance(v, (str, int, float)) and v != "":
                    vals.add(str(v))
        return sorted(vals)

    out = {}
    for name, keys in (
        ("voices", ("voice", "speaker", "speaker_id")),
        ("licence", ("licence", "license")),
        ("sources", ("source", "corpus", "engine", "dataset")),
        ("languages", ("language", "lang")),
    ):
        vals = distinct(*keys)
        if vals:
            out[name] = vals
    durations = [e.get("duration") for e in entries if isinstance(e.get("duration"), (int, float))]
    if durations:
        out["hours"] = round(sum(durations) / 3600.0, 4)
    return out


def _from_manifest(path: str, load_audio) -> tuple[list[Utterance], dict]:
    base = os.path.dirname(os.path.abspath(path))
    utts, entries, seen = [], [], set()
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            entry = json.loads(line)
            if "audio" not in entry:
                raise ValueError(f"{path}:{lineno}: manifest row has no 'audio' field")
            audio_path = entry["audio"]
            if not os.path.isabs(audio_path):
                audio_path = os.path.join(base, audio_path)
            uid = str(entry.get("id") or os.path.splitext(os.path.basename(audio_path))[0])
            if uid in seen:
                raise ValueError(f"{path}:{lineno}: duplicate utterance id {uid!r}")
            seen.add(uid)
            entries.append(entry)
            utts.append(Utterance(uid, (lambda p=audio_path: load_audio(p)), entry))
    info = {"kind": "manifest", "path": os.path.abspath(path), **_summarise_entries(entries)}
    return utts, info


def _from_folder(folder: str, load_audio) -> tuple[list[Utterance], dict]:
    paths = sorted(
        p
        for p in glob.glob(os.path.join(folder, "**", "*"), recursive=True)
        if p.lower().endswith(AUDIO_EXTENSIONS) and os.path.isfile(p)
        and not os.path.basename(p).startswith(".")
    )
    if not paths:
        raise FileNotFoundError(f"no audio files ({', '.join(AUDIO_EXTENSIONS)}) under {folder}")
    utts = [
        Utterance(os.path.splitext(os.path.relpath(p, folder))[0].replace(os.sep, "/"),
                  (lambda p=p: load_audio(p)))
        for p in paths
    ]
    return utts, {"kind": "folder", "path": os.path.abspath(folder)}


def _decode_hf_audio(value) -> np.ndarray:
    from tools.audio_io import resample_mono

    if isinstance(value, dict) and "array" in value:
        return resample_mono(np.asarray(value["array"], dtype=np.float32), int(value["sampling_rate"]))
    if hasattr(value, "get_all_samples"):  # datasets >= 4 (torchcodec AudioDecoder)
        s = value.get_all_samples()
        return resample_mono(np.asarray(s.data, dtype=np.float32).T, int(s.sample_rate))
    raise TypeError(f"cannot decode audio value of type {type(value).__name__}")


def _from_hf_dataset(name: str, split: str, audio_column: str, id_column: str):
    try:
        import datasets  # noqa: F401
    except ImportError:
        raise SystemExit(
            f"--audio {name!r} is neither a folder nor a manifest file, and reading it as a "
            "Hugging Face dataset needs the `datasets` package (pip install datasets)."
        )
    from datasets import load_dataset

    config = None
    if ":" in name:  # NAME:CONFIG
        name, config = name.split(":", 1)
    ds = load_dataset(name, config, split=split)
    if audio_column not in ds.column_names:
        raise SystemExit(f"dataset {name} has no column {audio_column!r}: {ds.column_names}")
    ids = ds[id_column] if id_column in ds.column_names else None
    utts = []
    for i in range(len(ds)):
        uid = str(ids[i]) if ids is not None else f"{split}/{i:07d}"
        utts.append(Utterance(uid, (lambda i=i: _decode_hf_audio(ds[i][audio_column]))))
    info = {"kind": "hf_dataset", "name": name, "config": config, "split": split}
    licence = getattr(getattr(ds, "info", None), "license", None)
    if licence:
        info["licence"] = [licence]
    return utts, info


def resolve_audio_source(spec: str, split: str = "train", audio_column: str = "audio",
                         id_column: str = "id") -> tuple[list[Utterance], dict]:
    """A folder (uses its manifest.jsonl if it has one), a .jsonl manifest, or an HF dataset."""
    from tools.audio_io import load_audio

    if os.path.isdir(spec):
        manifest = os.path.join(spec, "manifest.jsonl")
        if os.path.isfile(manifest):
            return _from_manifest(manifest, load_audio)
        return _from_folder(spec, load_audio)
    if os.path.isfile(spec):
        return _from_manifest(spec, load_audio)
    return _from_hf_dataset(spec, split, audio_column, id_column)


# --------------------------------------------------------------------------- model
def import_medusa():
    """``modeling_medusa`` from the repository root (the artifact's own code)."""
    if REPO_ROOT not in sys.path:
        sys.path.insert(0, REPO_ROOT)
    import modeling_medusa

    return modeling_medusa


def base_folder(base: str) -> str:
    """Where to load ``--base`` from: a Whisper model this repository can convert offline (tiny.en, base)
    named by Hub id resolves as tools.benchmark resolves it (the Hugging Face cache, else the copy converted
    from its PyPI wheel); anything else is returned unchanged."""
    from tools.real_whisper import KNOWN_MODELS, canonical_id, resolve_whisper

    if os.path.isdir(base) or canonical_id(base) not in KNOWN_MODELS:
        return base
    return resolve_whisper(base)


def load_from_base(args, **options):
    """``MedusaForASR.from_base`` of ``--base`` (``--trust-base-code`` its consent); a base that cannot be loaded
    (no such folder, not on the Hub or in its cache, refused code, another family) is the user's one-line error."""
    from tools.real_whisper import ConversionError

    medusa = import_medusa()
    try:
        return medusa.MedusaForASR.from_base(base_folder(args.base), trust_base_remote_code=args.trust_base_code,
                                             **options)
    except medusa.BaseModelNotFound as err:
        raise SystemExit(err.message("give --base a local folder or a Hub id")) from err
    except (OSError, ValueError, ImportError, ConversionError) as err:
        raise SystemExit(f"--base {args.base}: {' '.join(str(err).split())}") from err


def parse_device(name: str) -> str:
    """``--device`` of a pipeline command (``tools.runtime.resolve_device``); a device this machine lacks is a user
    error."""
    try:
        return resolve_device(name)
    except ValueError as err:
        raise SystemExit(str(err)) from err


def parse_dtype(name: str | None, device: str):
    """``--dtype`` of a pipeline command (``tools.runtime.resolve_dtype``); an unknown name is a user error."""
    try:
        return resolve_dtype(name, device)
    except ValueError as err:
        raise SystemExit(str(err)) from err


# --------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pipeline.collect", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="base model: Hub id or local folder")
    cli_args.add_trust_base_code(p)
    p.add_argument("--audio", required=True,
                   help="folder of audio files, manifest.jsonl ({'id','audio',...}), or HF dataset "
                        "name (NAME or NAME:CONFIG; needs `datasets`)")
    p.add_argument("--out", default="work_data/collect", help="output folder for the shards")
    p.add_argument("--batch-size", type=cli_args.positive_int, default=8)
    p.add_argument("--max-new-tokens", type=cli_args.positive_int, default=128)
    p.add_argument("--language", default=None,
                   help="multilingual Whisper: language code of the audio (default: detected per clip)")
    p.add_argument("--task", default=None, choices=("transcribe", "translate"),
                   help="multilingual Whisper: task (default: the model's own, transcribe)")
    p.add_argument("--timestamps", action="store_true",
                   help="Whisper: record the base's timestamped decoding (return_timestamps=True), for heads "
                        "that also draft timestamp tokens")
    p.add_argument("--shard-size", type=cli_args.positive_int, default=256, help="utterances per shard")
    p.add_argument("--speech", action="store_true",
                   help="also store each utterance's encoder output (Whisper), for heads that attend to the "
                        "speech (pipeline.train --speech-attention); ~1-1.5 MB per utterance")
    add_device_options(p, dtype_help="base model")
    p.add_argument("--split", default="train", help="HF dataset split")
    p.add_argument("--audio-column", default="audio", help="HF dataset audio column")
    p.add_argument("--id-column", default="id", help="HF dataset id column (else split/index)")
    p.add_argument("--skip", type=cli_args.non_negative_int, default=0,
                   help="ignore the first N utterances of the source (e.g. an evaluation holdout)")
    p.add_argument("--limit", type=cli_args.positive_int, default=None, help="use at most N utterances (after --skip)")
    return p


def _utterances(args) -> tuple[list[Utterance], dict]:
    """The utterances this run is asked for (after --skip / --limit) and a record of where they come from."""
    utterances, source_info = resolve_audio_source(args.audio, args.split, args.audio_column, args.id_column)
    utterances = utterances[args.skip:]
    if args.limit is not None:
        utterances = utterances[: args.limit]
    source_info.update({"spec": args.audio, "skip": args.skip, "limit": args.limit})
    return utterances, source_info


def _check_shard_settings(path: str, meta: dict, args) -> None:
    """A finished shard must come from the same base and settings as this run: else the folder would mix them."""
    if meta.get("base") != args.base:
        raise SystemExit(f"{path} was collected from base {meta.get('base')!r}, not {args.base!r}; use another --out.")
    if (meta.get("speech") == "true") != args.speech:
        raise SystemExit(f"{path} was collected {'with' if meta.get('speech') == 'true' else 'without'} "
                         "--speech; use the same or another --out.")
    for option in ("language", "task"):
        if meta.get(option) != getattr(args, option):
            raise SystemExit(f"{path} was collected with --{option} {meta.get(option)!r}, not "
                             f"{getattr(args, option)!r}; use the same or another --out.")
    if (meta.get("timestamps") == "true") != args.timestamps:
        raise SystemExit(f"{path} was collected {'with' if meta.get('timestamps') == 'true' else 'without'} "
                         "--timestamps; use the same or another --out.")


def _collected_ids(args, shards: list[str]) -> set[str]:
    """The utterances already in the finished shards (the shards are the record of what is done)."""
    done = set()
    for path in shards:
        meta = read_shard_metadata(path)
        _check_shard_settings(path, meta, args)
        done.update(meta["utterance_ids"])
    return done


class ShardWriter:
    """Rows collected so far, written as shards numbered on from the last one. A shard holds whole batches (the
    first batch end at or past ``shard_size`` rows): a base's hidden states depend, in their last bits, on the
    other rows of their batch, so a rerun after a kill must start at a batch boundary to rebuild the same
    batches and collect the same bits as an uninterrupted run."""

    def __init__(self, out: str, shard_size: int, meta: dict, shards: list[str]):
        self.out, self.shard_size, self.meta, self.pending = out, shard_size, meta, []
        self.next_index = int(SHARD_PATTERN.match(os.path.basename(shards[-1])).group(1)) + 1 if shards else 0

    def add_batch(self, rows: list[tuple]) -> None:
        self.pending.extend(rows)
        if len(self.pending) >= self.shard_size:
            self.flush()

    def flush(self) -> None:
        """Write what is pending as one shard."""
        if self.pending:
            rows, self.pending = self.pending, []
            path = os.path.join(self.out, f"shard_{self.next_index:05d}.safetensors")
            write_shard(path, rows, {**self.meta, "n_tokens": sum(int(r[1].numel()) for r in rows)})
            self.next_index += 1


def _load_batch(batch: list[Utterance], failed: list[dict]) -> tuple[list, list[Utterance]]:
    """The batch's audio; an unreadable file is reported in ``failed`` and retried on the next run."""
    from tqdm.auto import tqdm

    arrays, ok = [], []
    for utterance in batch:
        try:
            arrays.append(utterance.load())
            ok.append(utterance)
        except Exception as e:
            failed.append({"id": utterance.id, "error": f"{type(e).__name__}: {e}"})
            tqdm.write(f"[collect] skipping {utterance.id}: {type(e).__name__}: {e}")
    return arrays, ok


def _decode(model, arrays: list, args, prompt_options: dict) -> list:
    inputs = to_model(model.prepare_audio_inputs(arrays, **prompt_options), model)
    return model.collect_hidden_states(**inputs, max_new_tokens=args.max_new_tokens,
                                       **({"with_speech": True} if args.speech else {}),
                                       **({"return_timestamps": True} if args.timestamps else {}))


def _collect_rows(model, arrays: list, utterances: list[Utterance], args, prompt_options: dict,
                  failed: list[dict]) -> list[tuple]:
    """(id, tokens, hidden states, speech states or None) per utterance, from the base's own greedy decoding. A
    clip the base's generate decodes in several windows (over 30 s; with timestamps, a segment it seeks past) is
    left out and reported in ``failed``: its rows could not be told from the batch's other clips'."""
    outputs = _decode(model, arrays, args, prompt_options)
    if len(outputs) != len(utterances):
        outputs, kept = [], []
        for array, utterance in zip(arrays, utterances):
            windows = _decode(model, [array], args, prompt_options)
            if len(windows) == 1:
                outputs += windows
                kept.append(utterance)
            else:
                failed.append({"id": utterance.id, "error": f"decoded in {len(windows)} windows of the base's "
                                                            "generate; one utterance is one window"})
        utterances = kept
    rows = []
    for utterance, (tokens, hiddens, *speech) in zip(utterances, outputs):
        if tokens.shape[0] != hiddens.shape[0]:
            raise RuntimeError(f"{utterance.id}: {tokens.shape[0]} tokens but {hiddens.shape[0]} hiddens")
        rows.append((utterance.id, tokens.detach().cpu(), hiddens.detach().cpu(),
                     speech[0].detach().cpu() if speech else None))
    return rows


@dataclass
class RunCounts:
    clips: int = 0
    tokens: int = 0
    audio_seconds: float = 0.0
    model_seconds: float = 0.0
    failed: list = field(default_factory=list)


def _collect(model, todo: list[Utterance], args, prompt_options: dict, writer: ShardWriter) -> RunCounts:
    """Decode ``todo`` batch by batch into ``writer``; on a crash or Ctrl-C what was decoded is written."""
    import torch
    from tqdm.auto import tqdm

    counts = RunCounts()
    bar = tqdm(total=len(todo), unit="clip", desc="collect", dynamic_ncols=True)
    try:
        with torch.inference_mode():
            for start in range(0, len(todo), args.batch_size):
                batch = todo[start: start + args.batch_size]
                arrays, ok = _load_batch(batch, counts.failed)
                if ok:
                    t0 = time.perf_counter()
                    rows = _collect_rows(model, arrays, ok, args, prompt_options, counts.failed)
                    counts.model_seconds += time.perf_counter() - t0
                    writer.add_batch(rows)
                    kept = {row[0] for row in rows}
                    counts.tokens += sum(int(row[1].numel()) for row in rows)
                    counts.clips += len(rows)
                    counts.audio_seconds += sum(len(a) for a, u in zip(arrays, ok) if u.id in kept) / SAMPLE_RATE
                bar.update(len(batch))
                bar.set_postfix(tokens=counts.tokens)
    finally:
        writer.flush()
        bar.close()
    return counts


def _record_run(info: dict, info_path: str, args, counts: RunCounts, wall: float, device, dtype: str) -> dict:
    """collect_info.json brought up to date: totals over every shard, this run's throughput and failures."""
    shards = list_shards(args.out)
    metas = [read_shard_metadata(path) for path in shards]
    totals = {"n_utterances": sum(len(m["utterance_ids"]) for m in metas),
              "n_tokens": sum(int(m.get("n_tokens", 0)) for m in metas)}
    run = {
        "clips": counts.clips, "tokens": counts.tokens, "audio_seconds": round(counts.audio_seconds, 3),
        "wall_seconds": round(wall, 3),
        "model_seconds": round(counts.model_seconds, 3),
        "clips_per_s": round(counts.clips / wall, 4) if wall > 0 and counts.clips else 0.0,
        "tokens_per_s": round(counts.tokens / wall, 2) if wall > 0 and counts.tokens else 0.0,
        "device": str(device), "dtype": dtype, "batch_size": args.batch_size,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    info.update(totals)
    info["audio_seconds"] = round(info.get("audio_seconds", 0.0) + counts.audio_seconds, 3)  # of every run's clips
    info["n_shards"] = len(shards)
    info["failed"] = counts.failed
    if counts.clips:
        info["throughput"] = {k: run[k] for k in ("clips_per_s", "tokens_per_s", "device", "dtype", "batch_size")}
    info.setdefault("runs", []).append(run)
    write_json_atomic(info_path, info)
    print(f"[collect] this run: {counts.clips} clips, {counts.tokens} tokens in {wall:.1f} s "
          f"({run['clips_per_s']:.2f} clips/s, {run['tokens_per_s']:.1f} tokens/s); "
          f"total {totals['n_utterances']} utterances, {totals['n_tokens']} tokens in {len(shards)} shards"
          + (f"; {len(counts.failed)} left out (collect_info.json's failed says why; retried next run)"
             if counts.failed else ""))
    return info


def _read_info(info_path: str) -> dict:
    if not os.path.exists(info_path):
        return {}
    with open(info_path, encoding="utf-8") as f:
        return json.load(f)


def main(argv=None, model=None) -> dict:
    """Run collection; returns the collect_info dict. ``model`` may be injected (tests)."""
    args = build_parser().parse_args(argv)
    import torch

    quiet_generate_notices(verbose=False)  # (timestamps take the base's generate, which logs notices every call)
    if args.threads:
        torch.set_num_threads(args.threads)
    utterances, source_info = _utterances(args)
    os.makedirs(args.out, exist_ok=True)
    remove_stale_temporaries(args.out)
    shards = list_shards(args.out)
    done = _collected_ids(args, shards)
    todo = [u for u in utterances if u.id not in done]
    print(f"[collect] {len(utterances)} utterances from {source_info['kind']} {args.audio}; "
          f"{len(utterances) - len(todo)} already in {len(shards)} shard(s), {len(todo)} to do")

    device = parse_device(args.device)
    dtype = parse_dtype(args.dtype, device)
    if model is None and todo:
        model = load_from_base(args, torch_dtype=dtype, device_map=device)
    info_path = os.path.join(args.out, "collect_info.json")
    info = _read_info(info_path)
    if model is not None:
        model.eval()
        cfg = model.config
        info.update({"base": args.base, "family": cfg.base_family, "hidden_size": cfg.hidden_size,
                     "vocab_size": cfg.vocab_size})
    prompt_options = {k: v for k, v in (("language", args.language), ("task", args.task)) if v}
    info.update({"audio_source": source_info, "max_new_tokens": args.max_new_tokens, **prompt_options,
                 "timestamps": args.timestamps})
    shard_meta = {"base": args.base, "family": info.get("family", ""), "dtype": str(dtype).replace("torch.", ""),
                  "max_new_tokens": args.max_new_tokens, **prompt_options,
                  **({"speech": "true"} if args.speech else {}), **({"timestamps": "true"} if args.timestamps else {})}

    t_start = time.perf_counter()
    counts = _collect(model, todo, args, prompt_options, ShardWriter(args.out, args.shard_size, shard_meta, shards))
    device_used = model_device(model) if model is not None else device
    return _record_run(info, info_path, args, counts, time.perf_counter() - t_start, device_used, shard_meta["dtype"])


if __name__ == "__main__":
    sys.exit(run_cli(main))
