"""MERaLiON-2 test stand-in (remote-code file), written for transformers ~4.51.

Same module names, state-dict prefixes and forward/generation semantics as the
real MERaLiON-2 remote code:

    speech_encoder        transformers' WhisperEncoder, input (N, num_mel_bins, 3000)
    ln_speech             LayerNorm(d_model)
    speech_audio_adapter  gated adapter: stack ``speech_mlp_scale_factor`` frames,
                          mlp_adapter (Linear -> SiLU -> Dropout),
                          SiLU(gate_proj(x)) * pool_proj(x), out_proj -> text hidden
    text_decoder          transformers' Gemma2ForCausalLM

The speech vectors are ``masked_scatter``-ed into the positions of
``speech_token_index`` *before* Gemma2Model multiplies every input embedding by
sqrt(hidden_size), so they get that scaling too, as in the real model.
The numerics are the library's own (WhisperEncoder, Gemma2ForCausalLM).
"""

from typing import Optional

import torch
from torch import nn
from transformers.cache_utils import HybridCache
from transformers.generation import GenerationMixin
from transformers.modeling_utils import PreTrainedModel
from transformers.models.gemma2.modeling_gemma2 import Gemma2ForCausalLM
from transformers.models.whisper.modeling_whisper import WhisperEncoder

from .configuration_meralion2 import MERaLiON2Config


class MERaLiON2PreTrainedModel(PreTrainedModel):
    config_class = MERaLiON2Config
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["WhisperEncoderLayer", "WhisperDecoderLayer", "Gemma2DecoderLayer"]
    _supports_flash_attn_2 = True
    _supports_sdpa = True
    _supports_cache_class = True
    _supports_static_cache = True

    def _init_weights(self, module):
        std = getattr(self.config, "init_std", None)
        if std is None:
            std = self.config.speech_config.init_std
        if isinstance(module, (nn.Linear, nn.Conv1d)):
            module.weight.data.normal_(mean=0.0, std=std)
            if module.bias is not None:
                module.bias.data.zero_()
        elif isinstance(module, nn.Embedding):
            module.weight.data.normal_(mean=0.0, std=std)
            if module.padding_idx is not None:
                module.weight.data[module.padding_idx].zero_()


