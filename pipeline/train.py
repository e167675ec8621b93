"""Stage 2: train draft heads on the hidden states recorded by ``pipeline.collect``.

    python -m pipeline.train --data work_data/collect --base openai/whisper-tiny.en --out work_data/ckpt \\
        [--head-kind medusa|path] [--speech-attention] [--draft-vocab 4096] [--soft-labels 0.5] \\
        [--eval-data work_data/collect_human]

Head ``k`` (0-based) at position ``t`` learns ``tokens[t+k+1]`` from ``hiddens[t]`` (the hidden state whose
argmax was ``tokens[t]``) through the frozen base's own output projection, restricted to a draft
vocabulary (the ``--draft-vocab`` most frequent tokens of the training transcripts; 0 = all). Medusa heads
see ``hiddens[t]`` only; path heads (``--head-kind path``, Hydra-style) also see the true tokens
``tokens[t..t+k]`` (teacher forcing) and, with ``--speech-attention``, the speech (needs shards collected
with ``--speech``). Loss per head: cross-entropy on the base's token, mixed with ``--soft-labels`` of
cross-entropy on the base's own distribution at that position (recomputed from the recorded hidden
state: nothing extra is stored). AdamW (betas 0.9/0.95, no weight decay), warm-up then cosine, gradient
clipping at 1.0. A held-out split of whole utterances (deterministic from ``--seed`` and the ids)
selects the best checkpoint and measures per-head top-k accuracy; at the end the best heads are replayed
on it (and on ``--eval-data``) to measure the tokens per round of the chain and of trees built from that
accuracy (``pipeline.acceptance``: exactly what ``generate`` would measure on the same audio).

Outputs in ``--out``:
* ``last.pt``           heads + optimizer + scheduler + step (every epoch and every ``--save-every`` steps);
                        a rerun resumes from it (``--no-resume`` to restart)
* ``best.safetensors``  heads (+ ``draft_vocab``), best validation loss so far; metadata: the head shape
* ``metrics.json``      the best checkpoint's validation loss, per-head accuracy
                        (``head_accuracy = {"top1", "top5", "topk"}``; ``topk[k][j-1]`` = acc@j, j<=10) and
                        ``draft_candidates`` (tokens per round of each tree replayed on the held-out data)
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import re
import sys
import time
from dataclasses import dataclass

from pipeline.collect import (import_medusa, list_shards, load_from_base, load_shard, load_shard_speech, parse_device, parse_dtype,
                              run_cli)
from tools import cli_args
from tools.files import remove_stale_temporaries, save_safetensors_atomic, torch_save_atomic, write_json_atomic
from tools.runtime import add_device_options

TOPK = 10
IGNORE = -100
CANDIDATE_TREE_SIZES = (8, 16, 32, 64)  # draft nodes of the trees whose tokens per round are measured


# --------------------------------------------------------------------------- data
def _folder_shards(data_dir: str) -> list[str]:
    shards = list_shards(data_dir)
    if not shards:
        raise SystemExit(f"no shard_*.safetensors in {data_dir}; run `python -m pipeline.collect` first")
    return shards


def _folder_name(data_dir: str) -> str:
    return os.path.basename(os.path.normpath(data_dir))


class Collected:
    """All shards of one or several collect folders (e.g. one a language, one with timestamps): utterance u is
    tokens[starts[u]:starts[u]+lengths[u]] (and ``speech[u]``, its encoder output, when the shards hold it and
    ``with_speech``). With several folders an utterance id is prefixed by its folder's name."""

    def __init__(self, data_dirs, with_speech: bool = False):
        import torch

        data_dirs = [data_dirs] if isinstance(data_dirs, str) else list(data_dirs)
        shards = [(d, path) for d in data_dirs for path in _folder_shards(d)]
        hiddens, tokens, starts, lengths, speech, self.ids, self.meta = [], [], [], [], [], [], {}
        offset = 0
        prefix = {d: f"{_folder_name(d)}/" if len(data_dirs) > 1 else "" for d in data_dirs}
        for folder, path in shards:
            h, t, off, meta = load_shard(path)
            if self.meta and meta.get("base") != self.meta.get("base"):
                raise SystemExit(f"{path}: base {meta.get('base')!r} differs from the other shards'")
            shard_speech = load_shard_speech(path) if with_speech else None
            if with_speech and shard_speech is None:
                raise SystemExit(f"{path} holds no speech: collect again with `pipeline.collect --speech`")
            self.meta = self.meta or meta
            hiddens.append(h)
            tokens.append(t)
            starts.append(off[:-1] + offset)
            lengths.append(off[1:] - off[:-1])
            speech.append(shard_speech)
            self.ids.extend(prefix[folder] + i for i in meta["utterance_ids"])
            offset += int(t.numel())
        self.hiddens = torch.cat(hiddens)
        self.tokens = torch.cat(tokens)
        self.starts = torch.cat(starts)
        self.lengths = torch.cat(lengths)
        self.speech = torch.cat(speech) if with_speech else None
        self.shard_names = [prefix[d] + os.path.basename(p) for d, p in shards]
        if len(set(self.ids)) != len(self.ids):
            raise SystemExit(f"{', '.join(data_dirs)}: duplicate utterance ids across shards")

    @property
    def hidden_size(self) -> int:
        return int(self.hiddens.shape[-1])

    def fingerprint(self) -> dict:
        return {"shards": self.shard_names, "n_utterances": len(self.ids), "n_tokens": int(self.tokens.numel())}

    def to(self, device) -> "Collected":
        self.hiddens = self.hiddens.to(device)
        if self.speech is not None:
            self.speech = self.speech.to(device)
        return self

    def recordings(self, utts, speech_memory=None) -> list:
        """``pipeline.acceptance.Recording`` per utterance (speech memory computed by ``speech_memory``)."""
        from pipeline.acceptance import Recording

        out = []
        for u in utts:
            s, n = int(self.starts[u]), int(self.lengths[u])
            memory = None
            if speech_memory is not None and self.speech is not None:
                keys, values = speech_memory(self.speech[u][None])
                memory = (keys[0], values[0])
            out.append(Recording(self.tokens[s:s + n], self.hiddens[s:s + n], memory))
        return out


