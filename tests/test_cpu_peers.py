"""tools.benchmark_cpu_peers' rows from measured seconds and texts (no timing, no faster-whisper needed)."""

import pytest

from tools import benchmark_cpu_peers as peers
from tools import results_tables

META = {"model": "heads/x", "cpu": "a CPU", "load_before": [1.0, 1.0, 1.0], "load_after": [2.0, 1.5, 1.0],
        "command": "python -m tools.benchmark_cpu_peers --model heads/x", "date": "2026-12-06"}
REFERENCES = ["the cat sat", "a dog ran"]


def test_rows_against_the_float32_base():
    measured = {"hf_generate": {"seconds": [1.0, 3.0], "texts": ["The cat sat.", "A dog ran."]},
                "ours_auto": {"seconds": [0.5, 1.5], "texts": ["The cat sat.", "A dog ran."]},
                "faster_whisper_int8": {"seconds": [0.4, 0.6], "texts": ["The cat sat.", "A dog run."]}}
    rows = {row["system"]: row for row in peers.summary_rows(measured, REFERENCES, META)}
    assert all(tuple(row) == peers.ROW_FIELDS for row in rows.values())
    assert rows["hf_generate"]["speedup_vs_hf_generate"] == 1.0 and rows["hf_generate"]["exact_vs_float32_base"] == 1.0
    assert rows["ours_auto"]["e2e_seconds"] == 2.0 and rows["ours_auto"]["speedup_vs_hf_generate"] == 2.0
    assert rows["faster_whisper_int8"]["speedup_vs_hf_generate"] == 4.0
    assert rows["faster_whisper_int8"]["exact_vs_float32_base"] == 0.5
    assert rows["ours_auto"]["wer"] == 0.0 and rows["faster_whisper_int8"]["wer"] == pytest.approx(1 / 6)
    assert {row["clips"] for row in rows.values()} == {2}
    assert rows["ours_auto"]["command"] == META["command"] and rows["ours_auto"]["load_after"] == [2.0, 1.5, 1.0]


def test_bfloat16_rows_say_how_often_they_match_the_bfloat16_base_as_well():
    measured = {"hf_generate": {"seconds": [1.0, 3.0], "texts": ["The cat sat.", "A dog ran."]},
                "hf_generate_bfloat16": {"seconds": [0.5, 1.0], "texts": ["The cat sat.", "A dog run."]},
                "ours_auto_bfloat16": {"seconds": [0.25, 0.75], "texts": ["The cat sat.", "A dog run."]}}
    rows = {row["system"]: row for row in peers.summary_rows(measured, REFERENCES, META)}
    assert rows["ours_auto_bfloat16"]["exact_vs_float32_base"] == 0.5
    assert rows["ours_auto_bfloat16"]["exact_vs_bfloat16_base"] == 1.0
    assert rows["ours_auto_bfloat16"]["speedup_vs_hf_generate"] == 4.0
    assert rows["hf_generate"]["exact_vs_bfloat16_base"] is None
    assert "50% (100% of bf16's)" in results_tables.cpu_peers(list(rows.values()))


def test_systems_are_timed_in_a_new_order_every_repeat():
    calls = []
    decoders = {name: (lambda samples, name=name: calls.append(name) or name) for name in ("a", "b", "c", "d")}
    peers.measure(decoders, [{"samples": None}], repeats=8)
    orders = [tuple(calls[i:i + 4]) for i in range(4, len(calls), 4)]  # (after the warm-up)
    assert all(sorted(order) == ["a", "b", "c", "d"] for order in orders) and len(set(orders)) > 4


def test_a_run_replaces_its_models_rows_only():
    old = [{"model": "heads/x", "system": "hf_generate", "e2e_seconds": 9.0},
           {"model": "heads/y", "system": "hf_generate", "e2e_seconds": 8.0}]
    new = [{"model": "heads/x", "system": "hf_generate", "e2e_seconds": 7.0}]
    assert peers.merge_summary(old, new) == [old[1], new[0]]


def test_options_always_time_the_reference():
    assert peers.PeerOptions(systems=("ours_auto",)).systems == ("hf_generate", "ours_auto")
    with pytest.raises(ValueError, match="unknown systems"):
        peers.PeerOptions(systems=("ours_magic",))
    with pytest.raises(SystemExit):
        peers.parse_options(["--systems", "ours_magic"])


def test_a_run_told_the_language_keeps_the_detecting_runs_rows():
    detected = [{"model": "heads/x", "system": "hf_generate", "e2e_seconds": 9.0}]
    told = [{"model": "heads/x", "language": "en", "system": "hf_generate", "e2e_seconds": 6.0}]
    assert peers.merge_summary(detected, told) == detected + told
    assert peers.parse_options(["--language", "en"]).language == "en"
