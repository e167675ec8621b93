"""Which calls Medusa decodes, and which go to the base's own generate: the checks a model and each call pass."""

from __future__ import annotations

import copy

import torch

def check_on_one_device(base) -> None:
    """The decode loop runs the base's layers itself, past accelerate's dispatch hooks, so a base split over
    several devices or offloaded (device_map) would compute with weights that are not where it runs."""
    placed = {str(device) for device in (getattr(base, "hf_device_map", None) or {}).values()}
    if len(placed) > 1 or placed & {"disk", "meta"}:
        raise ValueError(f"The base model is spread over {sorted(placed)} by its device_map; Medusa runs the base's "
                         "layers itself (without accelerate's hooks), so the whole base must sit on one device: "
                         "load it with one device, e.g. device_map='cuda:0' or 'cpu'.")


def check_fits(config, backbone):
    if config.hidden_size != backbone.hidden_size:
        raise ValueError(
            f"Heads expect hidden size {config.hidden_size} but base {config.base_model_name_or_path!r} has "
            f"{backbone.hidden_size}: these heads were trained for another base."
        )
    if config.vocab_size != backbone.vocab_size:
        raise ValueError(
            f"Heads expect vocab size {config.vocab_size} but the base's output projection has "
            f"{backbone.vocab_size}: these heads were trained for another base."
        )


def check_max_new_tokens(max_new_tokens):
    """The base's generate refuses fewer than one new token; so do we (instead of emitting one anyway)."""
    if max_new_tokens is not None and (not isinstance(max_new_tokens, int) or max_new_tokens < 1):
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r} (as in the base's "
                         "generate); leave it unset for the base's default length.")


def check_inputs(inputs: dict, required):
    missing = [name for name in required if inputs.get(name) is None]
    if missing:
        raise ValueError(f"generate() is missing required input(s) {missing}; build them with the base's processor.")


# Settings of the base's generate that change what greedy decoding emits and that the Medusa loop does not
# implement, with the values that leave greedy decoding as it is. (Temperature, top-k/p and the like only act
# when sampling, length_penalty only with beams: the generation mode covers them.)
GREEDY_AS_IS = {
    "repetition_penalty": (1.0,), "encoder_repetition_penalty": (1.0,), "no_repeat_ngram_size": (0,),
    "encoder_no_repeat_ngram_size": (0,), "bad_words_ids": ([],), "sequence_bias": ({}, []),
    "forced_bos_token_id": (), "forced_eos_token_id": (), "exponential_decay_length_penalty": (),
    "min_length": (0,), "guidance_scale": (1.0,), "max_time": (), "stop_strings": ([], ""),
    "watermarking_config": (), "token_healing": (False,), "num_return_sequences": (1,),
    "return_dict_in_generate": (False,), "output_scores": (False,), "output_logits": (False,),
    "output_attentions": (False,), "output_hidden_states": (False,),
}
# generate() arguments that are objects or callbacks the Medusa loop cannot apply.
CALL_ONLY_OPTIONS = ("generation_config", "logits_processor", "stopping_criteria", "prefix_allowed_tokens_fn",
                     "assistant_model", "streamer", "negative_prompt_ids", "custom_generate")
MODE_NAMES = {"sample": "sampling", "beam_sample": "beam sampling"}


def activation_quantization(base, parameters: list) -> str | None:
    """Why a base with quantised activations is decoded by its own generate: each activation is rounded to
    a few bits, so the last-bit differences of verifying several tokens in one pass can move it to the
    next level, and the output would not be the base's own (weight-only quantisation is exact).
    ``parameters``: ``parameter_tensors`` of the model holding ``base``."""
    # every call runs this: plain parameters (the type itself) are passed over first
    if not any(type(p) is not torch.nn.Parameter and hasattr(p, "act_quant_kwargs") for p in parameters):
        return None
    for name, module in base.named_modules():
        weight = getattr(module, "weight", None)
        if getattr(weight, "act_quant_kwargs", None) is not None:  # torchao dynamic activation quantisation
            return f"a base with quantised activations ({name}: {type(weight).__name__}, dynamic activation scales)"
    return None


def parameter_tensors(module: torch.nn.Module) -> list:
    """Every parameter of ``module`` and its submodules, in a fixed order, a tied one once per module holding it:
    what ``module.parameters()`` yields, without its generators and de-duplication, which cost more than the
    checks every call runs over them (``benchmarks/round_cost/host_checks.py`` measures both)."""
    tensors, stack = [], [module]
    while stack:
        current = stack.pop()
        tensors += [p for p in current._parameters.values() if p is not None]
        stack += [m for m in reversed(current._modules.values()) if m is not None]
    return tensors


def generation_fallback_reason(kwargs: dict, base_config, backbone) -> str | None:
    """The first setting that makes the base's generate decode other than by the plain greedy search the
    Medusa loop reproduces, named with where it came from; None when there is none. Settings are those of
    the base's generation config updated with this call's, as the base's generate merges them; the backbone
    says which options its family's decoding leaves out and which it reads from the base's config."""
    for name in CALL_ONLY_OPTIONS:
        if kwargs.get(name) is not None:
            return f"the {name} argument"
    merged = copy.copy(base_config)  # (attributes are only replaced below, never changed in place)
    for name, value in kwargs.items():
        if hasattr(merged, name):
            setattr(merged, name, value)

    def named(name: str) -> str:
        value = kwargs[name] if name in kwargs else getattr(merged, name, None)
        origin = "" if name in kwargs else ", set in the base's generation_config"
        return f"{name}={_short_repr(value)}{origin}"

    mode = str(getattr(merged.get_generation_mode(), "value", "greedy_search"))
    if mode != "greedy_search":
        differs = [n for n in ("do_sample", "num_beams", "num_beam_groups", "penalty_alpha", "constraints",
                               "force_words_ids", "dola_layers", "prompt_lookup_num_tokens", "assistant_early_exit")
                   if not _is_mode_default(getattr(merged, n, None))]
        return f"{MODE_NAMES.get(mode, mode.replace('_', ' '))} ({', '.join(named(n) for n in differs)})"
    if (sampling := backbone.sampling_option(kwargs)) is not None:
        option, why = sampling
        return f"sampling ({named(option)}: {why})"
    as_is = {**GREEDY_AS_IS, **backbone.greedy_as_is}
    for name, neutral in as_is.items():
        value = kwargs[name] if name in kwargs else getattr(merged, name, None)
        if not (value is None or (not torch.is_tensor(value) and value in neutral)):
            return named(name)
    for name in backbone.base_config_settings:
        if name in kwargs and kwargs[name] != getattr(base_config, name, None):
            return f"{named(name)} (the decoder applies the base's own {name})"
    return None


def _is_mode_default(value) -> bool:
    return value is None or value is False or (type(value) in (int, float) and value in (0, 1))


def _short_repr(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def base_kwargs(kwargs, max_new_tokens, min_new_tokens) -> dict:
    out = dict(kwargs)
    if max_new_tokens is not None:
        out["max_new_tokens"] = max_new_tokens
    if min_new_tokens is not None:
        out["min_new_tokens"] = min_new_tokens
    return out
