"""Weight-only quantised linear layers for GPU verifiers. On the kernels PyTorch itself ships: int4 through
``aten._weight_int4pack_mm`` (the tinygemm kernel gpt-fast uses: groups of 128, bf16 scales and zero points)
and int8 through ``aten._weight_int8pack_mm`` (per-output-channel scales). On GemLite's Triton kernels (the
optional ``gemlite`` package, CUDA only): int4 in groups of 128 and int8 per channel, with a kernel chosen by the
number of rows (matrix-vector up to 4 rows, split-K GEMM up to 63, GEMM beyond). The layers keep their weights
packed and multiply them packed: nothing is dequantised to a dense copy. ``quantise_linears`` swaps a model's
``nn.Linear`` layers in place, so a base's own forward and ours both run them.

Used by ``tools.benchmark_quantised_gpu`` (verify cost by precision on MERaLiON-2-shaped decoders). Not the drafting
``medusa_heads.Int8Linear``: that one rounds its inputs to bfloat16 for the CPU kernel's speed (drafts only
propose); a verifier's layer keeps the activations' dtype and float32 scales."""

from __future__ import annotations

import torch
import torch.nn as nn

from medusa_heads import replace_linears

INT4_GROUP = 128  # the seed's W4A16 recipe (llm-compressor GPTQ, group 128)
INT4_INNER_K_TILES = (8, 4, 2)  # tinygemm's layouts, the widest that fits: K must be a multiple of 16 x this
PRECISIONS = ("bf16", "int8", "int4", "int8-gemlite", "int4-gemlite")


def int4_op(on_cuda: bool) -> str:
    """The aten op ``Int4WeightOnlyLinear`` multiplies with on that device."""
    return "_weight_int4pack_mm" if on_cuda else "_weight_int4pack_mm_for_cpu"


class Int4WeightOnlyLinear(nn.Module):
    """y = x W^T (+ b) with W held as 4-bit values in groups of ``group`` along K, each group with its own scale
    and zero point, W = (q - 8) * scale + zero with q in 0..15, multiplied packed by PyTorch's int4 kernel for the
    device the layer is built on: tinygemm on CUDA, its CPU port on the CPU (scales and zeros in bf16 for both).
    From a dense layer: asymmetric min-max rounding; ``from_groups``: given values (a GPTQ checkpoint's)."""

    kernel = "aten._weight_int4pack_mm (tinygemm), group 128"

    def __init__(self, linear: nn.Linear, group: int = INT4_GROUP):
        super().__init__()
        q, scale, lo = _int4_quantise(linear.weight.detach(), group)
        self._set_groups(q, scale, lo + scale * 8, linear.bias, group)

    @classmethod
    def from_groups(cls, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bias, group: int):
        """q [N, K] int in 0..15, scale and zero [N, K / group], on the device the layer is for."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer._set_groups(q, scale, zero, bias, group)
        return layer

    def _set_groups(self, q, scale, zero, bias, group):
        out_features, in_features = q.shape
        tiles = next((t for t in INT4_INNER_K_TILES if in_features % (16 * t) == 0), None)
        if tiles is None or out_features % 8 or in_features % group or group not in (32, 64, 128, 256):
            raise ValueError(f"the int4 kernel needs in_features % 32 == 0, out_features % 8 == 0 and groups of "
                             f"32/64/128/256; got {in_features} -> {out_features}, groups of {group}")
        self.in_features, self.out_features, self.group = in_features, out_features, group
        self.on_cuda = q.is_cuda
        if self.on_cuda:
            packed = torch.ops.aten._convert_weight_to_int4pack((q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8), tiles)
        else:
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), tiles)
        self.register_buffer("packed", packed)
        scales_and_zeros = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous()  # [K / group, N, 2]
        self.register_buffer("scales_and_zeros", scales_and_zeros.to(torch.bfloat16))
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    def forward(self, x):
        if x.is_cuda != self.on_cuda:
            raise RuntimeError("an int4 layer's packing is for the device it was built on: build it again there")
        flat = x.reshape(-1, self.in_features)
        multiply = getattr(torch.ops.aten, int4_op(self.on_cuda))
        if self.on_cuda:
            out = multiply(flat.to(torch.bfloat16), self.packed, self.group, self.scales_and_zeros)
        else:  # (the CPU kernel takes float32 activations as they are)
            out = multiply(flat, self.packed, self.group, self.scales_and_zeros.to(flat.dtype))
        out = out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)
        return out if self.bias is None else out + self.bias


def repack_gptq_linears(model: nn.Module, checkpoint) -> int:
    """The layers of a compressed-tensors W4A16 checkpoint (symmetric 4-bit groups, as llm-compressor's GPTQ
    writes), loaded decompressed (dense W = v * scale per group, v in -8..7), swapped in place for int4 kernel
    layers holding the same values: the scales from the checkpoint's files, the 4-bit values from the dense weights,
    checked exact (a layer that is not is left dense). Built for the device the weights are on. Returns how many
    layers were swapped."""
    from pathlib import Path

    from safetensors import safe_open

    scales = {}
    for path in sorted(Path(checkpoint).glob("*.safetensors")):
        with safe_open(str(path), "pt") as handle:
            for key in handle.keys():
                if key.endswith(".weight_scale"):
                    scales[key[: -len(".weight_scale")]] = handle.get_tensor(key)
    swapped = 0
    for name, scale in scales.items():
        module = _submodule(model, name)
        if not isinstance(module, nn.Linear) or not is_dense_weight(module):
            continue
        weight = module.weight.detach()
        rows, columns = weight.shape
        scale = scale.float().reshape(rows, -1).to(weight.device)
        group = columns // scale.shape[1]
        grouped = weight.float().reshape(rows, -1, group)
        values = (grouped / torch.where(scale == 0, 1.0, scale)[..., None]).round()
        # the values and scales must give back the loaded weights, up to the rounding of the dtype they were
        # loaded in (a bf16 load rounds value x scale, however the library computed it)
        if values.min() < -8 or values.max() > 7 or not torch.allclose(
                values * scale[..., None], grouped, rtol=torch.finfo(weight.dtype).eps, atol=0.0):
            continue
        parent_name, _, child = name.rpartition(".")
        layer = Int4WeightOnlyLinear.from_groups((values + 8).reshape(rows, columns).to(torch.int32), scale,
                                                 torch.zeros_like(scale), module.bias, group)
        setattr(model.get_submodule(parent_name) if parent_name else model, child, layer)
        swapped += 1
    return swapped


def is_dense_weight(module: nn.Module) -> bool:
    """A (decompressed) floating-point ``weight`` of the layer's full shape."""
    weight = getattr(module, "weight", None)
    return isinstance(weight, torch.Tensor) and weight.is_floating_point() and \
        tuple(weight.shape) == (module.out_features, module.in_features)


