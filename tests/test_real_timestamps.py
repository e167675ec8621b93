"""Timestamps and long-form audio on the real Whisper tiny.en with its committed heads (short clips also with the
timestamp-aware heads): Medusa's output equals the base's own generate (ids, segments, the tokenizer's offsets made
from them, and token-level timestamps) on flite speech, short clips and a two-minute recording, clean and under
noise, with and without conditioning on the previous window; words grouped from token times."""

import pytest
import torch

from backbone_whisper import segment_words
from conftest import requires_transformers5
from real_speech import converted_tiny_en, flite, long_recording, real_tiny_en_medusa, with_noise

pytestmark = requires_transformers5


@pytest.fixture(scope="module")
def model():
    return real_tiny_en_medusa()


@pytest.fixture(scope="module")
def timestamps_model():
    return real_tiny_en_medusa("whisper-tiny.en-timestamps")


@pytest.fixture(scope="module")
def recordings(tmp_path_factory):
    folder = tmp_path_factory.mktemp("long")
    clean = long_recording(folder, seconds=120.0)
    return clean, with_noise(clean, snr_db=10.0)


@pytest.mark.parametrize("heads", ["model", "timestamps_model"])
def test_short_clips_with_timestamps_equal_the_base(heads, request, tmp_path):
    model = request.getfixturevalue(heads)
    clips = [flite("The quick brown fox jumped over the lazy dog near the river bank.", tmp_path / "a.wav"),
             flite("Please call Stella. Ask her to bring these things with her from the store.", tmp_path / "b.wav",
                   "rms")]
    inputs = model.prepare_audio_inputs(clips)
    expected = model.generate(**inputs, return_timestamps=True, return_segments=True, use_medusa=False)
    tokenizer = model.processor.tokenizer
    for draft in ("chain", "tree"):
        got, stats = model.generate(**inputs, return_timestamps=True, return_segments=True, draft=draft,
                                    return_stats=True)
        assert torch.equal(got["sequences"], expected["sequences"]), draft
        assert [[(float(s["start"]), float(s["end"])) for s in row] for row in got["segments"]] == \
            [[(float(s["start"]), float(s["end"])) for s in row] for row in expected["segments"]]
        assert stats["accepted_tokens"] > 0, draft
    offsets = [tokenizer.decode(row.tolist(), output_offsets=True) for row in got["sequences"]]
    assert offsets == [tokenizer.decode(row.tolist(), output_offsets=True) for row in expected["sequences"]]
    for row in offsets:
        times = [t for piece in row["offsets"] for t in piece["timestamp"]]
        assert times and times == sorted(times)
    assert "lazy dog" in offsets[0]["text"].lower()


@pytest.mark.parametrize("condition_on_prev_tokens, draft, rows", [(False, "tree", 2), (True, "chain", 1)])
def test_long_form_equals_the_base_long_form(model, recordings, condition_on_prev_tokens, draft, rows):
    """Two minutes of speech, clean and at 10 dB SNR (one batch), or clean with the previous window's text as
    the prompt: sequential 30 s windows, each seeking to its last complete segment, as the base's long-form
    generate does them."""
    inputs = model.prepare_audio_inputs(list(recordings)[:rows])
    assert inputs["input_features"].shape[-1] > 3000
    options = {"condition_on_prev_tokens": condition_on_prev_tokens, "return_segments": True}
    expected = model.generate(**inputs, use_medusa=False, **options)
    got, stats = model.generate(**inputs, draft=draft, return_stats=True, **options)
    assert torch.equal(got["sequences"], expected["sequences"])
    for row_got, row_expected in zip(got["segments"], expected["segments"]):
        assert len(row_got) == len(row_expected) >= 10
        for a, b in zip(row_got, row_expected):
            assert (float(a["start"]), float(a["end"])) == (float(b["start"]), float(b["end"]))
            assert torch.equal(a["tokens"], b["tokens"])
    assert float(got["segments"][0][-1]["end"]) > 100.0
    assert stats["accepted_tokens"] > 0
    text = model.processor.batch_decode(got["sequences"], skip_special_tokens=True)[0].lower()
    assert "bingley" in text and "universally acknowledged" in text


