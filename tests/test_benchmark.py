"""benchmark.py's core on a tiny random Whisper with zero-initialised heads: fields present, lossless."""

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import has_table_row, requires_transformers5
from tiny_models import build_tiny_whisper, random_features

from tools import benchmark, benchmark_inputs

pytestmark = requires_transformers5

CLIP_FIELDS = {"id", "duration_s", "feature_ms", "tokens", "tokens_excl_eos", "baseline", "medusa", "speedup",
               "mean_accepted_per_round", "acceptance_rate", "exact_match"}
METHOD_FIELDS = {"latency_ms_median", "latency_ms_all", "tokens", "tokens_excl_eos", "tokens_per_s",
                 "tokens_per_s_excl_eos", "text", "wer"}
SUMMARY_FIELDS = {"speedup_sum_latency", "speedup_median", "baseline_tokens_per_s", "medusa_tokens_per_s",
                  "mean_accepted_per_round", "acceptance_rate", "exact_match_rate", "baseline_wer", "medusa_wer",
                  "baseline_latency_ms_total", "medusa_latency_ms_total"}


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread: on a busy 2-core machine two OpenMP threads make these tiny runs 10x slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_medusa(tmp_path_factory):
    from modeling_medusa import MedusaForASR

    root = tmp_path_factory.mktemp("bench")
    base = build_tiny_whisper(root / "base", seed=5)
    MedusaForASR.from_base(str(base), medusa_num_heads=3).save_pretrained(root / "heads")
    return MedusaForASR.from_pretrained(str(root / "heads")), root


def test_benchmark_core_writes_complete_lossless_results(tiny_medusa, tmp_path):
    model, _ = tiny_medusa
    clips = [(f"clip{i}", {"input_features": random_features(1, seed=i)}, None) for i in range(3)]
    results = benchmark.run_benchmark(model, clips, repeats=2, warmup=1, max_new_tokens=24, batch_size=2,
                                      progress=False)
    results["memory"] = benchmark.memory_info(results.pop("cuda_peak_bytes"), model.device, None)
    written = benchmark.write_outputs(results, tmp_path / "out", plot=True)

    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert (tmp_path / "out" / "results.md").read_text().startswith("# Medusa vs baseline")
    assert written["plot"].endswith(benchmark.PLOT_NAME) or written["plot"].startswith("skipped")
    assert [c["id"] for c in saved["clips"]] == ["clip0", "clip1", "clip2"]
    for clip in saved["clips"]:
        assert CLIP_FIELDS <= set(clip)
        assert METHOD_FIELDS <= set(clip["baseline"]) and METHOD_FIELDS <= set(clip["medusa"])
        assert len(clip["baseline"]["latency_ms_all"]) == 2 and clip["speedup"] > 0
        assert clip["exact_match"] is True
        assert clip["medusa"]["stats"]["new_tokens"] == clip["medusa"]["tokens"] >= 1
        assert not clip["medusa"]["fell_back_to_base"]
    summary = saved["summary"]
    assert SUMMARY_FIELDS <= set(summary)
    assert summary["exact_match_rate"] == 1.0
    assert summary["baseline_tokens"] == summary["medusa_tokens"] > 0
    assert summary["mean_accepted_per_round"] >= 1.0 and 0.0 <= summary["acceptance_rate"] <= 1.0
    assert saved["batched"]["summary"]["exact_match_rate"] == 1.0
    assert [b["rows"] for b in saved["batched"]["batches"]] == [2, 1]
    assert saved["draft_tree"]["depth"] == 3 and "method" in saved["memory"]


def test_missing_manifest_and_audio_give_clear_errors(tmp_path, capsys):
    assert benchmark.main(["--audio", str(tmp_path / "nope.jsonl"), "--model", str(tmp_path)]) == 2
    assert "manifest not found" in capsys.readouterr().err
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text(json.dumps({"id": "a", "audio": "wavs/a.wav", "text": "hi"}) + "\n")
    assert benchmark.main(["--audio", str(manifest), "--model", str(tmp_path)]) == 2
    assert "audio files in" in capsys.readouterr().err


def test_missing_model_gives_clear_error(tiny_medusa, tmp_path, capsys):
    _, root = tiny_medusa
    wav = tmp_path / "a.wav"
    wav.write_bytes(b"")
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text(json.dumps({"id": "a", "audio": "a.wav"}) + "\n")
    assert benchmark.main(["--audio", str(manifest), "--model", str(tmp_path / "no-heads")]) == 2
    assert "model folder not found" in capsys.readouterr().err
    assert benchmark.main(["--audio", str(manifest), "--model", str(root / "base")]) == 2
    assert "not a Medusa heads artifact" in capsys.readouterr().err


