"""MERaLiON-2 backbone adapter: speech prefill through the base's own modules, and a Gemma2
decoder forward over a cache we own.

Why not the library's cache: on transformers 4.51 (the version MERaLiON-2's code runs on) verifying
a multi-token chunk through ``text_decoder`` with its HybridCache is silently wrong once the sequence
passes the sliding window, and that cache cannot be rolled back. This forward writes K/V by slot,
applies the sliding window and both soft-caps itself, and reuses the base's norms, projections,
MLP and rotary embedding, so it is correct on every transformers version.
"""

from __future__ import annotations

import torch

try:
    from .backbone import Backbone, backs, compile_fixed_shape, encoder_output, fusable, fuse_linears
    from .cpu_kernels import Projection, weight_product
    from .kv_cache import DecodeState, StaticKVCache, attention_mask
    from .logits_rules import SuppressionRules
except ImportError:
    from backbone import Backbone, backs, compile_fixed_shape, encoder_output, fusable, fuse_linears
    from cpu_kernels import Projection, weight_product
    from kv_cache import DecodeState, StaticKVCache, attention_mask
    from logits_rules import SuppressionRules

class MERaLiON2Backbone(Backbone):
    family = "meralion2"
    output_has_prompt = True
    required_inputs = ("input_ids", "input_features", "feature_attention_mask")
    max_audio_seconds = 300.0
    default_max_new_tokens = 1536  # a window may hold up to 300 s of speech
    window_seconds = 30.0  # it takes up to 300 s in one prompt, but its model card advises at most 30 s for ASR
    remote_code = True
    processor_remote_code = True
    # its decoder applies no token suppression or forced ids
    greedy_as_is = {"suppress_tokens": ([],), "begin_suppress_tokens": ([],), "forced_decoder_ids": ([],)}
    base_config_settings = ("eos_token_id", "pad_token_id", "max_length")
    default_eos_token_ids = (1, 107)  # <eos>, <end_of_turn> (only when the base's generation config has none)

    @classmethod
    def is_model_type(cls, model_type: str) -> bool:
        return model_type.startswith("meralion")

    @classmethod
    def is_model(cls, base) -> bool:
        return hasattr(base, "text_decoder") and hasattr(base, "speech_encoder")

    @classmethod
    def load_base(cls, source: str, load_kwargs: dict):
        from transformers import AutoModelForSpeechSeq2Seq

        chosen = load_kwargs.get("attn_implementation")
        load_kwargs = {"attn_implementation": "eager", **load_kwargs}  # sdpa would drop Gemma2's attention soft-cap
        base = AutoModelForSpeechSeq2Seq.from_pretrained(source, trust_remote_code=True, **load_kwargs)
        if chosen is None:
            speech_attention_as_sdpa(base.speech_encoder)
        return base

    @property
    def generation_config(self):
        """The base's, read at each use, as the base's generate reads it: a caller may replace the object."""
        return self.base.generation_config

    def __init__(self, base):
        self.base = base
        self.lm = base.text_decoder
        self.model = base.text_decoder.model
        self.text_config = getattr(base.config, "text_config", None) or self.lm.config
        cfg = self.text_config
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.scaling = cfg.query_pre_attn_scalar**-0.5
        self.attn_softcap = getattr(cfg, "attn_logit_softcapping", None)
        self.final_softcap = getattr(cfg, "final_logit_softcapping", None)
        self.sliding = [self._is_sliding(i) for i in range(cfg.num_hidden_layers)]
        self.speech_token_index = getattr(base.config, "speech_token_index", 255999)
        lm_head = self.lm.lm_head
        self._projection = Projection(lambda: lm_head.weight, lambda: lm_head.bias)
        self.fused: list | None = None  # per layer (qkv weight, gate_up weight) once fuse_projections() ran
        # Gemma2 scales embeddings by sqrt(hidden): transformers 5.x's embedding module does it itself
        # (Gemma2TextScaledWordEmbedding.embed_scale), 4.x's Gemma2Model after the lookup.
        self.embedding_scales = hasattr(self.model.embed_tokens, "embed_scale")
        self._rope_table: tuple | None = None  # (cos, sin) [positions, head_dim] on a GPU, see _prepare_rope_table
        self._rope_tables_made: list = []  # every table made stays alive: captured rounds read them by address
        self._compiled_prompt = None  # (encoder, layers_over_prompt) compiled, made by the first compile=True prefill

    def _is_sliding(self, layer: int) -> bool:
        layer_types = getattr(self.text_config, "layer_types", None)
        if layer_types:
            return layer_types[layer] == "sliding_attention"
        return layer % 2 == 0  # Gemma2: even layers use the sliding window

    # ------------------------------------------------------------------ facts
    @property
    def hidden_size(self) -> int:
        return self.text_config.hidden_size

    @property
    def output_projection(self) -> torch.nn.Module:
        return self.lm.lm_head

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self._projection(hidden)
        if self.final_softcap:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(tokens)

    def unsupported_reason(self, kwargs: dict) -> str | None:
        mask = kwargs.get("attention_mask")
        if mask is not None and bool((mask[:, -1] == 0).any()):
            return "right padding (MERaLiON-2 expects left padding)"
        return None

    def check_prompt_options(self, language=None, task=None) -> None:
        if language or task:
            raise ValueError("language/task apply to Whisper bases; MERaLiON-2 takes an instruction instead, "
                             "e.g. instruction='Please transcribe this speech.'")

    def audio_inputs(self, processor, audios: list, instruction=None, language=None, task=None,
                     return_attention_mask: bool = False) -> dict:
        """The model card's ASR prompt (or ``instruction``) in the chat template around <SpeechHere>, the
        rows left-padded (decoding continues each row at its end); its processor gives the masks always."""
        prompt = (f"Instruction: {instruction or 'Please transcribe this speech.'} \n"
                  "Follow the text instruction based on the following audio: <SpeechHere>")
        tokenizer = processor.tokenizer
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
        side, tokenizer.padding_side = tokenizer.padding_side, "left"
        try:
            return dict(processor(text=[text] * len(audios), audios=audios, sampling_rate=16000))
        finally:
            tokenizer.padding_side = side

    def decode_text(self, tokenizer, sequences: torch.Tensor, inputs: dict | None = None) -> list[str]:
        """The new tokens' text (generate returns prompt + new tokens), without the speaker tags."""
        if inputs is not None and "input_ids" in inputs:
            sequences = sequences[:, inputs["input_ids"].shape[1]:]
        texts = tokenizer.batch_decode(sequences, skip_special_tokens=True)
        return [t.replace("<Speaker1>:", "").replace("<Speaker2>:", "").strip() for t in texts]

    def make_logits_processor(self, min_new_tokens: int | None):
        return SuppressionRules(self.vocab_size, self.device, self.eos_token_ids, min_new_tokens)

    def fuse_projections(self) -> bool:
        """Give every layer one q/k/v weight and one gate/up weight, so a verify pass runs two GEMMs
        where it ran five. The base's own layers keep working: their weights become views of the
        fused tensors (no extra memory). Returns False (and changes nothing) when the layers cannot
        share a tensor, e.g. quantised or offloaded weights, or with ``layer_regions``: a reused region given views
        of one tensor as its weights is refused (Higher order ops do not support aliasing), and given the fused
        tensors instead, it read wrong values in single-token passes."""
        if self.kernels.layer_regions:
            return False
        fused = []
        for layer in self.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            groups = ([attn.q_proj, attn.k_proj, attn.v_proj], [mlp.gate_proj, mlp.up_proj])
            if not all(fusable(linears) for linears in groups):
                return False
            fused.append(groups)
        self.fused = [tuple(fuse_linears(linears)[0] for linears in groups) for groups in fused]
        return True

    def _drop_stale_fusion(self):
        """A later ``.to()`` or weight reload gives the layers new tensors: then use them, unfused.
        (Checked once per call, outside the traced decode: ``data_ptr`` cannot be compiled.)"""
        if self.fused is not None and not all(
            backs(qkv, layer.self_attn.q_proj) and backs(gate_up, layer.mlp.gate_proj)
            for (qkv, gate_up), layer in zip(self.fused, self.model.layers)
        ):
            self.fused = None

    # ------------------------------------------------------------------ prefill & decode
    def prefill(self, inputs: dict, max_new_tokens: int | None, extra_slots: int, process_logits, cache_pool=None,
                capture=None, compile: bool = False):
        """The prompt's keys and values in a fresh cache, and the first token. ``capture``: run the prefill as one
        CUDA graph per shape; ``compile``: the speech encoder and the prompt's pass through the decoder layers
        compiled too, as ``compile=True`` rounds are (one compile per batch size and prompt length; the same
        bfloat16 standard)."""
        self._drop_stale_fusion()
        input_ids = inputs["input_ids"].to(self.device)
        batch, prompt_len = input_ids.shape
        mask = inputs.get("attention_mask")
        mask = torch.ones_like(input_ids) if mask is None else mask.to(input_ids.device)
        max_new = self._max_new_tokens(max_new_tokens, prompt_len)
        make = cache_pool.get if cache_pool is not None else StaticKVCache
        cache = make(len(self.model.layers), batch, self.num_kv_heads, prompt_len + max_new + extra_slots,
                     self.head_dim, self.model.embed_tokens.weight.dtype, input_ids.device)
        cache.index_put_when_compiled = self.kernels.cache_index_put
        self._prepare_rope_table(cache.capacity, cache.keys.device, cache.keys.dtype)
        first_slot = (mask == 0).long().cumprod(dim=1).sum(dim=1)  # count of left-padding tokens
        state = DecodeState(cache, torch.zeros_like(first_slot), first_slot, hidden=None, next_token=None)
        features = self.speech_features(inputs["input_features"])
        placeholders = int((input_ids == self.speech_token_index).sum())
        if capture is None:
            hidden = self._prompt_pass(state, input_ids, features, placeholders, compile)
        else:
            hidden = self._captured_prompt_pass(state, input_ids, features, placeholders, capture, compile)
        state.lengths = state.lengths + prompt_len
        self.start_decoding(state, hidden, input_ids, process_logits)
        return state, max_new, input_ids

    def _prompt_pass(self, state: DecodeState, input_ids, features, placeholders: int, compiled: bool):
        """Speech encoder -> adapter -> prompt embeddings -> the decoder layers over the whole prompt; ``compiled``:
        the encoder and the decoder layers' pass compiled."""
        encode, layers = self._compiled_prompt_parts() if compiled else (encoder_output, self.layers_over_prompt)
        return layers(state, self.prompt_embeddings(input_ids, features, placeholders, encode))

    def _compiled_prompt_parts(self):
        """(speech encoder, ``layers_over_prompt``) compiled, made once. Eager, the prompt's pass is thousands of
        small elementwise kernels (norms, rotary, soft-caps) around its products; compiled, they fuse
        (``benchmarks/round_cost/prompt_pass.py``)."""
        if self._compiled_prompt is None:
            self._compiled_prompt = (compile_fixed_shape(encoder_output), compile_fixed_shape(self.layers_over_prompt))
        return self._compiled_prompt

    def layers_over_prompt(self, state: DecodeState, embeds) -> torch.Tensor:
        """The decoder layers over a whole prompt's embeddings [B, T, H] (causal), writing its keys and values."""
        prompt_len = embeds.shape[1]
        depths = torch.arange(prompt_len, device=embeds.device)
        causal = torch.ones(prompt_len, prompt_len, dtype=torch.bool, device=embeds.device).tril()
        return self._forward_embeds(state, embeds, depths, causal, upto=prompt_len)

    def _captured_prompt_pass(self, state: DecodeState, input_ids, features, placeholders: int, capture, compiled):
        """``_prompt_pass`` as one CUDA graph per (cache, shapes): eager, the 32-layer speech encoder, the
        adapter and the prompt's pass through every decoder layer are hundreds of kernels launched one by one
        from Python. The graph writes the prompt's keys and values into the pool's cache."""
        cache = state.cache

        def prompt_pass(input_ids, features, first_slot):
            prompt_state = DecodeState(cache, torch.zeros_like(first_slot), first_slot, hidden=None, next_token=None)
            return self._prompt_pass(prompt_state, input_ids, features, placeholders, compiled)

        key = ("meralion2-prefill", id(cache), tuple(features.shape), tuple(input_ids.shape), placeholders, compiled)
        return capture(key, prompt_pass, input_ids, features, state.first_slot, keep=cache)

    def _max_new_tokens(self, max_new_tokens, prompt_len) -> int:
        if max_new_tokens is not None:
            return max_new_tokens
        gen = self.base.generation_config
        if getattr(gen, "max_new_tokens", None):
            return gen.max_new_tokens
        return max(gen.max_length - prompt_len, 1)

    def speech_features(self, input_features) -> torch.Tensor:
        encoder = self.base.speech_encoder
        return input_features.to(self.device, getattr(encoder, "dtype", self.base.dtype))

    def prompt_embeddings(self, input_ids, input_features, placeholders: int | None = None, encode=encoder_output):
        """Speech encoder -> ln_speech -> adapter, scattered into the <SpeechHere> placeholders (``placeholders``:
        their count, when the caller has it: counting them here is a host sync; ``encode``: ``encoder_output`` or
        its compiled form)."""
        base = self.base
        speech = encode(base.speech_encoder, self.speech_features(input_features))
        speech = base.speech_audio_adapter(base.ln_speech(speech))
        embeds = self._embed(input_ids)
        mask = input_ids == self.speech_token_index
        speech = self._scale(speech.reshape(-1, speech.shape[-1]).to(embeds.dtype))  # as 4.51 scales them
        if placeholders is None:
            placeholders = int(mask.sum())
        if placeholders != speech.shape[0]:
            raise ValueError(
                f"input_ids hold {placeholders} speech placeholders but the audio gives "
                f"{speech.shape[0]} speech vectors; build the inputs with the MERaLiON-2 processor."
            )
        order = (mask.flatten().cumsum(0) - 1).clamp(min=0).view(mask.shape)  # (masked_scatter, without its sync)
        return torch.where(mask[..., None], speech[order], embeds)

    def decode(self, state: DecodeState, tokens, depths, ancestors, upto: int) -> torch.Tensor:
        return self._forward_embeds(state, self._embed(tokens), depths, ancestors, upto)

    def _embed(self, tokens) -> torch.Tensor:
        """Token embeddings, scaled as Gemma2 scales them."""
        embeds = self.model.embed_tokens(tokens)
        return embeds if self.embedding_scales else self._scale(embeds)

    def _scale(self, embeds) -> torch.Tensor:
        return embeds * torch.tensor(self.hidden_size**0.5, dtype=embeds.dtype)

    def _forward_embeds(self, state: DecodeState, hidden, depths, ancestors, upto: int) -> torch.Tensor:
        """The decoder layers over already scaled input embeddings ``hidden``."""
        n = hidden.shape[1]
        cos, sin = self._rotary(hidden, state.positions(depths))
        window = getattr(self.text_config, "sliding_window", None)
        full_mask = attention_mask(state, depths, ancestors, upto)
        sliding_mask = attention_mask(state, depths, ancestors, upto, window) if window else full_mask
        slots = state.slots(n)
        compiling = torch.compiler.is_compiling()
        regions = self.kernels.layer_regions and compiling and self.fused is None  # (see fuse_projections)
        qkv, rest = (layer_qkv_region, layer_rest_region) if regions else (layer_qkv, layer_rest)
        broadcast = compiling and self.kernels.grouped_attention == "broadcast"
        for i, layer in enumerate(self.model.layers):
            attn, mlp = layer.self_attn, layer.mlp
            fused = self.fused[i] if self.fused is not None else None
            projections, feed = (attn, mlp) if fused is None else (fused[0], (fused[1], mlp.down_proj, mlp.act_fn))
            query, key, value = qkv(layer.input_layernorm, projections, hidden, cos, sin, self.num_heads,
                                    self.num_kv_heads, self.head_dim)
            state.cache.write(i, slots, key, value)
            keys, values = state.cache.layer(i, upto)
            mask = sliding_mask if self.sliding[i] else full_mask
            norms = (layer.post_attention_layernorm, layer.pre_feedforward_layernorm, layer.post_feedforward_layernorm)
            hidden = rest(norms, attn.o_proj, feed, hidden, query, keys, values, mask, self.scaling, self.attn_softcap,
                          broadcast)
        return self.model.norm(hidden)

    def _prepare_rope_table(self, positions: int, device, dtype):
        """On a GPU, cos/sin of every position a cache of ``positions`` slots can hold, made once, eagerly, by the
        base's own rotary module (so the values equal the ones it computes; compiled code's own cos may differ by an
        ulp). A larger cache adds a larger table; none is freed, as captured rounds read them by address."""
        rotary = self.model.rotary_emb
        if device.type not in self.kernels.rope_table_devices or getattr(rotary, "rope_type", "default") != "default":
            self._rope_table = None
            return
        table = self._rope_table
        if table is not None and table[0].shape[0] >= positions and table[0].device == device and table[0].dtype == dtype:
            return
        length = max(positions, getattr(self.text_config, "max_position_embeddings", 0) or 0)
        cos, sin = rotary(torch.empty(1, dtype=dtype, device=device), torch.arange(length, device=device)[None])
        self._rope_table = (cos[0], sin[0])
        self._rope_tables_made.append(self._rope_table)

    def _rotary(self, hidden, positions):
        """cos, sin [B, T, head_dim] at ``positions`` [B, T]. Computed inside a compiled pass, each position's cos
        and sin were recomputed by every layer's rotary kernel; on a GPU they
        are gathered from a table instead (left padding's negative positions read position 0: never attended)."""
        table = self._rope_table
        if table is None or table[0].device != hidden.device or table[0].dtype != hidden.dtype:
            return self.model.rotary_emb(hidden, positions)
        positions = positions.clamp(min=0)
        return table[0][positions], table[1][positions]

    # ------------------------------------------------------------------ output format
    def format_output(self, generated: list[list[int]], prompt: torch.Tensor) -> torch.Tensor:
        """Like a decoder-only generate: prompt + new tokens, finished rows padded after EOS."""
        return torch.cat([prompt, self.padded(generated, prompt).to(prompt.dtype)], dim=1)


