"""The model cards (the root README.md and every heads/*/README.md): one page rendered from the template by
``pipeline.update_card`` from committed results, a snippet that runs as pasted, and folders that run as downloaded."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = sorted(p for p in (ROOT / "heads").iterdir() if (p / "medusa_heads.safetensors").is_file())
CARDS = [ROOT, *ARTIFACTS]
MAX_WORDS, MAX_SENTENCE_WORDS, MAX_PLOT_BYTES = 1200, 40, 100_000


def card(folder: Path) -> tuple[dict, str]:
    """The card's YAML front matter and its text after it."""
    _, front, body = (folder / "README.md").read_text(encoding="utf-8").split("---\n", 2)
    return yaml.safe_load(front), body


def code_blocks(body: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", body, flags=re.S)


def sentences(body: str) -> list[str]:
    """The prose's sentences: code, tables and headings left out, each list item and paragraph on its own."""
    prose = re.sub(r"```.*?```", "", body, flags=re.S)
    lines = [line for line in prose.splitlines() if not line.startswith(("|", "#", "!["))]
    blocks = re.split(r"\n\s*\n|\n(?=- )", "\n".join(lines))
    return [s for block in blocks for s in re.split(r"(?<=[.!?])\s+(?=[A-Z`*\[(])", " ".join(block.split())) if s]


@pytest.mark.parametrize("folder", CARDS, ids=lambda p: p.name)
def test_card_is_rendered_from_the_template_and_its_committed_results(folder):
    """README.md is what ``python -m pipeline.update_card FOLDER`` renders today: no hand edits, no stale rows."""
    from pipeline.model_card import render_model_card
    from pipeline.update_card import PLOT_FILE, compared_section, read_rows, recipe_cost, shipped_rows

    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    rows = read_rows(folder) if folder in ARTIFACTS else shipped_rows()
    assert rows or config.get("card_note"), f"{folder}: no benchmark rows, and no card_note saying why"
    assert (folder / "README.md").read_text(encoding="utf-8") == render_model_card(
        config, rows, PLOT_FILE if rows else None, trained=folder in ARTIFACTS,
        recipe_cost=None if folder in ARTIFACTS else recipe_cost(),
        compared=compared_section(folder, config) if folder in ARTIFACTS else "")
    assert "benchmark" not in config or not config["benchmark"]  # the record lives in results.json
    if folder in ARTIFACTS and rows:
        results = json.loads((folder / "results.json").read_text(encoding="utf-8"))
        assert results["command"].startswith("python -m pipeline.update_card")
        assert all(row["command"].startswith("python -m tools.benchmark") for row in results["rows"])


def test_a_card_compares_every_heads_trained_for_its_base():
    """``compared_heads``: one row per heads trained for the card's base (CPU rows; other bases and GPU rows left
    out), its own marked, each language group's tokens per pass as a range, empty columns dropped; nothing when
    only its own heads were measured."""
    from pipeline.model_card import compared_heads

    def row(variant, language, passes, timestamps=False, base="openai/whisper-base", gpu=None, minutes=None):
        return {"variant": f"{variant} (path-speech, 1 layer)", "base": base, "language": language, "gpu": gpu,
                "timestamps": timestamps, "tokens_per_pass": passes, "draft": "tree-32", "training_gpu_minutes": minutes,
                "clips": 28 if language == "en" else 20}

    rows = [row("heads/whisper-base", "en", 3.1), row("heads/whisper-base", "de", 1.2),
            row("heads/whisper-base", "fr", 1.4), row("heads/whisper-base", "en", 9.9, gpu="H100"),
            row("work/b2", "en", 3.0, base="/cache/whisper-base", minutes=9.6),
            row("work/b2", "en", 2.7, timestamps=True, minutes=9.6), row("heads/whisper-tiny.en", "en", 2.8,
                                                                        base="openai/whisper-tiny.en")]
    section = compared_heads(rows, "openai/whisper-base", "heads/whisper-base")
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in section.splitlines() if line.startswith("|")]
    assert cells[0] == ["heads", "English", "timestamped", "other languages", "GPU minutes (where recorded)"]
    assert cells[2:] == [["`whisper-base` (these)", "3.10", "", "1.20–1.40", ""], ["`b2`", "3.00", "2.70", "", "9.6"]]
    assert "tree-32, CPU" in section and "English on 28 real recordings, other languages on synthetic" in section
    tiny = compared_heads(rows + [row("work/t2", "en", 2.9, base="openai/whisper-tiny.en")], "openai/whisper-tiny.en",
                          "heads/whisper-tiny.en")
    assert "other languages" not in tiny and "timestamped" not in tiny and "GPU minutes" not in tiny
    assert compared_heads(rows, "openai/whisper-tiny.en", "heads/whisper-tiny.en") == ""


