"""torch.compile's caches kept in the project's cache folder: a later process finds the graphs an earlier one
compiled there (so it compiles nothing), and the folder is torch's own when asked or already chosen."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = """
import json, torch
from torch._dynamo.utils import counters
from backbone import compile_fixed_shape

def double_softmax(x):
    return torch.softmax(x * 2, dim=-1) + 1

compile_fixed_shape(double_softmax)(torch.ones(3, 4))
print(json.dumps(dict(counters["inductor"])))
"""


def compile_in_a_new_process(env: dict) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_finds_the_first_ones_graphs_in_the_cache_folder(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "MEDUSA_ASR_COMPILE_CACHE")}
    env["MEDUSA_ASR_CACHE"] = str(tmp_path / "cache")
    first = compile_in_a_new_process(env)
    assert first.get("fxgraph_cache_miss", 0) >= 1
    assert any((tmp_path / "cache" / "torch_compile").iterdir())
    second = compile_in_a_new_process(env)
    assert second.get("fxgraph_cache_hit", 0) >= 1 and second.get("fxgraph_cache_miss", 0) == 0


def test_the_folder_is_torchs_own_when_off_or_already_named(tmp_path, monkeypatch):
    from medusa_options import compile_cache_dir, torch_default_cache_dir

    monkeypatch.setenv("MEDUSA_ASR_CACHE", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("MEDUSA_ASR_COMPILE_CACHE", raising=False)
    assert compile_cache_dir() == tmp_path / "torch_compile"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", torch_default_cache_dir())  # (torch wrote its own default there)
    assert compile_cache_dir() == tmp_path / "torch_compile"
    monkeypatch.setenv("MEDUSA_ASR_COMPILE_CACHE", "off")
    assert compile_cache_dir() is None
    monkeypatch.delenv("MEDUSA_ASR_COMPILE_CACHE")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "own"))
    assert compile_cache_dir() is None


def test_an_unwritable_cache_folder_leaves_torchs_own(tmp_path, monkeypatch):
    import medusa_options

    monkeypatch.setenv("MEDUSA_ASR_CACHE", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("MEDUSA_ASR_COMPILE_CACHE", raising=False)
    monkeypatch.setattr(medusa_options.os, "access", lambda path, mode: False)  # (a chmod would not stop root)
    assert medusa_options.compile_cache_dir() is None
