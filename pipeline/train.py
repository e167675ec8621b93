"""Stage 2: train Medusa heads on the hidden states recorded by ``pipeline.collect``.

    python -m pipeline.train --data work_data/collect --base openai/whisper-tiny.en --out work_data/ckpt

Head ``k`` (0-based) at position ``t`` learns to predict ``tokens[t+k+1]`` from ``hiddens[t]``
(the hidden state whose argmax was ``tokens[t]``), through ``model.head_logits`` -- the heads
followed by the frozen base's own output projection. Loss = sum over heads of the masked-mean
cross-entropy. AdamW (betas 0.9/0.95, no weight decay), linear warm-up then cosine decay,
gradient clipping at 1.0. A held-out split of whole utterances (chosen deterministically from
``--seed`` and the utterance ids) selects the best checkpoint and measures per-head top-k accuracy.

Outputs in ``--out``:
* ``last.pt``           heads + optimizer + scheduler + step (written every epoch and every
                        ``--save-every`` steps); a rerun resumes from it (``--no-resume`` to restart)
* ``best.safetensors``  heads only, best validation loss so far
* ``metrics.json``      the best checkpoint's validation loss and per-head accuracy
                        (``head_accuracy = {"top1", "top5", "topk"}``; ``topk[k][j-1]`` = acc@j, j<=10)
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import sys
import time

from pipeline.collect import (
    atomic_save_safetensors,
    run_cli,
    atomic_torch_save,
    atomic_write_json,
    base_folder,
    default_device,
    import_medusa,
    list_shards,
    load_shard,
    parse_dtype,
)

TOPK = 10
IGNORE = -100


# --------------------------------------------------------------------------- data
class Collected:
    """All shards of a collect folder, concatenated: utterance u is tokens[starts[u]:starts[u]+lengths[u]]."""

    def __init__(self, data_dir: str):
        import torch

        shards = list_shards(data_dir)
        if not shards:
            raise SystemExit(f"no shard_*.safetensors in {data_dir}; run `python -m pipeline.collect` first")
        hiddens, tokens, starts, lengths, self.ids, self.meta = [], [], [], [], [], {}
        offset = 0
        for path in shards:
            h, t, off, meta = load_shard(path)
            if self.meta and meta.get("base") != self.meta.get("base"):
                raise SystemExit(f"{path}: base {meta.get('base')!r} differs from the other shards'")
            self.meta = self.meta or meta
            hiddens.append(h)
            tokens.append(t)
            starts.append(off[:-1] + offset)
            lengths.append(off[1:] - off[:-1])
            self.ids.extend(meta["utterance_ids"])
            offset += int(t.numel())
        self.hiddens = torch.cat(hiddens)
        self.tokens = torch.cat(tokens)
        self.starts = torch.cat(starts)
        self.lengths = torch.cat(lengths)
        self.shard_names = [os.path.basename(p) for p in shards]
        if len(set(self.ids)) != len(self.ids):
            raise SystemExit(f"{data_dir}: duplicate utterance ids across shards")

    @property
    def hidden_size(self) -> int:
        return int(self.hiddens.shape[-1])

    def fingerprint(self) -> dict:
        return {"shards": self.shard_names, "n_utterances": len(self.ids), "n_tokens": int(self.tokens.numel())}


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


def batch_targets(data: Collected, utts, num_heads: int):
    """Flatten utterances into token positions that have at least one target.

    Returns (positions LongTensor[M] into data.hiddens, targets LongTensor[M, K] with IGNORE where
    head k's target ``t+k+1`` falls past the end of the utterance).
    """
    import torch

    utts = torch.as_tensor(utts, dtype=torch.long)
    starts, lengths = data.starts[utts], data.lengths[utts]
    n = (lengths - 1).clamp(min=0)  # positions with a next token
    owner = torch.repeat_interleave(torch.arange(len(utts)), n)
    local = torch.arange(int(n.sum())) - torch.repeat_interleave(torch.cumsum(n, 0) - n, n)
    positions = starts[owner] + local
    remaining = (lengths - 1)[owner] - local  # tokens after position t within the utterance (>= 1)
    k = torch.arange(num_heads)
    valid = remaining[:, None] > k[None, :]
    index = torch.where(valid, positions[:, None] + k[None, :] + 1, torch.zeros_like(valid, dtype=torch.long))
    targets = torch.where(valid, data.tokens[index], torch.full_like(index, IGNORE))
    return positions, targets


# --------------------------------------------------------------------------- model
def trainable_head_parameters(model) -> dict:
    """The heads' own parameters (anything shared with the base, e.g. its output projection, excluded)."""
    head_ids = {id(p) for p in model.medusa_heads.parameters()}
    shared = {id(p) for n, p in model.named_parameters(remove_duplicate=False)
              if not n.startswith("medusa_heads.") and id(p) in head_ids}
    return {n: p for n, p in model.medusa_heads.named_parameters() if id(p) not in shared}


def heads_state(model) -> dict:
    return {n: p.detach().to("cpu").clone().contiguous() for n, p in trainable_head_parameters(model).items()}


def load_heads_state(model, state: dict) -> None:
    expected = set(trainable_head_parameters(model))
    missing, unexpected = expected - set(state), set(state) - expected
    if missing or unexpected:
        raise SystemExit(f"heads checkpoint does not match the model: missing {sorted(missing)}, "
                         f"unexpected {sorted(unexpected)}")
    model.medusa_heads.load_state_dict(state, strict=False)


def build_model(base: str, heads: int, layers: int, dtype, device):
    medusa = import_medusa()
    return medusa.MedusaForASR.from_base(base_folder(base), medusa_num_heads=heads, medusa_num_layers=layers,
                                         torch_dtype=dtype, device_map=device)


def _device_of(model):
    return next(iter(trainable_head_parameters(model).values())).device


def _autocast(device, amp: bool):
    import contextlib

    import torch

    if not amp:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)


