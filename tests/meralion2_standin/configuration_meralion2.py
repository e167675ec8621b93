"""Configuration of the MERaLiON-2 test stand-in (remote-code file).

Mirrors the public interface of MERaLiON-2's ``MERaLiON2Config``: a Whisper
speech config, a Gemma2 text config, the speech placeholder id and the
adapter's frame-stacking factor.  A handful of text fields are mirrored at the
top level, exactly the ones the real config mirrors.  There is deliberately no
``sub_configs`` mapping (the real config has none), so an
``attn_implementation`` requested at load time only reaches the sub-models
because ``MERaLiON2ForConditionalGeneration.__init__`` copies it over.
"""

from transformers import Gemma2Config, WhisperConfig
from transformers.configuration_utils import PretrainedConfig

# Text fields the real config copies from ``text_config`` to the top level.
_MIRRORED_TEXT_FIELDS = (
    "sliding_window",
    "hidden_size",
    "num_attention_heads",
    "num_hidden_layers",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
)


def _default_speech_config() -> WhisperConfig:
    # whisper-large-v3 encoder shape (only the encoder is ever built)
    return WhisperConfig(
        d_model=1280,
        encoder_layers=32,
        encoder_attention_heads=20,
        encoder_ffn_dim=5120,
        encoder_layerdrop=0.0,
        num_mel_bins=128,
        max_source_positions=1500,
        scale_embedding=False,
        activation_function="gelu",
    )


class MERaLiON2Config(PretrainedConfig):
    """Composite config: ``speech_config`` (WhisperConfig) + ``text_config`` (Gemma2Config)."""

    model_type = "meralion2"
    is_composition = False

    def __init__(
        self,
        speech_config=None,
        text_config=None,
        speech_mlp_scale_factor: int = 15,
        speech_token_index: int = 255999,
        **kwargs,
    ):
        if speech_config is None:
            speech_config = _default_speech_config()
        elif isinstance(speech_config, dict):
            speech_config = WhisperConfig(**speech_config)
        if text_config is None:
            text_config = Gemma2Config()
        elif isinstance(text_config, dict):
            text_config = Gemma2Config(**text_config)

        self.speech_config = speech_config
        self.text_config = text_config
        self.speech_mlp_scale_factor = speech_mlp_scale_factor
        self.speech_token_index = speech_token_index
        for name in _MIRRORED_TEXT_FIELDS:
            setattr(self, name, getattr(text_config, name))

        super().__init__(**kwargs)