def test_token_timestamps_equal_the_base(model, tmp_path):
    """Two real clips in one batch (rows of different lengths, each aligned within its own audio frames):
    Medusa's ids, then one teacher-forced pass of the base's decoder for the alignment heads' cross-attentions;
    the token times equal the base's own generate(return_token_timestamps=True), which collects the same weights
    token by token (equal here; they could differ by one 0.02 s frame only where two warping paths cost the same
    to the last bits of the weights). The words: the segment's text, in order, within the clip."""
    texts = ["The quick brown fox jumped over the lazy dog near the river bank.",
             "Please call Stella. Ask her to bring these things with her from the store."]
    clips = [flite(texts[0], tmp_path / "a.wav"), flite(texts[1], tmp_path / "b.wav", "rms")]
    inputs = model.prepare_audio_inputs(clips, return_attention_mask=True)
    options = {"return_timestamps": True, "return_segments": True, "return_token_timestamps": True}
    expected = model.generate(**inputs, use_medusa=False, **options)
    got, stats = model.generate(**inputs, return_stats=True, draft="tree", **options)  # (auto may keep plain greedy on a CPU)
    assert torch.equal(got["sequences"], expected["sequences"]) and stats["accepted_tokens"] > 0
    for rows_got, rows_expected in zip(got["segments"], expected["segments"], strict=True):
        for a, b in zip(rows_got, rows_expected, strict=True):
            assert torch.equal(a["token_timestamps"], b["token_timestamps"])
    for clip, segments, words in zip(clips, model.segments(got), model.segment_words(got)):
        assert [w for segment_words in words for w, _, _ in segment_words] == \
            " ".join(text for _, _, text in segments).split()
        times = [t for segment_words in words for _, start, end in segment_words for t in (start, end)]
        assert times == sorted(times) and 0.0 <= times[0] and times[-1] <= len(clip) / 16000
    assert "lazy" in [w for w, _, _ in model.segment_words(got)[0][0]]


def test_words_group_tokens_and_take_their_times():
    """Hand-made tokens and times through the tokenizer's Whisper word rules: a word starts with a space,
    punctuation joins its neighbour ("(" the next word, "," "." ")" "!" the previous one), a piece without a space
    joins its word; a word lasts from the time of the token before it (here a timestamp) to its last token's,
    held within the segment's bounds when given."""
    from transformers import WhisperTokenizerFast

    tokenizer = WhisperTokenizerFast.from_pretrained(converted_tiny_en())
    ids = tokenizer(" Hello, world. It's (really) fine!", add_special_tokens=False).input_ids
    assert [tokenizer.decode([i]) for i in ids] == [" Hello", ",", " world", ".", " It", "'s", " (", "really", ")",
                                                     " fine", "!"]
    first_timestamp = tokenizer.convert_tokens_to_ids("<|notimestamps|>") + 1  # <|0.00|>, then 0.02 s a step
    tokens = [first_timestamp, *ids, first_timestamp + 150]
    times = [0.0, 0.4, 0.5, 0.9, 1.0, 1.3, 1.4, 1.6, 2.0, 2.1, 2.5, 2.6, 3.0]
    assert segment_words(tokenizer, tokens, times) == [
        ("Hello,", 0.0, 0.5), ("world.", 0.5, 1.0), ("It's", 1.0, 1.4), ("(really)", 1.4, 2.1), ("fine!", 2.1, 2.6)]
    assert segment_words(tokenizer, tokens, times, within=(0.2, 2.3))[::4] == [("Hello,", 0.2, 0.5),
                                                                               ("fine!", 2.1, 2.3)]
