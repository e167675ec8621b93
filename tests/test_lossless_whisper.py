"""Medusa output == the base's own greedy generate, token for token, over many random cases."""

import copy
import random

import numpy as np
import pytest
import torch

from tools.bf16_ties import check_bf16_batch
from conftest import requires_transformers5
from oracle import OracleDrafter, randomize_heads
from tiny_models import build_tiny_whisper, random_features

pytestmark = requires_transformers5

CASES_PER_MODEL = 30
MODEL_SEEDS = (1, 2, 3)


@pytest.fixture(scope="module", params=MODEL_SEEDS)
def whisper_medusa(request, tmp_path_factory):
    from modeling_medusa import MedusaForASR

    folder = build_tiny_whisper(tmp_path_factory.mktemp(f"whisper{request.param}"), seed=request.param)
    return MedusaForASR.from_base(str(folder), medusa_num_heads=4)


def random_tree(rng: random.Random, num_heads: int):
    paths = {(0,)}
    for _ in range(rng.randint(1, 12)):
        parent = rng.choice(sorted(paths))
        if len(parent) < num_heads:
            paths.add(parent + (rng.randint(0, 3),))
        else:
            paths.add((rng.randint(0, 3),))
    return [list(p) for p in paths]


def draw_case(rng: random.Random, num_heads: int) -> dict:
    return {
        "batch": rng.randint(1, 3),
        "features_seed": rng.randint(0, 10_000),
        "max_new_tokens": rng.choice([1, 2, 3, 5, 8, 13, 21, 34, 45]),
        "min_new_tokens": rng.choice([None, None, None, 2, 6]),
        "drafter": rng.choice(["random", "oracle", "oracle", "noisy_oracle"]),
        "draft": rng.choice(["chain", "chain", random_tree(rng, num_heads)]),
        "head_seed": rng.randint(0, 10_000),
        "cuda_graph": rng.random() < 0.3,  # the fixed-shape runner path (no graph on CPU, same buffers)
    }


def run_case(model, case):
    features = random_features(case["batch"], case["features_seed"])
    gen_kwargs = {"max_new_tokens": case["max_new_tokens"]}
    if case["min_new_tokens"]:
        gen_kwargs["min_new_tokens"] = case["min_new_tokens"]
    expected = model.generate(input_features=features, use_medusa=False, **gen_kwargs)
    randomize_heads(model, case["head_seed"])
    drafter = None
    if case["drafter"] != "random":
        rows = model.collect_hidden_states(input_features=features, max_new_tokens=case["max_new_tokens"] + 8)
        error = 0.0 if case["drafter"] == "oracle" else 0.4
        drafter = OracleDrafter(model, rows, model.backbone.vocab_size, error, seed=case["head_seed"])
    model.drafter = drafter
    try:
        got, stats = model.generate(input_features=features, draft=case["draft"], return_stats=True,
                                    cuda_graph=case["cuda_graph"], **gen_kwargs)
    finally:
        model.drafter = None
    return expected, got, stats


def test_medusa_equals_base_greedy_on_random_cases(whisper_medusa):
    rng = random.Random(1234)
    accepted_any = False
    for index in range(CASES_PER_MODEL):
        case = draw_case(rng, whisper_medusa.config.medusa_num_heads)
        expected, got, stats = run_case(whisper_medusa, case)
        assert torch.equal(expected, got), f"case {index} {case}: base {expected.tolist()} medusa {got.tolist()}"
        accepted_any |= stats["accepted_tokens"] > 0
    assert accepted_any, "no draft was ever accepted: the oracle cases did not exercise acceptance"


def test_oracle_heads_accept_long_runs_and_the_bonus_token(whisper_medusa):
    features = random_features(2, 99)
    rows = whisper_medusa.collect_hidden_states(input_features=features, max_new_tokens=40)
    drafter = OracleDrafter(whisper_medusa, rows, whisper_medusa.backbone.vocab_size)
    whisper_medusa.drafter = drafter
    try:
        got, stats = whisper_medusa.generate(input_features=features, max_new_tokens=30, return_stats=True)
    finally:
        whisper_medusa.drafter = None
    expected = whisper_medusa.generate(input_features=features, max_new_tokens=30, use_medusa=False)
    assert torch.equal(expected, got)
    if stats["new_tokens"] > 2 * stats["rounds"]:
        assert stats["mean_accepted_per_round"] > 2.0


def test_collected_hidden_states_reproduce_the_tokens(whisper_medusa):
    features = random_features(2, 7)
    rows = whisper_medusa.collect_hidden_states(input_features=features, max_new_tokens=20)
    for tokens, hiddens in rows:
        assert hiddens.shape == (len(tokens), whisper_medusa.config.hidden_size)
        logits = whisper_medusa.backbone.logits(hiddens)
        # Suppressed tokens aside, the recorded state's argmax is the emitted token.
        process = whisper_medusa.backbone.make_logits_processor(None)
        steps = torch.arange(len(tokens))[None, :]
        assert torch.equal(process(logits[None], steps)[0].argmax(-1), tokens)