def test_language_and_task_reach_every_input_and_bad_ones_give_clear_errors(tiny_medusa, tmp_path, capsys):
    import numpy as np
    import soundfile as sf
    import torch

    class RecordingModel:
        device, dtype, processor = torch.device("cpu"), torch.float32, object()

        def prepare_audio_inputs(self, audios, **options):
            self.options = options
            return {"input_features": torch.zeros(len(audios), 2), **options}

    model = RecordingModel()
    rows = []
    for i in range(2):
        sf.write(tmp_path / f"a{i}.wav", np.zeros(8000, np.float32), 16000)
        rows.append({"id": f"a{i}", "audio": str(tmp_path / f"a{i}.wav")})
    clips = benchmark_inputs.load_clips(model, rows, progress=False,
                                        prompt_options={"language": "fr", "task": "translate"})
    assert clips[0].inputs["language"] == "fr" and clips[1].inputs["task"] == "translate"
    model.options = None
    batched, _ = benchmark._stack_inputs(clips, model)  # batch features rebuilt from audio keep the options
    assert model.options == {"language": "fr", "task": "translate"} and batched["language"] == "fr"

    _, root = tiny_medusa  # English-only: another language is refused before any timing (en is what it does)
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert benchmark.main(["--audio", str(manifest), "--model", str(root / "heads"), "--language", "fr",
                           "--quiet", "--out", str(tmp_path / "out")]) == 2
    assert "English-only" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_finished_run_exits_0_and_adds_its_summary_rows(tiny_medusa, tmp_path, capsys):
    """The whole command on a manifest of real files: results written with the command that made them, both
    summary lists get this run's row (pointing at its results.json, the same command), exit status 0."""
    import numpy as np
    import soundfile as sf

    _, root = tiny_medusa
    sf.write(tmp_path / "a.wav", 0.1 * np.random.default_rng(0).standard_normal(16000).astype(np.float32), 16000)
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text(json.dumps({"id": "a", "audio": "a.wav", "text": "hello"}) + "\n")
    out, summary, quantised = tmp_path / "out", tmp_path / "summary.json", tmp_path / "quantised.json"
    assert benchmark.main(["--audio", str(manifest), "--model", str(root / "heads"), "--out", str(out), "--repeats", "1",
                           "--warmup", "0", "--max-new-tokens", "8", "--threads", "1", "--no-plot", "--quiet",
                           "--summary", str(summary), "--quantised-summary", str(quantised)]) == 0
    assert "# Medusa vs baseline" in capsys.readouterr().out
    results = json.loads((out / "results.json").read_text())
    assert results["summary"]["exact_match_rate"] == 1.0 and results["settings"]["clips"] == 1
    assert results["settings"]["command"].startswith("python -m tools.benchmark --audio")
    assert results["draft_tree"]["auto_measurements"] == []  # this artifact has one candidate: auto times nothing
    for path in (summary, quantised):
        [row] = json.loads(path.read_text())
        assert row["clips"] == 1 and row["command"] == results["settings"]["command"]
    assert json.loads(summary.read_text())[0]["results"] == "out/results.json"


