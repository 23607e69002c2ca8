"""The convolution family on the CPU: discovery's conv regions (geometry, the epilogue chain as
data, why a convolution did not match), BatchNorm folding against eager, the registry key,
the workload's reference, the kernel's template parameters and 3xTF32 split, candidate pruning,
and composition with stand-in ops (layout conversions counted, composed == eager)."""
from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fact_db
from fact_db.kernels import families
from fact_db.kernels.conv import family as conv_family
from fact_db.kernels.conv.fold import fold_bn
from fact_db.kernels.conv.kernel import (ConvConfig, ConvKernel, channels_last_strides, forward_padding, groups_of, is_channels_last,
                                         params, prepare_weight, render, split_activation, tf32_lo, to_channels_last,
                                         why_not)
from fact_db.kernels.conv.tune import MAX_TILE_AREA, candidates, per_warpgroup
from fact_db.kernels.conv.workload import ConvError, ConvWorkload, canonical_chain
from fact_db.kernels.impl import Impl
from fact_db.store.db import RegistryError
from fact_db.store.keys import ConvKey, Key
from tests import standins


class Chain3(nn.Module):
    """Three convolutions in a row: conv+ReLU, conv+BN+residual+ReLU, conv*scale-0.25+HardSwish."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(8, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        self.c3 = nn.Conv2d(16, 32, 1)
        self.s = nn.Parameter(torch.randn(32, 1, 1))
        with torch.no_grad():  # statistics that are not the identity, so folding matters
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        y = torch.relu(self.c1(x))
        y = torch.relu(self.bn(self.c2(y)) + y)
        return F.hardswish(self.c3(y) * self.s - 0.25)


# ------------------------------------------------------------------ discovery

def test_a_chain_of_convolutions_is_three_regions_with_their_geometry_and_chain():
    rep = fact_db.discover(Chain3().eval(), (torch.randn(2, 8, 8, 8),))
    assert [r.rule for r in rep.regions] == ["conv-bias-act", "conv-bn", "conv-epilogue"]
    r1, r2, r3 = rep.regions
    assert r1.attrs["geometry"] | {} == r1.problem
    assert r1.problem["k"] == 16 and r1.problem["filter"] == [3, 3] and r1.problem["padding"] == [1, 1]
    assert r1.shape == "N2 C8 K16 8x8 f3x3 s1x1 p1x1"
    assert [s["op"] for s in r2.attrs["chain"]] == ["add", "relu"]
    assert r2.attrs["chain"][0]["kind"] == "full" and r2.attrs["chain"][0]["tensor"] == r1.output
    assert {"bn_mean", "bn_var", "bn_weight", "bn_bias"} <= set(r2.operands) and "bias" not in r2.operands
    assert r3.attrs["chain"][:2] == [{"op": "mul", "tensor": "p_s", "kind": "channel", "node": "mul"},
                                     {"op": "sub", "scalar": 0.25, "node": "sub"}]
    assert not any(r.composable for r in rep.regions)


@pytest.mark.parametrize("padding,kernel,why", [("same", (3, 5), ""), ("same", (2, 3), "pads one side more"),
                                               ("valid", (3, 3), "")])
def test_string_padding_becomes_the_geometry_it_means(padding, kernel, why):
    conv = nn.Conv2d(8, 16, kernel, padding=padding, dilation=(1, 2))
    x = torch.randn(1, 8, 9, 9)
    rep = fact_db.discover(conv.eval(), (x,))
    [r] = rep.regions
    assert (why in r.composable) if why else not r.composable
    if not why:
        g = r.attrs["geometry"]
        w = ConvWorkload(g["n"], g["c"], g["k"], g["input"], g["filter"], g["stride"], g["padding"], g["dilation"])
        assert w.y_shape() == tuple(conv(x).shape)


def test_chains_of_any_length_are_one_region():
    class Long(nn.Module):
        def __init__(self):
            super().__init__()
            self.c = nn.Conv3d(4, 8, 3)

        def forward(self, x):
            x = self.c(x)
            for i in range(12):
                x = torch.tanh(x) * 2.0 + 0.1 * i
            return x
    rep = fact_db.discover(Long().eval(), (torch.randn(1, 4, 6, 6, 6),))
    assert [r.rule for r in rep.regions] == ["conv-epilogue"]
    assert len(rep.regions[0].attrs["chain"]) == 36


@pytest.mark.parametrize("model,inputs,rule,reason", [
    (nn.Conv2d(16, 16, 3, groups=16), (torch.randn(2, 16, 8, 8),), "conv", "`groups == 1` is false (groups=16)"),
    (nn.Conv2d(16, 32, 3).double(), (torch.randn(2, 16, 8, 8, dtype=torch.float64),), "conv", "dtype float64"),
])
def test_explain_says_why_a_convolution_did_not_match(model, inputs, rule, reason):
    rep = fact_db.discover(model.eval(), inputs)
    assert not rep.regions
    assert reason in rep.misses[rule].reason


def test_explain_says_a_weight_computed_in_forward_cannot_be_laid_out_once():
    """The layout reason: a convolution's weight is converted to channels-last (CUTLASS's NHWC)
    once, when composing, so a weight computed in forward matches the rule but is not composed,
    and discover and plan say why."""
    class Computed(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(32, 16, 3, 3))

        def forward(self, x):
            return F.conv2d(x, self.w * 2.0)
    x = torch.randn(2, 16, 8, 8)
    (region,) = fact_db.discover(Computed().eval(), (x,)).regions
    assert region.rule == "conv" and "is not a parameter (it is converted to channels-last once" in region.composable
    (r,) = fact_db.plan(Computed().eval(), (x,), policy="bf16").regions
    assert r.how == "eager" and any(n.startswith("not composable: the weight") for n in r.notes)
    (ok,) = fact_db.discover(nn.Conv2d(16, 32, 3).eval(), (x,)).regions
    assert not ok.composable


def test_discover_explain_prints_the_layout_reason(tmp_path):
    from click.testing import CliRunner

    from cli.main import cli
    problem = tmp_path / "computed_weight.py"
    problem.write_text(
        "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"
        "class Model(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.w = nn.Parameter(torch.randn(32, 16, 3, 3))\n\n"
        "    def forward(self, x):\n        return F.conv2d(x, self.w * 2.0)\n\n\n"
        "def get_inputs():\n    return [torch.randn(2, 16, 8, 8)]\n\n\n"
        "def get_init_inputs():\n    return []\n")
    r = CliRunner().invoke(cli, ["discover", str(problem), "--explain"])
    assert r.exit_code == 0, r.output
    assert "conv: matched at" in r.output and "stays eager PyTorch: the weight `mul` is not a parameter" in r.output


def test_explain_says_a_training_mode_batchnorm_is_not_folded():
    class TrainBn(nn.Module):
        def __init__(self):
            super().__init__()
            self.c = nn.Conv2d(16, 32, 3)
            self.register_buffer("m", torch.zeros(32))
            self.register_buffer("v", torch.ones(32))

        def forward(self, x):
            return F.batch_norm(self.c(x), self.m, self.v, training=True)
    rep = fact_db.discover(TrainBn().eval(), (torch.randn(2, 16, 8, 8),))
    assert "training=True, the rule needs False" in rep.misses["conv-bn"].reason
    assert [r.rule for r in rep.regions] == ["conv"]  # the convolution alone still is one


def test_a_chain_that_reads_its_own_intermediate_stays_eager_with_the_reason():
    class SelfRead(nn.Module):
        def __init__(self):
            super().__init__()
            self.c = nn.Conv2d(8, 16, 3)

        def forward(self, x):
            y = self.c(x)
            return torch.relu(y) * y
    rep = fact_db.discover(SelfRead().eval(), (torch.randn(1, 8, 6, 6),))
    [r] = rep.regions
    assert "a value computed inside the region" in r.composable


# ------------------------------------------------------------------ BatchNorm folding

@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
@pytest.mark.parametrize("dims", [1, 2, 3])
@pytest.mark.parametrize("bias", [True, False])
def test_folded_batchnorm_equals_eager(dtype, tol, dims, bias):
    conv = (nn.Conv1d, nn.Conv2d, nn.Conv3d)[dims - 1](6, 10, 3, padding=1, bias=bias).to(dtype)
    bn = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)[dims - 1](10, eps=1e-3).to(dtype).eval()
    with torch.no_grad():
        bn.running_mean.normal_()
        bn.running_var.uniform_(0.1, 3.0)
        bn.weight.normal_()
        bn.bias.normal_()
    x = torch.randn(2, 6, *([7] * dims), dtype=dtype)
    w, b = fold_bn(conv.weight, conv.bias, bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.eps)
    assert w.dtype == dtype and b.dtype == dtype
    ref = bn(conv(x))
    got = conv._conv_forward(x, w, b)
    assert (got - ref).abs().max().item() <= tol * max(1.0, ref.abs().max().item())


def test_folding_a_transposed_grouped_convolution_scales_its_output_channels():
    conv = nn.ConvTranspose2d(8, 6, 3, groups=2).double()
    bn = nn.BatchNorm2d(6).double().eval()
    with torch.no_grad():
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.normal_()
    x = torch.randn(1, 8, 5, 5, dtype=torch.float64)
    w, b = fold_bn(conv.weight, conv.bias, bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.eps,
                   transposed=True, groups=2)
    assert torch.allclose(F.conv_transpose2d(x, w, b, groups=2), bn(conv(x)), atol=1e-12)


def test_folding_without_affine_parameters():
    conv, bn = nn.Conv2d(4, 4, 1).double(), nn.BatchNorm2d(4, affine=False).double().eval()
    with torch.no_grad():
        bn.running_mean.normal_()
    x = torch.randn(1, 4, 3, 3, dtype=torch.float64)
    w, b = fold_bn(conv.weight, conv.bias, None, None, bn.running_mean, bn.running_var, bn.eps)
    assert torch.allclose(F.conv2d(x, w, b), bn(conv(x)), atol=1e-12)


# ------------------------------------------------------------------ registry key

def _key(**kw):
    base = dict(rule="conv-bn", arch="sm_90a", gpu="NVIDIA H100 80GB HBM3", dtype="bf16", layout="nhwc", n=8, c=64,
                k=64, input="56x56", filter="3x3", stride="1x1", padding="1x1", dilation="1x1", output_padding="0x0",
                groups=1, transposed=False, bias=True, chain='[{"op": "relu"}]', policy="bf16")
    return ConvKey(**(base | kw))


def test_conv_key_canonicalizes_and_digests_stably():
    k = _key()
    assert (k.arch, k.gpu, k.dtype, k.chain) == ("sm90a", "h100", "bfloat16", '[{"op":"relu"}]')
    assert k.summary == "conv-bn N8 C64 K64 56x56 f3x3 bf16"
    assert Key.from_dict("conv", k.as_dict()) == k
    assert k.digest() == _key(chain='[{"op":"relu"}]').digest()  # JSON spacing is not identity
    assert k.digest() != _key(padding="0x0").digest() != _key(policy="fp16", dtype="fp16").digest()
    assert k.near() == _key(n=32).near() and k.distance(_key(n=32)) == 2.0
    assert k.near() != _key(chain='[{"op": "tanh"}]').near()


@pytest.mark.parametrize("field,value,words", [
    ("input", "56,56", "input"), ("groups", 0, "groups"), ("layout", "nwhc", "layout"),
    ("chain", '{"op": "relu"}', "chain"), ("filter", "3x3x3", "one size per spatial dim"), ("policy", "tf16", "policy"),
])
def test_conv_key_refuses_a_bad_field_naming_it(field, value, words):
    with pytest.raises(RegistryError, match=words):
        _key(**{field: value})


def test_conv_rows_go_through_the_one_registry_api():
    from fact_db.kernels.conv.tune import ConvTrial, from_registry, record
    from fact_db.store.registry import Registry
    w = ConvWorkload(8, 64, 64, (56, 56), (3, 3), padding=(1, 1), chain='[{"op":"relu"}]', dtype="bfloat16",
                     policy="bf16", rule="conv-bias-act")
    cfg = ConvConfig(128, 64, 64)
    trials = [ConvTrial(cfg.label, "ok", 0.5, 1e-3, config=cfg), ConvTrial("cudnn", "ok", 0.7, 1e-3),
              ConvTrial("64x64x64 c1x1", "verify_failed", error="error 1 > bound", config=ConvConfig(64, 64, 64))]
    with Registry.open("memory") as reg:
        assert from_registry(w, reg, gpu="h100") is None
        record(w, trials, reg, gpu="h100", device_name="NVIDIA H100")
        hit = from_registry(w, reg, gpu="h100")
        assert hit is not None and hit.config == cfg and hit.time_ms == 0.5
        rec = reg.lookup(w.key("sm90a", "h100"), nearest=False).record
        assert rec.baseline == "cudnn" and rec.baseline_ms == 0.7 and rec.template == "conv_sm90"
        assert {t.status for t in reg.trials(w.key("sm90a", "h100"))} == {"ok", "verify_failed"}
        assert conv_family.answer(reg, w, "sm90a", "h100") == ("hit", 0.5)
        assert conv_family.answer(reg, ConvWorkload(**(w.as_dict() | {"policy": "fp16", "dtype": "float16"})),
                                  "sm90a", "h100") == ("miss", None)
        # cuDNN winning is recorded as the library's row
        w2 = ConvWorkload(1, 16, 16, (8, 8), (3, 3), groups=16)
        record(w2, [ConvTrial("cudnn", "ok", 0.01, 1e-7)], reg, gpu="h100")
        assert from_registry(w2, reg, gpu="h100").config is None


# ------------------------------------------------------------------ workload

@pytest.mark.parametrize("kw", [
    dict(n=2, c=4, k=8, input=(9, 11), filter=(3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2)),
    dict(n=1, c=4, k=6, input=(17,), filter=(5,), stride=(3,), padding=(2,), dilation=(2,)),
    dict(n=1, c=4, k=4, input=(4, 5, 6), filter=(3, 3, 3), padding=(1, 1, 1)),
    dict(n=2, c=8, k=6, input=(5, 5), filter=(3, 3), stride=(2, 2), padding=(1, 1), output_padding=(1, 1),
         transposed=True, groups=2),
])
def test_workload_output_shape_and_reference_match_pytorch(kw):
    w = ConvWorkload(**kw, chain=canonical_chain([{"op": "relu"}, {"op": "mul", "tensor": "t", "kind": "channel"}]))
    inp = w.make_inputs("randn", device="cpu")
    assert tuple(inp["x"].shape) == w.x_shape() and tuple(inp["w"].shape) == w.w_shape()
    y = w.eager(inp)
    assert tuple(y.shape) == w.y_shape()
    ref = w.reference(inp)
    assert ref.dtype == torch.float64 and (y.double() - ref).abs().max() < 1e-4


def test_workload_chain_keys_without_graph_names_and_round_trips():
    steps = [{"op": "sub", "scalar": 0.5, "node": "sub"}, {"op": "mul", "tensor": "p_s", "kind": "channel", "node": "m"}]
    w = ConvWorkload(2, 16, 32, (8, 8), (3, 3), chain=canonical_chain(steps))
    assert json.loads(w.chain) == [{"op": "sub", "scalar": 0.5}, {"kind": "channel", "op": "mul"}]
    assert ConvWorkload(**json.loads(json.dumps(w.as_dict()))) == w
    assert w.key_fields()["input"] == "8x8" and w.key("sm90a", "h100").family_class("conv") is ConvKey
    with pytest.raises(ConvError, match="one size per spatial dim"):
        ConvWorkload(2, 16, 32, (8, 8), (3,))
    with pytest.raises(ConvError, match="not one of"):
        ConvWorkload(2, 16, 32, (8, 8), (3, 3), chain='[{"op": "softmax"}]')


def test_eager_fp32_runs_without_tf32_and_restores_the_flags():
    seen = []

    class Spy(ConvWorkload):
        def _conv(self, x, w, b):
            seen.append(torch.backends.cudnn.allow_tf32)
            return super()._conv(x, w, b)
    w = Spy(1, 4, 4, (5, 5), (3, 3), policy="fp32")
    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = True
    try:
        w.eager(w.make_inputs(device="cpu"))
        w.eager(w.make_inputs(device="cpu"), policy="tf32")
        assert torch.backends.cudnn.allow_tf32 is True
    finally:
        torch.backends.cudnn.allow_tf32 = before
    assert seen == [False, True]


# ------------------------------------------------------------------ kernel: template, split, layout

def test_template_parameters_group_the_chain_and_number_the_vectors():
    steps = [{"op": "sub", "scalar": 0.5}, {"op": "hardswish"}, {"op": "mul", "kind": "channel"},
             {"op": "add", "kind": "full"}, {"op": "leaky_relu", "slope": 0.2}, {"op": "clamp", "min": -1.0, "max": None}]
    w = ConvWorkload(2, 16, 32, (8, 8), (3, 3), chain=canonical_chain(steps), dtype="bfloat16", policy="bf16")
    g = groups_of(w)
    assert [x["kind"] for x in g] == ["vec", "unary", "vec", "src", "unary"]
    assert (g[0]["index"], g[2]["index"]) == (0, 1)
    assert [s["value"] for s in g[1]["steps"]] == ["0.5f", None] and g[4]["steps"][0]["slope"] == "0.2f"
    src = render(w, ConvConfig(128, 64, 64))
    assert "x[i] * t[i]" in src and "Sm90SrcFetch<ElementC>" in src and "(v - 0.5f)" in src
    assert "fmaxf(v, -1.0f)" in src and "cutlass::conv::KernelImplicitTmaWarpSpecializedSm90>" in src
    assert params(w, ConvConfig(64, 64, 64))["element_c"] == "cutlass::bfloat16_t"
    fp32 = ConvWorkload(2, 16, 32, (8, 8), (3, 3))
    assert "split3_kernel<<<" in render(fp32, ConvConfig(128, 64, 32, split3=True))
    assert "split3_kernel" not in render(fp32, ConvConfig(128, 64, 32))
    assert params(ConvWorkload(2, 16, 32, (8, 8), (3, 3)), ConvConfig(64, 64, 32))["element_c"] == "void"


def test_tf32_split_recovers_what_truncation_loses():
    x = torch.randn(4096, dtype=torch.float32)
    lo = tf32_lo(x)
    hi = (x.view(torch.int32) & -8192).view(torch.float32)
    assert torch.all((lo.view(torch.int32) & 0x1FFF) == 0)  # lo is TF32 already: the kernel keeps all of it
    assert torch.all((hi + lo - x).abs() <= (x - hi).abs() * 2 ** -11)
    assert lo.abs().max() <= x.abs().max() * 2 ** -10


def _trunc(t):
    return (t.contiguous().view(torch.int32) & -8192).view(torch.float32)


def _round(t):  # to the nearest TF32 (ties away): what a rounding path to the tensor cores does
    return ((t.contiguous().view(torch.int32) + 0x1000) & -8192).view(torch.float32)


@pytest.mark.parametrize("load", [_trunc, _round], ids=["truncating", "rounding"])
def test_split3_over_three_channel_blocks_is_fp32_class_where_one_tf32_product_is_not(load):
    """What the kernel computes for split3, emulated on the CPU: three channel blocks
    [hi(x), hi(x), lo(x)] . [hi(w), lo(w), hi(w)] summed in one convolution, fp32-class whether
    the tensor cores truncate their raw fp32 operands or round them. Raw x and w in the hi
    blocks (the first version) were fp32-class only under truncation; on an H200 they gave
    TF32's error (8.7e-4, the 'rounding' case here)."""
    torch.manual_seed(0)
    x = torch.randn(2, 32, 9, 9)
    w = torch.randn(16, 32, 3, 3) / math.sqrt(32 * 9)
    ref = F.conv2d(x.double(), w.double())
    xs = split_activation(x.movedim(1, -1)).movedim(-1, 1)
    cfg = ConvConfig(128, 64, 32, split3=True)
    ws = prepare_weight(w, ConvWorkload(2, 32, 16, (9, 9), (3, 3)), cfg).movedim(-1, 1)
    assert torch.equal(load(xs), xs) and torch.equal(load(ws), ws)  # every operand is TF32 already
    got = F.conv2d(load(xs).double(), load(ws).double())
    one = F.conv2d(load(x).double(), load(w).double())
    rel = lambda a: ((a - ref).norm() / ref.norm()).item()  # noqa: E731
    assert rel(got) < 1e-6 < 1e-4 < rel(one)
    raw = F.conv2d(load(torch.cat([x, x, tf32_lo(x)], 1)).double(), load(torch.cat([w, tf32_lo(w), w], 1)).double())
    assert (rel(raw) < 1e-6) == (load is _trunc)  # the first version's split, right only when truncating


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_a_stride_1_transposed_convolution_runs_as_the_forward_one_the_kernel_computes(dims):
    w = ConvWorkload(2, 8, 12, (5,) * dims, (3,) * dims, padding=(1,) * dims, dilation=(2,) * dims, transposed=True)
    inp = w.make_inputs("randn", device="cpu")
    held = prepare_weight(inp["w"].double(), ConvWorkload(**(w.as_dict() | {"dtype": "float32"})), ConvConfig(64, 64, 32))
    fwd = (F.conv1d, F.conv2d, F.conv3d)[dims - 1](inp["x"].double(), held.movedim(-1, 1).double(), None, 1,
                                                   forward_padding(w), w.dilation)
    ref = w.reference({**inp, "bias": None})
    assert fwd.shape == ref.shape == (2, 12, *w.output)
    assert torch.allclose(fwd, ref, atol=1e-5)