@pytest.mark.parametrize("hub_prompt", [False, True], ids=["no-forced-ids", "hub-forced-ids"])
@pytest.mark.parametrize("kwargs", [{}, {"language": "en"}, {"language": "fr", "task": "translate"},
                                    {"task": "transcribe"}, {"language": "french"}])
def test_multilingual_prompt_language_and_task_match_the_base(kwargs, hub_prompt, tmp_path_factory):
    """Language given, detected per row, or set by name; task given, defaulted or forced by the config's
    legacy ids: same prompt, same ids."""
    from modeling_medusa import MedusaForASR

    folder = build_tiny_whisper(tmp_path_factory.mktemp("multilingual"), seed=6, multilingual=True,
                                hub_prompt=hub_prompt)
    model = MedusaForASR.from_base(str(folder))
    randomize_heads(model, 1)
    for seed in range(3):
        features = random_features(3, seed)
        expected = model.generate(input_features=features, max_new_tokens=12, use_medusa=False, **kwargs)
        assert torch.equal(model.generate(input_features=features, max_new_tokens=12, **kwargs), expected)


def test_language_detection_scores_only_the_language_tokens_as_the_full_projection_does(tmp_path_factory):
    """Detection projects onto the language tokens alone: the full projection's columns, up to float rounding."""
    from modeling_medusa import MedusaForASR

    model = MedusaForASR.from_base(str(build_tiny_whisper(tmp_path_factory.mktemp("ml"), seed=6, multilingual=True)))
    backbone, generator = model.backbone, torch.Generator().manual_seed(0)
    ids = backbone.language_ids()
    hidden = torch.randn(32, backbone.hidden_size, generator=generator) * 4
    with torch.no_grad():
        alone, full = backbone._language_logits(hidden, ids), backbone.logits(hidden[:, None])[:, -1][:, ids]
    assert torch.allclose(alone, full, rtol=1e-5, atol=1e-5) and torch.equal(alone.argmax(-1), full.argmax(-1))


def test_auto_drafts_only_in_the_languages_the_heads_were_trained_on(tmp_path_factory):
    """English-trained heads: a French call decodes without drafts (same ids as the base), an English one may
    draft; heads that name no languages draft in any."""
    from draft_trees import DraftTree
    from modeling_medusa import MedusaForASR

    model = MedusaForASR.from_base(str(build_tiny_whisper(tmp_path_factory.mktemp("ml"), seed=6, multilingual=True)))
    randomize_heads(model, 1)
    features = random_features(2, 0)
    model.config.training_data = {"languages": ["en"]}
    expected = model.generate(input_features=features, max_new_tokens=12, language="fr", use_medusa=False)
    ids, stats = model.generate(input_features=features, max_new_tokens=12, language="fr", return_stats=True)
    assert torch.equal(ids, expected) and stats["draft"] == DraftTree(()).name and stats["drafted_tokens"] == 0
    french, english = (torch.tensor([model.backbone.prompt_template(language=code)]) for code in ("fr", "en"))
    assert not model._heads_know(french) and model._heads_know(english)
    model.config.training_data = {}
    assert model._heads_know(french)


def test_prepare_audio_inputs_carries_language_and_task(tmp_path_factory):
    """Options given to prepare_audio_inputs reach generate (Medusa and the base alike); options a
    model cannot take fail there, naming the problem."""
    from modeling_medusa import MedusaForASR

    model = MedusaForASR.from_base(str(build_tiny_whisper(tmp_path_factory.mktemp("ml"), seed=6, multilingual=True)))
    randomize_heads(model, 1)
    audio = [np.random.default_rng(i).normal(0, 0.1, 16000 + 4000 * i).astype(np.float32) for i in range(2)]
    inputs = model.prepare_audio_inputs(audio, language="fr", task="translate")
    assert (inputs["language"], inputs["task"]) == ("fr", "translate")
    expected = model.base.generate(input_features=inputs["input_features"], language="fr", task="translate",
                                   max_new_tokens=10)
    assert torch.equal(model.generate(**inputs, max_new_tokens=10, use_medusa=False), expected)
    assert torch.equal(model.generate(**inputs, max_new_tokens=10), expected)
    assert "language" not in model.prepare_audio_inputs(audio)
    with pytest.raises(ValueError, match="Unknown Whisper language 'klingon'"):
        model.prepare_audio_inputs(audio, language="klingon")
    with pytest.raises(ValueError, match="Unknown Whisper task 'summarise'"):
        model.prepare_audio_inputs(audio, task="summarise")
    english = MedusaForASR.from_base(str(build_tiny_whisper(tmp_path_factory.mktemp("en"), seed=6)))
    # what an English-only model does anyway is accepted (and not passed on); anything else is refused
    english.check_prompt_options(language="English", task="transcribe")
    harmless = english.prepare_audio_inputs(audio, language="en", task="transcribe")
    assert "language" not in harmless and "task" not in harmless
    for refused in ({"language": "fr"}, {"task": "translate"}, {"language": "en", "task": "translate"}):
        with pytest.raises(ValueError, match="English-only"):
            english.prepare_audio_inputs(audio, **refused)
    with pytest.raises(ValueError, match="English-only"):  # as the base's own generate refuses it
        english.generate(input_features=inputs["input_features"], language="en", max_new_tokens=4)