def test_a_run_of_several_drafts_times_them_on_the_same_clips_and_rows_say_autos_gap(tiny_medusa, tmp_path, capsys):
    """--draft auto,none,chain: one run, one baseline timed beside every draft (interleaved per clip), a results
    folder and a summary row per draft; auto's row says how much slower it ran than the fastest fixed draft, and the
    row made again from its results.json (merging) and the tables say the same."""
    import soundfile as sf

    from pipeline.model_card import results_table
    from tools.benchmark_report import merge_summaries
    from tools.results_tables import real_speech

    _, root = tiny_medusa
    for i in range(2):
        sf.write(tmp_path / f"a{i}.wav", 0.1 * np.random.default_rng(i).standard_normal(16000).astype(np.float32),
                 16000)
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text("".join(json.dumps({"id": f"a{i}", "audio": f"a{i}.wav", "text": "hi"}) + "\n"
                                for i in range(2)))
    out, summary = tmp_path / "out", tmp_path / "summary.json"
    assert benchmark.main(["--audio", str(manifest), "--model", str(root / "heads"), "--out", str(out), "--repeats", "2",
                           "--warmup", "0", "--max-new-tokens", "8", "--threads", "1", "--no-plot", "--quiet",
                           "--draft", "chain,none,auto", "--summary", str(summary)]) == 0
    assert "## Drafts measured in this run" in capsys.readouterr().out
    assert not (out / "results.json").exists()
    results = {d: json.loads((out / d / "results.json").read_text()) for d in ("auto", "none", "chain")}
    baseline_ms = [[c["baseline"]["latency_ms_all"] for c in r["clips"]] for r in results.values()]
    assert baseline_ms[0] == baseline_ms[1] == baseline_ms[2]  # one baseline, measured once beside every draft
    assert results["chain"]["settings"]["drafts"] == ["auto", "chain", "none"]  # auto's first call comes first
    assert [r["settings"]["draft"] for r in results.values()] == ["auto", "none", "chain"]
    assert results["none"]["summary"]["medusa_latency_ms_total"] == results["none"]["summary"]["greedy_latency_ms_total"]
    totals = {d: r["summary"]["medusa_latency_ms_total"] for d, r in results.items()}
    best = min(("none", "chain"), key=totals.get)

    rows = {r["requested_draft"]: r for r in json.loads(summary.read_text())}
    assert rows["auto"]["best_fixed_draft"] == best
    assert rows["auto"]["auto_gap_vs_best_fixed"] == pytest.approx(totals["auto"] / totals[best] - 1)
    assert "auto_gap_vs_best_fixed" not in rows["chain"] and "best_fixed_draft" not in rows["none"]
    assert rows["chain"]["clips_per_s"] == pytest.approx(2 * 1000 / totals["chain"])  # each clip one request
    assert rows["none"]["clips_per_s"] == pytest.approx(rows["chain"]["own_greedy_clips_per_s"])
    assert rows["auto"]["results"] == "out/auto/results.json"
    remade = tmp_path / "remade.json"
    assert merge_summaries([out / "auto/results.json"], remade) == 1
    assert json.loads(remade.read_text())[0]["auto_gap_vs_best_fixed"] == rows["auto"]["auto_gap_vs_best_fixed"]
    table, side_by_side = real_speech(list(rows.values())).split("The fixed drafts timed beside `auto`")
    assert f"% ({best})" in table and "| chain (" not in table  # the fixed drafts: one line per run
    assert "chain " in side_by_side and "none " in side_by_side
    assert "vs best fixed draft" in results_table([rows["auto"]])
    assert "vs best fixed" not in results_table([rows["chain"]]) and "% (" not in real_speech([rows["chain"]])


def test_autos_gap_is_its_total_over_the_fastest_fixed_drafts_less_one():
    from tools.benchmark_report import auto_gap_fields, draft_comparison, gap_cell

    def compared(**totals):
        return draft_comparison({draft.replace("_", "-"): {"medusa_latency_ms_total": ms}
                                 for draft, ms in totals.items()})

    comparison = compared(auto=1100.0, none=2000.0, chain=1000.0, tree_16=1050.0)
    assert comparison["best_fixed_draft"] == "chain" and comparison["auto_gap_vs_best_fixed"] == pytest.approx(0.1)
    assert comparison["latency_ms_total"]["tree-16"] == 1050.0
    assert gap_cell(comparison) == "+10.0 % (chain)" and gap_cell({}) == ""
    assert auto_gap_fields("auto", comparison) == {"auto_gap_vs_best_fixed": pytest.approx(0.1),
                                                   "best_fixed_draft": "chain"}
    assert auto_gap_fields("chain", comparison) == {} and auto_gap_fields("auto", None) == {}
    assert compared(auto=1000.0, chain=1000.0)["auto_gap_vs_best_fixed"] == 0.0  # it picked the best
    assert compared(auto=900.0, none=1000.0)["auto_gap_vs_best_fixed"] == pytest.approx(-0.1)  # (none is fixed too)
    for alone in (compared(auto=1000.0), compared(chain=1.0, none=2.0)):  # nothing to compare auto with
        assert "best_fixed_draft" not in alone and auto_gap_fields("auto", alone) == {}