def heads_loss(model, hiddens, targets, dtype, amp: bool = False):
    """Sum over heads of masked-mean cross-entropy; also returns the per-head losses.

    One cross-entropy over all [M, K] (position, head) pairs with IGNORE targets, then a per-head
    mean: no boolean-mask copies of the [M, K, V] logits (several times faster on CPU).
    """
    import torch
    import torch.nn.functional as F

    with _autocast(hiddens.device, amp):
        logits = model.head_logits(hiddens.to(dtype))  # [M, K, V]
    m, k, v = logits.shape
    ce = F.cross_entropy(logits.reshape(m * k, v).float(), targets.reshape(-1), ignore_index=IGNORE,
                         reduction="none").view(m, k)
    count = (targets != IGNORE).sum(0)
    per_head = ce.sum(0) / count.clamp(min=1)  # heads with no target this batch contribute 0
    per_head_list = [float(x) if int(c) else float("nan") for x, c in zip(per_head.detach(), count)]
    return per_head.sum(), per_head_list


def evaluate(model, data: Collected, utts, num_heads: int, dtype, max_positions: int | None = None,
             amp: bool = False) -> dict:
    """Per-head mean CE and top-1..10 accuracy over every position of ``utts`` (order independent)."""
    import torch
    import torch.nn.functional as F

    device = _device_of(model)
    if max_positions is None:  # bound the [positions, K, V] logits to ~2e8 elements
        max_positions = max(32, min(4096, int(2e8 // (num_heads * model.config.vocab_size))))
    ce_sum = torch.zeros(num_heads, dtype=torch.float64)
    count = torch.zeros(num_heads, dtype=torch.float64)
    hits = torch.zeros(num_heads, TOPK, dtype=torch.float64)
    chunk, budget = [], 0
    groups = []
    for u in utts:
        chunk.append(u)
        budget += max(int(data.lengths[u]) - 1, 0)
        if budget >= max_positions:
            groups.append(chunk)
            chunk, budget = [], 0
    if chunk:
        groups.append(chunk)
    was_training = model.medusa_heads.training
    model.medusa_heads.eval()
    with torch.no_grad():
        for group in groups:
            positions, targets = batch_targets(data, group, num_heads)
            if positions.numel() == 0:
                continue
            with _autocast(device, amp):
                logits = model.head_logits(data.hiddens[positions.to(data.hiddens.device)].to(device, dtype))
            targets = targets.to(device)
            for k in range(num_heads):
                valid = targets[:, k] != IGNORE
                if not bool(valid.any()):
                    continue
                lg, tg = logits[valid, k].float(), targets[valid, k]
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
def lr_factor(step: int, warmup: int, total: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def epoch_order(n: int, seed: int, epoch: int):
    import torch

    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g)


# --------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pipeline.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="collect output folder (shard_*.safetensors)")
    p.add_argument("--base", required=True, help="base model (its output projection is used)")
    p.add_argument("--out", default="work_data/ckpt", help="checkpoint folder")
    p.add_argument("--heads", type=int, default=4, help="number of Medusa heads K")
    p.add_argument("--layers", type=int, default=1, help="residual blocks per head")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=16, help="utterances per step")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup-steps", type=int, default=None,
                   help="linear warm-up steps (default: min(100, 10%% of all steps))")
    p.add_argument("--val-fraction", type=float, default=0.05)
    p.add_argument("--min-tokens", type=int, default=2, help="drop utterances with fewer tokens")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default="float32", help="dtype of the base projection and heads during "
                                                      "training (float32 recommended)")
    p.add_argument("--amp", choices=("auto", "bf16", "off"), default="auto",
                   help="bf16 autocast of the heads + output projection (master weights stay in --dtype). "
                        "auto: on for CUDA, off on CPU. On CPUs with AMX/AVX512-BF16, bf16 is ~3x faster")
    p.add_argument("--save-every", type=int, default=200, help="also write last.pt every N steps")
    p.add_argument("--eval-every", type=int, default=0, help="also validate every N steps (0: epochs only)")
    p.add_argument("--max-steps", type=int, default=None,
                   help="stop (after checkpointing) once this global step is reached; rerun to continue")
    p.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                   help="continue from OUT/last.pt if present (default on)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    return p