def test_bfloat16_equals_the_base_bfloat16_greedy_up_to_its_own_near_ties(tmp_path_factory):
    """bf16: each row equals the base's own bf16 greedy output, or leaves it only where the base's top-2
    scores were within bf16 rounding and Medusa took the other tied token (see bf16_ties.py). Random
    heads and an oracle, chains and trees, batches of 1-3."""
    from modeling_medusa import MedusaForASR

    folder = build_tiny_whisper(tmp_path_factory.mktemp("bf16"), seed=2)
    model = MedusaForASR.from_base(str(folder), torch_dtype=torch.bfloat16)
    rng = random.Random(5)
    diverged = 0
    for index in range(16):
        case = draw_case(rng, model.config.medusa_num_heads)
        features = random_features(case["batch"], case["features_seed"]).to(torch.bfloat16)
        expected = model.generate(input_features=features, max_new_tokens=16, use_medusa=False)
        scores = model.base.generate(input_features=features, max_new_tokens=16, output_scores=True,
                                     return_dict_in_generate=True).scores
        randomize_heads(model, case["head_seed"], std=0.05)
        got = model.generate(input_features=features, max_new_tokens=16, draft=case["draft"],
                             cuda_graph=case["cuda_graph"])
        problems = check_bf16_batch(expected.tolist(), got.tolist(), scores)
        assert not problems, f"case {index} {case}: {problems}"
        diverged += not torch.equal(expected, got)
    print(f"bf16: {diverged}/16 cases left the base's output at one of its own near-ties")


def test_bfloat16_on_a_cpu_equals_the_base_bfloat16_greedy_exactly(tmp_path_factory):
    """On a CPU in bf16 a verify pass's nodes attend one by one over exactly the keys the base's steps see
    (``attend_one_by_one``), so its ids are the base's own bf16 greedy ids, near-ties included: chains and trees of
    up to 33 nodes, batches of 1-3."""
    from modeling_medusa import MedusaForASR

    # 64 wide a head, as in real Whisper: narrower heads hid the partings SDPA's sums cause here
    folder = build_tiny_whisper(tmp_path_factory.mktemp("bf16_cpu"), seed=4, width=256)
    model = MedusaForASR.from_base(str(folder), torch_dtype=torch.bfloat16)
    drafts = ["chain", [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]],
              [[a] for a in range(4)] + [[a, b] for a in range(4) for b in range(4)] + [[0, 0, c] for c in range(12)]]
    rng = random.Random(9)
    for index in range(12):
        batch, draft = rng.randint(1, 3), drafts[index % len(drafts)]
        features = random_features(batch, 100 + index).to(torch.bfloat16)
        expected = model.generate(input_features=features, max_new_tokens=32, use_medusa=False)
        randomize_heads(model, index, std=0.05)
        got = model.generate(input_features=features, max_new_tokens=32, draft=draft)
        assert torch.equal(expected, got), f"case {index} (batch {batch}): {expected.tolist()} {got.tolist()}"


def test_fixed_shape_runner_is_reused_across_calls_and_stays_exact(whisper_medusa):
    """Later calls of the same shapes reuse one runner (so a captured CUDA graph is not re-captured);
    its buffers are refilled in place, never replaced, and the output stays the base's greedy output."""
    randomize_heads(whisper_medusa, 3)
    whisper_medusa.release_caches()
    runners, pointers = set(), set()
    for seed in range(6):
        features = random_features(2, 100 + seed)
        max_new = 10 + seed
        expected = whisper_medusa.generate(input_features=features, max_new_tokens=max_new, use_medusa=False)
        got = whisper_medusa.generate(input_features=features, max_new_tokens=max_new, draft="chain", cuda_graph=True)
        assert torch.equal(expected, got), seed
        (runner,) = whisper_medusa.round_cache.runners.values()
        runners.add(id(runner))
        state = runner.state
        pointers.add(tuple(t.data_ptr() for t in (state.lengths, state.hidden, state.next_token, runner.result,
                                                  state.cache.keys, state.extra["cross_keys"])))
    assert len(runners) == 1 and len(pointers) == 1