def test_channels_last_helpers_for_1d_2d_3d():
    for shape in [(2, 3, 5), (2, 3, 4, 5), (2, 3, 4, 5, 6)]:
        x = torch.randn(shape)
        y = to_channels_last(x)
        assert torch.equal(x, y) and is_channels_last(y) and not is_channels_last(x)
        assert list(y.stride()) == channels_last_strides(shape)
        assert to_channels_last(y) is y


def test_why_not_says_which_convolutions_stay_with_cudnn():
    assert "grouped or depthwise" in why_not(ConvWorkload(1, 16, 16, (8, 8), (3, 3), groups=16))
    assert "a multiple of 8" in why_not(ConvWorkload(1, 16, 12, (8, 8), (3, 3), dtype="bfloat16", policy="bf16"))
    assert "a multiple of 4" in why_not(ConvWorkload(1, 16, 6, (8, 8), (3, 3)))
    # three input channels (a network's first convolution): padded, not refused
    assert why_not(ConvWorkload(1, 3, 64, (8, 8), (3, 3))) == ""
    assert why_not(ConvWorkload(1, 3, 64, (8, 8), (3, 3), dtype="bfloat16", policy="bf16")) == ""
    # a strided transposed convolution runs as phases (phases.py), but not with a residual, nor a
    # chain where its stride leaves pixels no tap reaches
    assert why_not(ConvWorkload(1, 16, 16, (8, 8), (3, 3), stride=(2, 2), transposed=True)) == ""
    res = canonical_chain([{"op": "add", "kind": "full"}])
    assert "residual" in why_not(ConvWorkload(1, 16, 16, (8, 8), (3, 3), stride=(2, 2), transposed=True, chain=res))
    relu = canonical_chain([{"op": "relu"}])
    assert why_not(ConvWorkload(1, 16, 16, (8,), (3,), stride=(2,), transposed=True, chain=relu)) == ""
    sparse = ConvWorkload(1, 16, 16, (8,), (3,), stride=(2,), dilation=(2,), transposed=True, chain=relu)
    assert "no filter tap reaches" in why_not(sparse)
    assert why_not(ConvWorkload(1, 16, 16, (8,), (3,), stride=(2,), dilation=(2,), transposed=True)) == ""
    assert why_not(ConvWorkload(1, 16, 16, (8, 8), (3, 3), padding=(1, 1), transposed=True)) == ""
    assert why_not(ConvWorkload(1, 16, 16, (8, 8), (3, 3))) == ""


