"""Tiny, faithful stand-in of MERaLiON-2 for offline tests (transformers ~4.51 only).

The real MERaLiON-2 weights and remote code are not reachable from the tests, so
``build_meralion2_standin`` writes a folder that looks like a MERaLiON-2 Hub
snapshot, with random weights:

* ``config.json`` (model_type ``meralion2``; auto_map ``AutoConfig`` and
  ``AutoModelForSpeechSeq2Seq``, no ``AutoModel``, as upstream), weights
  (``model.safetensors``), ``generation_config.json`` (eos ``[1, 107]``);
* the remote-code files from ``tests/meralion2_standin/``;
* a processor: WhisperFeatureExtractor (128 mel bins) + a byte-level tokenizer
  built offline (Gemma-like special-token ids, chat template), loadable with
  ``AutoProcessor.from_pretrained(folder, trust_remote_code=True)``.

Load it the way MERaLiON-2 is loaded::

    model = AutoModelForSpeechSeq2Seq.from_pretrained(
        folder, trust_remote_code=True, local_files_only=True, attn_implementation="eager")
    processor = AutoProcessor.from_pretrained(folder, trust_remote_code=True, local_files_only=True)

Pass ``attn_implementation="eager"``: without it transformers 4.51 gives the
text decoder SDPA, which silently drops Gemma2's attention soft-capping.

transformers 4.51 quirks the stand-in shares with the real model, made visible by
its short sliding window (16 by default; 4096 on the real 3B):

* ``HybridCache.get_seq_length()`` counts the filled slots of layer 0, a sliding
  layer, so it saturates at the window: always pass ``cache_position`` explicitly
  when decoding by hand (Gemma2Model otherwise derives it from that count).
* ``generate`` is exact while the prompt is longer than the window; if decoding
  *crosses* the window (prompt < window <= prompt + new tokens), the rolling sliding
  buffer drops a position one step early and logits drift from a cache-free run.
* ``generation_config.json`` holds no ``use_cache`` (so ``generate`` caches, with a
  HybridCache picked from ``text_config.cache_implementation``); ``text_config.use_cache``
  is False as upstream, so plain forwards build no cache unless ``use_cache=True``.

The remote code imports ``HybridCache`` & co. and, like the real code, targets
transformers 4.51; building under transformers >= 4.52 raises ``RuntimeError``.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import json
import math
import shutil
import sys
from pathlib import Path
from typing import Any, Dict, Sequence, Union

import numpy as np

STANDIN_CODE_DIR = Path(__file__).resolve().parent / "meralion2_standin"
REMOTE_CODE_FILES = ("configuration_meralion2.py", "modeling_meralion2.py", "processing_meralion2.py")

SPEECH_PLACEHOLDER = "<SpeechHere>"
SAMPLING_RATE = 16000
SPEECH_TOKENS_PER_CHUNK = 100  # 1500 encoder frames / speech_mlp_scale_factor 15
DEFAULT_INSTRUCTION = "Transcribe the speech"

# Gemma-like special ids (speech placeholder = vocab_size - 1, like 255999 upstream)
PAD_ID, EOS_ID, BOS_ID, UNK_ID, MASK_ID = 0, 1, 2, 3, 4
START_OF_TURN_ID, END_OF_TURN_ID = 106, 107
GENERATION_EOS_IDS = [EOS_ID, END_OF_TURN_ID]

# Gemma-style chat template (same rendered format; written for this stand-in).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + (message['content'] | trim) + '<end_of_turn>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)

# Default sizes; every key can be overridden through ``build_meralion2_standin(**size_overrides)``.
MERALION2_STANDIN_DEFAULTS: Dict[str, Any] = {
    # speech encoder (WhisperEncoder); max_source_positions stays 1500 so the
    # encoder takes exactly (N, num_mel_bins, 3000) and yields 100 tokens per chunk
    "speech_d_model": 16,
    "speech_layers": 1,
    "speech_heads": 2,
    "speech_ffn_dim": 32,
    "num_mel_bins": 128,
    "speech_mlp_scale_factor": 15,
    # text decoder (Gemma2ForCausalLM)
    "vocab_size": 300,
    "hidden_size": 32,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "intermediate_size": 64,
    "sliding_window": 16,
    "query_pre_attn_scalar": 8,
    "final_logit_softcapping": 30.0,
    "attn_logit_softcapping": 50.0,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 8192,
    # untied by default: with a random *tied* head greedy decoding collapses onto
    # repeating the current token; tie_word_embeddings=True is supported
    "tie_word_embeddings": False,
}

# Init: Linear/Conv weights N(0, gain / sqrt(fan_in)), biases N(0, 0.02), LayerNorm 1 + N(0, 0.1),
# Gemma2RMSNorm (stored zero-centred, used as 1 + w) N(0, 0.2). Chosen so that every part of
# Gemma2 visibly moves the logits (attention soft-cap: ~1, final soft-cap: ~1, SDPA vs eager: ~1),
# greedy top-1 margins stay far above float32 noise, and outputs vary with the audio.
_EMBED_STD = 1.0  # embed_tokens (and lm_head when tied)
_QK_GAIN = 3.0  # q_proj / k_proj: attention scores large enough for the 50 soft-cap to matter
_NORM_STD = 0.2
_LM_HEAD_GAIN = 3.0  # untied lm_head: logits std ~3, the 30 soft-cap visibly bends the top logits
_SPEECH_OUT_GAIN = 3.0  # adapter out_proj: speech vectors strong enough to steer the output
_QUIET_ROW_SCALE = 0.05  # output rows of ids the stand-in should (almost) never emit
_EOS_ROW_SCALE = 0.8  # output rows of eos / <end_of_turn>: emitted now and then
_LOUD_BYTES = list(range(0x20, 0x7F))  # printable ASCII: decoded output is plain text


def _require_transformers_451():
    import transformers
    from packaging.version import Version

    if Version(transformers.__version__) >= Version("4.52"):
        raise RuntimeError(
            f"The MERaLiON-2 stand-in targets transformers 4.51 (found {transformers.__version__}): like the real "
            "MERaLiON-2 remote code it relies on HybridCache-era Gemma2 internals (see docs/meralion2.md section 7)."
        )


def _standin_module(name: str):
    """Import one of the remote-code files from tests/meralion2_standin as a package module."""
    package = "_meralion2_standin_code"
    if package not in sys.modules:
        spec = importlib.machinery.ModuleSpec(package, None, is_package=True)
        module = importlib.util.module_from_spec(spec)
        module.__path__ = [str(STANDIN_CODE_DIR)]
        sys.modules[package] = module
    return importlib.import_module(f"{package}.{name}")


# ----------------------------------------------------------------------------- tokenizer
def _byte_to_unicode() -> Dict[int, str]:
    """The printable-character alphabet of byte-level BPE, byte -> char."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _special_tokens(vocab_size: int) -> Dict[int, str]:
    return {
        PAD_ID: "<pad>",
        EOS_ID: "<eos>",
        BOS_ID: "<bos>",
        UNK_ID: "<unk>",
        MASK_ID: "<mask>",
        START_OF_TURN_ID: "<start_of_turn>",
        END_OF_TURN_ID: "<end_of_turn>",
        vocab_size - 1: SPEECH_PLACEHOLDER,
    }