def test_compiled_rounds_equal_the_base_greedy(tmp_path_factory):
    """``compile=True`` (torch.compile of the fixed-shape round; on CPU without a CUDA graph): same ids
    as the base for chain and tree drafts, oracle and random heads, across reused calls."""
    from modeling_medusa import MedusaForASR

    folder = build_tiny_whisper(tmp_path_factory.mktemp("compiled"), seed=4)
    model = MedusaForASR.from_base(str(folder), medusa_num_heads=4)
    accepted = 0
    for index, draft in enumerate(["chain", [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]] * 2):
        features = random_features(2, 300 + index)
        expected = model.generate(input_features=features, max_new_tokens=24, use_medusa=False)
        randomize_heads(model, index)
        if index % 2 == 0:
            rows = model.collect_hidden_states(input_features=features, max_new_tokens=32)
            model.drafter = OracleDrafter(model, rows, model.backbone.vocab_size, 0.2, seed=index)
        try:
            got, stats = model.generate(input_features=features, max_new_tokens=24, draft=draft, compile=True,
                                        cuda_graph=False, return_stats=True)
        finally:
            model.drafter = None
        assert torch.equal(expected, got), f"call {index}: base {expected.tolist()} compiled {got.tolist()}"
        accepted += stats["accepted_tokens"]
    assert accepted > 0
    assert all(runner.graph is None for runner in model.round_cache.runners.values())
    model.release_caches()
    assert not model.round_cache.runners and not model.round_cache.pool.caches


def test_kept_rounds_are_dropped_when_weights_are_replaced(whisper_medusa):
    """A captured round holds raw pointers to the weights: after ``.to()``-style replacement of the
    weight tensors the kept runners must be dropped (a stale CUDA graph would read freed memory)."""
    randomize_heads(whisper_medusa, 5)
    features = random_features(2, 400)
    expected = whisper_medusa.generate(input_features=features, max_new_tokens=12, use_medusa=False)
    assert torch.equal(whisper_medusa.generate(input_features=features, max_new_tokens=12, draft="chain",
                                               cuda_graph=True), expected)
    (before,) = whisper_medusa.round_cache.runners.values()
    assert torch.equal(whisper_medusa.generate(input_features=features, max_new_tokens=12, draft="chain",
                                               cuda_graph=True), expected)
    assert list(whisper_medusa.round_cache.runners.values()) == [before]  # same weights: reused
    for param in whisper_medusa.parameters():  # what .to(device/dtype) does: new tensors
        param.data = param.data.clone()
    assert torch.equal(whisper_medusa.generate(input_features=features, max_new_tokens=12, draft="chain",
                                               cuda_graph=True), expected)
    (after,) = whisper_medusa.round_cache.runners.values()
    assert after is not before and before.graph is None


def test_a_kept_runner_asks_for_no_drafter_and_new_heads_get_a_new_one(whisper_medusa, monkeypatch):
    """A call replaying kept rounds builds no drafter (its heads' walk costs a GPU call's host time); heads changed
    in place drop the runners with the rest of the weights, and the next call drafts from the new heads."""
    import modeling_medusa

    randomize_heads(whisper_medusa, 6)
    features = random_features(2, 401)
    expected = whisper_medusa.generate(input_features=features, max_new_tokens=12, use_medusa=False)
    asked, kept = [], modeling_medusa._kept_drafter
    monkeypatch.setattr(modeling_medusa, "_kept_drafter", lambda model, *a: asked.append(a) or kept(model, *a))

    def chain_call():
        got, stats = whisper_medusa.generate(input_features=features, max_new_tokens=12, draft="chain",
                                             cuda_graph=True, return_stats=True)
        assert torch.equal(got, expected)
        return stats["accepted_tokens"]

    chain_call()
    built = len(asked)
    chain_call()
    assert built >= 1 and len(asked) == built
    (before,) = whisper_medusa.round_cache.runners.values()
    randomize_heads(whisper_medusa, 7)  # in place
    chain_call()
    (after,) = whisper_medusa.round_cache.runners.values()
    assert after is not before and len(asked) > built
    assert after.drafter is whisper_medusa.make_drafter(whisper_medusa.draft_tree("chain"), "cpu")  # the new heads'


def test_the_weights_checked_every_call_are_every_parameter(whisper_medusa):
    """``parameter_tensors`` (the cheap walk each call's weight check runs over) holds the same tensors as
    ``parameters()`` (a tied one once per module holding it) in a fixed order, and sees a layer replaced."""
    from modeling_medusa import parameter_tensors

    walked = parameter_tensors(whisper_medusa)
    assert {id(p) for p in walked} == {id(p) for p in whisper_medusa.parameters()}
    assert [id(p) for p in parameter_tensors(whisper_medusa)] == [id(p) for p in walked]
    layers = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Linear(4, 8, bias=False))
    layers[1].weight = layers[0].weight  # tied, as Whisper's output projection is
    assert [id(p) for p in parameter_tensors(layers)] == [id(layers[0].weight)] * 2
    layers[1] = torch.nn.Linear(4, 8)
    assert [id(p) for p in parameter_tensors(layers)] == [id(p) for p in layers.parameters()]


