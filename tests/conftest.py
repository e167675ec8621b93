import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MEDUSA_ASR_DRAFT_TIMINGS", "off")  # each test times its drafts afresh (and writes no file)
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or max(1, min(2, os.cpu_count() or 1))))  # a busy machine: OMP_NUM_THREADS=1


def transformers_major() -> int:
    import transformers

    return int(transformers.__version__.split(".")[0])


requires_transformers5 = pytest.mark.skipif(
    transformers_major() < 5,
    reason="The Whisper path targets transformers 5.x (what Whisper users run); 4.x's Whisper generate "
    "returns a different output layout.",
)


def transformers_below_452() -> bool:
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return (major, minor) < (4, 52)


def has_table_row(markdown: str, *cells: str) -> bool:
    """Whether a Markdown table row in ``markdown`` starts with ``cells``, whatever the padding (tabulate pads
    each column to its widest cell)."""
    rows = [[cell.strip() for cell in line.strip()[1:-1].split(" | ")]
            for line in markdown.splitlines() if line.startswith("|")]
    return any(row[:len(cells)] == list(cells) for row in rows)
