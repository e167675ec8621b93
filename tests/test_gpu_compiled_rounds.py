"""Compiled calls trace without graph breaks: a break inside a round leaves the code around it eager (every
round then runs unfused layer norms and adds) and gives a first call more frames to trace. Needs CUDA."""

import pytest
import torch

from conftest import requires_transformers5
from oracle import randomize_heads
from tiny_models import build_tiny_whisper, random_features

pytestmark = [requires_transformers5,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled rounds' GPU forms need a CUDA GPU")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("draft", ["chain", [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]], ids=["chain", "tree"])
def test_a_compiled_call_with_fused_path_drafting_traces_without_graph_breaks(tmp_path, dtype, draft):
    import torch._dynamo
    from torch._dynamo.utils import counters

    from modeling_medusa import MedusaForASR

    model = MedusaForASR.from_base(str(build_tiny_whisper(tmp_path / "whisper", seed=5)), head_kind="path",
                                   speech_attention=True, torch_dtype=dtype, device_map="cuda")
    randomize_heads(model, 3)
    model.set_draft_vocab(torch.arange(100))  # (fused path drafting drafts over a draft vocabulary)
    features = random_features(1, 2).to("cuda", dtype)
    expected = model.generate(input_features=features, max_new_tokens=16, use_medusa=False)
    torch._dynamo.reset()
    counters.clear()
    out = model.generate(input_features=features, max_new_tokens=16, draft=draft, compile=True)
    # (a break that makes Dynamo skip a whole frame is counted as "unimplemented" only)
    assert not counters["graph_break"] and not counters["unimplemented"], (dict(counters["graph_break"]),
                                                                         dict(counters["unimplemented"]))
    if dtype == torch.float32:  # (bf16 may part at the base's near-ties: test_lossless_whisper)
        assert torch.equal(out, expected)