def test_a_later_call_makes_no_tensor_from_host_values_before_its_rounds(whisper_medusa, monkeypatch):
    """The prompt, the language and suppressed ids and the draft tree's tensors are made once per device and
    shared (on a GPU each made afresh is a copy that waits for the work queued before it), and a call walks its
    parameters once; the backbone's device is the base's."""
    import modeling_medusa
    from draft_trees import _tree_tensors
    from logits_rules import device_ids

    features = random_features(1, 2)
    whisper_medusa.generate(input_features=features, max_new_tokens=6, draft="chain")
    walks, walk = [], modeling_medusa.parameter_tensors
    monkeypatch.setattr(modeling_medusa, "parameter_tensors", lambda module: walks.append(module) or walk(module))
    made = (device_ids.cache_info().misses, _tree_tensors.cache_info().misses)
    whisper_medusa.generate(input_features=features, max_new_tokens=6, draft="chain")
    assert (device_ids.cache_info().misses, _tree_tensors.cache_info().misses) == made
    assert walks.count(whisper_medusa) == 1
    assert whisper_medusa.backbone.device == whisper_medusa.base.device


def emitted_by_rounds(sequences: torch.Tensor, max_new_tokens: int, eos: int) -> int:
    """Tokens the rounds emitted, counted from returned ids: each row's new tokens (Whisper drops the
    final EOS and pads with it, so a row shorter than the limit ended by one EOS), less the first token,
    which the prefill chose."""
    total = 0
    for row in sequences.tolist():
        while row and row[-1] == eos:
            row = row[:-1]
        total += (len(row) + 1 if len(row) < max_new_tokens else len(row)) - 1
    return total


def test_tokens_per_round_counts_only_emitted_tokens(whisper_medusa):
    """mean_accepted_per_round = tokens the rounds emitted / rows served per round, checked against the
    returned ids on rounds ending by EOS inside a draft, by max_new_tokens, and by the base's own token."""
    eos = whisper_medusa.backbone.eos_token_ids[0]
    rng = random.Random(77)
    cut_inside_a_round = 0
    for index in range(14):
        features = random_features(rng.randint(1, 3), 500 + index)
        max_new = rng.choice([3, 7, 12, 40])
        rows = whisper_medusa.collect_hidden_states(input_features=features, max_new_tokens=max_new + 8)
        whisper_medusa.drafter = OracleDrafter(whisper_medusa, rows, whisper_medusa.backbone.vocab_size,
                                               rng.choice([0.0, 0.3]), seed=index)
        try:
            got, stats = whisper_medusa.generate(input_features=features, max_new_tokens=max_new,
                                                 draft=rng.choice(["chain", [[0], [1], [0, 0], [0, 0, 0]]]),
                                                 return_stats=True, cuda_graph=index % 2 == 1)
        finally:
            whisper_medusa.drafter = None
        emitted = emitted_by_rounds(got, max_new, eos)
        assert stats["emitted_tokens"] == emitted, (index, stats)
        assert stats["mean_accepted_per_round"] == pytest.approx(emitted / stats["row_rounds"])
        # a round whose drafts or bonus token were cut by EOS or the length limit emits fewer than accepted + 1
        cut_inside_a_round += stats["emitted_tokens"] < stats["accepted_tokens"] + stats["row_rounds"]
    assert cut_inside_a_round > 0, "no case ended inside a round: the cut-off cases were not exercised"


@pytest.mark.parametrize("speech, fused", [(False, False), (True, False), (True, True)],
                         ids=["path-heads", "path-heads-with-speech-attention", "fused-path-drafter"])
def test_path_heads_equal_the_base_greedy(speech, fused, tmp_path_factory):
    """Sequentially dependent heads (each node drafted from its own path), with and without attention to
    the speech, and a draft vocabulary: random weights, chains and trees, batches, eager and fixed-shape
    rounds: the base's greedy ids every time; also through the fused drafter a GPU uses, here on the CPU."""
    from configuration_medusa import MedusaConfig
    from draft_trees import DraftTree
    from medusa_heads import FusedPathDrafter
    from modeling_medusa import MedusaForASR

    folder = build_tiny_whisper(tmp_path_factory.mktemp("path"), seed=3)
    fresh = MedusaForASR.from_base(str(folder), medusa_num_heads=4)
    config = MedusaConfig(**{**fresh.config.to_dict(), "head_kind": "path", "speech_attention": speech})
    model = MedusaForASR(config, base=fresh.base, processor=fresh.processor).eval()
    model.set_draft_vocab(list(range(0, 120, 2)) + [112, 113])
    model.set_options(fused_path_drafting=("cuda", "cpu") if fused else ())
    assert isinstance(model.make_drafter(DraftTree.chain(2), "cpu"), FusedPathDrafter) == fused
    rng = random.Random(8)
    for index in range(10):
        case = draw_case(rng, 4)
        features = random_features(case["batch"], case["features_seed"])
        expected = model.generate(input_features=features, max_new_tokens=case["max_new_tokens"], use_medusa=False)
        randomize_heads(model, case["head_seed"], std=0.2)
        got = model.generate(input_features=features, max_new_tokens=case["max_new_tokens"], draft=case["draft"],
                             cuda_graph=case["cuda_graph"])
        assert torch.equal(expected, got), f"case {index} {case}"


