"""Whisper timestamps in the Medusa loop: the rules equal transformers' own WhisperTimeStampLogitsProcessor at
every node of a draft tree, and ``generate(return_timestamps=True)`` (short-form, long-form, prompts, segments)
equals the base's own generate token for token."""

import random
import warnings
from types import SimpleNamespace

import pytest
import torch

from conftest import requires_transformers5
from oracle import OracleDrafter, randomize_heads
from tiny_models import build_tiny_whisper, random_features

pytestmark = requires_transformers5

EOS, NO_TIMESTAMPS, TIMESTAMP_BEGIN, VOCAB = 40, 45, 46, 80  # ids below 40 are text, 41..44 other specials


def random_paths(rng: random.Random, depth: int, size: int) -> list[list[int]]:
    paths = {(0,)}
    for _ in range(size):
        parent = rng.choice(sorted(paths))
        paths.add(parent + (rng.randint(0, 2),) if len(parent) < depth else (rng.randint(0, 2),))
    return [list(p) for p in paths]


def random_token(rng: random.Random) -> int:
    """Mostly timestamps and text, so pairs, closing timestamps and EOS right after one all occur."""
    kind = rng.random()
    if kind < 0.45:
        return rng.randint(TIMESTAMP_BEGIN, VOCAB - 1)
    return EOS if kind < 0.5 else rng.randint(0, 44)


def last_timestamp(tokens: list[int]) -> int:
    return ([t for t in tokens if t >= TIMESTAMP_BEGIN] or [-1])[-1]


def base_processor(max_initial, from_logprob, begin_index):
    from transformers.generation.logits_process import WhisperTimeStampLogitsProcessor

    config = SimpleNamespace(no_timestamps_token_id=NO_TIMESTAMPS, eos_token_id=EOS, bos_token_id=EOS,
                             max_initial_timestamp_index=max_initial)
    return WhisperTimeStampLogitsProcessor(config, begin_index=begin_index, _detect_timestamp_from_logprob=from_logprob)


def random_logits(gen: torch.Generator, shape) -> torch.Tensor:
    """Text and timestamp scores on shifting scales: sometimes the timestamps' total wins, sometimes not."""
    logits = torch.randn(*shape, VOCAB, generator=gen) * 3
    logits[..., TIMESTAMP_BEGIN:] += torch.randn(*shape, 1, generator=gen) * 3 - 2
    return logits


@pytest.mark.parametrize("max_initial", [None, 0, 3])
@pytest.mark.parametrize("from_logprob", [True, False])
def test_rules_equal_the_base_processor_at_every_tree_node(max_initial, from_logprob):
    """Random histories (text, timestamps, EOS, at random lengths, prompts of random length) and random trees
    of random drafts: each node's logits equal the base processor's on that node's whole sequence, and the
    history carried over a random accepted path equals the one read off that path."""
    from backbone_whisper import TimestampRules
    from draft_trees import DraftTree
    from logits_rules import ChunkPath

    rng, gen = random.Random(7), torch.Generator().manual_seed(7)
    for case in range(40):
        batch, prompt_len = rng.randint(1, 3), rng.randint(1, 4)
        tree = DraftTree.from_paths(random_paths(rng, 4, rng.randint(0, 10)))
        tt = tree.tensors("cpu")
        base = base_processor(max_initial, from_logprob, prompt_len)
        rules = TimestampRules(base, VOCAB, "cpu")
        emitted = [[random_token(rng) for _ in range(rng.choice([1, 1, 2, 3, 6]))] for _ in range(batch)]
        prompts = [[rng.randint(0, VOCAB - 1) for _ in range(prompt_len)] for _ in range(batch)]
        chunk = torch.tensor([[row[-1]] + [random_token(rng) for _ in range(tree.num_nodes - 1)] for row in emitted])
        history = {"before_root": torch.tensor([row[-2] if len(row) > 1 else -1 for row in emitted]),
                   "last_timestamp": torch.tensor([last_timestamp(row[:-1]) for row in emitted])}
        generated = torch.tensor([len(row) for row in emitted])[:, None] + tt.depths[None, :]
        path = ChunkPath(chunk, tt, history, generated)
        logits = random_logits(gen, (batch, tree.num_nodes))
        got = rules(logits.clone(), generated, path)
        for b in range(batch):
            for node in range(tree.num_nodes):
                drafts = [int(chunk[b, n]) for n in tt.path_nodes[node, 1:int(tt.depths[node]) + 1]]
                sequence = torch.tensor([prompts[b] + emitted[b] + drafts])
                expected = base(sequence, logits[b, node][None].clone())[0]
                assert torch.equal(got[b, node], expected), f"case {case} row {b} node {node}: {sequence.tolist()}"
        best = torch.tensor([rng.randrange(tree.num_nodes) for _ in range(batch)])
        carried = rules.advance(path, best)
        for b in range(batch):
            accepted = emitted[b] + [int(chunk[b, n]) for n in tt.path_nodes[best[b], 1:int(tt.depths[best[b]]) + 1]]
            assert int(carried["before_root"][b]) == accepted[-1]
            assert int(carried["last_timestamp"][b]) == last_timestamp(accepted)