def test_every_repeat_runs_each_decoder_once_in_a_new_order():
    """No decoder always follows the same one (a rotation kept auto right after plain greedy, which showed as a
    steady cost of auto's own): each repeat a new seeded order, every decoder once."""
    from tools.benchmark import Timer

    class Recording:
        def __init__(self):
            self.calls = []

        def generate(self, draft=None, use_medusa=True, **_):
            import torch

            self.calls.append("baseline" if not use_medusa else draft)
            return torch.zeros(1, 1), {}

    model = Recording()
    timer = Timer(model, 8, {"auto": "auto", "chain": "chain", "tree-16": "tree-16"}, repeats=6, warmup=0)
    timer.device, timer.cuda, timer.sync = "cpu", False, lambda: None
    for _ in range(4):
        timer.run({})
    orders = [model.calls[i:i + 5] for i in range(0, len(model.calls), 5)]
    assert len(orders) == 24 and all(sorted(order) == sorted(["baseline", "none", "auto", "chain", "tree-16"])
                                     for order in orders)
    after_auto = {order[order.index("auto") - 1] for order in orders if order.index("auto") > 0}
    assert len(after_auto) > 1 and len({tuple(order) for order in orders}) > 6


def test_timestamped_benchmark_compares_timestamped_decoders(tmp_path):
    """--timestamps: every decoder returns timestamps; Medusa decodes them (no fallback) and equals the base."""
    from modeling_medusa import MedusaForASR

    folder = build_tiny_whisper(tmp_path / "base", seed=3, timestamps=1501, timestamp_scale=0.7)
    model = MedusaForASR.from_base(str(folder), medusa_num_heads=3)
    clips = [(f"clip{i}", {"input_features": random_features(1, seed=i)}, None) for i in range(2)]
    results = benchmark.run_benchmark(model, clips, repeats=1, warmup=0, max_new_tokens=20, draft="tree",
                                      progress=False, generate_kwargs={"return_timestamps": True})
    timestamp_begin = model.base.generation_config.no_timestamps_token_id + 1
    assert results["summary"]["exact_match_rate"] == 1.0
    for clip in results["clips"]:
        assert not clip["medusa"]["fell_back_to_base"] and clip["medusa"]["stats"]["rounds"] >= 1
    sequences = model.generate(**clips[0][1], max_new_tokens=20, return_timestamps=True, use_medusa=False)
    assert (sequences >= timestamp_begin).any()  # the runs above decoded timestamp tokens


def test_a_batched_run_summarises_its_batches_and_merging_remakes_rows_from_results(tmp_path):
    """A run with --batch-size: its summary row is the batched section's (batch size in the row and in the key, so
    batch 4 and 16 rows live side by side); merging a row from elsewhere remakes it from its results.json."""
    import shutil

    from tools.benchmark_report import merge_summaries, summary_row

    committed = Path(__file__).resolve().parents[1] / "benchmarks/real_speech/gpu_tiny.en_batch16_graph/results.json"
    results = json.loads(committed.read_text())
    row = summary_row(results, "cmd")
    batched = results["batched"]["summary"]
    assert row["batch"] == 16 and row["tokens_per_s"] == batched["medusa_tokens_per_s"]
    assert row["own_greedy_tokens_per_s"] == batched["greedy_tokens_per_s"] != results["summary"]["greedy_tokens_per_s"]

    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "run16").mkdir(parents=True)
    shutil.copy(committed, elsewhere / "run16/results.json")
    old_format = {k: v for k, v in row.items() if k != "batch"} | {"tokens_per_s": 0.0, "results": "run16/results.json"}
    (elsewhere / "summary.json").write_text(json.dumps([old_format]))
    into = tmp_path / "summary.json"
    unbatched = {**row, "batch": 1, "results": "x/results.json"}
    into.write_text(json.dumps([unbatched]))
    assert merge_summaries([elsewhere / "summary.json"], into) == 1
    merged = json.loads(into.read_text())
    assert [r["batch"] for r in merged] == [1, 16]
    assert merged[1] == {**row, "results": "elsewhere/run16/results.json"}

    results["settings"]["command"] = "python -m tools.benchmark --batch-size 16"  # a results file as the source
    (elsewhere / "run16/results.json").write_text(json.dumps(results))
    assert merge_summaries([elsewhere / "run16/results.json"], into) == 1
    [_, remade] = json.loads(into.read_text())
    assert remade["command"] == "python -m tools.benchmark --batch-size 16" and remade["batch"] == 16
    del results["settings"]["command"]
    (elsewhere / "run16/results.json").write_text(json.dumps(results))
    with pytest.raises(ValueError, match="no settings.command"):
        merge_summaries([elsewhere / "run16/results.json"], into)


