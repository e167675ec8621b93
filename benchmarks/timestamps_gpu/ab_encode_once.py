"""A timestamped whisper-base call on a GPU: ours with the speech encoded once by our captured encoder, against
ours with the base's own encoder (as before that change), the base's own ``generate`` and our untimestamped call;
the same clips, interleaved, medians. Prints one JSON line.

    python benchmarks/timestamps_gpu/ab_encode_once.py BASE_FOLDER EVAL_FOLDER   (from the repository root)
"""

import contextlib
import json
import statistics
import sys
import time

import torch

sys.path.insert(0, ".")
import backbone_whisper  # noqa: E402
from tools import runtime  # noqa: E402
from tools.audio_io import load_audio  # noqa: E402

KINDS = ["base", "ours_encode_once", "ours_base_encoder", "ours_plain"]
ENCODE_ONCE = backbone_whisper.WhisperBackbone.around_base_generate


def base_encoder(self, capture=None):
    return contextlib.nullcontext()  # the base's generate with its own encoder, as before the change


def on_gpu(inputs: dict) -> dict:
    return {k: (v.to("cuda", torch.bfloat16) if v.is_floating_point() else v.to("cuda")) if torch.is_tensor(v) else v
            for k, v in inputs.items()}


def call(model, kind: str, inputs: dict):
    if kind == "base":
        return model.generate(**inputs, return_timestamps=True, use_medusa=False)
    backbone_whisper.WhisperBackbone.around_base_generate = ENCODE_ONCE if kind == "ours_encode_once" else base_encoder
    return model.generate(**inputs, return_timestamps=kind != "ours_plain", draft="chain")


def main(base: str, eval_folder: str, clips: int = 6, repeats: int = 3):
    model = runtime.load_medusa("heads/whisper-base", torch.bfloat16, base=base, device_map="cuda").eval()
    rows = [json.loads(line) for line in open(f"{eval_folder}/manifest.jsonl")][:clips]
    inputs = [on_gpu(model.prepare_audio_inputs([load_audio(f"{eval_folder}/{r['audio']}")])) for r in rows]
    times, exact = {k: [] for k in KINDS}, {k: 0 for k in KINDS[1:3]}
    for clip in inputs:
        expected = call(model, "base", clip)
        for kind in KINDS:  # (a warm-up call each)
            out = call(model, kind, clip)
            if kind in exact:
                exact[kind] += torch.equal(out, expected)
        seconds = {k: [] for k in KINDS}
        for repeat in range(repeats):
            for kind in KINDS[repeat % 4:] + KINDS[:repeat % 4]:
                torch.cuda.synchronize()
                start = time.perf_counter()
                call(model, kind, clip)
                torch.cuda.synchronize()
                seconds[kind].append(time.perf_counter() - start)
        for kind in KINDS:
            times[kind].append(statistics.median(seconds[kind]) * 1000)
    print(json.dumps({"clips": len(inputs), "ms_per_call_median": {k: round(statistics.median(v), 2) for k, v in times.items()},
                      "exact_vs_base": exact, "device": torch.cuda.get_device_name()}))


if __name__ == "__main__":
    with torch.no_grad():
        main(sys.argv[1], sys.argv[2])
