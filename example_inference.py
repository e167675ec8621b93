"""Transcribe an audio file with this artifact: the base model's own greedy transcript, decoded faster.

    python example_inference.py speech.wav                 # the artifact in this script's folder
    python example_inference.py speech.wav ORG/REPO_NAME   # or any other folder / Hub repository

The heads' repository has the full command (subtitles, long files, folders, word times, benchmarks):
``python -m tools.transcribe``.
"""

import sys
from pathlib import Path

import soundfile
import soxr
from transformers import AutoModel

SAMPLE_RATE = 16_000
HERE = Path(__file__).absolute().parent  # this folder, whatever the working directory (a link keeps its folder)


def load_audio(path: str):
    """Mono float32 samples at 16 kHz."""
    samples, rate = soundfile.read(path, dtype="float32", always_2d=True)
    return soxr.resample(samples.mean(axis=1), rate, SAMPLE_RATE)


def transcribe(audio_path: str, model_path: str = str(HERE), max_new_tokens: int | None = None) -> str:
    model = AutoModel.from_pretrained(model_path, trust_remote_code=True)  # loads the base it names + the heads
    inputs = model.prepare_audio_inputs([load_audio(audio_path)])
    max_new_tokens = max_new_tokens or model.default_max_new_tokens  # (Whisper 224 per 30 s window)
    sequences, stats = model.generate(**inputs, max_new_tokens=max_new_tokens, return_stats=True)
    print(f"[{stats['draft']}: {stats['mean_accepted_per_round']:.2f} tokens per decoder pass]", file=sys.stderr)
    return model.decode_text(sequences, inputs)[0]


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print(__doc__, file=sys.stderr)
        return 2
    try:
        print(transcribe(*argv))
    except (OSError, ValueError, soundfile.LibsndfileError) as error:  # no heads, no base, untrusted base code, bad audio
        message = " ".join(str(error).split())
        print(f"example_inference.py: {message}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
