"""Where timestamped rounds end: counted on a transcript whose every round is known by hand."""

import torch

TB, EOS = 100, 99  # timestamps are the ids from TB on
TOKENS = torch.tensor([TB, 5, 6, 7, 8, TB + 40, TB + 40, 9, 10, TB + 70, EOS])


def never_a_timestamp(state):
    """Drafts the transcript itself, but a wrong token wherever it has a timestamp (hidden = position)."""
    at = int(state.hidden[0, 0])
    ahead = [t if t < TB else 1 for t in TOKENS[at + 1:at + 4].tolist()]
    return torch.tensor([[int(state.next_token[0]), *ahead, *[1] * (3 - len(ahead))]])


def recording():
    from pipeline.acceptance import Recording

    return Recording(TOKENS, torch.arange(len(TOKENS)).float()[:, None])


def test_rounds_are_counted_by_the_token_the_draft_missed():
    from draft_trees import DraftTree
    from pipeline.acceptance import tokens_per_round
    from pipeline.timestamp_rounds import replay_round_ends

    tree = DraftTree.chain(3)
    row = replay_round_ends(never_a_timestamp, tree, [recording()], TB, {EOS})
    # 0 -> 4 (three drafts and the base's 8), -> 5 (closing 40), -> 6 (opening 40), -> 9 (9, 10, closing 70), -> EOS
    assert row["rounds_by_end"] == {"text": 1, "closing timestamp": 2, "opening timestamp": 1,
                                    "end after a closing timestamp": 1}
    assert row["end_rounds_of_one_token"] == 1
    replay = tokens_per_round(never_a_timestamp, tree, [recording()])
    assert (row["rounds"], row["tokens"]) == (replay["rounds"], replay["tokens"]) == (5, 10)


def test_closing_values_known_in_advance():
    from pipeline.timestamp_rounds import closing_values_known

    projection = torch.zeros(TB + 80, 1)
    projection[TB + 40] = 1.0  # the base's likeliest timestamp: 40 wherever its hidden (the position) is positive
    counts = closing_values_known(never_a_timestamp, [recording()], projection, TB)
    # closing 40 at 5: the base said 40 at 4 and 3; closing 70 at 9: never; the heads never draft a timestamp
    assert counts == {"closing timestamps": 2, "heads' first draft": 0, "base, one token earlier": 1,
                      "base, two tokens earlier": 1}
