"""Carry a converted base's weights to a machine that only takes small transfers, in parts.

    python -m tools.carry_weights split ~/.cache/medusa-asr/whisper-tiny.en .gpu/part --parts 3
    python -m tools.carry_weights join .gpu/part1 .gpu/part2 .gpu/part3 --out /tmp/cache/whisper-tiny.en

``split`` writes every floating-point tensor of the folder's ``model.safetensors`` as float16 bytes where float16
gives back exactly the same values (true for the CTranslate2-derived Whisper weights), any other tensor (a quantised
checkpoint's packed integers and scales, sinusoidal positions) in its own dtype, cut into ``--parts`` folders of
equal size (a large tensor may straddle two), with the index and the folder's small JSON files in the first part.
``join`` puts the bytes back together, checks the SHA-256 of the original values and writes the folder again.
The lent GPU's working tree travels capped at 64 MiB a call and keeps ``/tmp`` for about 30 s between calls: carry
one part per call, copying it to ``/tmp``, and join in the last call.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys

from tools import cli_args

INDEX = "weights_index.json"
PART = "weights.part"
SMALL_FILES_LIMIT = 8 << 20  # (config, tokenizer, processor files travel with the first part)


def values_digest(state: dict) -> str:
    """SHA-256 over the tensors' bytes, in key order."""
    import torch

    digest = hashlib.sha256()
    for key in sorted(state):
        digest.update(state[key].contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def split(folder: str, out_prefix: str, parts: int) -> list[str]:
    import torch
    from safetensors.torch import load_file

    state = load_file(os.path.join(folder, "model.safetensors"))
    index, chunks, offset = [], [], 0
    for key in sorted(state):
        tensor = state[key]
        carried = _smaller_exact(tensor)
        data = carried.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
        index.append({"key": key, "dtype": str(tensor.dtype).removeprefix("torch."),
                      "carried": str(carried.dtype).removeprefix("torch."), "shape": list(tensor.shape),
                      "offset": offset, "bytes": len(data)})
        chunks.append(data)
        offset += len(data)
    blob = b"".join(chunks)
    cuts = [len(blob) * i // parts for i in range(parts + 1)]
    folders = [f"{out_prefix}{i + 1}" for i in range(parts)]
    for i, part in enumerate(folders):
        os.makedirs(part, exist_ok=True)
        with open(os.path.join(part, PART), "wb") as f:
            f.write(blob[cuts[i]:cuts[i + 1]])
    with open(os.path.join(folders[0], INDEX), "w", encoding="utf-8") as f:
        json.dump({"sha256": values_digest(state), "tensors": index}, f)
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if name != "model.safetensors" and os.path.isfile(path) and os.path.getsize(path) <= SMALL_FILES_LIMIT:
            shutil.copy(path, os.path.join(folders[0], name))
    return folders


def _smaller_exact(tensor):
    """The tensor as float16 where that keeps every value (and is smaller), else as it is."""
    import torch

    if not tensor.is_floating_point() or tensor.element_size() <= 2:
        return tensor
    half = tensor.to(torch.float16)
    return half if torch.equal(half.to(tensor.dtype), tensor) else tensor


def join(parts: list[str], out: str) -> str:
    import torch
    from safetensors.torch import save_file

    with open(os.path.join(parts[0], INDEX), encoding="utf-8") as f:
        index = json.load(f)
    blob = b"".join(open(os.path.join(part, PART), "rb").read() for part in parts)
    state = {}
    for entry in index["tensors"]:
        raw = bytearray(blob[entry["offset"]:entry["offset"] + entry["bytes"]])
        carried = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        values = carried.view(getattr(torch, entry["carried"])).reshape(entry["shape"])
        state[entry["key"]] = values.to(getattr(torch, entry["dtype"])).contiguous()
    if values_digest(state) != index["sha256"]:
        raise SystemExit("the joined weights differ from the original: a part is missing, repeated or out of order")
    os.makedirs(out, exist_ok=True)
    save_file(state, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    for name in os.listdir(parts[0]):
        if name not in (INDEX, PART):
            shutil.copy(os.path.join(parts[0], name), os.path.join(out, name))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.carry_weights", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("split", help="a converted base folder -> N part folders")
    s.add_argument("folder")
    s.add_argument("out_prefix", help="part folders are OUT_PREFIX1 ... OUT_PREFIXN")
    s.add_argument("--parts", type=cli_args.positive_int, default=3)
    j = sub.add_parser("join", help="the part folders, in order -> the base folder")
    j.add_argument("parts", nargs="+")
    j.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.command == "split":
        print("\n".join(split(args.folder, args.out_prefix, args.parts)))
    else:
        print(join(args.parts, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