class MERaLiON2SpeechAudioAdaperLarge(nn.Module):
    """Gated speech adapter: (N, T, C) -> (N, T // k, text_hidden) with k = speech_mlp_scale_factor."""

    def __init__(self, config: MERaLiON2Config):
        super().__init__()
        width = config.speech_config.d_model
        self.speech_mlp_scale_factor = config.speech_mlp_scale_factor
        inner = width * 5
        self.mlp_adapter = nn.Sequential(
            nn.Linear(width * self.speech_mlp_scale_factor, inner),
            nn.SiLU(),
            nn.Dropout(0.01),
        )
        self.gate_proj = nn.Linear(inner, inner)
        self.pool_proj = nn.Linear(inner, inner)
        self.act_fn = nn.SiLU()
        self.out_proj = nn.Linear(inner, config.text_config.hidden_size)

    def forward(self, speech_embeds: torch.Tensor, **kwargs) -> torch.Tensor:
        n, t, c = speech_embeds.shape
        k = self.speech_mlp_scale_factor
        stacked = speech_embeds.reshape(n, t // k, c * k)
        x = self.mlp_adapter(stacked)
        x = self.act_fn(self.gate_proj(x)) * self.pool_proj(x)
        return self.out_proj(x)


class MERaLiON2ForConditionalGeneration(MERaLiON2PreTrainedModel, GenerationMixin):
    def __init__(self, config: MERaLiON2Config):
        # No sub_configs on the config: the attention implementation chosen for the
        # composite model is pushed to both sub-models here (as the real code does).
        config.text_config._attn_implementation = config._attn_implementation
        config.speech_config._attn_implementation = config._attn_implementation
        super().__init__(config)
        self.speech_encoder = WhisperEncoder(config.speech_config)
        self.ln_speech = nn.LayerNorm(config.speech_config.d_model)
        self.speech_audio_adapter = MERaLiON2SpeechAudioAdaperLarge(config)
        self.vocab_size = config.text_config.vocab_size
        self.text_decoder = Gemma2ForCausalLM(config.text_config)
        self.pad_token_id = config.pad_token_id if config.pad_token_id is not None else -1
        self._padding_side = "left"
        self.post_init()

    # ------------------------------------------------------------------ plumbing
    @property
    def padding_side(self) -> str:
        return self._padding_side

    @padding_side.setter
    def padding_side(self, value: str):
        if value not in ("left", "right"):
            raise ValueError(f"{value} is not `left` or `right`.")
        self._padding_side = value

    def get_input_embeddings(self):
        return self.text_decoder.get_input_embeddings()

    def set_input_embeddings(self, value):
        self.text_decoder.set_input_embeddings(value)

    def get_output_embeddings(self):
        return self.text_decoder.get_output_embeddings()

    def set_output_embeddings(self, new_embeddings):
        self.text_decoder.set_output_embeddings(new_embeddings)

    def set_decoder(self, decoder):
        self.text_decoder.set_decoder(decoder)

    def get_decoder(self):
        return self.text_decoder.get_decoder()

    def tie_weights(self):
        return self.text_decoder.tie_weights()

    def resize_token_embeddings(self, new_num_tokens: Optional[int] = None, pad_to_multiple_of=None) -> nn.Embedding:
        embeds = self.text_decoder.resize_token_embeddings(new_num_tokens, pad_to_multiple_of)
        self.config.text_config.vocab_size = embeds.num_embeddings
        self.vocab_size = embeds.num_embeddings
        return embeds

    def _reorder_cache(self, *args, **kwargs):
        return self.text_decoder._reorder_cache(*args, **kwargs)

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        input_ids: torch.LongTensor = None,
        input_features: torch.FloatTensor = None,
        attention_mask: Optional[torch.Tensor] = None,
        feature_attention_mask: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.LongTensor] = None,
        past_key_values=None,
        inputs_embeds: Optional[torch.FloatTensor] = None,
        labels: Optional[torch.LongTensor] = None,
        use_cache: Optional[bool] = None,
        cache_position: Optional[torch.LongTensor] = None,
        output_attentions: Optional[bool] = None,
        output_hidden_states: Optional[bool] = None,
        return_dict: Optional[bool] = None,
    ):
        if output_attentions is None:
            output_attentions = self.config.output_attentions
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        if return_dict is None:
            return_dict = self.config.use_return_dict

        if input_features is not None:
            device = self.speech_encoder.device
            input_features = input_features.to(device)
            # like the real code: the mask is moved unconditionally, so it must be given
            feature_attention_mask = feature_attention_mask.to(device)
            if inputs_embeds is None:
                # (N_chunks, mel, 3000) -> (N_chunks, 1500, d_model) -> (N_chunks, 1500 // k, text hidden)
                # WhisperEncoder accepts the mask but ignores it.
                speech_hidden = self.speech_encoder(
                    input_features, attention_mask=feature_attention_mask
                ).last_hidden_state
                speech_embeds = self.speech_audio_adapter(self.ln_speech(speech_hidden))
                inputs_embeds = self.text_decoder.get_input_embeddings()(input_ids)
                is_speech = (input_ids == self.config.speech_token_index).unsqueeze(-1)
                is_speech = is_speech.expand_as(inputs_embeds).to(inputs_embeds.device)
                # Too many placeholders -> RuntimeError; too few -> silently truncated.
                # No dtype/device cast (as upstream): features must match the encoder's dtype,
                # and encoder and decoder must share a dtype.
                inputs_embeds = inputs_embeds.masked_scatter(is_speech, speech_embeds)
                input_ids = None

        return self.text_decoder(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            cache_position=cache_position,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=return_dict,
            labels=labels,
        )

    # ------------------------------------------------------------------ generation
    def prepare_inputs_for_generation(
        self,
        input_ids,
        attention_mask=None,
        input_features=None,
        feature_attention_mask=None,
        past_key_values=None,
        inputs_embeds=None,
        cache_position=None,
        position_ids=None,
        use_cache=None,
        **kwargs,
    ):
        first_step = int(cache_position[0]) == 0

        # keep only the tokens the cache has not seen yet
        if past_key_values is not None:
            if inputs_embeds is not None:
                input_ids = input_ids[:, -cache_position.shape[0]:]
            elif input_ids.shape[1] != cache_position.shape[0]:
                input_ids = input_ids[:, cache_position]

        # positions count real (non-padding) tokens only
        if attention_mask is not None and position_ids is None:
            position_ids = attention_mask.long().cumsum(-1) - 1
            position_ids.masked_fill_(attention_mask == 0, 1)
            if past_key_values is not None:
                position_ids = position_ids[:, -input_ids.shape[1]:].clone(memory_format=torch.contiguous_format)

        if inputs_embeds is not None and first_step:
            model_inputs = {"inputs_embeds": inputs_embeds, "input_ids": None}
        else:
            model_inputs = {"input_ids": input_ids.clone(memory_format=torch.contiguous_format), "inputs_embeds": None}

        # HybridCache + non-FA2: hand the decoder a 4-D mask as wide as the cache
        if (
            isinstance(past_key_values, HybridCache)
            and attention_mask is not None
            and attention_mask.ndim == 2
            and self.config._attn_implementation != "flash_attention_2"
        ):
            if model_inputs["inputs_embeds"] is not None:
                batch_size, seq_len = model_inputs["inputs_embeds"].shape[:2]
                device = model_inputs["inputs_embeds"].device
            else:
                batch_size, seq_len = model_inputs["input_ids"].shape
                device = model_inputs["input_ids"].device
            attention_mask = self.text_decoder.model._prepare_4d_causal_attention_mask_with_cache_position(
                attention_mask,
                sequence_length=seq_len,
                target_length=past_key_values.get_max_cache_shape(),
                dtype=self.text_decoder.lm_head.weight.dtype,
                device=device,
                cache_position=cache_position,
                batch_size=batch_size,
            )

        model_inputs.update(
            {
                "attention_mask": attention_mask,
                "position_ids": position_ids,
                "cache_position": cache_position,
                "past_key_values": past_key_values,
                "use_cache": use_cache,
            }
        )
        if first_step:
            model_inputs["input_features"] = input_features
            model_inputs["feature_attention_mask"] = feature_attention_mask
        return model_inputs
