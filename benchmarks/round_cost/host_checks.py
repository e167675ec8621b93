"""The host-side checks every ``generate`` call runs before its first kernel, timed alone on the machine this runs
on (microseconds of Python, the same on a GPU's host, where a tiny.en call takes ~5.6 ms): the weights' signature
the captured rounds are checked against, the scan for activation-quantised layers, the generation settings'
fallback check and the logits rules. Each is timed as ``generate`` runs it now and, for the walks, through
``torch.nn.Module``'s own iterators (what they replaced).

    python benchmarks/round_cost/host_checks.py --model heads/whisper-tiny.en \
        --out benchmarks/round_cost/cpu_tiny.en_host_checks.json
"""

import argparse
import statistics
import sys
import time

import torch

sys.path.insert(0, ".")
import generation_checks  # noqa: E402
from tools import runtime  # noqa: E402
from tools.benchmark_environment import cpu_name  # noqa: E402
from tools.files import command_line, write_json_atomic  # noqa: E402


def median_us(fn, repeats: int, calls: int = 50) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls)
    return round(statistics.median(times) * 1e6, 1)


def signature(tensors) -> tuple:
    """The key ``RoundCache.check_weights`` builds from the tensors it is given."""
    return tuple((p.data_ptr(), p.dtype, p.device, p._version) for p in tensors)


def any_activation_quantised_weight(base) -> bool:
    """The scan through ``named_modules`` and each module's ``weight`` attribute (the form before)."""
    return any(getattr(getattr(m, "weight", None), "act_quant_kwargs", None) is not None
               for _, m in base.named_modules())


def checks(model, repeats: int) -> dict:
    base, backbone = model.backbone.base, model.backbone
    kwargs = {"input_features": torch.zeros(1, base.config.num_mel_bins, 3000)}
    parameters = generation_checks.parameter_tensors(model)
    return {
        "parameter_tensors": len(parameters),
        "weights_signature_module_parameters_us": median_us(lambda: signature(model.parameters()), repeats),
        "weights_signature_parameter_tensors_us": median_us(
            lambda: signature(generation_checks.parameter_tensors(model)), repeats),
        "activation_quantisation_named_modules_us": median_us(lambda: any_activation_quantised_weight(base), repeats),
        # (a call walks its parameters once, for this check and the weights' signature: the scan alone)
        "activation_quantisation_now_us": median_us(lambda: generation_checks.activation_quantization(base, parameters),
                                                    repeats),
        "generation_fallback_check_us": median_us(
            lambda: generation_checks.generation_fallback_reason(kwargs, base.generation_config, backbone), repeats),
        "logits_rules_us": median_us(lambda: backbone.make_logits_processor(None), repeats),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="heads/whisper-tiny.en")
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    model = runtime.load_medusa(args.model, torch.float32, runtime.base_to_load(args.model, None)).eval()
    row = checks(model, args.repeats)
    print(row, flush=True)
    write_json_atomic(args.out, {"command": command_line("benchmarks/round_cost/host_checks.py"), "cpu": cpu_name(),
                                 "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "model": args.model,
                                 "checks": row})


if __name__ == "__main__":
    main()