def _trajectory_settings(args, data: Collected) -> dict:
    """Everything that determines the training trajectory; resuming requires it unchanged."""
    return {"base": args.base, "heads": args.heads, "layers": args.layers, "epochs": args.epochs,
            "batch_size": args.batch_size, "lr": args.lr, "warmup_steps": args.warmup_steps,
            "val_fraction": args.val_fraction, "min_tokens": args.min_tokens, "seed": args.seed,
            "dtype": args.dtype, "amp": args.amp, "data": data.fingerprint()}


def _print_accuracy(acc: dict) -> None:
    print("head | predicts | top-1  | top-5  | top-10 | positions   (tok+n: n tokens after the one the hidden produced)")
    for k, (t1, t5, tk, n) in enumerate(zip(acc["top1"], acc["top5"], acc["topk"], acc["n_positions"])):
        print(f"{k:4d} | tok+{k + 1:<4d} | {t1:6.3f} | {t5:6.3f} | {tk[-1]:6.3f} | {n}")


def main(argv=None, model=None) -> dict:
    """Train; returns the metrics dict. ``model`` (a MedusaForASR-like object) may be injected."""
    args = build_parser().parse_args(argv)
    import torch
    from tqdm.auto import tqdm

    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device or default_device()
    dtype = parse_dtype(args.dtype, device)
    amp = args.amp == "bf16" or (args.amp == "auto" and str(device).startswith("cuda"))
    os.makedirs(args.out, exist_ok=True)
    last_path = os.path.join(args.out, "last.pt")
    best_path = os.path.join(args.out, "best.safetensors")
    metrics_path = os.path.join(args.out, "metrics.json")

    data = Collected(args.data)
    train_utts, val_utts = split_utterances(data.ids, data.lengths, args.val_fraction, args.seed,
                                            max(args.min_tokens, 2))
    if not train_utts:
        raise SystemExit("no training utterances (all shorter than --min-tokens?)")
    held_out = bool(val_utts)
    if not held_out:
        print("[train] WARNING: no validation split (too little data or --val-fraction 0); "
              "best checkpoint and accuracy are measured on the training set")
        val_utts = train_utts
    steps_per_epoch = math.ceil(len(train_utts) / args.batch_size)
    total_steps = steps_per_epoch * args.epochs
    warmup = args.warmup_steps if args.warmup_steps is not None else min(100, max(1, total_steps // 10))
    settings = _trajectory_settings(args, data)

    torch.manual_seed(args.seed)
    if model is None:
        model = build_model(args.base, args.heads, args.layers, dtype, device)
    for p in model.parameters():
        p.requires_grad_(False)
    params = trainable_head_parameters(model)
    for p in params.values():
        p.requires_grad_(True)
    cfg = model.config
    if (cfg.medusa_num_heads, cfg.medusa_num_layers) != (args.heads, args.layers):
        raise SystemExit(f"model has {cfg.medusa_num_heads} heads x {cfg.medusa_num_layers} layers, "
                         f"asked for --heads {args.heads} --layers {args.layers}")
    if data.hidden_size != cfg.hidden_size:
        raise SystemExit(f"shards have hidden size {data.hidden_size}, the base {cfg.hidden_size}: "
                         f"were they collected from another base?")
    if data.meta.get("base") not in (None, args.base):
        print(f"[train] note: shards were collected with --base {data.meta.get('base')!r}")
    model_device = _device_of(model)
    if model_device.type != "cpu":  # keep the recorded hidden states next to the heads (bf16)
        data.hiddens = data.hiddens.to(model_device)

    optimizer = torch.optim.AdamW(list(params.values()), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, warmup, total_steps))
    step, best, history = 0, None, []

    if args.resume and os.path.exists(last_path):
        ckpt = load_checkpoint(last_path)
        if ckpt["settings"] != settings:
            changed = sorted(k for k in settings if ckpt["settings"].get(k) != settings[k])
            raise SystemExit(f"{last_path} was trained with different settings ({', '.join(changed)}); "
                             "use --no-resume to start over or another --out")
        load_heads_state(model, ckpt["heads"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        step, best, history = ckpt["step"], ckpt["best"], ckpt["history"]
        print(f"[train] resumed from {last_path} at step {step}/{total_steps}")

    summary = {
        "base": args.base, "family": getattr(cfg, "base_family", None),
        "heads": args.heads, "layers": args.layers,
        "hidden_size": cfg.hidden_size, "vocab_size": cfg.vocab_size,
        "data": {"dir": os.path.abspath(args.data), **data.fingerprint(),
                 "n_train_utterances": len(train_utts),
                 "n_val_utterances": len(val_utts) if held_out else 0,
                 "n_train_tokens": int(data.lengths[train_utts].sum()),
                 "collected_with": {k: data.meta.get(k) for k in ("base", "family", "dtype", "max_new_tokens")}},
        "train_args": {**{k: v for k, v in settings.items() if k != "data"}, "warmup_steps": warmup,
                       "optimizer": "AdamW(betas=(0.9, 0.95), weight_decay=0)", "schedule": "warmup+cosine",
                       "grad_clip": 1.0},
        "held_out": held_out, "total_steps": total_steps, "steps_per_epoch": steps_per_epoch,
    }

    def save_last():
        atomic_torch_save(last_path, {"heads": heads_state(model), "optimizer": optimizer.state_dict(),
                                      "scheduler": scheduler.state_dict(), "step": step, "best": best,
                                      "history": history, "settings": settings})

    def write_metrics(finished: bool):
        if best is None:
            return
        atomic_write_json(metrics_path, {**summary, **best, "finished": finished, "history": history})

    def validate(epoch_done: float):
        nonlocal best
        result = evaluate(model, data, val_utts, args.heads, dtype, amp=amp)
        record = {"step": step, "epoch": round(epoch_done, 4), **result}
        history.append({k: record[k] for k in ("step", "epoch", "val_loss", "per_head_loss")}
                       | {"top1": result["head_accuracy"]["top1"]})
        tqdm.write(f"[train] step {step} epoch {epoch_done:.2f}: val loss {result['val_loss']:.4f}, top-1 "
                   + " / ".join(f"{a:.3f}" for a in result["head_accuracy"]["top1"]))
        if best is None or result["val_loss"] < best["val_loss"]:
            best = record
            atomic_save_safetensors(best_path, heads_state(model),
                                    metadata={"step": str(step), "val_loss": repr(result["val_loss"]),
                                              "base": args.base})
        write_metrics(finished=False)

    model.eval()  # the frozen base stays in eval mode; only the heads train
    model.medusa_heads.train()
    start_step, t0 = step, time.perf_counter()
    bar = tqdm(total=total_steps, initial=step, unit="step", desc="train", dynamic_ncols=True)
    order, order_epoch = None, -1
    while step < total_steps and (args.max_steps is None or step < args.max_steps):
        epoch, b = divmod(step, steps_per_epoch)
        if epoch != order_epoch:
            order, order_epoch = epoch_order(len(train_utts), args.seed, epoch), epoch
        batch = [train_utts[i] for i in order[b * args.batch_size:(b + 1) * args.batch_size].tolist()]
        positions, targets = batch_targets(data, batch, args.heads)
        hiddens = data.hiddens[positions.to(data.hiddens.device)].to(model_device)
        loss, per_head = heads_loss(model, hiddens, targets.to(model_device), dtype, amp)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        optimizer.step()
        scheduler.step()
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{float(loss.detach()):.3f}", lr=f"{scheduler.get_last_lr()[0]:.2e}")
        end_of_epoch = step % steps_per_epoch == 0
        if end_of_epoch or (args.eval_every and step % args.eval_every == 0):
            validate(step / steps_per_epoch)
        if end_of_epoch or step % args.save_every == 0 or step == total_steps or step == args.max_steps:
            save_last()
    bar.close()
    seconds = time.perf_counter() - t0
    if step > start_step:
        print(f"[train] {step - start_step} steps in {seconds:.1f} s "
              f"({(step - start_step) / max(seconds, 1e-9):.2f} steps/s)")
    finished = step >= total_steps
    write_metrics(finished)
    if not finished:
        print(f"[train] stopped at step {step}/{total_steps} (--max-steps); rerun to resume")
    if best is not None:
        print(f"[train] best: step {best['step']} (epoch {best['epoch']}), val loss {best['val_loss']:.4f}"
              f"{'' if held_out else ' (training set!)'} -> {best_path}")
        _print_accuracy(best["head_accuracy"])
        return {**summary, **best, "finished": finished, "history": history}
    return {**summary, "finished": finished, "history": history}


if __name__ == "__main__":
    sys.exit(run_cli(main))
