"""Timestamps and long-form audio on the real Whisper tiny.en with its committed heads: Medusa's output equals
the base's own generate (ids, segments, and the tokenizer's offsets made from them) on flite speech, short clips
and a two-minute recording, clean and under noise, with and without conditioning on the previous window."""

import pytest
import torch

from conftest import requires_transformers5
from real_speech import flite, long_recording, real_tiny_en_medusa, with_noise

pytestmark = requires_transformers5


@pytest.fixture(scope="module")
def model():
    return real_tiny_en_medusa()


@pytest.fixture(scope="module")
def recordings(tmp_path_factory):
    folder = tmp_path_factory.mktemp("long")
    clean = long_recording(folder, seconds=120.0)
    return clean, with_noise(clean, snr_db=10.0)


def test_short_clips_with_timestamps_equal_the_base(model, tmp_path):
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