def collected_recordings(model, folder: str) -> list:
    """Every recording of a ``pipeline.collect`` folder, with the speech memory where ``model``'s heads attend to
    the speech (for replaying exported heads: ``pipeline.replay_difference``, ``pipeline.timestamp_rounds``)."""
    memory = model.backbone.speech_memory_of if model.config.speech_attention else None
    data = Collected([folder], with_speech=memory is not None)
    return data.recordings(range(len(data.ids)), memory)


def split_utterances(ids: list[str], lengths, val_fraction: float, seed: int, min_tokens: int):
    """Deterministic split by utterance: order by sha1(seed:id), the first fraction is validation.

    Independent of shard order, and adding data later does not move existing utterances
    between the splits. Utterances shorter than ``min_tokens`` are dropped.
    """
    keep = [i for i in range(len(ids)) if int(lengths[i]) >= min_tokens]
    order = sorted(keep, key=lambda i: hashlib.sha1(f"{seed}:{ids[i]}".encode()).hexdigest())
    n_val = 0
    if val_fraction > 0 and len(keep) >= 2:
        n_val = min(len(keep) - 1, max(1, round(val_fraction * len(keep))))
    return sorted(order[n_val:]), sorted(order[:n_val])


def draft_vocabulary(tokens, size: int, vocab_size: int):
    """The ``size`` most frequent token ids of the training transcripts (None: the whole vocabulary)."""
    import torch

    if not size or size >= vocab_size:
        return None
    counts = torch.bincount(tokens.reshape(-1), minlength=vocab_size)
    order = counts.argsort(descending=True, stable=True)[:size]
    return torch.sort(order[counts[order] > 0]).values


def timestamp_ids(base, vocab_size: int):
    """Whisper's timestamp token ids (every id after ``<|notimestamps|>``), None for a base without them."""
    import torch

    no_timestamps = getattr(getattr(base, "generation_config", None), "no_timestamps_token_id", None)
    return None if no_timestamps is None else torch.arange(int(no_timestamps) + 1, vocab_size)


@dataclass
class UtteranceBatch:
    """A padded batch of utterances: per position t, the root token and the true tokens after it."""

    hiddens: object  # [B, T, H] the recorded states (zeros past an utterance's end)
    inputs: object  # [B, T, K] tokens[t + k] (the token each head's path ends with; path heads' inputs)
    targets: object  # [B, T, K] tokens[t + k + 1] as draft-vocabulary indices, IGNORE where none
    target_hiddens: object  # [B, T, K, H] hiddens[t + k + 1] (the base's distribution there: soft labels)
    speech: object = None  # [B, L, H] encoder outputs, when training speech attention