def _layout(vocab_size: int):
    """(ids of the 256 byte tokens in byte order, ids of the <unusedN> tokens)."""
    specials = _special_tokens(vocab_size)
    if vocab_size - 1 <= END_OF_TURN_ID or vocab_size < 256 + len(specials):
        raise ValueError(f"vocab_size must be >= {256 + len(specials)} (all bytes + Gemma's special ids)")
    free = [i for i in range(vocab_size) if i not in specials]
    return free[:256], free[256:]


MAX_SPECIAL_UNUSED = 4096


def build_meralion2_tokenizer(vocab_size: int = 300):
    """Byte-level tokenizer with Gemma's special ids, built offline.

    ids: 0 ``<pad>``, 1 ``<eos>``, 2 ``<bos>``, 3 ``<unk>``, 4 ``<mask>``, 106 ``<start_of_turn>``,
    107 ``<end_of_turn>``, ``vocab_size - 1`` ``<SpeechHere>``; the 256 bytes fill the free
    ids from 5 upwards, the rest are ``<unusedN>``. Any text round-trips through
    encode/decode. Like Gemma's tokenizer it prepends ``<bos>`` unless
    ``add_special_tokens=False``.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = _special_tokens(vocab_size)
    byte_ids, unused_ids = _layout(vocab_size)
    vocab = {tok: i for i, tok in specials.items()}
    for byte, char in _byte_to_unicode().items():
        vocab[char] = byte_ids[byte]
    unused = []
    for n, i in enumerate(unused_ids):
        vocab[f"<unused{n}>"] = i
        unused.append(f"<unused{n}>")

    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    # the library adds special tokens one by one, far too slowly for a real vocabulary's ~255 000 unused ids: past a
    # few thousand they stay plain vocabulary entries (no text encodes to them; they decode to their own names)
    special_strings = [specials[i] for i in sorted(specials)] + (unused if len(unused) <= MAX_SPECIAL_UNUSED else [])
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in special_strings])
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B:1", special_tokens=[("<bos>", BOS_ID)]
    )
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
        additional_special_tokens=["<start_of_turn>", "<end_of_turn>", SPEECH_PLACEHOLDER],
        padding_side="left",
        clean_up_tokenization_spaces=False,
        chat_template=CHAT_TEMPLATE,
        model_max_length=8192,
    )
    assert hf_tok.convert_tokens_to_ids("<end_of_turn>") == END_OF_TURN_ID
    assert hf_tok.convert_tokens_to_ids(SPEECH_PLACEHOLDER) == vocab_size - 1
    return hf_tok


# ----------------------------------------------------------------------------- model
def _sinusoids(length: int, channels: int) -> "torch.Tensor":
    import torch

    half = channels // 2
    inv = torch.exp(-math.log(10000.0) / (half - 1) * torch.arange(half, dtype=torch.float32))
    angles = torch.arange(length, dtype=torch.float32)[:, None] * inv[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=1)


def _make_config(sizes: Dict[str, Any]):
    from transformers import Gemma2Config, WhisperConfig

    cfg_mod = _standin_module("configuration_meralion2")
    speech = WhisperConfig(
        d_model=sizes["speech_d_model"],
        encoder_layers=sizes["speech_layers"],
        encoder_attention_heads=sizes["speech_heads"],
        encoder_ffn_dim=sizes["speech_ffn_dim"],
        decoder_layers=1,
        decoder_attention_heads=sizes["speech_heads"],
        decoder_ffn_dim=sizes["speech_ffn_dim"],
        encoder_layerdrop=0.0,
        num_mel_bins=sizes["num_mel_bins"],
        max_source_positions=1500,
        scale_embedding=False,
        activation_function="gelu",
        vocab_size=51866,  # whisper-large-v3's (unused: only the encoder is built)
    )
    vocab = sizes["vocab_size"]
    text = Gemma2Config(
        vocab_size=vocab,
        hidden_size=sizes["hidden_size"],
        intermediate_size=sizes["intermediate_size"],
        num_hidden_layers=sizes["num_hidden_layers"],
        num_attention_heads=sizes["num_attention_heads"],
        num_key_value_heads=sizes["num_key_value_heads"],
        head_dim=sizes["head_dim"],
        hidden_activation="gelu_pytorch_tanh",
        max_position_embeddings=sizes["max_position_embeddings"],
        rms_norm_eps=sizes["rms_norm_eps"],
        rope_theta=sizes["rope_theta"],
        query_pre_attn_scalar=sizes["query_pre_attn_scalar"],
        sliding_window=sizes["sliding_window"],
        final_logit_softcapping=sizes["final_logit_softcapping"],
        attn_logit_softcapping=sizes["attn_logit_softcapping"],
        tie_word_embeddings=sizes["tie_word_embeddings"],
        cache_implementation="hybrid",
        use_cache=False,  # as in the real config: pass use_cache=True yourself
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        bos_token_id=BOS_ID,
        torch_dtype="float32",
    )
    return cfg_mod.MERaLiON2Config(
        speech_config=speech,
        text_config=text,
        speech_mlp_scale_factor=sizes["speech_mlp_scale_factor"],
        speech_token_index=vocab - 1,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        tie_word_embeddings=sizes["tie_word_embeddings"],
        torch_dtype="float32",
    )


def _init_weights(model, seed: int):
    """Deterministic, non-degenerate init of every parameter (independent of library init code)."""
    import torch
    from torch import nn

    gen = torch.Generator().manual_seed(seed)

    def normal_(t, std, mean=0.0):
        t.copy_(torch.randn(t.shape, generator=gen) * std + mean)

    with torch.no_grad():
        for name, module in model.named_modules():
            kind = type(module).__name__
            if isinstance(module, (nn.Linear, nn.Conv1d)):
                if name.endswith("lm_head") and model.config.text_config.tie_word_embeddings:
                    continue  # shares embed_tokens' weight
                fan_in = module.weight[0].numel()
                gain = 1.0
                if name.endswith(("q_proj", "k_proj")) and "text_decoder" in name:
                    gain = _QK_GAIN
                elif name.endswith("lm_head"):
                    gain = _LM_HEAD_GAIN
                elif name.endswith("speech_audio_adapter.out_proj"):
                    gain = _SPEECH_OUT_GAIN
                normal_(module.weight, gain / math.sqrt(fan_in))
                if module.bias is not None:
                    normal_(module.bias, 0.02)
            elif isinstance(module, nn.Embedding):
                if name.endswith("embed_positions"):
                    module.weight.copy_(_sinusoids(*module.weight.shape))
                else:
                    normal_(module.weight, _EMBED_STD)  # text embeddings (and the tied lm_head)
            elif isinstance(module, nn.LayerNorm):
                normal_(module.weight, 0.1, mean=1.0)
                normal_(module.bias, 0.05)
            elif kind == "Gemma2RMSNorm":
                normal_(module.weight, _NORM_STD)
        # Shape the output distribution like a trained ASR model's: it (almost) never emits pad/
        # bos/unk/mask/<start_of_turn>/<unusedN>/the speech placeholder (a generated placeholder
        # would also break cache-free re-runs with input_features), emits printable ASCII bytes
        # (so decoded text is plain text), and ends with eos (1) or <end_of_turn> (107) now and then.
        vocab = model.config.text_config.vocab_size
        byte_ids, _ = _layout(vocab)
        loud = {byte_ids[b] for b in _LOUD_BYTES}
        scale = torch.full((vocab, 1), _QUIET_ROW_SCALE)
        scale[sorted(loud)] = 1.0
        scale[[EOS_ID, END_OF_TURN_ID]] = _EOS_ROW_SCALE
        model.get_output_embeddings().weight.mul_(scale)
    model.tie_weights()


def build_meralion2_standin(folder: Union[str, Path], seed: int = 0, dtype=None, **size_overrides) -> Path:
    """Write a random MERaLiON-2 (model, remote code, processor; tiny unless sized otherwise) into ``folder`` and
    return it.

    Deterministic in ``seed``; the weights are saved in ``dtype`` (a torch dtype; default float32).
    ``size_overrides`` are keys of ``MERALION2_STANDIN_DEFAULTS`` (e.g. ``sliding_window=64``,
    ``num_hidden_layers=2``, ``vocab_size=400``; ``full_size_overrides`` gives a real shape's).
    The speech placeholder is ``vocab_size - 1``; generation stops on ``[1, 107]``.
    """
    _require_transformers_451()
    from transformers import GenerationConfig, WhisperFeatureExtractor

    unknown = set(size_overrides) - set(MERALION2_STANDIN_DEFAULTS)
    if unknown:
        raise TypeError(f"unknown size overrides {sorted(unknown)}; known: {sorted(MERALION2_STANDIN_DEFAULTS)}")
    sizes = {**MERALION2_STANDIN_DEFAULTS, **size_overrides}

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)

    config = _make_config(sizes)
    config.auto_map = {
        "AutoConfig": "configuration_meralion2.MERaLiON2Config",
        "AutoModelForSpeechSeq2Seq": "modeling_meralion2.MERaLiON2ForConditionalGeneration",
    }
    model_cls = _standin_module("modeling_meralion2").MERaLiON2ForConditionalGeneration
    model = model_cls(config)
    _init_weights(model, seed)
    model.eval()
    if dtype is not None:
        model.to(dtype)
    model.generation_config = GenerationConfig(
        bos_token_id=BOS_ID, eos_token_id=list(GENERATION_EOS_IDS), pad_token_id=PAD_ID
    )
    model.save_pretrained(folder, safe_serialization=True)
    for name in REMOTE_CODE_FILES:
        shutil.copyfile(STANDIN_CODE_DIR / name, folder / name)

    # processor: feature extractor + tokenizer (+ chat template on the tokenizer)
    processor_cls = _standin_module("processing_meralion2").MERaLiON2Processor
    feature_extractor = WhisperFeatureExtractor(
        feature_size=sizes["num_mel_bins"], sampling_rate=SAMPLING_RATE, return_attention_mask=False
    )
    tokenizer = build_meralion2_tokenizer(sizes["vocab_size"])
    processor = processor_cls(
        feature_extractor,
        tokenizer,
        fixed_speech_embeds_length=1500 // sizes["speech_mlp_scale_factor"],
        speech_token_index=sizes["vocab_size"] - 1,
    )
    processor.save_pretrained(folder)
    for json_name in ("preprocessor_config.json", "processor_config.json"):
        path = folder / json_name
        data = json.loads(path.read_text()) if path.exists() else {}
        data["processor_class"] = "MERaLiON2Processor"
        data["auto_map"] = {"AutoProcessor": "processing_meralion2.MERaLiON2Processor"}
        path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return folder


# ----------------------------------------------------------------------------- inputs
def load_meralion2_processor(folder: Union[str, Path]):
    """``AutoProcessor.from_pretrained(folder, trust_remote_code=True)``, offline."""
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(str(folder), trust_remote_code=True, local_files_only=True)


def meralion2_user_prompt(instruction: str = DEFAULT_INSTRUCTION) -> str:
    """The user turn MERaLiON-2's own examples use."""
    return f"Instruction: {instruction} \nFollow the text instruction based on the following audio: {SPEECH_PLACEHOLDER}"


def make_meralion2_inputs(
    processor_or_folder, audios: Union[np.ndarray, Sequence[np.ndarray]], instruction: str = DEFAULT_INSTRUCTION
) -> Dict[str, "torch.Tensor"]:
    """Chat-templated prompt(s) + ``processor(text=..., audios=..., sampling_rate=16000)``.

    ``audios``: one 1-D float array at 16 kHz or a list of them (one prompt each; a
    batch is left-padded). Returns a plain dict with ``input_ids``, ``attention_mask``,
    ``input_features`` (sum of chunks, mel, 3000) and ``feature_attention_mask``.
    """
    if isinstance(processor_or_folder, (str, Path)):
        processor = load_meralion2_processor(processor_or_folder)
    else:
        processor = processor_or_folder
    if isinstance(audios, np.ndarray) and audios.ndim == 1:
        audios = [audios]
    audios = [np.asarray(a, dtype=np.float32) for a in audios]
    conversation = [{"role": "user", "content": meralion2_user_prompt(instruction)}]
    prompt = processor.tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    batch = processor(text=[prompt] * len(audios), audios=audios, sampling_rate=SAMPLING_RATE)
    return dict(batch)


# ----------------------------------------------------------------------------- full size, from the command line
WHISPER_LARGE_V3_ENCODER = {"speech_d_model": 1280, "speech_layers": 32, "speech_heads": 20, "speech_ffn_dim": 5120}


def full_size_overrides(shape: str) -> Dict[str, Any]:
    """The stand-in's sizes at a real MERaLiON-2 shape (``tools.meralion2_shaped.SHAPES``): Whisper-large-v3's
    encoder and that shape's Gemma2 decoder (head_dim 256, 256 000 tokens, a 4 096-token sliding window)."""
    from tools.meralion2_shaped import GEMMA2_HEAD_DIM, GEMMA2_VOCAB, SHAPES

    return {**WHISPER_LARGE_V3_ENCODER, **SHAPES[shape], "head_dim": GEMMA2_HEAD_DIM, "vocab_size": GEMMA2_VOCAB,
            "sliding_window": 4096, "query_pre_attn_scalar": GEMMA2_HEAD_DIM}


def main(argv=None) -> None:
    """``python tests/standin.py --shape meralion2-3b --out DIR``: the stand-in at full size with random weights, for
    what the recipe and the engine cost at that size (never for quality: random weights transcribe nothing)."""
    import argparse

    import torch

    from tools.meralion2_shaped import SHAPES

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--out", required=True, help="folder to write (a MERaLiON-2 Hub snapshot's layout)")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    folder = build_meralion2_standin(args.out, seed=args.seed, dtype=getattr(torch, args.dtype),
                                     **full_size_overrides(args.shape))
    print(f"{args.shape} stand-in with random weights ({args.dtype}) written to {folder}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the repository's tools
    main()