def test_candidates_respect_the_register_budget_and_the_policy():
    half = ConvWorkload(8, 64, 128, (56, 56), (3, 3), padding=(1, 1), dtype="bfloat16", policy="bf16")
    cands = candidates(half, limit=20)
    assert cands and all(per_warpgroup(c) <= MAX_TILE_AREA and c.tile_k == 64 and not c.split3 for c in cands)
    assert len(set(cands)) == len(cands)
    # a promoted coop warpgroup keeps a second copy of its accumulators in 232 registers
    fp32_cands = candidates(ConvWorkload(8, 64, 256, (56, 56), (3, 3), padding=(1, 1)), limit=40)
    assert all(per_warpgroup(c) <= MAX_TILE_AREA // 2 for c in fp32_cands if c.schedule != "ws")
    assert any(c.schedule == "coop" for c in fp32_cands)
    fp32 = ConvWorkload(8, 64, 128, (56, 56), (3, 3), padding=(1, 1))
    assert all(c.split3 and c.tile_k == 32 for c in candidates(fp32))
    assert not any(c.split3 for c in candidates(ConvWorkload(8, 64, 128, (56, 56), (3, 3), policy="tf32")))
    small_k = ConvWorkload(8, 64, 32, (56, 56), (3, 3))
    assert all(c.tile_n <= 64 for c in candidates(small_k, limit=20))
    assert candidates(ConvWorkload(8, 64, 64, (56, 56), (3, 3), groups=4)) == []


def test_every_schedule_is_timed_even_on_a_small_budget():
    """The cost model cannot tell what a second consumer warpgroup, or a CTA that keeps its SM,
    buys on a geometry: the candidates alternate between the persistent kernel, the cooperative
    one and CUTLASS's, best tile of each first; the persistent one only where its tiles are more
    than a wave of SMs (with fewer it is the cooperative kernel)."""
    w = ConvWorkload(128, 64, 128, (128, 128), (3, 3), dtype="bfloat16", policy="bf16")
    cands = candidates(w, limit=8)
    assert [c.schedule for c in cands[:6]] == ["persistent", "coop", "ws"] * 2
    assert (cands[0].tile_m, cands[0].tile_n) == (256, 128) and cands[0].label == "256x128x64 c1x1 persistent"
    assert cands[1].label == "256x128x64 c1x1 coop"
    assert [c.schedule for c in candidates(w, limit=3)] == ["persistent", "coop", "ws"]
    # 2 x 30 x 30 pixels, 128 channels: 15 tiles of 256 x 128, under a wave of 132 SMs
    one_wave = ConvWorkload(2, 64, 128, (32, 32), (3, 3), dtype="bfloat16", policy="bf16")
    assert [c.schedule for c in candidates(one_wave, limit=4)] == ["coop", "ws", "coop", "ws"]
    # the ping-pong kernel is offered when asked for (conv_realize --schedules): ws's tiles, a tile a
    # warpgroup (64 x 128 at most where promoted), and, like persistent, only over more than a wave
    pp = candidates(w, limit=8, schedules=("pingpong", "ws"))
    assert [c.schedule for c in pp[:4]] == ["pingpong", "ws"] * 2 and pp[0].label == "128x128x64 c1x1 pingpong"
    assert all(per_warpgroup(c) == c.tile_m * c.tile_n for c in pp)
    fp32 = ConvWorkload(128, 64, 128, (128, 128), (3, 3))
    assert all(c.tile_m * c.tile_n <= MAX_TILE_AREA // 2 for c in candidates(fp32, 20, ("pingpong",)))
    assert [c.schedule for c in candidates(one_wave, limit=4, schedules=("pingpong", "ws"))] == ["ws"] * 4
    assert "pingpong" not in {c.schedule for c in candidates(w, limit=20)}  # not offered by default yet


def test_the_coop_schedule_renders_fact_dbs_kernel_and_ws_renders_cutlasss():
    w = ConvWorkload(8, 64, 128, (56, 56), (3, 3), dtype="bfloat16", policy="bf16")
    coop = render(w, ConvConfig(256, 128, 64, schedule="coop"))
    assert "using Kernel = CoopConvKernel<ProblemShape, CollectiveMainloop, CollectiveEpilogue, false>;" in coop
    pingpong = render(w, ConvConfig(128, 128, 64, schedule="pingpong"))
    assert "using Kernel = PingpongConvKernel<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;" in pingpong
    assert "using CollectiveMainloop = BuiltMainloop;" in pingpong and "TmaWarpSpecializedCooperative" not in pingpong
    persistent = render(w, ConvConfig(256, 128, 64, schedule="persistent"))
    assert "using Kernel = CoopConvKernel<ProblemShape, CollectiveMainloop, CollectiveEpilogue, true>;" in persistent
    assert "TmaWarpSpecializedCooperative" in persistent and "Shape<_2, _1, _1>" in persistent
    assert "TmaWarpSpecializedCooperative" in coop and "Shape<_2, _1, _1>" in coop
    ws = render(w, ConvConfig(128, 128, 64))
    assert "CoopConvKernel" not in ws and "cutlass::conv::kernel::ConvUniversal<" in ws
    fp32 = ConvWorkload(8, 64, 128, (56, 56), (3, 3))
    src = render(fp32, ConvConfig(128, 128, 32, split3=True, promote=1, schedule="coop"))
    assert "using CollectiveMainloop = PromotedMainloop<CoopMainloop, 1>;" in src
    from fact_db.kernels.conv.kernel import params
    from fact_db.kernels import template
    bad = template.render("conv_sm90", {**params(w, ConvConfig(128, 128, 64)), "schedule": "stream_k"})
    assert "#error \"conv_sm90.cu.j2: schedule must be ws, coop, persistent or pingpong, got 'stream_k'\"" in bad
    with pytest.raises(ConvError, match="schedule 'stream_k'.*ws.*coop.*persistent.*pingpong"):
        ConvConfig(128, 128, 64, schedule="stream_k")


def test_split3_candidates_promote_their_partial_sums_and_say_so():
    """Unpromoted split3 missed the fp32 bound by 3-4x on an H200: fp32's candidates promote
    every k-tile or every second (the more often first among equal tiles), tf32x3's every
    fourth, the others never; the template then swaps the collective's mma for the promoted
    one, and a registry row from before `promote` existed still reads back (unpromoted)."""
    fp32 = ConvWorkload(8, 64, 128, (56, 56), (3, 3), padding=(1, 1))
    cands = candidates(fp32, limit=20)
    assert {c.promote for c in cands} == {1, 2} and all(c.split3 for c in cands)
    assert cands[0].promote == 1 and cands[0].label.startswith("split3 promote/1 ")
    assert {c.promote for c in candidates(ConvWorkload(8, 64, 128, (56, 56), (3, 3), policy="tf32x3"))} == {4}
    for plain in (ConvWorkload(8, 64, 128, (56, 56), (3, 3), policy="tf32"),
                  ConvWorkload(8, 64, 128, (56, 56), (3, 3), dtype="bfloat16", policy="bf16")):
        assert {c.promote for c in candidates(plain)} == {0}
    src = render(fp32, next(c for c in cands if c.schedule == "ws"))
    assert "using CollectiveMainloop = PromotedMainloop<BuiltMainloop, 1>;" in src and "GmmaFP8Accumulation" in src
    plain_src = render(fp32, ConvConfig(128, 64, 32, split3=True))
    assert "PromotedMainloop" not in plain_src and "using CollectiveMainloop = BuiltMainloop;" in plain_src
    old = {"tile_m": 128, "tile_n": 64, "tile_k": 32, "cluster_m": 1, "cluster_n": 1, "stages": "auto", "split3": True}
    assert ConvConfig(**old).promote == 0


def test_a_pointwise_fp32_convolution_leads_with_the_gemm_kernel():
    """1x1, stride 1, no padding, one group, under fp32 or tf32x3: the GEMM kernel
    (conv_gemm_sm90, A split in registers) takes every place but the last (at most four),
    cooperative and ping-pong alternating; the conv kernels' best config is last. Anything
    else (a 3x3, a stride, bf16, tf32, groups) has no GEMM config."""
    from fact_db.kernels.conv.kernel import GEMM_TEMPLATE, TEMPLATE, is_pointwise, why_not_gemm
    from fact_db.kernels.conv.tune import gemm_candidates
    w = ConvWorkload(32, 256, 64, (56, 56), (1, 1), policy="fp32")
    cands = candidates(w, limit=4)
    assert [c.schedule for c in cands[:3]] == ["gemm"] * 3 and cands[3].schedule in ("persistent", "coop", "ws")
    assert all(c.template == GEMM_TEMPLATE and c.split3 and c.promote == 1 for c in cands[:3])
    assert len(candidates(w, limit=12)) == 5  # every GEMM config (four here) and one conv kernel
    # K = 64: no 128-wide tile over 64 channels; the cooperative kernel, then the ping-pong one
    assert [c.label for c in cands[:2]] == ["regsplit promote/1 128x64x32 c1x1 gemm",
                                            "regsplit promote/1 64x64x32 c1x1 gemm"]
    # 32 x 56 x 56 pixels: many waves of tiles, so the conv kernels' best is the persistent one
    assert [c.schedule for c in candidates(w, limit=2)] == ["gemm", "persistent"]
    wide = ConvWorkload(32, 64, 256, (56, 56), (1, 1), policy="tf32x3")
    got = gemm_candidates(wide)
    assert len(got) == 8
    assert [(c.tile_m, c.tile_n, c.tile_k) for c in got[:3]] == [(128, 128, 32), (64, 128, 32), (128, 64, 32)]
    assert is_pointwise(ConvWorkload(8, 64, 64, (9,), (1,)))
    assert is_pointwise(ConvWorkload(2, 8, 8, (4, 4, 4), (1, 1, 1)))
    for other, words in [(ConvWorkload(8, 64, 64, (56, 56), (3, 3), padding=(1, 1)), "not a pointwise"),
                         (ConvWorkload(8, 64, 64, (56, 56), (1, 1), stride=(2, 2)), "not a pointwise"),
                         (ConvWorkload(8, 64, 64, (56, 56), (1, 1), padding=(1, 1)), "not a pointwise"),
                         (ConvWorkload(8, 64, 64, (56, 56), (1, 1), groups=2), "not a pointwise"),
                         (ConvWorkload(8, 64, 64, (56, 56), (1, 1), policy="tf32"), "fp32-class"),
                         (ConvWorkload(8, 64, 64, (56, 56), (1, 1), dtype="bfloat16", policy="bf16"), "fp32-class"),
                         (ConvWorkload(8, 6, 64, (56, 56), (1, 1)), "a multiple of 4")]:
        assert words in why_not_gemm(other) and gemm_candidates(other) == []
        assert all(c.template == TEMPLATE for c in candidates(other, limit=8))
    with pytest.raises(ConvError, match="split3 and promote"):
        ConvConfig(128, 128, 16, split3=True, promote=0, schedule="gemm")


def test_the_gemm_kernels_weight_is_hi_and_lo_and_its_products_are_fp32_class():
    """prepare_weight for schedule gemm: [hi(w); lo(w)], K x C each, both TF32 values. What the
    kernel sums, emulated: hi(x) hi(w) + hi(x) lo(w) + lo(x) hi(w) with hi = trunc, lo = the rest
    rounded, fp32-class where one TF32 product is not."""
    torch.manual_seed(0)
    w = ConvWorkload(2, 64, 48, (7, 7), (1, 1), policy="fp32")
    inp = w.make_inputs("randn", device="cpu")
    held = prepare_weight(inp["w"], w, ConvConfig(128, 64, 16, split3=True, promote=2, schedule="gemm"))
    assert held.shape == (2, 48, 64) and held.is_contiguous()
    hi, lo = held
    assert torch.equal(_trunc(hi), hi) and torch.equal(_trunc(lo), lo)
    assert torch.equal(hi, _trunc(inp["w"].reshape(48, 64))) and torch.equal(lo, tf32_lo(inp["w"].reshape(48, 64)))
    a = inp["x"].movedim(1, -1).reshape(-1, 64)  # channels-last pixels: the GEMM's A, M x C
    ref = a.double() @ inp["w"].reshape(48, 64).double().T
    ah, al = _trunc(a), tf32_lo(a)
    got = ah.double() @ hi.double().T + ah.double() @ lo.double().T + al.double() @ hi.double().T
    one = _round(a).double() @ _round(inp["w"].reshape(48, 64)).double().T
    rel = lambda t: ((t - ref).norm() / ref.norm()).item()  # noqa: E731
    assert rel(got) < 1e-6 < 1e-4 < rel(one)


def test_the_gemm_schedule_renders_the_fp32tc_gemm_with_the_chain_as_its_epilogue():
    from fact_db.kernels import template
    w = ConvWorkload(8, 64, 256, (56, 56), (1, 1), chain=canonical_chain([{"op": "add", "kind": "full"},
                                                                          {"op": "relu"}]))
    src = render(w, ConvConfig(128, 128, 16, split3=True, promote=2, schedule="gemm"))
    assert "fact_tc::kRegSplit" in src and "using FusionOp = ChainFusion;" in src
    assert "Sm90SrcFetch<ElementC>" in src and "fmaxf(v, 0.f)" in src
    assert "int fact_conv_gemm_sm90_launch(" in src and "split3_kernel" not in src
    # conv_sm90 builds the same chain from the same shared piece
    conv = render(w.__class__(**(w.as_dict() | {"filter": (3, 3)})), ConvConfig(128, 128, 32, split3=True, promote=1))
    assert "using Fusion = ChainFusion;" in conv and "chain_arguments(vecs)" in conv
    bad = template.render("conv_gemm_sm90", {**params(w, ConvConfig(128, 128, 32, split3=True, promote=1)),
                                             "schedule": "gemm", "promote": 0})
    assert "#error \"conv_gemm_sm90.cu.j2: needs split3 true, schedule gemm and promote >= 1\"" in bad


def test_a_gemm_winner_is_recorded_under_its_own_template_and_read_back():
    from fact_db.kernels.conv.tune import ConvTrial, from_registry, record
    from fact_db.store.registry import Registry
    w = ConvWorkload(8, 64, 256, (56, 56), (1, 1), chain='[{"op":"relu"}]', rule="conv-bias-act")
    cfg = ConvConfig(128, 128, 16, split3=True, promote=2, schedule="gemm")
    with Registry.open("memory") as reg:
        record(w, [ConvTrial(cfg.label, "ok", 0.1, 1e-7, config=cfg), ConvTrial("cudnn", "ok", 0.3, 2e-7)], reg,
               gpu="h100", device_name="NVIDIA H100")
        assert reg.lookup(w.key("sm90a", "h100"), nearest=False).record.template == "conv_gemm_sm90"
        assert from_registry(w, reg, gpu="h100").config == cfg


# ------------------------------------------------------------------ family and composition

def _impls(rep, policy="fp32"):
    impls = {}
    for i, r in enumerate(rep.regions):
        w, note = families.workload_of(r, rep.graph, policy)
        assert families.of(w) is conv_family, note
        cfg = ConvConfig(128, 64, 32, split3=policy == "fp32")
        impls[i] = Impl("conv", "stand-in", standins.conv_op(w), {"workload": w.as_dict(), "config": asdict(cfg)})
    return impls


def test_workloads_read_channels_last_after_a_fact_db_convolution():
    rep = fact_db.discover(Chain3().eval(), (torch.randn(2, 8, 8, 8),))
    ws = [families.workload_of(r, rep.graph, "fp32")[0] for r in rep.regions]
    assert [w.layout for w in ws] == ["nchw", "nhwc", "nhwc"]
    assert [w.rule for w in ws] == ["conv-bias-act", "conv-bn", "conv-epilogue"]
    assert ws[1].bias and ws[1].residual and ws[2].vec_steps == [{"op": "mul", "kind": "channel"}]


def test_composed_three_conv_chain_equals_eager_with_one_layout_conversion():
    from fact_db.composition.compose import rewrite
    torch.manual_seed(1)
    model = Chain3().eval()
    x = torch.randn(2, 8, 8, 8)
    rep = fact_db.discover(model, (x,))
    standins.CALLS.clear()
    gm, notes = rewrite(rep.graph.program, rep.regions, _impls(rep))
    with torch.no_grad():
        got, want = gm(x), model(x)
    assert standins.CALLS["conv"] == 3 and standins.CALLS["conv_not_channels_last"] == 0
    assert (got - want).abs().max().item() < 1e-4
    assert gm.meta["factdb_layout_conversions"] == ["region 1 conv-bias-act: input `x` converted to channels-last"]
    assert any(n.startswith("layout: 1 conversion(s) to channels-last left for 3 fact-db convolution(s)") for n in notes)
    # BatchNorm is gone: folded into the held weight and bias, made once.
    assert not any("batch_norm" in str(n.target) for n in gm.graph.nodes)
    assert {b for b, _ in gm.named_buffers() if b.startswith("_factdb_conv")} == {
        "_factdb_conv_weight_0", "_factdb_conv_weight_1", "_factdb_conv_bias_1", "_factdb_conv_weight_2"}


def test_a_convolution_whose_input_comes_from_pytorch_gets_its_own_conversion():
    from fact_db.composition.compose import rewrite

    class Split(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Conv2d(8, 16, 3, padding=1), nn.Conv2d(16, 16, 1)

        def forward(self, x):
            y = torch.relu(self.a(x))
            return self.b(y.flatten(2).view(y.shape))  # a reshape: PyTorch hands back contiguous NCHW
    model = Split().eval()
    x = torch.randn(1, 8, 6, 6)
    rep = fact_db.discover(model, (x,))
    gm, notes = rewrite(rep.graph.program, rep.regions, _impls(rep, "tf32"))
    assert len(gm.meta["factdb_layout_conversions"]) == 2
    standins.CALLS.clear()
    with torch.no_grad():
        assert torch.allclose(gm(x), model(x), atol=1e-5)
    assert standins.CALLS["conv_not_channels_last"] == 0


def test_an_input_another_fact_db_convolution_reads_is_not_charged_its_conversion():
    """ResNet's block input is read by the first 1x1 convolution and added back after the
    last: composition converts it once for both, so realization times the first one as
    arriving channels-last. An input whose other reader is not a fact-db convolution's chain
    is still charged its conversion."""
    import importlib.util

    from tests.conftest import PROBLEMS
    spec = importlib.util.spec_from_file_location("resnet50_bottleneck", PROBLEMS / "resnet50_bottleneck.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rep = fact_db.discover(mod.Model(16, 4).eval(), (torch.randn(2, 16, 8, 8),))
    assert [families.workload_of(r, rep.graph, "fp32")[0].layout for r in rep.regions] == ["nhwc"] * 3

    class Side(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Conv2d(8, 8, 1)

        def forward(self, x):
            return torch.relu(self.a(x)), x * 2.0  # x's other reader: no convolution's chain
    rep = fact_db.discover(Side().eval(), (torch.randn(1, 8, 6, 6),))
    assert [families.workload_of(r, rep.graph, "fp32")[0].layout for r in rep.regions] == ["nchw"]


def test_branches_reading_one_input_share_its_conversion():
    """GoogLeNet's inception module: one input read by several convolutions (1x1 branches
    beside a 3x3). Each branch is timed as reading channels-last, and composition converts the
    input once for all of them."""
    from fact_db.composition.compose import rewrite

    class Inception(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Conv2d(16, 8, 1), nn.Conv2d(16, 8, 1), nn.Conv2d(16, 8, 3, padding=1)

        def forward(self, x):
            return torch.cat([torch.relu(self.a(x)), torch.relu(self.b(x)), self.c(x)], 1)
    torch.manual_seed(4)
    model, x = Inception().eval(), torch.randn(2, 16, 8, 8)
    rep = fact_db.discover(model, (x,))
    ws = [families.workload_of(r, rep.graph, "fp32")[0] for r in rep.regions]
    assert len(ws) == 3 and [w.layout for w in ws] == ["nhwc"] * 3
    gm, _ = rewrite(rep.graph.program, rep.regions, _impls(rep))
    standins.CALLS.clear()
    with torch.no_grad():
        assert (gm(x) - model(x)).abs().max().item() < 1e-4
    assert standins.CALLS["conv"] == 3 and standins.CALLS["conv_not_channels_last"] == 0
    assert len(gm.meta["factdb_layout_conversions"]) == 1


def test_a_bottleneck_converts_its_input_once_for_the_first_convolution_and_the_residual():
    """ResNet's bottleneck reads x twice: the first 1x1 convolution's input and the last one's
    residual. Both want it channels-last: one conversion serves both. Its pointwise
    convolutions hold the GEMM kernel's [hi(w); lo(w)] weight at fp32."""
    from fact_db.composition.compose import rewrite
    from fact_db.kernels.conv.kernel import is_pointwise
    import importlib.util

    from tests.conftest import PROBLEMS
    spec = importlib.util.spec_from_file_location("resnet50_bottleneck", PROBLEMS / "resnet50_bottleneck.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(2)
    model = mod.Model(16, 4).eval()
    for bn in (model.bn1, model.bn2, model.bn3):  # BatchNorm statistics that are not the identity
        bn.running_mean.uniform_(-0.5, 0.5), bn.running_var.uniform_(0.5, 2.0)
    x = torch.randn(2, 16, 8, 8)
    rep = fact_db.discover(model, (x,))
    impls = {}
    for i, r in enumerate(rep.regions):
        w, _ = families.workload_of(r, rep.graph, "fp32")
        cfg = (ConvConfig(128, 64, 16, split3=True, promote=2, schedule="gemm") if is_pointwise(w)
               else ConvConfig(128, 64, 32, split3=True))
        impls[i] = Impl("conv", "stand-in", standins.conv_op(w), {"workload": w.as_dict(), "config": asdict(cfg)})
    assert sum(is_pointwise(ConvWorkload(**m.record["workload"])) for m in impls.values()) == 2
    gm, notes = rewrite(rep.graph.program, rep.regions, impls)
    standins.CALLS.clear()
    with torch.no_grad():
        got, want = gm(x), model(x)
    assert standins.CALLS["conv"] == 3 and standins.CALLS["conv_not_channels_last"] == 0
    assert (got - want).abs().max().item() < 1e-4
    assert len(gm.meta["factdb_layout_conversions"]) == 1, gm.meta["factdb_layout_conversions"]
    assert sum(1 for n in gm.graph.nodes if n.target is torch.ops.aten.clone.default) == 1
    # regions rewritten last to first: x's conversion for the residual comes after the first
    # convolution's insertion point, so that one makes its own; the graph stays valid
    order = list(range(len(rep.regions)))[::-1]
    gm2, _ = rewrite(rep.graph.program, [rep.regions[i] for i in order], {j: impls[i] for j, i in enumerate(order)})
    gm2.graph.lint()
    with torch.no_grad():
        assert (gm2(x) - want).abs().max().item() < 1e-4
    assert sum("`x` converted" in c for c in gm2.meta["factdb_layout_conversions"]) == 2


def test_composed_chain_runs_under_torch_compile():
    from fact_db.composition.compose import rewrite
    model = Chain3().eval()
    x = torch.randn(2, 8, 8, 8)
    rep = fact_db.discover(model, (x,))
    gm, _ = rewrite(rep.graph.program, rep.regions, _impls(rep))
    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(gm, fullgraph=True, backend="eager")(x)
        assert torch.allclose(out, model(x), atol=1e-4)


def test_realize_takes_the_choosers_result_and_cudnn_wins_leave_the_region_eager():
    from fact_db.kernels.conv.tune import ConvTrial
    from fact_db.kernels.family import Context
    w = ConvWorkload(2, 16, 32, (8, 8), (3, 3))
    cudnn = ConvTrial("cudnn", "ok", 0.2, 1e-7)
    ctx = Context(hooks={"conv": lambda w: ([cudnn], cudnn, "tuned")})
    out = conv_family.realize(w, None, ctx)
    assert out.impl.kind == "eager" and "cuDNN is the fastest" in out.impl.note and out.eager_ms == 0.2


def test_fp32_measurement_shows_pytorch_default_tf32_as_its_own_variant():
    """Under fp32 the eager baseline runs cuDNN without TF32; a model with convolutions also
    gets eager under PyTorch's default (cuDNN TF32 on), timed and with its error."""
    import copy

    from fact_db.pipeline.measure import TF32_DEFAULT, has_convolutions, measure, pytorch_default
    from fact_db.pipeline.run import like_drawer
    model, x = Chain3().eval(), torch.randn(2, 8, 8, 8)
    ref = copy.deepcopy(model).double()
    seen = []
    spy = lambda *a: (seen.append(torch.backends.cudnn.allow_tf32), model(*a))[1]  # noqa: E731
    variants = measure(model, model, spy, "fp32", like_drawer((x,)), ref, peers=(), timer=lambda fn, xs: 1.0,
                       progress=False)
    assert [v.name for v in variants] == ["eager fp32", TF32_DEFAULT, "fact-db"]
    assert all(v.err is not None and v.err < 1e-5 for v in variants)
    assert not [v.name for v in measure(model, model, spy, "tf32", like_drawer((x,)), ref, peers=(),
                                        timer=lambda fn, xs: 1.0, progress=False) if v.name == TF32_DEFAULT]
    assert has_convolutions(model, (x,)) and not has_convolutions(nn.Linear(4, 4), (torch.randn(2, 4),))
    flags = []
    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        pytorch_default(lambda t: flags.append((torch.backends.cudnn.allow_tf32,
                                                torch.backends.cuda.matmul.allow_tf32)))(x)
        assert flags == [(True, False)] and torch.backends.cudnn.allow_tf32 is False
    finally:
        torch.backends.cudnn.allow_tf32 = before


def _conv_realizer(files):
    """realize_regions with the conv family's tuner and loader replaced (realize's conv hooks):
    every conv region 'tuned' to a stand-in kernel that claims `files`' kernel.so as its library."""
    from fact_db.kernels.conv.tune import ConvTrial
    from fact_db.realization.realize import realize_regions

    def realize(disc, policy):
        def chooser(w):
            from fact_db.kernels.conv.kernel import is_pointwise
            cfg = ConvConfig(128, 64, 32 if w.dtype == "float32" else 64, split3=policy in ("fp32", "tf32x3"))
            if policy == "fp32" and is_pointwise(w):  # the pointwise GEMM kernel, as the tuner offers first
                cfg = ConvConfig(64, 64, 32, split3=True, promote=1, schedule="gemm")
            t = ConvTrial(cfg.label, "ok", 0.5, 1e-7, config=cfg, so=str(files / "kernel.so"), build_key="c" * 24)
            return [t, ConvTrial("cudnn", "ok", 1.0, 1e-7)], t, "tuned"

        def make(w, best):
            return Impl("conv", f"stand-in {best.label}", standins.conv_op(w), {
                "standin": "conv", "workload": w.as_dict(), "config": asdict(best.config), "template": best.config.template,
                "build_key": best.build_key, "so": best.so})
        return realize_regions(disc, policy, conv_chooser=chooser, conv_impl=make, progress=False)
    return realize


def _conv_loader(rec):
    if rec.get("standin") == "conv":
        return Impl("conv", rec.get("label", ""), standins.conv_op(ConvWorkload(**rec["workload"])), rec)
    return None


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["fp32", "bf16"])
def test_optimize_composes_saves_and_loads_convolutions(tmp_path, policy):
    """fact_db.optimize on a three-convolution model with stand-in kernels: verified end to end,
    the layout conversions in the report, the artifact holding each conv kernel's workload and
    config, and loading it composing the same module."""
    from fact_db.composition.artifact import load
    from fact_db.pipeline import optimize
    from fact_db.pipeline.measure import TF32_DEFAULT
    files = tmp_path / "build"
    files.mkdir()
    (files / "kernel.so").write_bytes(b"not a real library")
    (files / "kernel.cu").write_text("// conv_sm90 source\n")
    torch.manual_seed(0)
    model, x = Chain3().eval(), torch.rand(2, 8, 8, 8)
    fast = optimize(model, (x,), policy=policy, realizer=_conv_realizer(files), timer=standins.composed_faster, peers=(),
                    out=tmp_path / "art", progress=False)
    assert fast.report.verification.ok, fast.report.verification.reason
    standins.CALLS.clear()
    tol = 1e-4 if policy == "fp32" else 3e-2
    with torch.no_grad():
        assert torch.allclose(fast(x), model(x), atol=tol, rtol=tol)
    assert standins.CALLS["conv"] == 3 and standins.CALLS["conv_not_channels_last"] == 0
    assert any(n.startswith("layout: 1 conversion(s) to channels-last left for 3") for n in fast.report.notes)
    assert (TF32_DEFAULT in [v.name for v in fast.report.variants]) == (policy == "fp32")
    m = json.loads((tmp_path / "art" / "manifest.json").read_text())
    convs = [r["impl"] for r in m["regions"] if r["impl"]["kind"] == "conv"]
    assert len(convs) == 3 and convs[1]["workload"]["layout"] == "nhwc" and convs[1]["config"]["tile_n"] == 64
    # the last convolution is a 1x1: at fp32 the pointwise GEMM kernel, its weight [hi(w); lo(w)]
    assert [c["template"] for c in convs] == ["conv_sm90"] * 2 + ["conv_gemm_sm90" if policy == "fp32" else "conv_sm90"]
    assert [r["rule"] for r in m["regions"]] == ["conv-bias-act", "conv-bn", "conv-epilogue"]
    again = load(tmp_path / "art", loader=_conv_loader)
    standins.CALLS.clear()
    with torch.no_grad():
        assert torch.allclose(again(x), model(x), atol=tol, rtol=tol)
    assert standins.CALLS["conv"] == 3


def test_the_family_table_dispatches_convolutions():
    w = ConvWorkload(2, 16, 32, (8, 8), (3, 3))
    assert families.of(w) is conv_family and families.for_job("conv") is conv_family
    assert families.for_impl("conv") is conv_family and families.by_name("conv") is conv_family


def test_the_tuner_skips_configs_that_failed_before_and_cudnn_is_always_timed(monkeypatch):
    from pathlib import Path

    from fact_db.core import environment
    from fact_db.kernels.build import Built, Source
    from fact_db.kernels.conv import tune as conv_tune
    from fact_db.store.records import TrialRecord
    from fact_db.store.registry import Registry
    w = ConvWorkload(8, 64, 64, (28, 28), (3, 3), padding=(1, 1), dtype="bfloat16", policy="bf16")
    a, b = ConvConfig(128, 64, 64), ConvConfig(64, 64, 64)
    seen = []

    def evaluate(w_, so, cfg, trials=5, reps=20):
        seen.append(cfg)
        return {"status": "ok", "time_ms": {None: 1.0, a: 0.5, b: 0.7}[cfg], "err": 1e-3, "eager_err": 1e-3,
                "device": "NVIDIA H100"}
    monkeypatch.setattr(conv_tune, "evaluate_one", evaluate)
    built = {c: Built(Source("conv_sm90", "", "sm90a"), "k" * 24, Path("/nowhere/kernel.so")) for c in (a, b)}
    with Registry.open("memory") as reg:
        reg.add_trials([TrialRecord(key=w.key("sm90a", "h100"), template="conv_sm90",
                                    config={**asdict(a), "label": a.label}, status="verify_failed")
                        .stamped(environment.current())])
        trials = conv_tune.tune_conv(w, [a, b], built=built, in_process=True, registry=reg, progress=False)
        assert seen == [None, b]
        assert [t.label for t in trials] == [b.label, "cudnn"]
        assert conv_tune.from_registry(w, reg, gpu="h100").config == b


def test_where_cudnn_wins_a_conv_bn_region_its_batchnorm_is_still_folded():
    """The library path for a conv-bn region (kernel.cudnn_op, whose function library_fn is
    registered here for the CPU): cuDNN's convolution on the folded weight, as the model holds
    it, then the chain; no BatchNorm left, no layout conversion, composed == eager."""
    from fact_db.composition.compose import rewrite
    from fact_db.kernels.conv.kernel import _library_strides, library_fn
    from fact_db.kernels.conv.tune import ConvTrial

    class ConvBnRelu(nn.Module):
        def __init__(self):
            super().__init__()
            self.c, self.bn = nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)
            with torch.no_grad():
                self.bn.running_mean.normal_()
                self.bn.running_var.uniform_(0.5, 2.0)

        def forward(self, x):
            return torch.relu(self.bn(self.c(x)))
    model, x = ConvBnRelu().eval(), torch.randn(2, 3, 8, 8)
    rep = fact_db.discover(model, (x,))
    [r] = rep.regions
    w, note = families.workload_of(r, rep.graph, "fp32")
    assert note == "" and w.bias and w.c == 3  # three channels: a candidate (padded) that cuDNN beat here
    impl = conv_family.impl_of(w, ConvTrial("cudnn", "ok", 1.0, 1e-7), folds=True)
    assert impl.kind == "conv" and impl.record["library"] == "cudnn"
    fn = library_fn(w)

    @torch.library.custom_op("factdb_test::cudnn_conv_bn_relu", mutates_args=(),
                             schema="(Tensor x, Tensor w, Tensor? bias, Tensor[] vecs, Tensor? residual) -> Tensor")
    def op(x, wt, bias, vecs, residual):
        return fn(x, wt, bias, vecs, residual)

    @op.register_fake
    def _(x, wt, bias, vecs, residual):
        shape = (x.shape[0], w.k, *w.output)
        return torch.empty_strided(shape, _library_strides(x, shape), dtype=x.dtype, device=x.device)
    impl.op = torch.ops.factdb_test.cudnn_conv_bn_relu
    gm, notes = rewrite(rep.graph.program, rep.regions, {0: impl})
    assert not any("batch_norm" in str(n.target) for n in gm.graph.nodes)
    assert gm.meta["factdb_layout_conversions"] == [] and not any(n.startswith("layout") for n in notes)
    assert tuple(gm._factdb_conv_weight_0.shape) == (16, 3, 3, 3)
    with torch.no_grad():
        assert torch.allclose(gm(x), model(x), atol=1e-5)
    cl = x.contiguous(memory_format=torch.channels_last)
    assert fn(cl, gm._factdb_conv_weight_0, gm._factdb_conv_bias_0, [], None).is_contiguous(
        memory_format=torch.channels_last)


@pytest.mark.parametrize("batch_s, late, tuned", [(0.85, 0.2, True), (1.2, 0.2, True), (1.2, 0.0, False)])
def test_the_budgets_last_part_tunes_the_workloads_compiled_before_it(monkeypatch, batch_s, late, tuned):
    """KernelBench L3-7 (GoogleNet, 58 regions) on the GPU: the batch compile ran to the end of
    the tuning budget, and then every region was skipped, those whose kernels it had built too.
    No compile starts in the budget's last GRACE; that part tunes the workloads with a candidate
    built (on what was built), and one with none built is skipped. A batch ending after the
    whole budget (compiles started in time finish late) leaves LATE of the budget for them."""
    import time

    from fact_db.kernels.conv.tune import ConvTrial
    from fact_db.realization import realize as realize_mod
    rep = fact_db.discover(Chain3().eval(), (torch.randn(2, 8, 8, 8),))
    batch = []

    def slow_batch(workloads, ctx):
        batch.extend(workloads)
        time.sleep(batch_s)  # past the compile deadline (0.8 s of 1 s); at 1.2 s, past the budget too
        return set(workloads[:2])
    monkeypatch.setattr(conv_family, "prebuild", slow_batch)
    monkeypatch.setattr(realize_mod, "GRACE", 0.2)
    monkeypatch.setattr(realize_mod, "LATE", late)
    tuned_ws = []

    def chooser(w):
        tuned_ws.append(w)
        t = ConvTrial("cudnn", "ok", 1.0, 1e-7)
        return [t], t, "tuned"
    t0 = time.perf_counter()
    out = realize_mod.realize_regions(rep, "fp32", gpu="h100", budget_s=1.0, conv_chooser=chooser,
                                      conv_impl=lambda w, best: Impl.eager("cuDNN"), progress=False)
    assert len(set(batch)) == 3 and time.perf_counter() - t0 < batch_s + 0.5
    assert tuned_ws == (batch[:2] if tuned else [])
    assert [z.how for z in sorted(out, key=lambda z: batch.index(z.workload))] == \
        (["tuned", "tuned", "skipped"] if tuned else ["skipped"] * 3)
    assert all("the tuning budget was spent" in " ".join(z.notes) for z in out if z.how == "skipped")


def test_conv_compiles_stop_at_the_budget_and_a_team_registry_claims_the_workload(monkeypatch):
    """As every family (kernels/family.py): the batch compile gets the tuning budget's deadline,
    and tuning goes through registry_first, so a team registry's hosts claim a convolution
    workload before tuning it and take what the host they waited for stored meanwhile."""
    import contextlib

    from fact_db.kernels import build
    from fact_db.kernels.conv import tune as conv_tune
    from fact_db.kernels.family import Context
    w = ConvWorkload(8, 64, 128, (32, 32), (3, 3))
    seen = {}
    monkeypatch.setattr(build, "build", lambda sources, **kw: seen.update(kw) or [])
    conv_family.prebuild([w], Context(max_candidates=3, deadline=123.0))
    assert seen["deadline"] == 123.0

    class Claim:
        coordinated = True

    class TeamRegistry:
        claimed = []

        @contextlib.contextmanager
        def claim(self, key):
            self.claimed.append(key)
            yield Claim()
    hit = type("Hit", (), {"config": None})()  # cuDNN won, as another host measured it
    answers = iter([None, hit])  # nothing stored before the claim; the other host's row after it
    monkeypatch.setattr(conv_tune, "from_registry", lambda *a: next(answers))
    monkeypatch.setattr(conv_tune, "tune_conv", lambda *a, **k: pytest.fail("tuned what another host stored"))
    reg = TeamRegistry()
    trials, best, how = conv_family.tune_region(w, Context(registry=reg))
    assert (trials, best, how) == ([hit], hit, "registry")
    assert reg.claimed == [w.key("sm90a", "h100")]


@pytest.mark.parametrize("dims, dtype, policy, transposed", [(2, "float32", "fp32", False), (3, "float32", "fp32", False),
                                                              (2, "bfloat16", "bf16", False), (1, "float32", "tf32", True)])
def test_three_input_channels_run_padded_with_zeros_that_change_no_sum(dims, dtype, policy, transposed):
    """C = 3 (RGB) is 12 bytes a pixel at fp32, which TMA cannot address: the kernel runs with C
    rounded up to the alignment (kernel.channels), the weight padded with zero channels once
    (prepare_weight, split3's three parts each padded) and the activation packed channels-last
    with zero channels in one pass. The convolution of the padded pair is the workload's."""
    from fact_db.kernels.conv.kernel import channels
    w = ConvWorkload(2, 3, 16, (9,) * dims, (3,) * dims, padding=(1,) * dims, dtype=dtype, policy=policy,
                     transposed=transposed)
    cp = channels(w)
    assert cp == (4 if dtype == "float32" else 8) and cp % (16 // torch.tensor([], dtype=getattr(torch, dtype)).element_size()) == 0
    inp = w.make_inputs("randn", device="cpu")
    plain = prepare_weight(inp["w"], w, ConvConfig(64, 64, 32))
    assert plain.shape[-1] == cp and not plain[..., 3:].any()
    split = prepare_weight(inp["w"], w, ConvConfig(64, 64, 32, split3=True)) if dtype == "float32" else None
    if split is not None:  # [hi, lo, hi], each of the padded width
        assert split.shape[-1] == 3 * cp and not split[..., 3:cp].any() and torch.equal(split[..., :cp], split[..., 2 * cp:])
    x = F.pad(inp["x"].movedim(1, -1), (0, cp - 3))
    assert x.is_contiguous() and x.shape[-1] == cp and not x[..., 3:].any()
    conv = (F.conv1d, F.conv2d, F.conv3d)[dims - 1]
    got = conv(x.movedim(-1, 1).double(), plain.movedim(-1, 1).double(), None, 1, forward_padding(w), w.dilation)
    ref = w.reference({**inp, "bias": None})
    assert torch.allclose(got, ref, atol=1e-2 if dtype == "bfloat16" else 1e-5)
    kernel = ConvKernel.__new__(ConvKernel)
    kernel.workload = w
    assert list(kernel.geometry(2))[1] == cp  # the kernel is launched for the padded channels


def test_conv_realize_times_any_geometry_given_as_a_shape():
    """benchmarks/conv_realize.py --shape: a full-size geometry (KernelBench L1-87's, where the
    kernel tied cuDNN and won 3.6x at a smaller size) as ConvWorkload arguments; a bad field is
    named."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from conv_realize import parse_shape
    geo = parse_shape("n=16,c=64,k=128,input=1024x1024,filter=1x1,bias=0")
    w = ConvWorkload(**geo)
    assert (w.n, w.c, w.k, w.input, w.filter, w.bias) == (16, 64, 128, (1024, 1024), (1, 1), False)
    t = ConvWorkload(**parse_shape("n=2,c=32,k=16,input=8x8,filter=3x3,stride=2x2,padding=1x1,transposed=1"))
    assert t.transposed and t.stride == (2, 2) and t.output == (15, 15)
    for bad, words in (("n=2,c=3", "needs k, input, filter"), ("n=2,c=3,k=8,input=8x8,filter=3x3,size=4", "'size=4'"),
                       ("n=two,c=3,k=8,input=8x8,filter=3", "n=two is not a number"),
                       ("n=2,c=3,k=8,input=8by8,filter=3", "input=8by8 is not sizes like 56x56")):
        with pytest.raises(ValueError, match=words):
            parse_shape(bad)


# ------------------------------------------------------------------------------------------
# Strided transposed convolutions as phases (fact_db/kernels/conv/phases.py)

PHASED = [  # (input, filter, stride, padding, dilation, output_padding)
    ((7,), (3,), (2,), (1,), (1,), (1,)),             # a decoder's upsampling, 1-D
    ((9,), (5,), (3,), (2,), (1,), (0,)),             # stride 3, taps 2 or 1 a phase
    ((131,), (3,), (2,), (1,), (2,), (0,)),           # KernelBench L1-79: gcd(d, s) = 2, odd phases bias only
    ((6, 5), (3, 3), (5, 5), (1, 1), (2, 2), (0, 0)),  # L1-81: stride 5 > filter, phases without a tap
    ((5, 6), (4, 3), (2, 3), (3, 0), (1, 1), (1, 2)),  # padding beyond the filter, output padding
    ((4, 5), (3, 7), (1, 1), (1, 3), (1, 1), (0, 0)),  # stride 1 (L1-78): one phase, the forward padding
    ((3, 4, 5), (3, 3, 3), (2, 2, 2), (1, 1, 1), (1, 1, 1), (0, 0, 0)),  # L1-73
    ((3, 4, 4), (3, 3, 3), (2, 2, 2), (1, 1, 1), (2, 2, 2), (0, 0, 0)),  # L1-77
    ((2, 3, 3), (5, 5, 5), (2, 2, 2), (2, 2, 2), (1, 1, 1), (1, 0, 1)),  # L2-78, output padding
]


def _phased(geo, **kw) -> ConvWorkload:
    i, f, s, p, d, op = geo
    return ConvWorkload(2, 4, 8, i, f, stride=s, padding=p, dilation=d, output_padding=op, transposed=True, **kw)


@pytest.mark.parametrize("geo", PHASED)
def test_a_strided_transposed_convolution_is_its_phases_forward_convolutions(geo):
    """Each output phase of a transposed convolution is a stride-1 forward convolution of the
    input with every s/gcd(d, s)-th tap, flipped: the phases, copied into every s-th output
    pixel (the bias alone where no tap reaches), equal ConvTranspose in float64."""
    from fact_db.kernels.conv import phases
    w = _phased(geo)
    x, wt, b = torch.randn(2, 4, *w.input, dtype=torch.float64), torch.randn(4, 8, *w.filter, dtype=torch.float64), \
        torch.randn(8, dtype=torch.float64)
    ct = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[w.spatial - 1]
    ref = ct(x, wt, b, w.stride, w.padding, w.output_padding, 1, w.dilation)
    assert ref.shape == (2, 8, *w.output)
    torch.testing.assert_close(phases.reference(x, wt, w, b), ref, rtol=1e-12, atol=1e-12)
    p = phases.plan(w)
    assert phases.phased(w) == (w.stride != (1,) * w.spatial or any(w.output_padding))
    # every output pixel is one phase's or an empty one's, once; a phase reads every s/gcd(d, s)-th tap
    covered = torch.zeros(w.output, dtype=torch.int32)
    for ph in p.phases:
        covered[phases.pixels(ph.dst, p.stride)[2:]] += 1
        assert all(1 <= j <= -(-f * math.gcd(d, s) // s) for j, f, s, d in zip(ph.filter, w.filter, w.stride,
                                                                                 w.dilation))
    for spans in p.empty:
        covered[phases.pixels(spans, p.stride)[2:]] += 1
    assert bool((covered == 1).all())
    assert sum(math.prod(ph.filter) for ph in p.phases) == math.prod(w.filter)  # every tap in one phase


def _emulated(w: ConvWorkload, cfg: ConvConfig):
    """ConvKernel with its launch replaced by PyTorch's forward convolution of what it is
    given: the geometry array and the weight pointer, read back from the prepared weight."""
    import ctypes

    from fact_db.kernels.conv.kernel import channels
    k = ConvKernel.__new__(ConvKernel)
    k.workload, k.config, k.path = w, cfg, Path("emulated")
    seen = {}

    def run(xn, w_ptr, ptrs, r, y, geo):
        g = list(geo)
        n, c, kk, sp = g[0], g[1], g[2], w.spatial
        assert (n, c, kk) == (xn.shape[0], channels(w), w.k)
        inp, flt, out, stride, pad, dil = (tuple(g[3 + 3 * j: 3 + 3 * j + sp]) for j in range(6))
        assert inp == w.input and tuple(y.shape[2:]) == out
        split = 3 if cfg.split3 else 1
        held = seen["wp"]
        off = (w_ptr - held.data_ptr()) // held.element_size()
        wv = held.reshape(-1)[off: off + kk * math.prod(flt) * c * split].reshape(kk, *flt, c * split)
        wv = wv[..., :c] + wv[..., c:2 * c] if split == 3 else wv  # split3's [hi, lo, hi]: hi + lo is the weight
        conv = (F.conv1d, F.conv2d, F.conv3d)[sp - 1]
        z = conv(xn.movedim(-1, 1).double(), wv.movedim(-1, 1).double(), None, stride, pad, dil)
        if w.bias:
            z += seen["bias"].double().reshape(1, -1, *([1] * sp))
        y.copy_(z)
    k._run = run
    return k, seen


@pytest.mark.parametrize("geo", PHASED)
@pytest.mark.parametrize("cfg", [ConvConfig(64, 64, 32), ConvConfig(64, 64, 32, split3=True, promote=1)])
def test_the_kernel_launches_each_phase_with_its_geometry_and_weight(geo, cfg):
    """ConvKernel runs a strided transposed convolution as its phases: one launch each, with the
    phase's geometry (stride 1, its taps, padding, output) and its part of the prepared weight
    (prepare_weight lays the phases' forward weights one after another); emulated here with
    PyTorch's convolution of exactly what each launch is given, the result is ConvTranspose."""
    w = _phased(geo)
    inp = w.make_inputs("randn", device="cpu")
    k, seen = _emulated(w, cfg)
    seen["wp"] = prepare_weight(inp["w"], w, cfg)
    seen["bias"] = inp["bias"]
    got = k(inp["x"], seen["wp"], inp["bias"])
    assert is_channels_last(got) and got.shape == (2, 8, *w.output)
    ref = w.reference({**inp})
    torch.testing.assert_close(got.double(), ref.double(), rtol=1e-5, atol=1e-5)


def test_a_strided_transposed_kernel_with_a_residual_is_refused_not_launched():
    """why_not keeps a residual off the phases; a kernel built for one anyway (a hand-made case:
    the GPU test's first phased case carried the residual chain and read a null pointer) is
    refused at the call with the reason."""
    res = canonical_chain([{"op": "add", "kind": "full"}])
    w = _phased(PHASED[0], chain=res)
    inp = w.make_inputs("randn", device="cpu")
    k, seen = _emulated(w, ConvConfig(64, 64, 32))
    with pytest.raises(ConvError, match="residual"):
        k(inp["x"], prepare_weight(inp["w"], w, ConvConfig(64, 64, 32)), inp["bias"], residual=inp["r"])
