"""The rows of ``benchmarks/scale_out/summary.json``: one per measurement of the engines past one process
(Ray Data bulk transcription, the Ray Serve endpoint, vLLM), each written by the script that measured it.

A row is keyed by what it measured (engine, model, device, dtype, workers or concurrency, batch size, medusa);
writing a row with the same key replaces the older one, so a rerun refreshes its rows and leaves the other scripts'
rows alone.
"""

from __future__ import annotations

import json
from pathlib import Path

from tools.files import replace_rows, write_json_atomic

SUMMARY = Path(__file__).resolve().parent.parent / "benchmarks" / "scale_out" / "summary.json"
FIELDS = ("engine", "model", "device", "workers", "concurrency", "medusa", "clips", "requests", "clips_per_s",
          "requests_per_s", "p50_ms", "p95_ms", "errors", "identical_to_single_process", "tokens_per_pass",
          "command", "date")
KEY = ("engine", "model", "device", "dtype", "workers", "concurrency", "batch_size", "medusa")


def row_key(row: dict) -> tuple:
    """(rows written before they recorded a dtype ran at the commands' default, auto)"""
    return tuple(row.get(name, "auto" if name == "dtype" else None) for name in KEY)


def merge_rows(rows: list[dict], path: str | Path = SUMMARY) -> list[dict]:
    """Write ``rows`` into the summary at ``path`` (replacing rows with the same key) and return all its rows."""
    path = Path(path)
    kept = json.loads(path.read_text())["rows"] if path.exists() else []
    merged = replace_rows(kept, [dict(row) for row in rows], row_key)
    merged.sort(key=lambda row: tuple(str(value) for value in row_key(row)))
    write_json_atomic(path, {"fields": list(FIELDS), "rows": merged})
    return merged