def make_batch(data: Collected, utts, num_heads: int, vocab_index, device, with_targets_hidden: bool):
    """Pad ``utts`` into an ``UtteranceBatch``; ``vocab_index`` maps token id -> draft index (or IGNORE)."""
    import torch

    utts = torch.as_tensor(utts, dtype=torch.long)
    starts, lengths = data.starts[utts], data.lengths[utts]
    longest = int(lengths.max())
    span = torch.arange(longest + num_heads + 1)
    inside = span[None, :] < lengths[:, None]  # [B, S]
    flat = (starts[:, None] + span[None, :]).clamp(max=len(data.tokens) - 1)
    tokens = torch.where(inside, data.tokens[flat], torch.zeros_like(flat))
    positions = torch.arange(longest)
    offsets = torch.arange(num_heads)
    at = positions[:, None] + offsets[None, :]  # [T, K] offset t+k
    inputs = tokens[:, at]
    has_target = inside[:, at + 1] & inside[:, positions][:, :, None]
    targets = torch.where(has_target, vocab_index[tokens[:, at + 1]], torch.full_like(inputs, IGNORE))
    flat = flat.to(data.hiddens.device)
    hiddens = data.hiddens[flat[:, :longest]].to(device).float() * inside[:, :longest, None].to(device)
    target_hiddens = None
    if with_targets_hidden:
        target_hiddens = data.hiddens[flat[:, at + 1]].to(device).float()
    speech = data.speech[utts.to(data.speech.device)].to(device) if data.speech is not None else None
    return UtteranceBatch(hiddens, inputs.to(device), targets.to(device), target_hiddens, speech)


# --------------------------------------------------------------------------- model
def trainable_head_parameters(model) -> dict:
    """The heads' own parameters (anything shared with the base, e.g. its output projection, excluded)."""
    head_ids = {id(p) for p in model.medusa_heads.parameters()}
    shared = {id(p) for n, p in model.named_parameters(remove_duplicate=False)
              if not n.startswith("medusa_heads.") and id(p) in head_ids}
    return {n: p for n, p in model.medusa_heads.named_parameters() if id(p) not in shared}


def heads_state(model) -> dict:
    state = {n: p.detach().to("cpu").clone().contiguous() for n, p in trainable_head_parameters(model).items()}
    if getattr(model, "draft_vocab", None) is not None:
        state["draft_vocab"] = model.draft_vocab.detach().to("cpu").clone()
    return state


def grown_parameters(names, state: dict) -> set:
    """Of ``names``, what heads grown from ``state`` add: the residual layers it lacks but whose block's first layer
    it has (``--layers``), and a prefix attention it lacks (``--prefix-attention``). Each is zero-initialised to
    start as the identity, so the grown heads draft as before."""
    from pipeline.prefix_attention import PREFIX

    def added_layer(name):
        return re.search(r"layers\.[1-9]\d*\.", name) and re.sub(r"layers\.\d+\.", "layers.0.", name) in state

    has_prefix = any(k.startswith(PREFIX) for k in state)
    return {n for n in names if added_layer(n) or (n.startswith(PREFIX) and not has_prefix)}


def load_heads_state(model, state: dict, grow: bool = False) -> None:
    """Load trained heads; ``grow`` also takes smaller heads that these grow from (``grown_parameters``)."""
    state = dict(state)
    vocab = state.pop("draft_vocab", None)
    expected = set(trainable_head_parameters(model))
    missing, unexpected = expected - set(state), set(state) - expected
    if grow:
        missing -= grown_parameters(missing, state)
    if missing or unexpected:
        raise SystemExit(f"heads checkpoint does not match the model: missing {sorted(missing)}, "
                         f"unexpected {sorted(unexpected)}")
    model.medusa_heads.load_state_dict(state, strict=False)
    if vocab is not None or getattr(model, "draft_vocab", None) is not None:
        model.set_draft_vocab(vocab)


def heads_metadata(model) -> dict:
    """The head shape, recorded in the checkpoint so that export can rebuild the same heads."""
    cfg = model.config
    return {"head_kind": cfg.head_kind, "num_heads": str(cfg.medusa_num_heads), "num_layers": str(cfg.medusa_num_layers),
            "speech_attention": str(bool(cfg.speech_attention)).lower()}


def build_model(args, dtype, device):
    return load_from_base(args, medusa_num_heads=args.heads, medusa_num_layers=args.layers, head_kind=args.head_kind,
                          speech_attention=args.speech_attention, torch_dtype=dtype, device_map=device)


def _device_of(model):
    return next(iter(trainable_head_parameters(model).values())).device


def _autocast(device, amp: bool):
    import contextlib

    import torch

    if not amp:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)


def head_states(model, batch: UtteranceBatch):
    """[B, T, K, H]: the states whose projections are the heads' draft logits (teacher-forced paths)."""
    heads = model.medusa_heads
    if model.config.head_kind == "medusa":
        return heads(batch.hiddens)
    from pipeline.prefix_attention import root_states

    speech = model.backbone.speech_memory_of(batch.speech) if model.config.speech_attention else None
    return heads.teacher_forced(root_states(heads, batch.hiddens), model.backbone.embed(batch.inputs), speech)


