"""The GPU benchmark's Whisper-large-v3 shapes (``tools.benchmark_gpu --shape whisper-large-v3*``), run end to end on a
CPU at tiny widths (``--device cpu --tiny``): the same code path the GPU run takes, with the replayed drafts (the
shipped whisper-base heads' measured top-k) giving exactly the base's own greedy, the library's generate agreeing
with it, and every row labelled speed-only with its acceptance source and its call without the encoder."""

import json

import torch

from conftest import requires_transformers5

pytestmark = requires_transformers5


def test_whisper_shape_rows_are_exact_and_labelled(tmp_path):
    from tools import benchmark_gpu
    from tools.whisper_shaped import PROFILE

    out = tmp_path / "gpu"
    with torch.no_grad():
        benchmark_gpu.main(["--shape", "whisper-large-v3-turbo", "--device", "cpu", "--tiny", "--text-layers", "1",
                            "--sections", "lengths,batching", "--lengths", "6", "--batches", "2",
                            "--batch-new-tokens", "6", "--length-drafts", "none,chain", "--batch-drafts", "none,chain",
                            "--repeats", "1", "--out", str(out)])
    result = json.loads((out / "results-whisper-large-v3-turbo.json").read_text())
    assert result["profile"] == PROFILE and result["speed_only"] is True and result["text_layers"] == 1
    assert {m["nodes"] for m in result["replayed_profile"]["heads_measured_tokens_per_round"]} >= {4, 32}
    rows = result["lengths"] + result["batching"]
    assert not [r for r in rows if "error" in r]
    assert {(r["method"], r["batch"]) for r in rows} == {(m, b) for m in ("ours", "ours_greedy", "hf_static", "hf_dynamic")
                                                         for b in (1, 2)}
    for row in rows:
        assert row["speed_only"] is True and "whisper-base" in row["acceptance"] and row["weights"].startswith("random")
        assert row["call_tok_per_s"] > 0 and row["decode_tok_per_s"] > 0
        if row["method"].startswith("ours"):  # (ours without the encoder: the call less its measured time)
            assert row["exact"] and row["first_divergence"] is None and row["decode_tok_per_s"] > row["call_tok_per_s"]
        else:
            assert row["matches_our_greedy"]
    drafted = [r for r in rows if r["method"] == "ours"]
    assert all(r["profile"] == PROFILE and r["draft"] == "chain-4" and r["tokens_per_round"] > 1 for r in drafted)
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["decode"]) == len(rows) and all(r["speed_only"] for r in summary["decode"])
    assert "Whole calls and decode alone" in (out / "results-whisper-large-v3-turbo.md").read_text()