@pytest.mark.parametrize("folder", CARDS, ids=lambda p: p.name)
def test_card_is_one_page_with_short_sentences_a_named_licence_and_its_plot(folder):
    front, body = card(folder)
    assert len(body.split()) <= MAX_WORDS
    long = [s for s in sentences(body) if len(s.split()) > MAX_SENTENCE_WORDS]
    assert not long, long
    assert front["license"] != "other" or front.get("license_name")
    snippets = code_blocks(body, "python")
    assert len(snippets) >= 2 and "dtype=torch.bfloat16" in snippets[1]
    for code in snippets:
        ast.parse(code)
    assert "pip install" in code_blocks(body, "bash")[0]
    plots = re.findall(r"!\[[^]]*\]\(([^)]+)\)", body)
    unmeasured = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("card_note")
    assert plots or unmeasured  # an artifact measured nowhere says why, in bold, under its intro
    assert all((folder / p).is_file() and (folder / p).stat().st_size < MAX_PLOT_BYTES for p in plots)
    for term in ("draft", "verify pass", "round", "tree"):
        assert f"*{term}*" in body  # defined where it is first used
    if folder == ROOT:
        for command in ("make test", "make demo", "tools.bulk --help", "tools.serve --help",
                        "pipeline.export_vllm --help", "train_heads.sh"):
            assert command in body, command


def test_sentences_are_split_the_way_a_reader_reads_them():
    body = "One two. Three `four` five.\n\n- An item. Another.\n- Last item\n\n| a | b |\n```python\nx = 1\n```\n"
    assert sentences(body) == ["One two.", "Three `four` five.", "- An item.", "Another.", "- Last item"]


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_a_downloaded_folder_runs_the_cards_snippet_and_example_inference_on_a_real_clip(tmp_path):
    """heads/whisper-tiny.en as upload-check writes it (real files, the base's processor), a spoken clip saved
    as speech.wav inside it: the card's first snippet, pasted, and ``python example_inference.py speech.wav``
    print the base's greedy transcript."""
    from real_speech import converted_tiny_en, flite

    from pipeline import hub_folder

    artifact = ROOT / "heads" / "whisper-tiny.en"
    converted_tiny_en()
    folder = tmp_path / "whisper-tiny.en"
    hub_folder.write_hub_folder(artifact, folder)
    flite("The quick brown fox jumps over the lazy dog.", folder / "speech.wav")
    (tmp_path / "snippet.py").write_text(code_blocks(card(artifact)[1], "python")[0])
    both = (f"exec(open({str(tmp_path / 'snippet.py')!r}).read(), {{}})\n"  # one process: imports paid once
            "import runpy, sys\nsys.argv = ['example_inference.py', 'speech.wav']\n"
            "runpy.run_path('example_inference.py', run_name='__main__')\n")
    done = run([sys.executable, "-c", both], folder)
    assert done.returncode == 0, done.stderr
    pasted, example = done.stdout.splitlines()
    assert "quick brown fox" in pasted.lower() and example == pasted


def test_root_example_says_in_one_line_that_meralion2_heads_must_be_trained(tmp_path, monkeypatch, capsys):
    """The root's example loads its own folder whatever the working directory, which has no heads yet."""
    import example_inference

    monkeypatch.chdir(tmp_path)
    assert example_inference.main([str(tmp_path / "speech.wav")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no trained heads" in err and "MERaLiON" in err


def test_a_downloaded_folder_whose_base_cannot_be_found_says_so_in_one_line(tmp_path, capsys):
    """An upload folder on a machine with an empty cache and no network: one line naming the base and how to get
    it, exit status 2, no traceback."""
    import shutil

    import example_inference
    from modeling_medusa import CODE_FILES

    folder = tmp_path / "downloaded"
    folder.mkdir()
    artifact = ROOT / "heads" / "whisper-tiny.en"
    config = json.loads((artifact / "config.json").read_text(encoding="utf-8"))
    (folder / "config.json").write_text(json.dumps({**config, "base_model_name_or_path": "nobody/no-such-whisper"}))
    for name in ("medusa_heads.safetensors", *CODE_FILES):
        shutil.copyfile(ROOT / name if name in CODE_FILES else artifact / name, folder / name)
    assert example_inference.main([str(tmp_path / "speech.wav"), str(folder)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nobody/no-such-whisper" in err and "download it" in err


@pytest.mark.parametrize("folder", ARTIFACTS, ids=lambda p: p.name)
def test_each_artifact_folder_holds_its_example(folder):
    assert (folder / "example_inference.py").read_bytes() == (ROOT / "example_inference.py").read_bytes()


def test_results_page_is_rendered_from_the_committed_summaries_and_fits_5000_words():
    """docs/RESULTS.md is tools.results_tables' rendering of the committed result files, tables with dates and
    commands; `wc -w` counts table rules and bars too, and still stays within 5 000."""
    from tools import results_tables

    page = (ROOT / "docs" / "RESULTS.md").read_text(encoding="utf-8")
    assert page == results_tables.render()
    assert len(page.split()) <= 5000
    assert "python -m tools.benchmark --audio" in page and "| date" in page.replace("  ", "")


def test_gpu_tables_show_a_measurement_compiled_where_it_was_also_run_as_cuda_graphs():
    from tools.results_tables import shown_decode_rows

    def row(method, mode, batch=16, draft="chain-4"):
        return {"shape": "meralion2-3b", "batch": batch, "method": method, "rounds_mode": mode, "draft": draft,
                "new_tokens": 64}

    rows = [row("ours", "graph"), row("ours", "compiled"), row("ours", "graph", batch=4), row("hf_dynamic", None)]
    assert shown_decode_rows(rows) == [rows[1], rows[2]]


def test_benchmarks_hold_results_and_one_index_no_scripts():
    found = [p for p in (ROOT / "benchmarks").rglob("*") if p.suffix in (".sh", ".py")]
    assert not found, found
    assert [p.name for p in (ROOT / "benchmarks").rglob("README.md")] == ["README.md"]
