"""The paired WER difference of two runs on the same clips (tools.wer_difference)."""

import json

from tools.wer_difference import main, paired_clips, wer_difference


def results(texts: dict[str, str]) -> dict:
    references = {"a": "the cat sat on the mat", "b": "a dog ran home", "c": "birds sing at dawn today",
                  "d": "unmatched"}
    return {"clips": [{"id": clip, "reference": references[clip], "baseline": {"text": text}}
                      for clip, text in texts.items()]}


def test_identical_runs_differ_by_nothing_and_one_more_error_moves_the_difference_by_one_word():
    first = results({"a": "The cat sat on the mat.", "b": "A dog ran home.", "c": "Birds sing at dawn today."})
    same = wer_difference(paired_clips(first, first, "baseline"), resamples=200)
    assert same["difference_points"] == 0 and same["interval_points"] == [0.0, 0.0] and same["words"] == 15
    worse = results({"a": "The cat sat on a mat.", "b": "A dog ran home.", "c": "Birds sing at dawn today."})
    row = wer_difference(paired_clips(first, worse, "baseline"), resamples=200)
    assert row["word_edits_second"] - row["word_edits_first"] == 1
    assert abs(row["difference_points"] - 100 / 15) < 1e-9
    low, high = row["interval_points"]
    assert low <= row["difference_points"] <= high and low >= 0  # no resample can have fewer errors than the first
    assert row["clips_transcribed_differently"] == 1


def test_clips_are_matched_by_id_and_a_row_is_written_with_its_command(tmp_path):
    first = results({"a": "the cat sat on the mat", "b": "a dog ran home", "c": "birds sing at dawn today"})
    second = results({"b": "a dog ran", "c": "birds sing at dawn today", "d": "unmatched"})  # shares b and c
    paths = []
    for name, run in (("first", first), ("second", second)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(run))
    out = tmp_path / "wer_difference.json"
    main([str(paths[0]), str(paths[1]), "--out", str(out), "--resamples", "100"])
    [row] = json.loads(out.read_text())
    assert row["clips"] == 2 and row["words"] == 9 and row["difference_points"] == 100 / 9
    assert row["command"].startswith("python -m tools.wer_difference")


def heads_run(rounds: dict[str, tuple[int, int]]) -> dict:
    return {"clips": [{"id": clip, "medusa": {"stats": {"emitted_tokens": tokens, "row_rounds": n}}}
                      for clip, (tokens, n) in rounds.items()]}


def test_tokens_a_pass_differ_by_the_rounds_the_second_run_needed_more(tmp_path):
    from tools.wer_difference import paired_rounds, pass_difference

    first = heads_run({"a": (12, 4), "b": (9, 3), "c": (6, 2)})
    same = pass_difference(paired_rounds(first, first), resamples=200)
    assert same["difference_percent"] == 0 and same["interval_percent"] == [0.0, 0.0]
    slower = heads_run({"a": (12, 6), "b": (9, 3), "c": (6, 2), "d": (1, 1)})  # a took two rounds more; d unmatched
    row = pass_difference(paired_rounds(first, slower), resamples=200)
    assert (row["clips"], row["rounds_first"], row["rounds_second"]) == (3, 9, 11)
    assert abs(row["difference_percent"] - 100 * (27 / 11 / 3 - 1)) < 1e-9
    low, high = row["interval_percent"]
    assert low <= row["difference_percent"] <= high == 0.0  # no resample has the second run faster
    paths = [tmp_path / "first.json", tmp_path / "second.json"]
    for path, run in zip(paths, (first, slower)):
        path.write_text(json.dumps(run))
    out = tmp_path / "differences.json"
    main([str(paths[0]), str(paths[1]), "--metric", "tokens_per_pass", "--out", str(out), "--resamples", "100"])
    [row] = json.loads(out.read_text())
    assert row["metric"] == "tokens_per_pass" and "--metric tokens_per_pass" in row["command"]
