"""Where timestamped decoding spends its extra rounds, replayed on recorded timestamped transcripts.

    python -m pipeline.timestamp_rounds --heads ARTIFACT --data work_data/collect_real_ts --draft tree-32 \\
        [--out DIR]

A round ends at the first token the draft missed, which the base then emits itself. This replays the heads'
draft (``pipeline.acceptance``: the states a live decoder would have) over the recordings of
``pipeline.collect --timestamps`` and counts the rounds by that token: text, a timestamp that closes a
segment, the same timestamp opening the next, or the end of the transcript right after a closing timestamp. A
closing timestamp the draft missed costs a second round as well, of one token when the transcript ends there: the
base must see the timestamp before it can end (``end_rounds_of_one_token``). It also reports how often
a closing timestamp's exact value is known in advance: the heads' first draft where the next token closes a
segment, and the base's own most likely timestamp one and two tokens earlier. Writes OUT/timestamp_rounds.json.
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

import torch

from pipeline.acceptance import _ReplayState, tokens_per_round
from pipeline.train import collected_recordings, timestamp_ids
from tools.files import command_line, write_json_atomic

ROUND_ENDS = ("text", "closing timestamp", "opening timestamp", "end after a closing timestamp")


def round_end(tokens: list, at: int, timestamp_begin: int, eos: set) -> str:
    """What the base emitted itself at ``tokens[at]``, the token a round's draft missed."""
    token, before = tokens[at], tokens[at - 1] if at else -1
    if token in eos:
        return ROUND_ENDS[3] if before >= timestamp_begin else ROUND_ENDS[0]
    if token >= timestamp_begin:
        return ROUND_ENDS[2] if before >= timestamp_begin else ROUND_ENDS[1]
    return ROUND_ENDS[0]


@torch.no_grad()
def replay_round_ends(drafter, tree, recordings, timestamp_begin: int, eos: set) -> dict:
    """Rounds and tokens of the replayed draft, the rounds by the token that ended them, and how many rounds emitted
    nothing but the end after a closing timestamp."""
    replay = tokens_per_round(drafter, tree, recordings, round_ends=True)
    ends, single = collections.Counter(), 0
    for rec, positions in zip(recordings, replay["round_ends"]):
        tokens, before = rec.tokens.tolist(), 0
        for position in positions:
            end = round_end(tokens, position, timestamp_begin, eos)
            ends[end] += 1
            single += end == ROUND_ENDS[3] and position - before == 1
            before = position
    return {"rounds": replay["rounds"], "tokens": replay["tokens"],
            "tokens_per_round": round(replay["tokens_per_round"], 4),
            "rounds_by_end": {end: ends[end] for end in ROUND_ENDS}, "end_rounds_of_one_token": single}


@torch.no_grad()
def closing_values_known(drafter, recordings, projection: torch.Tensor, timestamp_begin: int) -> dict:
    """At each closing timestamp: whether the heads' first draft one token earlier is it, and whether the base's own
    most likely timestamp (its logits, the rules aside) one and two tokens earlier is it."""
    counts = collections.Counter()
    for rec in recordings:
        tokens = rec.tokens.tolist()
        likeliest = (rec.hiddens.float() @ projection[timestamp_begin:].float().T).argmax(-1) + timestamp_begin
        for at in range(2, len(tokens)):
            if tokens[at] < timestamp_begin or tokens[at - 1] >= timestamp_begin:
                continue
            counts["closing timestamps"] += 1
            state = _ReplayState(rec.hiddens[at - 1:at], rec.tokens[at - 1:at], rec.speech)
            counts["heads' first draft"] += int(drafter(state)[0, 1]) == tokens[at]
            counts["base, one token earlier"] += int(likeliest[at - 1]) == tokens[at]
            counts["base, two tokens earlier"] += int(likeliest[at - 2]) == tokens[at]
    return dict(counts)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pipeline.timestamp_rounds", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--heads", required=True, help="an exported artifact (its heads and its base)")
    p.add_argument("--data", required=True, action="append",
                   help="a folder of `pipeline.collect --timestamps --speech`; repeatable")
    p.add_argument("--draft", default="tree-32", help="the draft to replay (chain, tree, tree-N)")
    p.add_argument("--out", default=None, help="folder for timestamp_rounds.json")
    return p


def main(argv=None) -> dict:
    args = build_parser().parse_args(argv)
    from transformers import AutoModel

    model = AutoModel.from_pretrained(args.heads, trust_remote_code=True).eval()
    timestamps = timestamp_ids(model.base, model.config.vocab_size)
    if timestamps is None:
        raise SystemExit(f"{args.heads}: its base has no timestamp tokens (a Whisper base has)")
    eos = model.base.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    tree = model.draft_policy.resolve(args.draft)
    drafter = model.make_drafter(tree, "cpu")
    result = {"command": command_line("pipeline.timestamp_rounds", argv), "heads": args.heads, "draft": args.draft,
              "data": {}}
    for folder in args.data:
        recordings = collected_recordings(model, folder)
        row = replay_round_ends(drafter, tree, recordings, int(timestamps[0]), eos)
        row["closing_values_known"] = closing_values_known(drafter, recordings, model.base.proj_out.weight,
                                                           int(timestamps[0]))
        result["data"][folder] = row
        print(f"[timestamp_rounds] {folder}: {json.dumps(row)}")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        write_json_atomic(Path(args.out) / "timestamp_rounds.json", result)
    return result


if __name__ == "__main__":
    main()