def test_chains_that_stop_drafting_early_equal_the_base_greedy(tmp_path_factory):
    """A CPU chain stops drafting where its drafts' probability falls below ``cpu_chain_stop``: random path heads
    (this tiny base's drafts are 0.4-1.0 likely) and thresholds that stop it after one draft (above 1), after
    one to three, or never (0), or as this machine's timings set it ("auto"), in batches of 1-3 (a batch stops
    where all its rows would): the base's greedy ids every time, and the stats count the drafts each round
    verified."""
    from configuration_medusa import MedusaConfig
    from modeling_medusa import MedusaForASR

    folder = build_tiny_whisper(tmp_path_factory.mktemp("stop"), seed=4)
    fresh = MedusaForASR.from_base(str(folder), medusa_num_heads=4)
    config = MedusaConfig(**{**fresh.config.to_dict(), "head_kind": "path", "speech_attention": True})
    model = MedusaForASR(config, base=fresh.base, processor=fresh.processor).eval()
    model.set_draft_vocab(list(range(0, 120, 2)) + [112, 113])
    rng = random.Random(21)
    drafts_per_round = {}
    for index in range(14):
        stop = [0.0, 2.0, 0.999, 0.99, 0.9, 0.6, "auto"][index % 7]
        batch, max_new = rng.randint(1, 3), rng.choice([5, 13, 34])
        features = random_features(batch, 900 + index)
        expected = model.generate(input_features=features, max_new_tokens=max_new, use_medusa=False)
        randomize_heads(model, rng.randint(0, 10_000), std=rng.choice([0.05, 0.2]))
        model.set_options(cpu_chain_stop=stop)
        got, stats = model.generate(input_features=features, max_new_tokens=max_new, draft="chain",
                                    return_stats=True)
        assert torch.equal(expected, got), f"case {index}: stop {stop}, batch {batch}"
        drafts_per_round.setdefault(stop, []).append(stats["drafted_tokens"] / stats["row_rounds"])
    assert all(d == 4 for d in drafts_per_round[0.0])  # no threshold: the full chain
    means = sorted(sum(d) / len(d) for d in drafts_per_round.values())
    assert means[0] == 1 and any(1 < m < 4 for m in means), drafts_per_round


def test_cpu_drafts_come_from_an_int8_copy_of_the_current_heads(tmp_path_factory):
    """On a CPU the drafter multiplies int8 copies of the heads (test_path_heads_equal_the_base_greedy shows
    the ids stay the base's); a copy made before the heads changed is never used after."""
    from configuration_medusa import MedusaConfig
    from draft_trees import DraftTree
    from medusa_heads import Int8Linear, int8_drafting_supported
    from modeling_medusa import MedusaForASR

    if not int8_drafting_supported("cpu"):
        pytest.skip("this torch has no CPU int8 weight-only kernel")
    fresh = MedusaForASR.from_base(str(build_tiny_whisper(tmp_path_factory.mktemp("int8"), seed=3)), medusa_num_heads=4)
    config = MedusaConfig(**{**fresh.config.to_dict(), "head_kind": "path", "speech_attention": True})
    model = MedusaForASR(config, base=fresh.base, processor=fresh.processor).eval()
    tree = DraftTree.chain(4)
    first = model.make_drafter(tree, "cpu")
    assert isinstance(first.heads.blocks[0].merge, Int8Linear) and first.projection.int8
    assert model.make_drafter(tree, "cpu") is first
    randomize_heads(model, 1, std=0.2)
    second = model.make_drafter(tree, "cpu")
    merge, weight = second.heads.blocks[0].merge, model.medusa_heads.blocks[0].merge.weight
    assert second is not first
    assert torch.allclose(merge.rows.float() * merge.scales.float()[:, None], weight, atol=float(weight.abs().max()) / 100)
    model.set_options(int8_cpu_drafting=False)
    assert model.make_drafter(tree, "cpu").heads is model.medusa_heads


def padded_like_a_short_clip(features: torch.Tensor, speech_ends: list[int]) -> torch.Tensor:
    """Each row's frames after its end set to the row's floor value, as a 30 s window's padding is."""
    features = features.clone()
    floor = features.amin(dim=(1, 2))
    for row, end in enumerate(speech_ends):
        features[row, :, end:] = floor[row]
    return features


def test_speech_frames_end_where_the_padding_starts():
    from backbone_whisper import SPEECH_FRAME_MARGIN, speech_frames

    features = padded_like_a_short_clip(random_features(2, 0), [401, 900])
    assert speech_frames(features) == 450 + SPEECH_FRAME_MARGIN  # the longer row (900 mel frames), encoder rate
    assert speech_frames(random_features(1, 0)) is None  # no padding: every frame
    assert speech_frames(padded_like_a_short_clip(random_features(1, 0), [2990])) is None  # the margin covers the rest


