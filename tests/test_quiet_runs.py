"""A normal run prints no warning its user cannot act on: the transcription command on a real clip with the shipped
tiny.en heads, and a pytest run of a small test file, each in a fresh process (import-time notices count too)."""

import os
import re
import subprocess
import sys

from conftest import ROOT, requires_transformers5
from real_speech import converted_tiny_en, flite

pytestmark = requires_transformers5
NOTICE = re.compile(r"warn|deprecat|failed to load|experimental", re.IGNORECASE)


def run(argv: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True)


def notices(text: str) -> list[str]:
    return [line for line in text.replace("\r", "\n").splitlines() if NOTICE.search(line)]


def test_transcription_prints_no_warning(tmp_path):
    converted_tiny_en()  # (skips where the base cannot be had)
    flite("A few small heads guess the next words, and the model checks them in one pass.", tmp_path / "clip.wav")
    result = run(["-m", "tools.transcribe", str(tmp_path / "clip.wav")])
    assert result.returncode == 0, result.stderr
    assert "heads" in result.stdout.lower()
    assert notices(result.stderr) == []


def test_a_test_file_runs_without_warnings():
    result = run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_structure.py"])
    assert result.returncode == 0, result.stdout
    assert notices(result.stdout + result.stderr) == []


def test_the_data_tools_find_the_cache_folder_without_loading_model_code():
    """Synthesis workers and the text normaliser ask for the project's cache folder only: importing the model code
    for it loads transformers (seconds a worker) and whatever quantisation libraries it finds, with their notices."""
    code = ("import sys; from pipeline.texts import cache_root; from tools.text_normalizer import spelling_table_path;"
            " cache_root(); spelling_table_path(); print(sorted(m for m in ('transformers', 'modeling_medusa', 'torch')"
            " if m in sys.modules))")
    result = run(["-c", code])
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[]"]