def test_gpu_summary_rows_come_from_the_results_files(tmp_path):
    """benchmark_gpu_report.write_summary turns each shape's results file into the issue's summary rows:
    verify rows with their ratio to that shape's floor, decode rows without failed ones, each run's command."""
    from tools import benchmark_gpu_report as report
    from tools.files import write_json_atomic

    ours = {"method": "ours", "draft": "tree-32", "profile": "seed_76_47_35_27", "batch": 1, "new_tokens": 32,
            "call_tok_per_s": 600.0, "loop_tok_per_s": 900.0, "outside_rounds_ms": 17.0, "tokens_per_round": 3.1,
            "exact": True, "call_seconds": 0.05, "rounds_mode": "compiled", "time_to_first_token_ms": 17.0}
    results = {"shape": "meralion2-3b", "text_layers": 26, "device": "GPU", "torch": "t", "transformers": "x",
               "date": "2026-12-01", "floor_ms": 2.0, "decoder_weight_GB": 5.0, "copy_bandwidth_GBps": 2500.0,
               "commands": {"verify": "python -m tools.benchmark_gpu --sections verify"},
               "verify": [{"tokens": 5, "hf_eager_ms": 30.0, "fused_compiled_graph_ms": 3.0}],
               "lengths": [ours, {"method": "hf_static", "batch": 1, "error": "OutOfMemoryError"}]}
    write_json_atomic(tmp_path / "results-meralion2-3b.json", results)
    summary = report.write_summary(tmp_path)
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    assert summary["floor_ms"] == {"meralion2-3b": 2.0}
    assert {(r["method"], r["x_floor"]) for r in summary["verify"]} == {("hf_eager", 15.0), ("ours_fused_compiled_graph", 1.5)}
    assert [r["method"] for r in summary["decode"]] == ["ours"]
    assert summary["runs"] == [{"shape": "meralion2-3b", "section": "verify", "command": "python -m tools.benchmark_gpu --sections verify"}]
    assert has_table_row(report.render_markdown(results), "32", "tree-32")


def test_gpu_tables_name_every_run_of_a_section_and_the_drafts_cost():
    """A section measured in parts lists each part's command (the rows keep theirs), and rows run at trained heads'
    cost say so, in the header and in a column."""
    from tools import benchmark_gpu_report as report

    row = {"method": "ours", "draft": "chain-4", "profile": "seed_76_47_35_27", "batch": 1, "new_tokens": 32,
           "call_tok_per_s": 700.0, "loop_tok_per_s": 950.0, "outside_rounds_ms": 11.0, "tokens_per_round": 2.4,
           "exact": True, "call_seconds": 0.05, "rounds_mode": "compiled", "time_to_first_token_ms": 11.0,
           "drafter_cost": "heads", "command": "run --length-drafts chain"}
    results = {"shape": "meralion2-3b", "text_layers": 26, "device": "GPU", "torch": "t", "transformers": "x",
               "date": "2026-12-04", "floor_ms": 1.2, "decoder_weight_GB": 5.2, "copy_bandwidth_GBps": 4300.0,
               "commands": {"lengths": "run --length-drafts tree-32"},
               "lengths": [row, {**row, "draft": "tree-32", "command": "run --length-drafts tree-32"}]}
    assert report.section_commands(results) == [("lengths", "run --length-drafts chain"),
                                                ("lengths", "run --length-drafts tree-32")]
    table = report.render_markdown(results)
    assert "drafter cost `heads`" in table
    assert has_table_row(table, "ours", "chain-4", "seed_76_47_35_27", "compiled", "heads")
    assert report.section_commands({"commands": {"verify": "run --sections verify"}}) == [("verify", "run --sections verify")]


def test_a_gpu_batching_run_keeps_the_rows_it_does_not_measure_again():
    """Batch sizes measured in parts (each within a device call's limit): a run of batch 64 compiled keeps batch
    16's rows and batch 64's graph rows, and replaces batch 64's compiled rows and the library's batch-64 rows."""
    from tools.benchmark_gpu import rows_not_measured_again

    rows = [{"batch": 16, "method": "ours", "rounds_mode": "compiled"}, {"batch": 16, "method": "hf_static"},
            {"batch": 64, "method": "ours", "rounds_mode": "graph"}, {"batch": 64, "method": "ours", "rounds_mode": "compiled"},
            {"batch": 64, "method": "hf_static"}]
    assert rows_not_measured_again(rows, {64}, {64}) == rows[:3]
    assert rows_not_measured_again(rows, {64}, set()) == [rows[0], rows[1], rows[3]]