def test_first_token_rules_equal_the_base_processor():
    """Before anything is generated (the prefill's token): only timestamps, up to max_initial_timestamp_index;
    timestamps in the prompt (previous windows' text) do not count."""
    from backbone_whisper import TimestampRules
    from draft_trees import DraftTree
    from logits_rules import ChunkPath

    gen = torch.Generator().manual_seed(3)
    for max_initial in (None, 0, 5):
        base = base_processor(max_initial, True, 3)
        rules = TimestampRules(base, VOCAB, "cpu")
        prompt = torch.tensor([[1, 2, 60], [61, 62, 3]])
        logits = random_logits(gen, (2, 1))
        nothing = torch.zeros(2, 1, dtype=torch.long)
        got = rules(logits.clone(), nothing, ChunkPath(prompt[:, -1:], DraftTree(()).tensors("cpu"),
                                                       rules.start(2, "cpu"), nothing))
        assert torch.equal(got[:, 0], base(prompt, logits[:, 0].clone()))


def test_after_a_closing_timestamp_the_same_timestamp_is_drafted_first():
    """The rules allow only a timestamp no lower, or EOS, after a timestamp that follows text: node 1 drafts that
    timestamp again (Whisper's usual next segment start). Elsewhere the heads' drafts stay: after text, after a
    timestamp that opens a segment, and at the first token (no token before the root)."""
    from backbone_whisper import TimestampRules
    from logits_rules import ChainedRules, SuppressionRules

    rules = ChainedRules(SuppressionRules(VOCAB, "cpu", eos_token_ids=[EOS]),
                         TimestampRules(base_processor(None, True, 1), VOCAB, "cpu"))
    t1, t2 = TIMESTAMP_BEGIN + 3, TIMESTAMP_BEGIN + 7
    chunk = torch.tensor([[t2, 5, 6], [t2, 5, 6], [7, 5, 6], [t1, 5, 6]])  # roots, then the heads' drafts
    history = {"before_root": torch.tensor([9, t1, 9, -1]), "last_timestamp": torch.tensor([t1, t1, t1, -1])}
    hinted = rules.hint_drafts(chunk, history)
    assert hinted.tolist() == [[t2, t2, 6], [t2, 5, 6], [7, 5, 6], [t1, 5, 6]]
    assert chunk[0, 1] == 5  # (the drafted chunk itself is left as it was)


# --------------------------------------------------------------------------- generate == the base's generate


@pytest.fixture(scope="module", params=(1, 2))
def timestamp_model(request, tmp_path_factory):
    """Tiny random Whispers with the real timestamp layout (1501 tokens, 0.00-30.00 s)."""
    from modeling_medusa import MedusaForASR

    folder = build_tiny_whisper(tmp_path_factory.mktemp(f"ts{request.param}"), seed=request.param, timestamps=1501,
                                timestamp_scale=0.7)
    return MedusaForASR.from_base(str(folder), medusa_num_heads=4)