def speech_attention_as_sdpa(encoder: torch.nn.Module) -> None:
    """The speech encoder's self-attention through SDPA, as the library's default load gives a Whisper encoder.
    MERaLiON-2's remote code hands the implementation asked for at load time to both of its sub-models, and the
    decoder must be eager (SDPA drops Gemma2's attention soft-cap), so the encoder would run the eager one, which is
    several times slower. The base's own
    ``generate`` runs the same module, so ours still equals it. Transformers 4.x picks the attention class when it
    builds a layer (same weights: only the class changes); 5.x reads the config on every call."""
    from transformers.models.whisper import modeling_whisper

    classes = getattr(modeling_whisper, "WHISPER_ATTENTION_CLASSES", None)
    if classes is not None:
        for layer in encoder.layers:
            if type(layer.self_attn) is classes["eager"]:
                layer.self_attn.__class__ = classes["sdpa"]
    encoder.config._attn_implementation = "sdpa"


def grouped_attention(query, keys, values, mask, scaling: float, softcap: float | None,
                      broadcast_cache: bool = False) -> torch.Tensor:
    """Attention of query heads [B, H, T, D] over key/value heads [B, Hkv, L, D] (each key/value head's H / Hkv
    query heads consecutive), mask [B, 1, T, L] -> [B, T, H * D], scores soft-capped where ``softcap``.

    Two forms of the same products. By default a key/value head's query heads are rows of one product. With
    ``broadcast_cache`` the cache is broadcast over them instead (a [B, Hkv, 1, L, D] operand): run eagerly or
    captured, torch.matmul then copies every layer's keys and values into the group size each step, a large share of a
    step at large batches. Compiled, the broadcast form ran faster only while the compiled cache write copied the
    whole cache anyway; since that write is in place, inductor's copies of the broadcast cache are what is left,
    so compiled rounds use rows too (``KernelOptions.grouped_attention``)."""
    batch, heads, n, dim = query.shape
    kv_heads, length = keys.shape[1], keys.shape[2]
    groups = heads // kv_heads
    if broadcast_cache:
        query = query.reshape(batch, kv_heads, groups, n, dim)
        keys, values = keys[:, :, None], values[:, :, None]
    else:
        query = query.reshape(batch, kv_heads, groups * n, dim)
    scores = torch.matmul(query, keys.transpose(-1, -2)) * scaling
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.view(batch, kv_heads, groups, n, length).masked_fill(~mask[:, :, None], torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.matmul(probs if broadcast_cache else probs.view(batch, kv_heads, groups * n, length), values)
    return out.reshape(batch, heads, n, dim).transpose(1, 2).reshape(batch, n, heads * dim)


def _rotate(x, cos, sin):
    cos, sin = cos[:, None], sin[:, None]
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _feed_forward(feed, x):
    """Gemma2's MLP: ``feed`` is the module, or (its fused gate/up weight, down projection, activation)."""
    if isinstance(feed, torch.nn.Module):
        return feed(x)
    gate_up, down, act = feed
    gate, up = weight_product(x, gate_up).chunk(2, dim=-1)
    return down(act(gate) * up)


def layer_qkv(norm, projections, hidden, cos, sin, heads: int, kv_heads: int, head_dim: int):
    """A Gemma2 layer's query, key and value heads [B, heads, T, D], rotated; ``projections``: its attention module,
    or one fused q/k/v weight."""
    x = norm(hidden)
    batch, n, _ = x.shape
    if isinstance(projections, torch.nn.Module):
        query, key, value = projections.q_proj(x), projections.k_proj(x), projections.v_proj(x)
    else:
        widths = [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]
        query, key, value = weight_product(x, projections).split(widths, dim=-1)
    query = query.view(batch, n, heads, head_dim).transpose(1, 2)
    key = key.view(batch, n, kv_heads, head_dim).transpose(1, 2)
    value = value.reshape(batch, n, kv_heads, head_dim).transpose(1, 2)
    return _rotate(query, cos, sin), _rotate(key, cos, sin), value


def layer_rest(norms, o_proj, feed, hidden, query, keys, values, mask, scaling: float, softcap: float | None,
               broadcast_cache: bool):
    """The rest of a Gemma2 layer once its keys and values are in the cache: attention, output projection, MLP
    (``norms``: post-attention, pre- and post-feed-forward)."""
    out = grouped_attention(query, keys, values, mask, scaling, softcap, broadcast_cache=broadcast_cache)
    hidden = hidden + norms[0](o_proj(out))
    return hidden + norms[2](_feed_forward(feed, norms[1](hidden)))


# Compiled, every layer is the same code over other weights: traced and compiled once, then reused for all
# (hierarchical compilation), which Dynamo does only for inputs it can compare (tensors, constants, modules; not
# the backbone object). The cache write stays outside: a region that mutates its inputs is functionalised.
layer_qkv_region = torch.compiler.nested_compile_region(layer_qkv)
layer_rest_region = torch.compiler.nested_compile_region(layer_rest)
