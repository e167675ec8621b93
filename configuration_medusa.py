"""Configuration of a Medusa speculative-decoding artifact for speech recognition models."""

from transformers import PretrainedConfig

SUPPORTED_FAMILIES = ("meralion2", "whisper")
CANDIDATES_FORM = 'a list of {"paths": [[rank, ...], ...], "tokens_per_round": number}'


def _is_paths(paths) -> bool:
    return isinstance(paths, list) and all(
        isinstance(path, list) and all(isinstance(rank, int) and rank >= 0 for rank in path) for path in paths)


def _check_draft_candidates(candidates) -> None:
    """config.json's ``draft_candidates`` in the form export writes (None or empty: none measured)."""
    if candidates is None:
        return
    well_formed = isinstance(candidates, list) and all(
        isinstance(c, dict) and _is_paths(c.get("paths"))
        and isinstance(c.get("tokens_per_round"), (int, float)) and not isinstance(c.get("tokens_per_round"), bool)
        for c in candidates)
    if not well_formed:
        shown = repr(candidates)
        raise ValueError(f"config.json: draft_candidates must be {CANDIDATES_FORM}, got "
                         f"{shown if len(shown) <= 60 else shown[:57] + '...'}; export the heads again "
                         "(pipeline.export) or delete the field.")


class MedusaConfig(PretrainedConfig):
    """Describes K Medusa heads grafted onto a frozen ASR base model.

    The base model itself is never stored in the artifact: ``base_model_name_or_path``
    names it (a Hub id or a local folder) and it is loaded next to the heads.
    The provenance fields are free-form records that the model card is generated from.
    """

    model_type = "medusa_asr"

    def __init__(
        self,
        base_model_name_or_path: str = "MERaLiON/MERaLiON-2-3B",
        base_family: str = "meralion2",
        medusa_num_heads: int = 4,
        medusa_num_layers: int = 1,
        hidden_size: int = 2304,
        vocab_size: int = 256000,
        tree: list | None = None,
        head_kind: str = "medusa",
        speech_attention: bool = False,
        draft_vocab_size: int | None = None,
        draft_candidates: list | None = None,
        training_data: dict | None = None,
        head_accuracy: dict | None = None,
        benchmark: dict | None = None,
        **kwargs,
    ):
        if base_family not in SUPPORTED_FAMILIES:
            raise ValueError(
                f"base_family={base_family!r} is not supported; choose one of {SUPPORTED_FAMILIES}."
            )
        if head_kind not in ("medusa", "path"):
            raise ValueError(f"head_kind={head_kind!r}: use 'medusa' (independent heads) or 'path' "
                             "(each head also sees the tokens drafted before it on its path).")
        if speech_attention and head_kind != "path":
            raise ValueError("speech_attention=True needs head_kind='path'.")
        if medusa_num_heads < 1 or medusa_num_layers < 1:
            raise ValueError("medusa_num_heads and medusa_num_layers must both be >= 1.")
        _check_draft_candidates(draft_candidates)
        self.base_model_name_or_path = base_model_name_or_path
        self.base_family = base_family
        self.medusa_num_heads = medusa_num_heads
        self.medusa_num_layers = medusa_num_layers
        self.hidden_size = hidden_size
        self.vocab_size = vocab_size
        # Sparse draft tree as a list of paths of per-head top-k ranks, e.g. [[0], [1], [0, 0]];
        # chosen from measured per-head top-k accuracy by the training pipeline. None = chain.
        self.tree = tree
        # "medusa": K independent heads on the last hidden state; "path": head k also takes the token of
        # the node it drafts after (Hydra-style), optionally attending to the speech (speech_attention).
        self.head_kind = head_kind
        self.speech_attention = speech_attention
        # Heads project onto this many token ids (stored with the heads); None = the whole vocabulary.
        self.draft_vocab_size = draft_vocab_size
        # Drafts measured at export: [{"paths": [...], "tokens_per_round": float}, ...] on held-out data;
        # draft="auto" weighs these against measured verify cost.
        self.draft_candidates = draft_candidates or []
        self.training_data = training_data or {}
        self.head_accuracy = head_accuracy or {}
        self.benchmark = benchmark or {}
        super().__init__(**kwargs)