def oracle_for(model, error: float, seed: int, **inputs):
    """Drafts the continuation the base decodes for these inputs (every window), from its hidden states."""
    rows = model.collect_hidden_states(**inputs)
    return OracleDrafter(model, rows, model.backbone.vocab_size, error, seed=seed)


def medusa_equals_base(model, case: dict, **inputs):
    expected = model.generate(**inputs, use_medusa=False)
    randomize_heads(model, case["head_seed"])
    if case["drafter"] != "random":
        model.drafter = oracle_for(model, 0.0 if case["drafter"] == "oracle" else 0.4, case["head_seed"], **inputs)
    try:
        with warnings.catch_warnings():  # every window must run in the Medusa loop
            warnings.filterwarnings("error", message="Medusa decoding does not support")
            got, stats = model.generate(**inputs, draft=case["draft"], cuda_graph=case["cuda_graph"],
                                        return_stats=True)
    finally:
        model.drafter = None
    return expected, got, stats


def draw_case(rng: random.Random) -> dict:
    return {"drafter": rng.choice(["random", "oracle", "oracle", "noisy_oracle"]),
            "draft": rng.choice(["chain", "none", random_paths(rng, 4, rng.randint(1, 10))]),
            "head_seed": rng.randint(0, 10_000), "cuda_graph": rng.random() < 0.3}


def assert_same_output(expected, got, context):
    if isinstance(expected, dict):
        assert torch.equal(expected["sequences"], got["sequences"]), context
        for rows_expected, rows_got in zip(expected["segments"], got["segments"]):
            assert len(rows_expected) == len(rows_got), context
            for a, b in zip(rows_expected, rows_got):
                assert (float(a["start"]), float(a["end"])) == (float(b["start"]), float(b["end"])), context
                assert torch.equal(a["tokens"], b["tokens"]) and torch.equal(a["result"], b["result"]), context
    else:
        assert torch.equal(expected, got), f"{context}: base {expected.tolist()} medusa {got.tolist()}"


def test_timestamps_equal_the_base_on_random_cases(timestamp_model):
    rng = random.Random(11)
    accepted = 0
    for index in range(12):
        case = draw_case(rng)
        inputs = {"input_features": random_features(rng.randint(1, 3), rng.randint(0, 10_000)),
                  "return_timestamps": True, "max_new_tokens": rng.choice([1, 3, 8, 21, 40])}
        if rng.random() < 0.3:
            inputs["min_new_tokens"] = rng.choice([2, 6])
        if rng.random() < 0.4:
            inputs["return_segments"] = True
        expected, got, stats = medusa_equals_base(timestamp_model, case, **inputs)
        assert_same_output(expected, got, f"case {index} {case} {inputs['max_new_tokens']}")
        accepted += stats["accepted_tokens"]
    assert accepted > 0, "no draft was accepted: the oracle cases did not exercise acceptance"


