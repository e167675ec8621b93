"""Processor of the MERaLiON-2 test stand-in (remote-code file).

Same call semantics as MERaLiON-2's ``MERaLiON2Processor``:

* each audio (1-D mono array at the feature extractor's rate, no resampling) is
  cut into ``whisper_chunk_size``-second pieces; chunk count is
  ``len // chunk_samples + 1`` capped at ``time_duration_limit // whisper_chunk_size``
  (so an exact multiple of 30 s gets one extra, empty-padded chunk, as upstream);
* every speech placeholder in the matching text is replaced by
  ``fixed_speech_embeds_length * n_chunks`` copies;
* each chunk becomes padded, normalised log-mel features (WhisperFeatureExtractor,
  ``padding="max_length"``, so always 3000 frames);
* the text is tokenised with ``add_special_tokens=False`` (the chat template
  already holds ``<bos>``).

Returns ``input_features`` (sum of chunks, mel, 3000), ``feature_attention_mask``
(sum of chunks, 3000), ``input_ids`` and ``attention_mask``.
"""

from typing import List, Optional, Union

import numpy as np
from transformers.feature_extraction_utils import BatchFeature
from transformers.processing_utils import ProcessorMixin


class MERaLiON2Processor(ProcessorMixin):
    attributes = ["feature_extractor", "tokenizer"]
    feature_extractor_class = "WhisperFeatureExtractor"
    tokenizer_class = "AutoTokenizer"
    valid_kwargs = [
        "fixed_speech_embeds_length",
        "speech_token_index",
        "time_duration_limit",
        "whisper_chunk_size",
        "do_normalize",
    ]

    def __init__(
        self,
        feature_extractor=None,
        tokenizer=None,
        fixed_speech_embeds_length: int = 100,
        speech_token_index: int = 255999,
        time_duration_limit: int = 300,
        whisper_chunk_size: int = 30,
        do_normalize: bool = True,
    ):
        self.fixed_speech_embeds_length = fixed_speech_embeds_length
        self.speech_token_index = speech_token_index
        self.time_duration_limit = time_duration_limit
        self.whisper_chunk_size = whisper_chunk_size
        self.number_chunk_limit = time_duration_limit // whisper_chunk_size
        self.do_normalize = do_normalize
        super().__init__(feature_extractor, tokenizer)
        # the placeholder string is whatever the tokenizer calls that id
        self.speech_token = self.tokenizer.added_tokens_decoder[speech_token_index].content
        self.feature_chunk_size = whisper_chunk_size * self.feature_extractor.sampling_rate

    # -------------------------------------------------------------- helpers
    def _number_of_chunks(self, audios: List[np.ndarray]) -> np.ndarray:
        lengths = np.array([a.shape[0] for a in audios])
        return np.minimum(lengths // self.feature_chunk_size + 1, self.number_chunk_limit)

    def _chunk(self, audios):
        if isinstance(audios, np.ndarray):
            audios = [audios]
        counts = self._number_of_chunks(audios)
        pieces = []
        for audio, n in zip(audios, counts):
            for i in range(int(n)):
                pieces.append(audio[i * self.feature_chunk_size:(i + 1) * self.feature_chunk_size])
        return counts, pieces

    def _expand_placeholders(self, text: List[str], counts: np.ndarray) -> List[str]:
        out = []
        for item, n in zip(text, counts):
            out.append(item.replace(self.speech_token, self.speech_token * (self.fixed_speech_embeds_length * int(n))))
        return out

    # -------------------------------------------------------------- call
    def __call__(
        self,
        text=None,
        audios: Union[np.ndarray, List[np.ndarray]] = None,
        padding=True,
        sampling_rate: Optional[int] = None,
        do_normalize: Optional[bool] = None,  # accepted but ignored, as upstream (self.do_normalize is used)
        **kwargs,
    ) -> BatchFeature:
        if text is None:
            raise ValueError("You need to specify either a `text` input to process.")
        if not isinstance(text, list):
            text = [text]
        if not isinstance(audios, list):
            audios = [audios]
        if sampling_rate is None:
            sampling_rate = self.feature_extractor.sampling_rate
        for i, audio in enumerate(audios):
            if audio.ndim > 1:
                raise ValueError(f"MERaLiON2 only accepts mono audio; audio {i} has {audio.ndim} dimensions")

        return_tensors = kwargs.pop("return_tensors", "pt")
        data = {}
        counts, pieces = self._chunk(audios)
        text = self._expand_placeholders(text, counts)
        features = self.feature_extractor(
            pieces,
            sampling_rate=sampling_rate,
            return_tensors=return_tensors,
            return_attention_mask=True,
            padding="max_length",
            do_normalize=self.do_normalize,
            **kwargs,
        )
        data["input_features"] = features["input_features"]
        data["feature_attention_mask"] = features["attention_mask"]

        encoded = self.tokenizer(
            text=text,
            return_tensors=return_tensors,
            add_special_tokens=False,
            return_attention_mask=True,
            padding=padding,
            **kwargs,
        )
        data["input_ids"] = encoded["input_ids"]
        data["attention_mask"] = encoded["attention_mask"]
        return BatchFeature(data=data)

    def batch_decode(self, *args, **kwargs):
        return self.tokenizer.batch_decode(*args, **kwargs)

    def decode(self, *args, **kwargs):
        return self.tokenizer.decode(*args, **kwargs)

    @property
    def model_input_names(self):
        names = self.tokenizer.model_input_names + self.feature_extractor.model_input_names
        return list(dict.fromkeys(names + ["feature_attention_mask"]))