def test_rows_a_gpu_rerun_keeps_keep_the_command_that_measured_them():
    from tools.benchmark_gpu import naming_their_run

    rows = [{"batch": 16}, {"batch": 64, "command": "python -m tools.benchmark_gpu --batches 64"}]
    kept = naming_their_run(rows, "python -m tools.benchmark_gpu --batches 16")
    assert [row["command"] for row in kept] == ["python -m tools.benchmark_gpu --batches 16", rows[1]["command"]]
    assert "command" not in rows[0]  # (the earlier rows are not changed in place)


def test_a_gpu_lengths_run_of_one_method_group_keeps_the_other_groups_rows():
    """The library's rows measured apart from ours (each within a device call's limit): a run of "hf" keeps every
    row of our loop and replaces the library's rows; a run of both replaces everything."""
    from tools.benchmark_gpu import length_rows_kept

    rows = [{"method": "ours", "new_tokens": 16}, {"method": "ours_greedy", "new_tokens": 16},
            {"method": "seed_style_eager_chain"}, {"method": "hf_static", "new_tokens": 16}, {"method": "hf_dynamic"}]
    assert length_rows_kept(rows, ["hf"]) == rows[:3]
    assert length_rows_kept(rows, ["ours"]) == rows[3:]
    assert length_rows_kept(rows, ["ours", "hf"]) == []


def test_a_gpu_lengths_run_at_some_lengths_keeps_the_rows_of_the_others():
    from tools.benchmark_gpu import length_rows_kept

    rows = [{"method": "ours", "new_tokens": 16}, {"method": "ours", "new_tokens": 32},
            {"method": "hf_static", "new_tokens": 16}, {"method": "hf_static", "new_tokens": 32}]
    assert length_rows_kept(rows, ["ours"], {32}) == rows[:1] + rows[2:]
    assert length_rows_kept(rows, ["ours", "hf"], {32, 64}) == [rows[0], rows[2]]

def test_draft_option_takes_the_named_drafts_and_sized_trees():
    import argparse

    for value in ("auto", "chain", "tree", "none", "tree-32"):
        assert benchmark.draft_option(value) == value
    for value in ("tree-", "tree-x", "chain-4", "trees"):
        with pytest.raises(argparse.ArgumentTypeError, match="tree-N"):
            benchmark.draft_option(value)


def test_draft_option_takes_a_comma_list_of_different_drafts(capsys):
    import argparse

    parser = benchmark.build_parser()
    assert parser.parse_args([]).draft == ["auto"]
    assert parser.parse_args(["--draft", "auto, none,chain,tree-16"]).draft == ["auto", "none", "chain", "tree-16"]
    for value, problem in (("auto,auto", "each draft once"), ("auto,", "use auto"), ("auto,chain-4", "tree-N"),
                           (",", "use auto")):
        with pytest.raises(argparse.ArgumentTypeError, match=problem):
            benchmark.drafts_option(value)
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["--draft", "chain,tree,chain"])
    assert exited.value.code == 2 and "--draft" in capsys.readouterr().err


def test_segment_comparison_measures_boundaries_against_the_known_sentences():
    """compare_segments: each decoder's segments against the sentences' known places (seconds from each segment
    start/end to the nearest sentence start/end), its WER, and whether ours holds the base's ids."""
    from tools import compare_segments

    rate = compare_segments.SAMPLE_RATE
    sentences = [("the cat sat", 0, 2 * rate), ("on a red mat", 3 * rate, 5 * rate)]
    stats = {"draft": "chain of 4", "mean_accepted_per_round": 2.5, "rounds": 4, "drafted_tokens": 16}
    outputs = {"ours": ([(0.1, 2.0, "the cat sat"), (3.0, 5.4, "on a red mat")], [1, 2, 3], stats),
               "base": ([(0.1, 2.0, "the cat sat"), (3.0, 5.4, "on a red mat")], [1, 2, 3], None),
               "other": ([(0.0, 5.0, "the cat sat on a mat")], None, None)}
    calls = []

    def decoder(name):
        def run(samples):
            calls.append(name)
            return outputs[name]
        return run

    rows = compare_segments.compare({name: decoder(name) for name in outputs}, np.zeros(5 * rate), sentences, 2)
    assert len(calls) == 3 * 3  # a warm-up and two timed runs each
    assert rows["ours"]["ids_equal_base"] is True and "ids_equal_base" not in rows["other"]
    assert rows["ours"]["mean_accepted_per_round"] == 2.5 and "drafted_tokens" not in rows["ours"]
    assert rows["ours"]["segments"] == 2 and rows["other"]["segments"] == 1
    assert rows["ours"]["start_error"] == {"median_s": pytest.approx(0.05), "max_s": pytest.approx(0.1)}
    assert rows["ours"]["end_error"] == {"median_s": pytest.approx(0.2), "max_s": pytest.approx(0.4)}
    assert rows["ours"]["wer"] == 0.0 and rows["other"]["wer"] == pytest.approx(1 / 7)
    assert "| other" in compare_segments.render({"model": "m", "seconds_of_audio": 5, "sentences": 2, "device": "cpu",
                                                 "dtype": "float32", "repeats": 2, "command": "c",
                                                 "conditions": {"clean": rows}})