def long_features(batch: int, seed: int, frames: int) -> torch.Tensor:
    """More than one 30 s window of features (3000 frames each)."""
    pieces = [random_features(batch, seed + i) for i in range(-(-frames // 3000))]
    return torch.cat(pieces, dim=-1)[..., :frames]


@pytest.mark.parametrize("condition_on_prev_tokens", [False, True])
def test_long_form_equals_the_base_long_form(timestamp_model, condition_on_prev_tokens):
    """Sequential windows (seeking to the last timestamp, the previous text as the prompt when conditioning),
    batches of different lengths (attention mask): the base's long-form generate, segments included."""
    rng = random.Random(21 + condition_on_prev_tokens)
    for index in range(4):
        batch = rng.randint(1, 3)
        frames = [rng.randint(3100, 8000) for _ in range(batch)]
        features = long_features(batch, rng.randint(0, 1000), max(frames))
        mask = torch.tensor([[1] * n + [0] * (max(frames) - n) for n in frames])
        case = draw_case(rng)
        inputs = {"input_features": features * mask[:, None, :], "attention_mask": mask,
                  "condition_on_prev_tokens": condition_on_prev_tokens, "return_segments": rng.random() < 0.5,
                  "max_new_tokens": rng.choice([12, 25])}
        expected, got, _ = medusa_equals_base(timestamp_model, case, **inputs)
        assert_same_output(expected, got, f"case {index} {case}")


def test_prompt_ids_equal_the_base(timestamp_model):
    """Whisper's prompt (previous text before <|startoftranscript|>), with and without timestamps."""
    rng = random.Random(5)
    prompt_ids = torch.tensor([114, 9, 17, 33, 71])  # <|startofprev|> and some text
    for index, timestamps in enumerate([False, True, True]):
        case = draw_case(rng)
        inputs = {"input_features": random_features(2, 40 + index), "prompt_ids": prompt_ids,
                  "return_timestamps": timestamps, "max_new_tokens": 20}
        expected, got, _ = medusa_equals_base(timestamp_model, case, **inputs)
        assert_same_output(expected, got, f"case {index} {case}")


@pytest.mark.parametrize("threshold", [1e9, 0.01])  # the compression ratio never / always rejects a window
def test_temperature_fallback_equals_the_base(timestamp_model, threshold):
    """``temperature=(0.0, 0.5, 1.0)`` with a compression-ratio threshold, short- and long-form: every window is
    decoded greedily first, by Medusa, and retried by the base's own sampling where the threshold rejects it
    (the same random seed: the same samples); the output is the base's, segments included."""
    rng = random.Random(31)
    for index in range(4):
        case = draw_case(rng)
        frames = rng.choice([3000, 6500])
        features = long_features(2, rng.randint(0, 1000), frames)
        inputs = {"input_features": features, "temperature": (0.0, 0.5, 1.0), "compression_ratio_threshold": threshold,
                  "max_new_tokens": 20, "return_segments": frames > 3000}
        if frames > 3000:
            inputs["attention_mask"] = torch.ones(2, frames, dtype=torch.long)
        torch.manual_seed(index)
        expected = timestamp_model.generate(**inputs, use_medusa=False)
        randomize_heads(timestamp_model, case["head_seed"])
        with warnings.catch_warnings(record=True) as caught:  # greedy windows in the Medusa loop; only sampled
            warnings.simplefilter("always")  # retries in the base's, each said in a warning
            warnings.filterwarnings("error", message="Medusa decoding does not support")
            torch.manual_seed(index)
            got, stats = timestamp_model.generate(**inputs, draft=case["draft"], return_stats=True)
        assert_same_output(expected, got, f"case {index} {case} frames={frames}")
        assert stats["rounds"] > 0, "no window was decoded by Medusa"
        retries = [str(w.message) for w in caught if str(w.message).startswith("Temperature fallback")]
        assert bool(retries) == (threshold < 1), retries  # a retry where the threshold rejects, and only there
        assert all("temperature 0.5" in r or "temperature 1" in r for r in retries), retries


# --------------------------------------------------------------------------- token timestamps (word times)

ALIGNMENT_HEADS = [[0, 1], [1, 0], [1, 3]]  # (decoder layer, head) of the tiny models


@pytest.mark.parametrize("frames, condition_on_prev_tokens", [((900, 3000, 2100), False), ((3400, 7000, 5200), True)])
def test_token_timestamps_equal_the_base(timestamp_model, monkeypatch, frames, condition_on_prev_tokens):
    """``return_token_timestamps=True``: Medusa decodes each window, then one teacher-forced pass of the base's
    decoder gives the window's cross-attentions, which the base's own generate collects token by token. The
    queries are the same (the padding after a row's EOS and the left-padded prompts of conditioned long-form
    windows included), so every token's time equals the base's: short-form rows of different lengths, each
    aligned within its own frames, and long-form windows, offset to where they start. (One pass and token by
    token differ in the last bits of the weights; a time could move by one 0.02 s frame only where two warping
    paths cost the same to that precision.) The model keeps its attention implementation afterwards."""
    monkeypatch.setattr(timestamp_model.base.generation_config, "alignment_heads", ALIGNMENT_HEADS, raising=False)
    implementation = timestamp_model.base.config._attn_implementation
    width = max(max(frames), 3000)
    mask = torch.tensor([[1] * n + [0] * (width - n) for n in frames])
    inputs = {"input_features": long_features(len(frames), 7, width) * mask[:, None, :], "attention_mask": mask,
              "return_timestamps": True, "return_segments": True, "return_token_timestamps": True,
              "condition_on_prev_tokens": condition_on_prev_tokens, "max_new_tokens": 25}
    case = {"drafter": "oracle", "draft": "chain", "head_seed": 3, "cuda_graph": False}
    expected, got, stats = medusa_equals_base(timestamp_model, case, **inputs)
    assert torch.equal(expected["sequences"], got["sequences"]) and stats["accepted_tokens"] > 0
    for rows_expected, rows_got in zip(expected["segments"], got["segments"], strict=True):
        assert len(rows_expected) == len(rows_got) > 0
        for a, b in zip(rows_expected, rows_got):
            assert torch.equal(a["tokens"], b["tokens"]) and float(a["start"]) == float(b["start"])
            assert torch.equal(a["token_timestamps"], b["token_timestamps"]), (a["token_timestamps"], b["token_timestamps"])
    if width > 3000:  # long-form: the times of later windows carry their offsets
        assert (torch.cat([s["token_timestamps"] for row in got["segments"] for s in row]) > 30.0).any()
    assert timestamp_model.base.config._attn_implementation == implementation


def test_word_timestamps_need_alignment_heads(timestamp_model, monkeypatch, tmp_path, capsys):
    """A base without alignment heads (the tiny models, or a conversion whose source had none: an empty list)
    cannot time words: a clear error naming them, from the model, its generate and, before any audio is
    decoded, the transcription command."""
    import soundfile as sf

    from tools import transcribe

    gen = timestamp_model.base.generation_config
    with pytest.raises(ValueError, match="no alignment_heads"):
        timestamp_model.check_word_timestamps()
    monkeypatch.setattr(gen, "alignment_heads", [], raising=False)
    with pytest.raises(ValueError, match="no alignment_heads"):
        timestamp_model.generate(input_features=random_features(1, 0), return_token_timestamps=True)
    sf.write(str(tmp_path / "a.wav"), random_features(1, 0)[0, 0].numpy() * 0.1, 16000)
    code = transcribe.main([str(tmp_path / "a.wav"), "--format", "json", "--word-timestamps", "--quiet"],
                                  model_loader=lambda *args, **kwargs: timestamp_model)
    err = capsys.readouterr().err
    assert code == transcribe.EXIT_USER_ERROR
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        line for line in err.splitlines() if "--word-timestamps: this Whisper base's generation_config has no "
        "alignment_heads" in line]
    monkeypatch.setattr(gen, "alignment_heads", [[2, 0]], raising=False)  # the tiny decoder has layers 0 and 1
    with pytest.raises(ValueError, match=r"alignment_heads \[\[2, 0\]\] .* outside"):
        timestamp_model.check_word_timestamps()


def test_windowed_calls_encode_the_speech_once(tmp_path, monkeypatch):
    """The base's generate encodes the same features twice when it detects the language (once to detect, once for
    the window); inside our windowed calls the encoder runs once, the ids are the base's own, and afterwards the
    encoder is the base's own again."""
    from modeling_medusa import MedusaForASR
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    folder = build_tiny_whisper(tmp_path / "ml", seed=5, multilingual=True, timestamps=1501, timestamp_scale=0.7)
    model = MedusaForASR.from_base(str(folder), medusa_num_heads=4)
    runs = []
    original = WhisperEncoder.forward
    monkeypatch.setattr(WhisperEncoder, "forward", lambda self, *a, **k: runs.append(1) or original(self, *a, **k))
    for seed in range(3):
        inputs = {"input_features": random_features(2, seed), "return_timestamps": True, "max_new_tokens": 12}
        runs.clear()
        expected = model.generate(**inputs, use_medusa=False)
        base_runs = len(runs)  # the base alone: language detection, then each window (a short one may need two)
        runs.clear()
        assert torch.equal(model.generate(**inputs, draft="chain"), expected)
        assert base_runs >= 2 and len(runs) == base_runs - 1  # detection and the first window share one
    assert "forward" not in vars(model.base.model.encoder)