def _submodule(model: nn.Module, name: str):
    try:
        return model.get_submodule(name)
    except AttributeError:
        return None


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


class GemliteLinear(nn.Module):
    """A GemLite layer (weights packed, multiplied by GemLite's Triton kernels) built from a dense CUDA layer.
    GemLite tunes its kernel per shape and row count on first use: call the layer once per row count before
    capturing a CUDA graph (the tuning synchronises the device)."""

    kernel = "GemLite (Triton)"

    def __init__(self, linear: nn.Linear):
        super().__init__()
        if not linear.weight.is_cuda:
            raise RuntimeError("GemLite's kernels are Triton kernels for CUDA: move the model to the GPU first")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.inner = self._pack(linear, _gemlite_helpers())

    def _pack(self, linear: nn.Linear, helpers):
        raise NotImplementedError

    def forward(self, x):
        return self.inner(x.to(torch.bfloat16)).to(x.dtype)


class GemliteInt4Linear(GemliteLinear):
    """4-bit weights in groups of 128, asymmetric min-max rounding (as ``Int4WeightOnlyLinear``), bf16 scales."""

    kernel = "GemLite A16W4 (Triton), group 128"

    def _pack(self, linear, helpers):
        q, scale, lo = _int4_quantise(linear.weight.detach(), INT4_GROUP)
        bias = None if linear.bias is None else linear.bias.detach().to(torch.bfloat16)
        # GemLite's form: W = (q - zero) * scale, so zero = -lo / scale
        return helpers.A16W4_HQQ_INT(device=linear.weight.device, dtype=torch.bfloat16).from_weights(
            q.to(torch.uint8), scale.to(torch.bfloat16), (-lo / scale).to(torch.bfloat16), bias=bias)


class GemliteInt8Linear(GemliteLinear):
    """8-bit weights, symmetric per output channel."""

    kernel = "GemLite A16W8 (Triton), per-channel scales"

    def _pack(self, linear, helpers):
        return helpers.A16W8_INT8(device=linear.weight.device, dtype=torch.bfloat16).from_linear(linear,
                                                                                               del_orig=False)


def _gemlite_helpers():
    try:
        from gemlite import helper
    except ImportError as err:
        raise RuntimeError("the *-gemlite precisions need GemLite's kernels: pip install gemlite") from err
    return helper


QUANTISED = {"int8": Int8WeightOnlyLinear, "int4": Int4WeightOnlyLinear,
             "int8-gemlite": GemliteInt8Linear, "int4-gemlite": GemliteInt4Linear}


def bits(precision: str) -> str:
    """The weight precision a ``PRECISIONS`` entry names, whatever its kernel: ``"int4-gemlite"`` -> ``"int4"``."""
    return precision.split("-")[0]


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