def test_drafts_reading_only_the_speech_frames_equal_the_base_greedy(tmp_path_factory, monkeypatch):
    """On a CPU, speech-attending heads read the frames up to the end of the speech (a short clip's window
    is mostly padding); the base's layers read every frame, so the ids stay the base's."""
    import backbone_whisper
    from configuration_medusa import MedusaConfig
    from modeling_medusa import MedusaForASR

    fresh = MedusaForASR.from_base(str(build_tiny_whisper(tmp_path_factory.mktemp("frames"), seed=2)), medusa_num_heads=4)
    config = MedusaConfig(**{**fresh.config.to_dict(), "head_kind": "path", "speech_attention": True})
    model = MedusaForASR(config, base=fresh.base, processor=fresh.processor).eval()
    seen = []
    speech_memory = backbone_whisper.WhisperBackbone.speech_memory
    monkeypatch.setattr(backbone_whisper.WhisperBackbone, "speech_memory",
                        lambda self, state: seen.append(speech_memory(self, state)[0].shape[2]) or speech_memory(self, state))
    rng, drafted_cases = random.Random(5), 0
    for index in range(6):
        case = draw_case(rng, 4)
        ends = [rng.randrange(100, 2000) for _ in range(case["batch"])]
        features = padded_like_a_short_clip(random_features(case["batch"], case["features_seed"]), ends)
        expected = model.generate(input_features=features, max_new_tokens=case["max_new_tokens"], use_medusa=False)
        randomize_heads(model, case["head_seed"], std=0.2)
        seen.clear()
        got = model.generate(input_features=features, max_new_tokens=case["max_new_tokens"], draft=case["draft"],
                             cuda_graph=False)
        assert torch.equal(expected, got), f"case {index} {case}"
        assert not seen or set(seen) == {backbone_whisper.speech_frames(features)}, (seen, ends)
        drafted_cases += bool(seen)
    assert drafted_cases > 0


class DirectCalls:
    """``CapturedCalls``' contract without CUDA: the function run on the inputs as given; the keys it was asked."""

    def __init__(self):
        self.keys = []

    def __call__(self, key, fn, *inputs, keep=None):
        self.keys.append(key)
        return fn(*inputs)


@pytest.mark.parametrize("multilingual", [False, True])
def test_captured_prefill_decomposition_equals_the_eager_prefill(tmp_path, multilingual):
    """On a GPU the prefill runs as ONE captured call (speech encoder + cross-attention K/V + each row's language
    where it is detected + the prompt's pass); the function it captures gives the same state as the eager
    prefill: same prompt, first token, hidden state and prompt keys/values."""
    from modeling_medusa import MedusaForASR

    folder = build_tiny_whisper(tmp_path / "w", seed=5, multilingual=multilingual)
    model = MedusaForASR.from_base(str(folder), medusa_num_heads=4)
    backbone = model.backbone
    inputs = {"input_features": random_features(2, seed=3)}
    process = backbone.make_logits_processor(None)
    eager, _, eager_prompt = backbone.prefill(inputs, 20, 8, process, cache_pool=model.round_cache.pool)
    eager_cache = [t.clone() for t in (eager.cache.keys, eager.cache.values)]
    calls = DirectCalls()
    captured, _, prompt = backbone.prefill(inputs, 20, 8, process, cache_pool=model.round_cache.pool, capture=calls)
    assert [(key[0], key[-1]) for key in calls.keys] == [("whisper-prefill", multilingual)]  # (detect or not)
    assert torch.equal(prompt, eager_prompt) and torch.equal(captured.lengths, eager.lengths)
    assert torch.equal(captured.next_token, eager.next_token) and torch.equal(captured.hidden, eager.hidden)
    n = int(captured.lengths.max())
    assert all(torch.equal(a[..., :n, :], b[..., :n, :]) for a, b in zip(eager_cache, (captured.cache.keys, captured.cache.values)))
    assert all(torch.equal(captured.extra[k], eager.extra[k]) for k in ("cross_keys", "cross_values"))


def test_captured_calls_copy_inputs_clone_outputs_and_run_eagerly_what_cannot_be_captured(monkeypatch):
    """The wrapper around each captured prefill graph, with a stand-in for the CUDA graph: a later call's
    inputs reach the graph, an earlier call's outputs are not overwritten by it, and a function whose capture
    fails (a host sync inside, say) runs eagerly with a warning, once."""
    import medusa_fast

    class ReplayedBody:
        def __init__(self, body):
            self.replay = body

    monkeypatch.setattr(medusa_fast, "capture_cuda_graph", lambda body, warmups: ReplayedBody(body))
    calls = medusa_fast.CapturedCalls()
    double = lambda x: (x * 2, x + 1)  # noqa: E731
    first = calls(("double",), double, torch.ones(3))
    second = calls(("double",), double, torch.full((3,), 5.0))
    assert first[0].tolist() == [2.0] * 3 and second[0].tolist() == [10.0] * 3 and second[1].tolist() == [6.0] * 3

    def refuse(body, warmups):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(medusa_fast, "capture_cuda_graph", refuse)
    with pytest.warns(UserWarning, match="runs eagerly"):
        assert calls(("synced",), double, torch.ones(2))[1].tolist() == [2.0, 2.0]
    assert calls(("synced",), double, torch.zeros(2))[0].tolist() == [0.0, 0.0]  # eagerly, no second try