def heads_loss(model, batch: UtteranceBatch, soft_labels: float = 0.0, amp: bool = False):
    """Sum over heads of masked-mean cross-entropy (mixed with the soft-label cross-entropy); also the
    per-head losses."""
    import torch
    import torch.nn.functional as F

    projection = model.draft_projection()
    with _autocast(batch.hiddens.device, amp):
        logits = projection.logits(head_states(model, batch)).float()  # [B, T, K, V']
    valid = batch.targets != IGNORE
    ce = F.cross_entropy(logits.flatten(0, 2), batch.targets.flatten(), ignore_index=IGNORE,
                         reduction="none").view(batch.targets.shape)
    if soft_labels:
        with torch.no_grad(), _autocast(batch.hiddens.device, amp):
            teacher = projection.logits(batch.target_hiddens).float().softmax(dim=-1)
        soft = -(teacher * logits.log_softmax(dim=-1)).sum(dim=-1)
        ce = (1.0 - soft_labels) * ce + soft_labels * soft
    count = valid.sum((0, 1))
    per_head = (ce * valid).sum((0, 1)) / count.clamp(min=1)
    per_head_list = [float(x) if int(c) else float("nan") for x, c in zip(per_head.detach(), count)]
    return per_head.sum(), per_head_list


def evaluate(model, data: Collected, utts, num_heads: int, vocab_index, amp: bool = False,
             batch_size: int = 64) -> dict:
    """Per-head mean CE and top-1..10 accuracy over every position of ``utts`` (teacher-forced paths, so a
    path head's accuracy is conditional on a correct path)."""
    import torch
    import torch.nn.functional as F

    device = _device_of(model)
    ce_sum = torch.zeros(num_heads, dtype=torch.float64)
    count = torch.zeros(num_heads, dtype=torch.float64)
    hits = torch.zeros(num_heads, TOPK, dtype=torch.float64)
    projection = model.draft_projection()
    was_training = model.medusa_heads.training
    model.medusa_heads.eval()
    with torch.no_grad():
        for start in range(0, len(utts), batch_size):
            batch = make_batch(data, utts[start:start + batch_size], num_heads, vocab_index, device, False)
            with _autocast(device, amp):
                logits = projection.logits(head_states(model, batch)).float()
            for k in range(num_heads):
                valid = batch.targets[..., k] != IGNORE
                if not bool(valid.any()):
                    continue
                lg, tg = logits[..., k, :][valid], batch.targets[..., k][valid]
                ce_sum[k] += float(F.cross_entropy(lg, tg, reduction="sum"))
                count[k] += int(valid.sum())
                top = lg.topk(min(TOPK, lg.shape[-1]), dim=-1).indices
                found = (top == tg[:, None]).cumsum(-1) > 0  # [n, k']: target within top-j
                if found.shape[1] < TOPK:  # vocab smaller than 10: top-j for j >= V is everything
                    found = torch.cat([found, found.new_ones(found.shape[0], TOPK - found.shape[1])], 1)
                hits[k] += found.sum(0).double().cpu()
    model.medusa_heads.train(was_training)
    denom = count.clamp(min=1)
    per_head_loss = (ce_sum / denom).tolist()
    topk = (hits / denom[:, None]).tolist()
    return {
        "val_loss": float(sum(per_head_loss)),
        "per_head_loss": [round(x, 6) for x in per_head_loss],
        "head_accuracy": {
            "top1": [round(r[0], 6) for r in topk],
            "top5": [round(r[4], 6) for r in topk],
            "topk": [[round(x, 6) for x in r] for r in topk],
            "n_positions": [int(c) for c in count],
        },
    }


def candidate_trees(topk_accuracy, num_heads: int) -> list:
    """The chain and trees of ``CANDIDATE_TREE_SIZES`` nodes built from the measured accuracy."""
    import_medusa()
    from draft_trees import DraftTree, build_tree_from_accuracy

    trees = [DraftTree.chain(num_heads)]
    trees += [DraftTree.from_paths(build_tree_from_accuracy(topk_accuracy, n)) for n in CANDIDATE_TREE_SIZES]
    return list(dict.fromkeys(trees))


def replay_candidates(model, recordings, trees) -> list[dict]:
    """Tokens per round of each tree, replayed on ``recordings`` with the model's own drafter."""
    import torch

    from pipeline.acceptance import tokens_per_round
    from pipeline.prefix_attention import prefixed_recordings

    device = _device_of(model)
    dtype = next(model.medusa_heads.parameters()).dtype
    model.medusa_heads.eval()
    rows = []
    with torch.no_grad():
        recordings = prefixed_recordings(model.medusa_heads, recordings, device, dtype)
        for tree in trees:
            replay = tokens_per_round(model.make_drafter(tree, device), tree, recordings, device=device, dtype=dtype)
            rows.append({"paths": [list(p) for p in tree.paths], "nodes": tree.num_nodes - 1, "name": tree.name,
                         "tokens_per_round": round(replay["tokens_per_round"], 4), "rounds": replay["rounds"]})
    return rows


