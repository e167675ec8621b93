"""Captured rounds are kept across ``generate`` calls (``RoundCache``): on a GPU, calls that replay rounds
captured by an earlier call, with a chain and with a tree in turn, give the base's own greedy ids, and the later
calls capture nothing new. Needs CUDA (skipped elsewhere)."""

import pytest
import torch

from conftest import requires_transformers5
from oracle import randomize_heads
from tiny_models import build_tiny_whisper, random_features

pytestmark = [requires_transformers5,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="captured rounds need a CUDA GPU")]


def test_captured_rounds_reused_across_calls_stay_exact(tmp_path):
    from modeling_medusa import MedusaForASR

    model = MedusaForASR.from_base(str(build_tiny_whisper(tmp_path / "whisper", seed=2)), device_map="cuda")
    randomize_heads(model, 0)
    runners = []
    for call in range(6):
        features = random_features(2, call).to("cuda")
        expected = model.generate(input_features=features, max_new_tokens=20, use_medusa=False)
        for draft in ("chain", [[0], [1], [0, 0], [0, 1], [0, 0, 0]]):
            assert torch.equal(model.generate(input_features=features, max_new_tokens=20, draft=draft), expected)
        runners.append(len(model.round_cache.runners))
    assert runners == [2] * 6  # one runner per draft, captured by the first call, replayed by the others


def test_auto_with_compiled_rounds_times_the_loops_own_runners_and_stays_exact(tmp_path):
    """With ``compile=True``, auto times its best few candidates by the compiled runners the loop then replays:
    the runner it picks is one of those (nothing compiled again), and the ids are the base's own."""
    from modeling_medusa import MedusaForASR

    model = MedusaForASR.from_base(str(build_tiny_whisper(tmp_path / "whisper", seed=3)), device_map="cuda")
    randomize_heads(model, 1)
    heads = model.config.medusa_num_heads
    model.config.head_accuracy = {"topk": [[0.8 - 0.1 * h, 0.9 - 0.1 * h, 0.95 - 0.1 * h] for h in range(heads)]}
    features = random_features(1, 0).to("cuda")
    expected = model.generate(input_features=features, max_new_tokens=16, use_medusa=False)
    out, stats = model.generate(input_features=features, max_new_tokens=16, draft="auto", compile=True,
                                return_stats=True)
    assert torch.equal(out, expected)
    compiled_keys = [key for key, _ in model.draft_policy.timings if key.compiled]
    assert compiled_keys and len(model.round_cache.runners) == len(compiled_keys)  # the shortlist, each one runner
    assert stats["draft"] in {tree.name for (key, tree) in model.draft_policy.timings if key.compiled}
    runners = dict(model.round_cache.runners)
    assert torch.equal(model.generate(input_features=features, max_new_tokens=16, draft="auto", compile=True), expected)
    assert model.round_cache.runners == runners  # the second call replays what the first compiled


def test_kept_compiled_timings_let_a_later_model_compile_only_the_draft_it_runs(tmp_path, monkeypatch):
    """With ``compile=True`` and a timings file, a model made later (as a new process makes it) recalls what the
    first timed: it compiles one runner, the draft the first picked, and gives the same ids."""
    import modeling_medusa
    from modeling_medusa import MedusaForASR

    monkeypatch.setenv("MEDUSA_ASR_DRAFT_TIMINGS", str(tmp_path / "timings.json"))
    base = str(build_tiny_whisper(tmp_path / "whisper", seed=4))
    features = random_features(1, 1).to("cuda")

    def fresh_model():
        model = MedusaForASR.from_base(base, device_map="cuda")
        randomize_heads(model, 2)
        heads = model.config.medusa_num_heads
        model.config.head_accuracy = {"topk": [[0.8 - 0.1 * h, 0.9 - 0.1 * h, 0.95 - 0.1 * h] for h in range(heads)]}
        return model

    first = fresh_model()
    expected = first.generate(input_features=features, max_new_tokens=16, use_medusa=False)
    out, first_stats = first.generate(input_features=features, max_new_tokens=16, draft="auto", compile=True,
                                      return_stats=True)
    assert torch.equal(out, expected) and len(first.round_cache.runners) >= 2
    later = fresh_model()
    timed = []
    for timer in ("verify_pass_timer", "loop_round_timer"):
        own = getattr(modeling_medusa, timer)
        monkeypatch.setattr(modeling_medusa, timer, lambda *args, own=own: timed.append(args) or own(*args))
    got, stats = later.generate(input_features=features, max_new_tokens=16, draft="auto", compile=True,
                                return_stats=True)
    assert torch.equal(got, expected) and stats["draft"] == first_stats["draft"]
    assert not timed and len(later.round_cache.runners) == 1


def test_a_capture_survives_a_collectable_cycle_that_holds_another_graph():
    """The cyclic GC is paused while a graph is captured: collecting a dead cycle that holds another captured graph
    mid-capture would invalidate the capture (and collecting before every capture made first calls slow)."""
    import gc

    from medusa_fast import capture_cuda_graph

    class Holder:
        pass

    x = torch.arange(8.0, device="cuda")
    held = Holder()
    held.graph, held.me = capture_cuda_graph(lambda: x * 2), held  # a cycle, dead once `held` is dropped
    del held
    thresholds = gc.get_threshold()
    gc.set_threshold(1, 1, 1)  # (a collection at almost every allocation of a container)
    try:
        out = {}

        def body():
            out["containers"] = [[i] for i in range(100)]  # (with these thresholds the cyclic GC would run here)
            out["y"] = x + 1

        graph = capture_cuda_graph(body)
    finally:
        gc.set_threshold(*thresholds)
    x.copy_(torch.arange(8.0, device="cuda") * 10)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out["y"], torch.arange(8.0, device="cuda") * 10 + 1)
    assert gc.isenabled()