def test_generate_under_inference_mode_equals_the_base_greedy(tmp_path_factory):
    """Users often call generate inside ``torch.inference_mode``: the derived copies the drafter and the
    projection keep (int8 rows on a CPU, a gathered draft vocabulary) are then inference tensors, which have
    no version counter."""
    from configuration_medusa import MedusaConfig
    from modeling_medusa import MedusaForASR

    fresh = MedusaForASR.from_base(str(build_tiny_whisper(tmp_path_factory.mktemp("inference"), seed=5)),
                                   medusa_num_heads=4)
    config = MedusaConfig(**{**fresh.config.to_dict(), "head_kind": "path", "speech_attention": True})
    model = MedusaForASR(config, base=fresh.base, processor=fresh.processor).eval()
    model.set_draft_vocab(list(range(0, 120, 3)))
    randomize_heads(model, 2, std=0.2)
    features = random_features(2, 11)
    expected = model.generate(input_features=features, max_new_tokens=12, use_medusa=False)
    for draft in ("chain", "tree"):
        with torch.inference_mode():
            got = model.generate(input_features=features, max_new_tokens=12, draft=draft)
        assert torch.equal(expected, got), draft


def test_fused_self_attention_projections_share_memory_and_keep_the_output(tmp_path_factory):
    """The self-attention's q/k/v fused into one weight and bias (what the rounds run): the base's layers become
    views of them (no memory added, k keeps no bias), the base's own generate is unchanged, Medusa still equals it,
    and new weight tensors (what ``.to()`` makes) are fused anew instead of stale weights read."""
    from backbone import backs
    from modeling_medusa import MedusaForASR

    folder = build_tiny_whisper(tmp_path_factory.mktemp("whisper_fused"), seed=7)
    model = MedusaForASR.from_base(str(folder), medusa_num_heads=4)
    rng = random.Random(8)
    cases = [(random_features(rng.randint(1, 3), rng.randint(0, 9999)), rng.choice(["chain", [[0], [1], [0, 0], [0, 0, 0]]]))
             for _ in range(6)]
    expected = [model.generate(input_features=features, use_medusa=False, max_new_tokens=20) for features, _ in cases]
    bytes_before = sum(p.numel() * p.element_size() for p in model.base.parameters())
    assert model.backbone.fuse_projections()
    attn = model.backbone.decoder.layers[1].self_attn
    weight, bias = model.backbone.fused[1]
    width = attn.q_proj.out_features
    assert attn.k_proj.weight.data_ptr() == weight[width].data_ptr()
    assert attn.v_proj.bias.data_ptr() == bias[2 * width].data_ptr() and attn.k_proj.bias is None
    assert not bias[width:2 * width].any()
    assert sum(p.numel() * p.element_size() for p in model.base.parameters()) == bytes_before
    for index, ((features, draft), want) in enumerate(zip(cases, expected)):
        assert torch.equal(model.generate(input_features=features, use_medusa=False, max_new_tokens=20), want)
        randomize_heads(model, index)
        assert torch.equal(model.generate(input_features=features, draft=draft, max_new_tokens=20,
                                          cuda_graph=index % 2 == 0), want)
    for param in model.base.parameters():
        param.data = param.data.clone()
    features, _ = cases[0]
    stale = model.backbone.fused
    assert torch.equal(model.generate(input_features=features, draft="chain", max_new_tokens=20), expected[0])
    fused_weight = model.backbone.fused[0][0]  # fused again, over the new tensors
    assert model.backbone.fused is not stale and backs(fused_weight, model.backbone.decoder.layers[0].self_attn.q_proj)
    assert model.backbone.fuse_projections()  # then a layer swapped for another kind of module: nothing to fuse
    attn = model.backbone.decoder.layers[0].self_attn
    attn.q_proj = torch.nn.Sequential(copy.deepcopy(attn.q_proj))
    assert torch.equal(model.generate(input_features=features, draft="chain", max_new_tokens=20), expected[0])
    assert model.backbone.fused is None


def test_a_replaced_base_generation_config_is_the_one_decoded(whisper_medusa):
    """``model.base.generation_config = <a new config>`` (as users set options): Medusa decodes with the new
    one, as the base's generate does, not with the object it saw when loaded."""
    model, features = whisper_medusa, random_features(2, 7)
    before = model.generate(input_features=features, max_new_tokens=12, draft="chain")
    original = model.base.generation_config
    spoken = sorted({t for t in before[:, 2:6].flatten().tolist() if t < 112})  # text ids (112+: special)
    try:
        model.base.generation_config = copy.deepcopy(original)
        model.base.generation_config.suppress_tokens = [*original.suppress_tokens, *spoken]
        expected = model.generate(input_features=features, max_new_tokens=12, use_medusa=False)
        got = model.generate(input_features=features, max_new_tokens=12, draft="chain")
    finally:
        model.base.generation_config = original
    assert not torch.equal(expected, before) and torch.equal(expected, got)