def load_checkpoint(path: str) -> dict:
    """``last.pt``, or a one-line error saying how to start over when it is truncated or corrupt."""
    import pickle

    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError) as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise SystemExit(f"{path} is truncated or corrupt ({reason}); rerun with --no-resume to start over, "
                         "or use another --out.") from err


# --------------------------------------------------------------------------- schedule
def epoch_order(n: int, seed: int, epoch: int):
    import torch

    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g)


# --------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pipeline.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, action="append",
                   help="collect output folder (shard_*.safetensors); repeat to train on several (languages, "
                        "timestamps)")
    p.add_argument("--base", required=True, help="base model (its output projection is used)")
    cli_args.add_trust_base_code(p)
    p.add_argument("--out", default="work_data/ckpt", help="checkpoint folder")
    p.add_argument("--heads", type=cli_args.positive_int, default=4, help="number of heads K (draft depth)")
    p.add_argument("--layers", type=cli_args.positive_int, default=1, help="residual blocks per head")
    p.add_argument("--head-kind", choices=("medusa", "path"), default="medusa",
                   help="medusa: independent heads; path: each head also sees the tokens before it on its path")
    p.add_argument("--speech-attention", action="store_true",
                   help="path heads also attend to the speech (Whisper; shards collected with --speech)")
    p.add_argument("--draft-vocab", type=cli_args.non_negative_int, default=0,
                   help="heads project onto the N most frequent training tokens (0: the whole vocabulary); "
                        "timestamped data adds every timestamp token")
    p.add_argument("--soft-labels", type=cli_args.fraction, default=0.0,
                   help="weight of the base's own distribution in the loss (0: its argmax only; 1: only it)")
    p.add_argument("--prefix-attention", action="store_true",
                   help="experiment: path heads start from a causal self-attention over the base's hiddens so far "
                        "(Hydra++); measured by replay only, the decoder does not run it (export refuses it)")
    p.add_argument("--eval-data", action="append", default=[],
                   help="another collect folder (e.g. real speech) to replay the best heads on; repeatable")
    p.add_argument("--init-heads", default=None,
                   help="start from these trained heads (a medusa_heads.safetensors or best.safetensors of the same "
                        "shape, or with fewer --layers or no prefix attention: what is added starts as the identity) "
                        "and their draft vocabulary, to which --draft-vocab N adds the new data's N most frequent "
                        "tokens: fine-tune them on new data")
    p.add_argument("--epochs", type=cli_args.positive_int, default=3)
    p.add_argument("--batch-size", type=cli_args.positive_int, default=16, help="utterances per step")
    p.add_argument("--lr", type=cli_args.positive_float, default=1e-3)
    p.add_argument("--warmup-steps", type=cli_args.non_negative_int, default=None,
                   help="linear warm-up steps (default: min(100, 10%% of all steps))")
    p.add_argument("--val-fraction", type=cli_args.below_one, default=0.05)
    p.add_argument("--min-tokens", type=cli_args.non_negative_int, default=2, help="drop utterances with fewer tokens")
    p.add_argument("--seed", type=cli_args.seed, default=0)
    add_device_options(p, dtype="float32", dtype_help="base projection and heads (float32 recommended)")
    p.add_argument("--amp", choices=("auto", "bf16", "off"), default="auto",
                   help="bf16 autocast of the heads + output projection (master weights stay in --dtype). "
                        "auto: on for CUDA, off on CPU. On CPUs with AMX/AVX512-BF16, bf16 is ~3x faster")
    p.add_argument("--save-every", type=cli_args.positive_int, default=200, help="also write last.pt every N steps")
    p.add_argument("--eval-every", type=cli_args.non_negative_int, default=0, help="also validate every N steps (0: epochs only)")
    p.add_argument("--max-steps", type=cli_args.positive_int, default=None,
                   help="stop (after checkpointing) once this global step is reached; rerun to continue")
    p.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                   help="continue from OUT/last.pt if present (default on)")
    return p


def _trajectory_settings(args, data: Collected) -> dict:
    """Everything that determines the training trajectory; resuming requires it unchanged."""
    return {"base": args.base, "heads": args.heads, "layers": args.layers, "head_kind": args.head_kind,
            "speech_attention": args.speech_attention, "draft_vocab": args.draft_vocab,
            "soft_labels": args.soft_labels, "epochs": args.epochs,
            **({"prefix_attention": True} if args.prefix_attention else {}),
            "batch_size": args.batch_size, "lr": args.lr, "warmup_steps": args.warmup_steps,
            "val_fraction": args.val_fraction, "min_tokens": args.min_tokens, "seed": args.seed,
            "dtype": args.dtype, "amp": args.amp, "data": data.fingerprint(), "init_heads": args.init_heads}


