"""tools.files (atomic writes, umask permissions, staged folders), tools.markdown (tables) and tools.runtime (device,
dtype, inputs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conftest import has_table_row  # noqa: E402
from tools import files, markdown, runtime  # noqa: E402


# --------------------------------------------------------------------------- atomic writes


def test_write_atomic_replaces_and_leaves_no_temp_files(tmp_path):
    target = tmp_path / "out" / "a.txt"
    files.write_atomic(target, "one\n")
    files.write_atomic(target, "two\n")
    assert target.read_text() == "two\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["a.txt"]


def test_write_atomic_keeps_old_file_when_replace_fails(tmp_path, monkeypatch):
    target = tmp_path / "a.txt"
    target.write_text("old\n")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(files.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        files.write_atomic(target, "new\n")
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_a_failed_writer_leaves_neither_target_nor_temp_file(tmp_path):
    def broken_write(temp_name):
        Path(temp_name).write_bytes(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        files.write_atomic_with(tmp_path / "a.bin", broken_write)
    assert list(tmp_path.iterdir()) == []


def test_written_files_get_umask_permissions(tmp_path):
    umask = os.umask(0o022)
    try:
        files.write_atomic(tmp_path / "a.txt", b"bytes")
        files.torch_save_atomic(tmp_path / "a.pt", {"x": 1})
    finally:
        os.umask(umask)
    assert {oct((tmp_path / name).stat().st_mode & 0o777) for name in ("a.txt", "a.pt")} == {"0o644"}


def test_json_keeps_each_callers_formatting(tmp_path):
    files.write_json_atomic(tmp_path / "a.json", {"é": 1})
    files.write_json_atomic(tmp_path / "b.json", {"é": [1]}, indent=1, ensure_ascii=False)
    files.write_json_atomic(tmp_path / "c.json", {"b": 1, "a": 2}, sort_keys=True)
    assert (tmp_path / "a.json").read_text() == json.dumps({"é": 1}, indent=2) + "\n"
    assert (tmp_path / "b.json").read_text(encoding="utf-8") == '{\n "é": [\n  1\n ]\n}\n'
    assert (tmp_path / "c.json").read_text() == '{\n  "a": 2,\n  "b": 1\n}\n'


def test_safetensors_round_trip_with_metadata(tmp_path):
    import torch
    from safetensors import safe_open

    files.save_safetensors_atomic(tmp_path / "t.safetensors", {"w": torch.ones(2)}, metadata={"k": "v"})
    with safe_open(str(tmp_path / "t.safetensors"), framework="pt") as f:
        assert f.metadata() == {"k": "v"} and f.get_tensor("w").tolist() == [1.0, 1.0]


def test_staged_folder_replaces_only_on_success(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(RuntimeError):
        with files.staged_folder(out) as staged:
            (staged / "new.txt").write_text("new")
            raise RuntimeError("interrupted")
    assert [p.name for p in out.iterdir()] == ["old.txt"]
    with files.staged_folder(out) as staged:
        (staged / "new.txt").write_text("new")
    assert [p.name for p in out.iterdir()] == ["new.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # the staging folder became out


# --------------------------------------------------------------------------- Markdown tables


def test_markdown_table_keeps_each_cell_on_its_row_and_its_numbers_as_written():
    table = markdown.markdown_table(["", "value"], [["a|b", "0.050"], ["two\nlines", 1e-05]])
    assert len(table.splitlines()) == 4 and set(table.splitlines()[1]) == {"|", "-"}
    assert has_table_row(table, "a\\|b", "0.050") and has_table_row(table, "two lines", "1e-05")


# --------------------------------------------------------------------------- runtime


def test_device_and_dtype_names():
    import torch

    assert runtime.resolve_device("cpu") == "cpu"
    assert runtime.resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="cpu, cuda, cuda:N or auto"):
        runtime.resolve_device("gpu")
    assert runtime.resolve_dtype("auto", "cpu") is torch.float32
    assert runtime.resolve_dtype("bf16", "cpu") is runtime.resolve_dtype("bfloat16", "cpu") is torch.bfloat16
    with pytest.raises(ValueError, match="unknown --dtype 'int3'"):
        runtime.resolve_dtype("int3", "cpu")


def test_to_model_moves_tensors_and_casts_only_floating_ones():
    import torch

    class Model:
        device, dtype = torch.device("cpu"), torch.bfloat16

    moved = runtime.to_model({"x": torch.zeros(2), "ids": torch.zeros(2, dtype=torch.long), "language": "en"}, Model())
    assert moved["x"].dtype is torch.bfloat16 and moved["ids"].dtype is torch.long and moved["language"] == "en"
    assert str(runtime.model_device(object())) == "cpu"
    runtime.synchronize(Model())  # nothing to wait for on the CPU
    runtime.synchronize("cpu")


def test_command_line_quotes_arguments_so_the_recorded_command_reruns(monkeypatch):
    assert files.command_line("tools.benchmark", ["--audio", "my clips/manifest.jsonl"]) == (
        "python -m tools.benchmark --audio 'my clips/manifest.jsonl'")
    assert files.command_line("benchmarks/x/ab.py", []) == "python benchmarks/x/ab.py"
    monkeypatch.setattr(sys, "argv", ["prog", "--out", "a b"])
    assert files.command_line("tools.profile_rounds") == "python -m tools.profile_rounds --out 'a b'"


def test_stale_temporaries_of_dead_writers_are_removed_and_live_ones_kept(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".a.txt.tmp-{dead.pid}-x1"
    live = tmp_path / f".b.txt.tmp-{os.getpid()}-x2"
    kept = [live, tmp_path / ".hidden", tmp_path / "c.txt"]
    for path in (stale, *kept):
        path.write_text("part")
    assert files.remove_stale_temporaries(tmp_path) == 1
    assert not stale.exists() and all(path.exists() for path in kept)
