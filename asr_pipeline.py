"""The Hugging Face ASR pipeline over a Medusa artifact:
``transformers.pipeline("automatic-speech-recognition", model=<artifact>, trust_remote_code=True)``.

The library's own pipeline does everything (audio decoding and resampling, chunking, batching, timestamps,
segment merging); this subclass only tells it that the model decodes like Whisper, hands it the processor (the
base's, loaded with the model, else the copy an exported artifact ships), and keeps greedy decoding as the default
(the pipeline's own default is a 5-beam search, which Medusa does not accelerate: pass ``num_beams=5`` for it).
A MERaLiON-2 artifact is refused in one line: its processor builds an instruction prompt the pipeline does not."""

from __future__ import annotations

from transformers import AutomaticSpeechRecognitionPipeline, GenerationConfig


class MedusaSpeechRecognitionPipeline(AutomaticSpeechRecognitionPipeline):
    _load_tokenizer = False  # the model's processor is used (see __init__)
    _load_feature_extractor = False
    _default_generation_config = GenerationConfig(max_new_tokens=256)  # greedy: what Medusa accelerates

    def __init__(self, model, feature_extractor=None, tokenizer=None, **kwargs):
        if getattr(model, "family", None) != "whisper":
            raise ValueError(f"The ASR pipeline runs Whisper-family artifacts; this one's base is "
                             f"{getattr(model, 'family', type(model).__name__)}: use model.generate (see the model card).")
        processor = model.processor
        if processor is None and (tokenizer is None or feature_extractor is None):
            processor = _shipped_processor(model)
            if processor is None:
                raise ValueError("The base was loaded without a processor: pass tokenizer= and feature_extractor= "
                                 "(e.g. WhisperProcessor.from_pretrained(<base>)'s).")
        super().__init__(model, feature_extractor=feature_extractor or processor.feature_extractor,
                         tokenizer=tokenizer or processor.tokenizer, **kwargs)
        self.type = "seq2seq_whisper"  # the parent decided from config.model_type, which is Medusa's
        # Timestamps: the parent's postprocess reads the encoder length from the model's config (Medusa's here)
        model.config.max_source_positions = model.base.config.max_source_positions


def _shipped_processor(model):
    """The processor files an exported artifact ships beside its config (None when there are none)."""
    from transformers import WhisperProcessor

    try:
        return WhisperProcessor.from_pretrained(model.config.name_or_path)
    except (OSError, ValueError, TypeError):
        return None