def _print_accuracy(acc: dict) -> None:
    print("head | predicts | top-1  | top-5  | top-10 | positions   (tok+n: n tokens after the one the hidden produced)")
    for k, (t1, t5, tk, n) in enumerate(zip(acc["top1"], acc["top5"], acc["topk"], acc["n_positions"])):
        print(f"{k:4d} | tok+{k + 1:<4d} | {t1:6.3f} | {t5:6.3f} | {tk[-1]:6.3f} | {n}")


def _index_of(vocab, vocab_size: int):
    """token id -> its index in the draft vocabulary ``vocab`` (IGNORE outside it)."""
    import torch

    index = torch.full((vocab_size,), IGNORE, dtype=torch.long)
    index[vocab] = torch.arange(len(vocab))
    return index


class Trainer:
    """One training run: the model's heads, the data, the optimiser and the checkpoints in ``out``."""

    def __init__(self, args, model, data: Collected, amp: bool):
        import torch
        from transformers import get_cosine_schedule_with_warmup

        self.args, self.model, self.data, self.amp = args, model, data, amp
        self.train_utts, self.val_utts = split_utterances(data.ids, data.lengths, args.val_fraction, args.seed,
                                                          max(args.min_tokens, 2))
        if not self.train_utts:
            raise SystemExit("no training utterances (all shorter than --min-tokens?)")
        self.held_out = bool(self.val_utts)
        if not self.held_out:
            print("[train] WARNING: no validation split (too little data or --val-fraction 0); "
                  "best checkpoint and accuracy are measured on the training set")
            self.val_utts = self.train_utts
        self.steps_per_epoch = math.ceil(len(self.train_utts) / args.batch_size)
        self.total_steps = self.steps_per_epoch * args.epochs
        self.warmup = args.warmup_steps if args.warmup_steps is not None else min(100, max(1, self.total_steps // 10))
        self.settings = _trajectory_settings(args, data)
        self.paths = {name: os.path.join(args.out, name) for name in ("last.pt", "best.safetensors", "metrics.json")}
        self.params = trainable_head_parameters(model)
        if args.init_heads:  # fine-tune trained heads: their weights and their draft vocabulary
            from safetensors.torch import load_file

            load_heads_state(model, load_file(args.init_heads), grow=True)
        for p in model.parameters():
            p.requires_grad_(False)
        for p in self.params.values():
            p.requires_grad_(True)
        self.vocab_index = self._vocab_index()
        self.optimizer = torch.optim.AdamW(list(self.params.values()), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
        self.scheduler = get_cosine_schedule_with_warmup(self.optimizer, self.warmup, self.total_steps)
        self.step, self.best, self.history = 0, None, []

    def _vocab_index(self):
        """token id -> draft-vocabulary index (IGNORE outside it); sets the model's draft vocabulary."""
        import torch

        vocab_size = self.model.config.vocab_size
        train_tokens = torch.cat([self.data.tokens[int(self.data.starts[u]):int(self.data.starts[u] + self.data.lengths[u])]
                                  for u in self.train_utts])
        vocab = draft_vocabulary(train_tokens, self.args.draft_vocab, vocab_size)
        kept = self.model.draft_vocab if self.args.init_heads else None
        if kept is not None:  # the heads' own, and the new data's --draft-vocab most frequent
            vocab = kept.cpu() if vocab is None or not self.args.draft_vocab else torch.unique(torch.cat([kept.cpu(), vocab]))
        timestamps = timestamp_ids(self.model.base, vocab_size)
        if vocab is not None and timestamps is not None and bool((train_tokens >= int(timestamps[0])).any()):
            # a segment closes at any time: a vocabulary of the frequent ones cannot draft most of them
            vocab = torch.unique(torch.cat([vocab, timestamps]))
        if vocab is not None:
            self.model.set_draft_vocab(vocab)
            return _index_of(vocab, vocab_size)
        return torch.arange(vocab_size)

    def resume(self):

        ckpt = load_checkpoint(self.paths["last.pt"])
        if ckpt["settings"] != self.settings:
            changed = sorted(k for k in self.settings if ckpt["settings"].get(k) != self.settings[k])
            raise SystemExit(f"{self.paths['last.pt']} was trained with different settings ({', '.join(changed)}); "
                             "use --no-resume to start over or another --out")
        load_heads_state(self.model, ckpt["heads"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.scheduler.load_state_dict(ckpt["scheduler"])
        self.step, self.best, self.history = ckpt["step"], ckpt["best"], ckpt["history"]
        print(f"[train] resumed from {self.paths['last.pt']} at step {self.step}/{self.total_steps}")

    def save_last(self):
        torch_save_atomic(self.paths["last.pt"], {
            "heads": heads_state(self.model), "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(), "step": self.step, "best": self.best,
            "history": self.history, "settings": self.settings})

    def batch(self, step: int):
        epoch, b = divmod(step, self.steps_per_epoch)
        order = epoch_order(len(self.train_utts), self.args.seed, epoch)
        utts = [self.train_utts[i] for i in order[b * self.args.batch_size:(b + 1) * self.args.batch_size].tolist()]
        return make_batch(self.data, utts, self.args.heads, self.vocab_index, _device_of(self.model),
                          with_targets_hidden=bool(self.args.soft_labels))

    def train_step(self) -> float:
        import torch

        loss, _ = heads_loss(self.model, self.batch(self.step), self.args.soft_labels, self.amp)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(self.params.values()), 1.0)
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        return float(loss.detach())

    def validate(self, summary: dict):
        from tqdm.auto import tqdm

        result = evaluate(self.model, self.data, self.val_utts, self.args.heads, self.vocab_index, self.amp)
        record = {"step": self.step, "epoch": round(self.step / self.steps_per_epoch, 4), **result}
        self.history.append({k: record[k] for k in ("step", "epoch", "val_loss", "per_head_loss")}
                            | {"top1": result["head_accuracy"]["top1"]})
        tqdm.write(f"[train] step {self.step} epoch {record['epoch']:.2f}: val loss {result['val_loss']:.4f}, top-1 "
                   + " / ".join(f"{a:.3f}" for a in result["head_accuracy"]["top1"]))
        if self.best is None or result["val_loss"] < self.best["val_loss"]:
            self.best = record
            save_safetensors_atomic(self.paths["best.safetensors"], heads_state(self.model),
                                    metadata={"step": str(self.step), "val_loss": repr(result["val_loss"]),
                                              "base": self.args.base, **heads_metadata(self.model)})
        self.write_metrics(summary, finished=False)

    def write_metrics(self, summary: dict, finished: bool, extra: dict | None = None):
        if self.best is not None:
            write_json_atomic(self.paths["metrics.json"],
                              {**summary, **self.best, **(extra or {}), "finished": finished, "history": self.history})

    def run(self, summary: dict):
        from tqdm.auto import tqdm

        self.model.eval()  # the frozen base stays in eval mode; only the heads train
        self.model.medusa_heads.train()
        start_step, t0 = self.step, time.perf_counter()
        limit = self.total_steps if self.args.max_steps is None else min(self.total_steps, self.args.max_steps)
        bar = tqdm(total=self.total_steps, initial=self.step, unit="step", desc="train", dynamic_ncols=True)
        while self.step < limit:
            loss = self.train_step()
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}", lr=f"{self.scheduler.get_last_lr()[0]:.2e}")
            end_of_epoch = self.step % self.steps_per_epoch == 0
            if end_of_epoch or (self.args.eval_every and self.step % self.args.eval_every == 0):
                self.validate(summary)
            if end_of_epoch or self.step % self.args.save_every == 0 or self.step == limit:
                self.save_last()
        bar.close()
        seconds = time.perf_counter() - t0
        if self.step > start_step:
            print(f"[train] {self.step - start_step} steps in {seconds:.1f} s "
                  f"({(self.step - start_step) / max(seconds, 1e-9):.2f} steps/s)")
        return self.step >= self.total_steps

    def measure_drafts(self, eval_sets: dict) -> dict:
        """Replay the best heads on the held-out split (and ``eval_sets``): tokens per round per tree."""
        from safetensors.torch import load_file

        load_heads_state(self.model, load_file(self.paths["best.safetensors"]))
        trees = candidate_trees(self.best["head_accuracy"]["topk"], self.args.heads)
        memory = self.model.backbone.speech_memory_of if self.args.speech_attention else None
        out = {"draft_candidates": replay_candidates(self.model, self.data.recordings(self.val_utts, memory), trees)}
        for name, data in eval_sets.items():
            out.setdefault("eval_replay", {})[name] = replay_candidates(self.model, data.recordings(
                range(len(data.ids)), memory), trees)
        return out


def _run_summary(args, model, data: Collected, trainer: Trainer) -> dict:
    cfg = model.config
    return {
        "base": args.base, "family": getattr(cfg, "base_family", None),
        "heads": args.heads, "layers": args.layers, "head_kind": args.head_kind,
        "speech_attention": args.speech_attention, "draft_vocab_size": getattr(cfg, "draft_vocab_size", None),
        "hidden_size": cfg.hidden_size, "vocab_size": cfg.vocab_size,
        "data": {"dir": [os.path.abspath(d) for d in args.data] if len(args.data) > 1 else os.path.abspath(args.data[0]),
                 **data.fingerprint(),
                 "n_train_utterances": len(trainer.train_utts),
                 "n_val_utterances": len(trainer.val_utts) if trainer.held_out else 0,
                 "n_train_tokens": int(data.lengths[trainer.train_utts].sum()),
                 "collected_with": {k: data.meta.get(k) for k in ("base", "family", "dtype", "max_new_tokens")}},
        "train_args": {**{k: v for k, v in trainer.settings.items() if k != "data"}, "warmup_steps": trainer.warmup,
                       "optimizer": "AdamW(betas=(0.9, 0.95), weight_decay=0)", "schedule": "warmup+cosine",
                       "grad_clip": 1.0},
        "held_out": trainer.held_out, "total_steps": trainer.total_steps, "steps_per_epoch": trainer.steps_per_epoch,
    }


def main(argv=None, model=None) -> dict:
    """Train; returns the metrics dict. ``model`` (a MedusaForASR-like object) may be injected."""
    args = build_parser().parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.speech_attention and args.head_kind != "path":
        raise SystemExit("--speech-attention needs --head-kind path")
    device = parse_device(args.device)
    dtype = parse_dtype(args.dtype, device)
    amp = args.amp == "bf16" or (args.amp == "auto" and str(device).startswith("cuda"))
    os.makedirs(args.out, exist_ok=True)
    remove_stale_temporaries(args.out)
    data = Collected(args.data, with_speech=args.speech_attention)
    torch.manual_seed(args.seed)
    if model is None:
        model = build_model(args, dtype, device)
    cfg = model.config
    if (cfg.medusa_num_heads, cfg.medusa_num_layers, cfg.head_kind) != (args.heads, args.layers, args.head_kind):
        raise SystemExit(f"model has {cfg.medusa_num_heads} {cfg.head_kind} heads x {cfg.medusa_num_layers} layers, "
                         f"asked for --heads {args.heads} --layers {args.layers} --head-kind {args.head_kind}")
    if args.prefix_attention:
        if args.head_kind != "path":
            raise SystemExit("--prefix-attention needs --head-kind path")
        from pipeline.prefix_attention import PrefixAttention

        heads_weight = next(model.medusa_heads.parameters())
        model.medusa_heads.prefix = PrefixAttention(cfg.hidden_size).to(heads_weight.device, heads_weight.dtype)
    if data.hidden_size != cfg.hidden_size:
        raise SystemExit(f"shards have hidden size {data.hidden_size}, the base {cfg.hidden_size}: "
                         f"were they collected from another base?")
    if data.meta.get("base") not in (None, args.base):
        print(f"[train] note: shards were collected with --base {data.meta.get('base')!r}")
    data.to(_device_of(model) if _device_of(model).type != "cpu" else "cpu")
    # (opened before training: a missing evaluation set fails here, not after the last epoch)
    eval_sets = {_folder_name(d): Collected(d, with_speech=args.speech_attention).to(data.hiddens.device)
                 for d in args.eval_data}
    trainer = Trainer(args, model, data, amp)
    if args.resume and os.path.exists(trainer.paths["last.pt"]):
        trainer.resume()
    summary = _run_summary(args, model, data, trainer)
    finished = trainer.run(summary)
    if not finished:
        trainer.write_metrics(summary, finished=False)
        print(f"[train] stopped at step {trainer.step}/{trainer.total_steps} (--max-steps); rerun to resume")
        return {**summary, **(trainer.best or {}), "finished": False, "history": trainer.history}
    drafts = trainer.measure_drafts(eval_sets)
    trainer.write_metrics(summary, finished=True, extra=drafts)
    best = trainer.best
    print(f"[train] best: step {best['step']} (epoch {best['epoch']}), val loss {best['val_loss']:.4f}"
          f"{'' if trainer.held_out else ' (training set!)'} -> {trainer.paths['best.safetensors']}")
    _print_accuracy(best["head_accuracy"])
    for row in drafts["draft_candidates"]:
        replays = "".join(f", {name} {next(r['tokens_per_round'] for r in rows if r['paths'] == row['paths']):.3f}"
                          for name, rows in drafts.get("eval_replay", {}).items())
        print(f"[train] {row['name']}: {row['tokens_per_round']:.3f} tokens/round held out{replays}")
    return {**summary, **best, **drafts, "finished": True, "history": trainer.history}


if __name__ == "__main__":
    sys.exit(run_cli(main))
