"""``transformers.pipeline("automatic-speech-recognition", model=<artifact>, trust_remote_code=True)`` on the real
Whisper tiny.en with its committed heads: it loads from the artifact folder alone, Medusa decodes (no fallback
to the base), and text, timestamps and chunked long audio equal the library's pipeline over the base itself."""

import warnings

import pytest

from conftest import requires_transformers5
from real_speech import ROOT, converted_tiny_en, flite, long_recording

pytestmark = requires_transformers5
ARTIFACT = str(ROOT / "heads" / "whisper-tiny.en")


@pytest.fixture(scope="module")
def pipelines():
    from transformers import WhisperForConditionalGeneration, WhisperProcessor, pipeline

    converted_tiny_en()  # the artifact names openai/whisper-tiny.en: resolved offline to this converted copy
    ours = pipeline("automatic-speech-recognition", model=ARTIFACT, trust_remote_code=True)
    base_folder = str(converted_tiny_en())
    processor = WhisperProcessor.from_pretrained(base_folder)
    base = pipeline("automatic-speech-recognition", model=WhisperForConditionalGeneration.from_pretrained(base_folder),
                    tokenizer=processor.tokenizer, feature_extractor=processor.feature_extractor,
                    generate_kwargs={"num_beams": 1})  # the pipeline's own default is beam search; ours is greedy
    return ours, base


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    folder = tmp_path_factory.mktemp("clips")
    return [flite("The quick brown fox jumped over the lazy dog near the river bank.", folder / "a.wav"),
            flite("Please call Stella. Ask her to bring these things with her from the store.", folder / "b.wav",
                  "rms")]


def _medusa_ran(call):
    """Run ``call`` and fail if Medusa handed any of it to the base's own decoding."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = call()
    fallbacks = [str(w.message) for w in caught if "Medusa decoding does not support" in str(w.message)]
    assert not fallbacks, fallbacks
    return result


def test_pipeline_loads_the_artifact_and_decodes_with_medusa(pipelines, clips):
    ours, base = pipelines
    assert type(ours).__name__ == "MedusaSpeechRecognitionPipeline" and ours.type == "seq2seq_whisper"
    got = _medusa_ran(lambda: ours([{"raw": c, "sampling_rate": 16000} for c in clips],
                                   generate_kwargs={"draft": "tree"}))  # drafts even where auto would pick none
    want = base([{"raw": c, "sampling_rate": 16000} for c in clips])
    assert [g["text"] for g in got] == [w["text"] for w in want]
    assert "quick brown fox" in got[0]["text"].lower()


def test_pipeline_timestamps_equal_the_base_pipeline(pipelines, clips):
    ours, base = pipelines
    got = _medusa_ran(lambda: ours({"raw": clips[1], "sampling_rate": 16000}, return_timestamps=True))
    want = base({"raw": clips[1], "sampling_rate": 16000}, return_timestamps=True)
    assert got["chunks"] == want["chunks"] and len(got["chunks"]) >= 1


def test_pipeline_chunked_long_audio_equals_the_base_pipeline(pipelines, tmp_path):
    ours, base = pipelines
    audio = long_recording(tmp_path, seconds=65.0)
    options = {"chunk_length_s": 30, "batch_size": 2, "return_timestamps": True}
    got = _medusa_ran(lambda: ours({"raw": audio, "sampling_rate": 16000}, generate_kwargs={"draft": "chain"},
                                   **options))
    want = base({"raw": audio, "sampling_rate": 16000}, **options)
    assert got["text"] == want["text"] and got["chunks"] == want["chunks"]
    assert len(got["text"].split()) > 100


def test_pipeline_word_timestamps_equal_the_base_pipeline(pipelines, clips):
    """``return_timestamps="word"``: Medusa decodes, the base's cross-attention times the words, as in the
    library's pipeline over the base."""
    ours, base = pipelines
    got = _medusa_ran(lambda: ours({"raw": clips[0], "sampling_rate": 16000}, return_timestamps="word"))
    want = base({"raw": clips[0], "sampling_rate": 16000}, return_timestamps="word")
    assert got["chunks"] == want["chunks"] and len(got["chunks"]) >= 10