def test_a_joined_recording_places_each_clip_where_its_text_says_reversing_the_order_on_each_pass(tmp_path):
    """compare_segments --audio: the manifest's recorded clips joined with pauses, forward then reversed, until the
    asked length; each sentence's text and place in samples is the clip's."""
    import soundfile as sf

    from tools import compare_segments
    from tools.long_recording import SAMPLE_RATE, joined_recording

    clips = [(f"clip {k}", np.full(SAMPLE_RATE * (k + 1), 0.1 * (k + 1), dtype=np.float32)) for k in range(3)]
    samples, sentences = joined_recording(clips, seconds=14, pause=0.5)
    assert [text for text, _, _ in sentences] == ["clip 0", "clip 1", "clip 2", "clip 2", "clip 1", "clip 0"]
    assert len(samples) == sentences[-1][2] + SAMPLE_RATE // 2 >= 14 * SAMPLE_RATE
    for text, start, end in sentences:
        k = int(text[-1])
        assert end - start == SAMPLE_RATE * (k + 1) and np.all(samples[start:end] == np.float32(0.1 * (k + 1)))
        assert not samples[end:end + SAMPLE_RATE // 2].any()  # the pause after it
    with pytest.raises(ValueError, match="no clips"):
        joined_recording([], seconds=1)

    rows = []
    for k, (text, audio) in enumerate(clips):
        sf.write(tmp_path / f"{k}.wav", audio, SAMPLE_RATE)
        rows.append(json.dumps({"id": f"c{k}", "audio": f"{k}.wav", "text": text}))
    (tmp_path / "manifest.jsonl").write_text("\n".join(rows) + "\n")
    joined, placed, source = compare_segments.recording(str(tmp_path / "manifest.jsonl"), seconds=5)
    assert [text for text, _, _ in placed] == ["clip 0", "clip 1", "clip 2"] and "3 recorded clips" in source
    assert np.allclose(joined[placed[1][1]:placed[1][2]], 0.2, atol=1e-4)
    (tmp_path / "manifest.jsonl").write_text(rows[0] + "\n" + json.dumps({"id": "x", "audio": "1.wav"}) + "\n")
    with pytest.raises(SystemExit, match="without a text"):
        compare_segments.recording(str(tmp_path / "manifest.jsonl"), seconds=5)


def test_the_results_page_lists_each_long_recording_with_ours_against_the_base():
    """RESULTS' long-form rows: the three decoders' seconds, ours against the base's generate and whether the ids
    are equal (said once above the table when every row's are), per recording and condition."""
    from tools.results_tables import long_form

    rows = {"ours": {"seconds": 5.0, "ids_equal_base": True, "mean_accepted_per_round": 1.9},
            "base": {"seconds": 9.0}, "faster-whisper": {"seconds": 6.0}}
    run = {"model": "heads/whisper-base", "seconds_of_audio": 182.4, "conditions": {"clean": rows},
           "recording": "28 recorded clips of m.jsonl joined (40 in all)"}
    other = dict(run, recording="flite voices", conditions={"noisy": dict(rows, ours=dict(rows["ours"],
                                                                                          ids_equal_base=False))})
    cells = [[cell.strip() for cell in line.split("|")[1:-1]] for line in long_form([run, other]).splitlines()[2:]]
    assert cells == [["base", "182 s, clean", "5.00 / 9.00 / 6.00", "1.80×, same ids", "1.90"],
                     ["base", "182 s, noisy", "5.00 / 9.00 / 6.00", "1.80×, other ids", "1.90"]]
    same = [[cell.strip() for cell in line.split("|")[1:-1]] for line in long_form([run]).splitlines()[2:]]
    assert same == [["base", "182 s, clean", "5.00 / 9.00 / 6.00", "1.80×", "1.90"]]


def test_the_noise_note_counts_what_other_processes_took_not_a_load_left_by_a_run_that_ended():
    from tools.benchmark_environment import cpu_seconds, other_processes_cpus
    from tools.benchmark_report import _timings_noisy

    quiet = {"timing_spread_median": 0.03}
    after_a_run = {"device": "cpu", "cpus_usable": 2, "load_average_at_start": [2.0, 1.7, 1.1]}
    assert _timings_noisy(quiet, after_a_run)  # (runs before the CPU time was measured: the load average decides)
    assert not _timings_noisy(quiet, {**after_a_run, "other_processes_cpus": 0.1})
    assert _timings_noisy(quiet, {**after_a_run, "other_processes_cpus": 0.9})
    assert other_processes_cpus((10.0, 1.0), (16.0, 5.0), wall_seconds=4.0) == 0.5  # 6 s busy, 4 of them ours
    assert other_processes_cpus(None, (16.0, 5.0), wall_seconds=4.0) is None
    reading = cpu_seconds()
    assert reading is None or (reading[0] >= 0 and reading[1] >= 0)


def test_the_length_figure_draws_every_run_given_and_records_its_command(tmp_path):
    pytest.importorskip("matplotlib")
    from tools import plot_lengths

    def run(model, device):
        clips = [{"tokens": t, "speedup": 2.0 + t / 10, "decode_speedup_vs_own_greedy": 1.2, "draft_ran": "chain-4"}
                 for t in (5, 12, 30)]
        return {"settings": {"model": model, "dtype": "float32"}, "environment": {"device": device}, "clips": clips}

    sources = []
    for name, device in (("tiny", "cpu"), ("base", "cuda")):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(run(f"heads/whisper-{name}", device)))
        sources.append(str(path))
    out = tmp_path / "lengths.png"
    assert plot_lengths.main([*sources, "--out", str(out)]) == 0
    assert out.read_bytes().startswith(b"\x89PNG")
    record = json.loads(out.with_suffix(".json").read_text())
    assert record["command"].startswith("python -m tools.plot_lengths")
    assert [r["label"] for r in record["runs"]] == ["whisper-tiny, CPU, float32, chain-4",
                                                     "whisper-base, GPU, float32, chain-4"]


