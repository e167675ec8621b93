"""Weight-only quantised linear layers for GPU verifiers, on the kernels PyTorch itself ships: int4 through
``aten._weight_int4pack_mm`` (the tinygemm kernel gpt-fast uses: groups of 128, bf16 scales and zero points)
and int8 through ``aten._weight_int8pack_mm`` (per-output-channel scales). The layers keep their weights packed
and multiply them packed: nothing is dequantised to a dense copy. ``quantise_linears`` swaps a model's
``nn.Linear`` layers in place, so a base's own forward and ours both run them.

Used by ``tools.benchmark_quantised_gpu`` (verify cost by precision on MERaLiON-2-shaped decoders). Not the drafting
``medusa_heads.Int8Linear``: that one rounds its inputs to bfloat16 for the CPU kernel's speed (drafts only
propose); a verifier's layer keeps the activations' dtype and float32 scales."""

from __future__ import annotations

import torch
import torch.nn as nn

from medusa_heads import replace_linears

INT4_GROUP = 128  # the seed's W4A16 recipe (llm-compressor GPTQ, group 128)
INT4_INNER_K_TILES = 8  # tinygemm's layout: K must be a multiple of 16 x this
PRECISIONS = ("bf16", "int8", "int4")


class Int4WeightOnlyLinear(nn.Module):
    """y = x W^T (+ b) with W held as 4-bit values in groups of ``INT4_GROUP`` along K, each group with its
    own scale and zero point (asymmetric min-max rounding: W ~= lo + q * scale, q in 0..15)."""

    kernel = "aten._weight_int4pack_mm (tinygemm), group 128"

    def __init__(self, linear: nn.Linear, group: int = INT4_GROUP):
        super().__init__()
        out_features, in_features = linear.weight.shape
        if in_features % (16 * INT4_INNER_K_TILES) or out_features % 8 or in_features % group:
            raise ValueError(f"int4 tinygemm needs in_features % 128 == 0 and out_features % 8 == 0; "
                             f"got {in_features} -> {out_features}")
        self.in_features, self.out_features, self.group = in_features, out_features, group
        q, scale, lo = _int4_quantise(linear.weight.detach(), group)
        packed = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack(packed, INT4_INNER_K_TILES))
        zero = lo + scale * 8  # tinygemm dequantises as (q - 8) * scale + zero
        scales_and_zeros = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous()  # [K / group, N, 2]
        self.register_buffer("scales_and_zeros", scales_and_zeros.to(torch.bfloat16))
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)

    def forward(self, x):
        flat = x.reshape(-1, self.in_features).to(torch.bfloat16)
        out = torch.ops.aten._weight_int4pack_mm(flat, self.packed, self.group, self.scales_and_zeros)
        out = out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)
        return out if self.bias is None else out + self.bias


def _int4_quantise(weight: torch.Tensor, group: int):
    """(q [N, K] int32 in 0..15, scale [N, K / group], lo [N, K / group]) by min-max per group."""
    rows, columns = weight.shape
    grouped = weight.float().reshape(rows, columns // group, group)
    lo, hi = grouped.amin(-1), grouped.amax(-1)
    scale = (hi - lo).clamp(min=1e-6) / 15
    q = ((grouped - lo[..., None]) / scale[..., None]).round().clamp(0, 15).to(torch.int32)
    return q.reshape(rows, columns), scale, lo


class Int8WeightOnlyLinear(nn.Module):
    """y = (x W8^T) * s (+ b): W8 int8 per output channel, symmetric (s = max |w| / 127)."""

    kernel = "aten._weight_int8pack_mm, per-channel scales"

    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight = linear.weight.detach().float()
        scale = weight.abs().amax(dim=1).clamp(min=1e-8) / 127
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.register_buffer("weight_int8", (weight / scale[:, None]).round().clamp(-127, 127).to(torch.int8))
        self.register_buffer("scales", scale.to(linear.weight.dtype))
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)

    def forward(self, x):
        flat = x.reshape(-1, self.in_features)
        out = torch.ops.aten._weight_int8pack_mm(flat, self.weight_int8, self.scales.to(x.dtype))
        out = out.reshape(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias


QUANTISED = {"int8": Int8WeightOnlyLinear, "int4": Int4WeightOnlyLinear}


def quantise_linears(module: nn.Module, precision: str, skip=("lm_head",)) -> int:
    """Replace every ``nn.Linear`` under ``module`` (but those named in ``skip``) by its ``precision`` version,
    in place, freeing the dense weights; returns how many were replaced. ``"bf16"`` changes nothing."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: use one of {', '.join(PRECISIONS)}")
    if precision == "bf16":
        return 0
    return replace_linears(module, QUANTISED[precision], skip)


def module_bytes(module: nn.Module) -> int:
    """Bytes of the parameters and buffers a pass reads (shared tensors counted once)."""
    seen, total = set(), 0
    for tensor in [*module.parameters(), *module.buffers()]:
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            total += tensor.numel() * tensor.element_size()
    return total