def test_round_timeline_splits_replays_at_markers_and_finds_the_gaps():
    from tools.profile_rounds import split_replays, summarise_replays

    def replay(t0, gap):  # three kernels of 2 us, the second gap ``gap`` us long
        return [(t0, t0 + 2, "gemm"), (t0 + 2.5, t0 + 4.5, "norm"), (t0 + 4.5 + gap, t0 + 6.5 + gap, "attention")]

    events = [(0, 1, "copy before any marker")]
    for i, gap in enumerate((1.0, 9.0, 3.0)):
        t0 = 100.0 * (i + 1)
        events += [(t0 - 20, t0 - 19, "state restore copy"), (t0 - 10, t0 - 5, "spin_kernel"), *replay(t0, gap),
                   (t0 + 30, t0 + 35, "spin_kernel")]
    replays = split_replays(sorted(events))
    assert [len(r) for r in replays] == [3, 3, 3]
    assert all("restore" not in name for r in replays for _, _, name in r)
    summary = summarise_replays(replays, largest=2)
    assert summary["kernels"] == 3 and summary["busy_us"] == 6.0
    assert summary["span_us"] == 9.5 and summary["gaps_us"] == 3.5  # the median replay: gaps 0.5 and 3
    assert summary["largest_gaps"][0] == {"us": 3.0, "after": "norm", "before": "attention"}
    assert [row[2] for row in summary["in_order"]] == ["gemm", "norm", "attention"]
    assert [row[:2] for row in summary["in_order"]] == [[0.0, 2.0], [0.5, 2.0], [3.0, 2.0]]


def test_verify_pass_variants_are_timed_in_turn():
    """verify_pass_kernels times the variants of one size in turn, so a drift (here: every call slower than the one
    before) falls on all of them alike: equal passes get equal medians, wherever they stand in the list."""
    import importlib.util

    spec = importlib.util.find_spec("tools.verify_pass_kernels")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    calls, clock = [], iter(range(1000))

    def drifting_timer(replay):
        replay()
        return next(clock)

    medians = module.interleaved_ms({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, repeats=5,
                                    timer=drifting_timer)
    assert calls == ["a", "b"] * 6  # a warm-up turn, then five timed turns
    assert medians == {"a": 4, "b": 5}  # (the turns' middle: one call apart, not five)
