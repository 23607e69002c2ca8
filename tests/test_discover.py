"""Discovery on the benchmark problems: coverage targets, ranking, and bad inputs."""
import pytest
import torch
from torch import nn

import fact_db
from fact_db.discovery.discover import analyse
from fact_db.core.errors import ProblemError, TraceError
from fact_db.discovery.trace import load_problem, trace_problem

from conftest import BAD, PROBLEMS

ALL_PROBLEMS = sorted(p.stem for p in PROBLEMS.glob("*.py"))


def regions(report):
    return [r.rule for r in report.regions]


def test_mingpt_block_coverage(traced, ruleset):
    rep = analyse(traced("mingpt_block"), ruleset, arch="sm90", policy="fp32")
    got = regions(rep)
    # four linears: QKV (gemm-bias), attention proj + residual, c_fc + tanh-GELU, MLP proj + residual
    assert got.count("gemm-bias") == 1
    assert got.count("gemm-residual") == 2
    assert got.count("gemm-bias-gelu-tanh") == 1
    assert got.count("attention-causal") == 1
    assert got.count("layernorm") == 2
    linears = [n.name for n in traced("mingpt_block").calls() if n.op == "aten.linear"]
    covered = {n for r in rep.regions for n in r.nodes}
    assert set(linears) <= covered
    gelu = next(r for r in rep.regions if r.rule == "gemm-bias-gelu-tanh")
    assert gelu.problem == {"M": 128 * 512, "N": 3072, "K": 768, "batch": 1}
    assert len(gelu.nodes) == 9  # the linear and the eight ops of the hand-written GELU
    attn = next(r for r in rep.regions if r.rule == "attention-causal")
    assert attn.problem == {"batch_heads": 128 * 8, "Lq": 512, "Lk": 512, "D": 96, "Dv": 96}
    assert not attn.assumptions  # the tril buffer's values were known and checked
    assert rep.uncovered == []
    assert all(r.registry == "miss" for r in rep.regions)


def test_llama_block_coverage(traced, ruleset):
    rep = analyse(traced("llama_block"), ruleset)
    got = regions(rep)
    assert got.count("rmsnorm") == 2
    assert "sdpa-attention" in got and "dual-gemm-swiglu" in got
    assert got.count("gemm-residual") == 2  # o_proj + residual, down_proj + residual
    assert got.count("gemm") == 0 and got.count("gemm-horizontal") == 1  # q, k, v projections: one GEMM
    qkv = next(r for r in rep.regions if r.rule == "gemm-horizontal")
    assert qkv.problem == {"M": 2048, "N": 3072, "K": 2048, "batch": 1}
    assert [m["n"] for m in qkv.attrs["members"]] == [2048, 512, 512]
    assert rep.uncovered == []


@pytest.mark.parametrize("name, expected", [
    ("square_gemm_fp32", ["gemm"]),
    ("batched_gemm", ["batched-gemm"]),
    ("large_k_gemm", ["gemm-large-k"]),
    ("gemm_bias_relu", ["gemm-bias-relu"]),
    ("gemm_bias_gelu", ["gemm-bias-gelu"]),
    ("gemm_bias_gelu_tanh", ["gemm-bias-gelu-tanh"]),
    ("gemm_bias_silu", ["gemm-bias-silu"]),
    ("gemm_residual", ["gemm-residual"]),
    ("gemm_softmax", ["gemm-softmax"]),
    ("causal_attention", ["attention-causal"]),
    ("sdpa_attention", ["sdpa-attention"]),
    ("layernorm", ["layernorm"]),
])
def test_single_pattern_problems(traced, ruleset, name, expected):
    rep = analyse(traced(name), ruleset)
    assert regions(rep) == expected
    assert rep.uncovered == []


# Problems kept on purpose with ops no rule covers, and the ops that must stay uncovered:
# relu_self_attention is the attention variant no rule covers (issue 25's target for
# Inductor's glue around fact-db's GEMMs), its mask, ReLU and scaling left to PyTorch.
UNCOVERED_ON_PURPOSE = {"relu_self_attention": {"aten.masked_fill", "aten.relu", "aten.mul", "aten.div"}}


def test_every_benchmark_problem_is_fully_covered(traced, ruleset):
    for name in ALL_PROBLEMS:
        rep = analyse(traced(name), ruleset)
        assert rep.regions, name
        left = {u.op.rsplit(".", 1)[0] if u.op.count(".") > 1 else u.op for u in rep.uncovered}
        assert left <= UNCOVERED_ON_PURPOSE.get(name, set()), (name, rep.uncovered)


def test_roofline_ranks_and_policies(traced, ruleset):
    g = traced("square_gemm_fp32")
    fp32 = analyse(g, ruleset, policy="fp32").regions[0].estimate
    tf32 = analyse(g, ruleset, policy="tf32").regions[0].estimate
    assert fp32.flops == 2 * 4096 ** 3
    assert fp32.bound == "compute"
    # 137 GFLOP: fact-db's fp32 kernels run 3xTF32 on tensor cores (400/3 TFLOP/s on the
    # H100), eager SGEMM SIMT at 51; tf32 at the full 400
    assert fp32.fused_s == pytest.approx(2 * 4096 ** 3 / (400e12 / 3) + 3e-6, rel=1e-6)
    assert fp32.eager_s == pytest.approx(2 * 4096 ** 3 / 51e12 + 3e-6, rel=1e-2)
    assert fp32.gain_s > 0 and tf32.fused_s == pytest.approx((fp32.fused_s - 3e-6) / 3 + 3e-6, rel=1e-6)
    h200 = analyse(traced("layernorm"), ruleset, gpu="h200").regions[0].estimate
    h100 = analyse(traced("layernorm"), ruleset, gpu="h100").regions[0].estimate
    assert h200.bound == "memory" and h200.fused_s < h100.fused_s
    with pytest.raises(ValueError, match="unknown precision policy"):
        analyse(g, ruleset, policy="fp8")


def test_fusion_saves_bytes(traced, ruleset):
    r = analyse(traced("gemm_bias_gelu_tanh"), ruleset).regions[0]
    out_bytes = 2048 * 16384 * 4
    # eager moves the activation through eight elementwise kernels; fused it is written once
    assert r.estimate.bytes_saved > 10 * out_bytes
    assert r.estimate.gain_s > 0


def test_python_api_on_a_real_module():
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64))
    rep = fact_db.discover(model, (torch.randn(32, 64),), arch="sm80")
    assert regions(rep) == ["gemm-bias-relu", "gemm-bias"]
    assert rep.gpu == "A100"


def test_discovery_does_not_allocate_full_size(ruleset):
    # 256 x 524288 fp32 inputs would be 512 MiB each; tracing builds them on meta.
    g = trace_problem(load_problem(str(PROBLEMS / "large_k_gemm.py")))
    assert [n.shape for n in g.nodes if n.op == "input"] == [(256, 524288), (524288, 256)]


# ---------------------------------------------------------------- bad input

def test_missing_file():
    with pytest.raises(ProblemError, match="problem file `nope/missing.py` does not exist"):
        load_problem("nope/missing.py")


def test_missing_get_inputs():
    with pytest.raises(ProblemError, match=r"defines no `get_inputs\(\)`"):
        load_problem(str(BAD / "no_get_inputs.py"))


def test_syntax_error():
    with pytest.raises(ProblemError, match="syntax error at line 6"):
        load_problem(str(BAD / "syntax_error.py"))


def test_init_raises_names_the_line():
    with pytest.raises(ProblemError) as e:
        trace_problem(load_problem(str(BAD / "init_raises.py")))
    assert "ValueError: width must be a multiple of 64, got 100 at init_raises.py:10" in str(e.value)


def test_forward_raises_names_the_line():
    with pytest.raises(TraceError) as e:
        trace_problem(load_problem(str(BAD / "forward_raises.py")))
    assert "RuntimeError" in str(e.value) and "forward_raises.py:8" in str(e.value)
    assert e.value.partial is None


def test_data_dependent_control_flow_gives_a_partial_result(ruleset):
    with pytest.raises(TraceError) as e:
        trace_problem(load_problem(str(BAD / "data_dependent.py")))
    msg = str(e.value)
    assert "data-dependent control flow at data_dependent.py:15" in msg and "partial result" in msg
    part = e.value.partial
    assert part is not None and part.partial
    assert regions(analyse(part, ruleset)) == ["gemm-bias-relu"]


@pytest.mark.parametrize("name, dtype", [("complex_gemm", "complex64"), ("int8_gemm", "int8")])
def test_unsupported_dtypes_are_named(ruleset, name, dtype):
    rep = analyse(trace_problem(load_problem(str(BAD / f"{name}.py"))), ruleset)
    assert rep.regions == []
    assert len(rep.uncovered) == 1
    u = rep.uncovered[0]
    assert u.op == "aten.matmul" and f"dtype {dtype} is not covered by any rule" in u.reason
    assert u.share == pytest.approx(1.0)  # the model is that one product


def test_import_spec_factory(tmp_path, monkeypatch, ruleset):
    (tmp_path / "mymodels.py").write_text(
        "import torch\nfrom torch import nn\n"
        "def make():\n    return nn.Sequential(nn.Linear(16, 16), nn.SiLU()), (torch.randn(4, 16),)\n"
        "def bad():\n    return 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    g = trace_problem(load_problem("mymodels:make"))
    assert regions(analyse(g, ruleset)) == ["gemm-bias-silu"]
    with pytest.raises(ProblemError, match="must return"):
        trace_problem(load_problem("mymodels:bad"))
    with pytest.raises(ProblemError, match="has no callable `nothere`"):
        load_problem("mymodels:nothere")
    with pytest.raises(ProblemError, match="cannot import `no_such_pkg_xyz`"):
        load_problem("no_such_pkg_xyz:make")


def test_real_allocation_during_construction_is_bounded():
    from fact_db.discovery import trace

    class Big(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("early", torch.tril(torch.ones(64, 64)))
            # 20 x 4 MiB of weights exceed the 64 MiB budget for real tensors
            self.layers = nn.ModuleList(nn.Linear(1024, 1024, bias=False) for _ in range(20))
            self.register_buffer("late", torch.tril(torch.ones(1500, 1500)))  # 9 MiB: no longer fits

        def forward(self, x):
            return x
    p = trace.Problem("big", Big, lambda: [torch.rand(4, 1024)])
    model, inputs, known = trace.build_on_meta(p)
    assert "early" in known and torch.equal(known["early"], torch.tril(torch.ones(64, 64)))
    assert "late" not in known  # built on meta: the budget was spent
    assert all(prm.device.type == "meta" for prm in model.parameters())
    assert inputs[0].device.type == "meta"


class Wrapped(nn.Module):
    """A GEMM + ReLU under torch.autocast(enabled=False), then a GEMM + GELU under
    torch.no_grad() (or, with no_grad=False, outside any wrapper)."""

    def __init__(self, no_grad: bool = True):
        super().__init__()
        self.a, self.b, self.no_grad = nn.Linear(64, 64), nn.Linear(64, 64), no_grad

    def forward(self, x):
        with torch.autocast(device_type="cpu", enabled=False):
            y = torch.relu(self.a(x.float()))
        if not self.no_grad:
            return nn.functional.gelu(self.b(y))
        with torch.no_grad():
            return nn.functional.gelu(self.b(y))


def test_discovery_walks_into_autocast_and_grad_mode_wrappers():
    """torch.export wraps code under torch.autocast(enabled=False) or torch.no_grad() (older
    HF rotary embeddings) in higher-order ops whose bodies are submodules; discovery inlines
    them, naming their ops under the wrapper, and matches rules inside."""
    from fact_db.discovery.discover import discover

    r = discover(Wrapped(), (torch.randn(8, 64),))
    assert [x.rule for x in r.regions] == ["gemm-bias-relu", "gemm-bias-gelu"]
    assert all("." in n for x in r.regions for n in x.nodes)  # ops of the wrappers' bodies, inlined
    assert r.uncovered == []


def test_discovery_registry_column_for_gemm_regions_hit_near_and_stale():
    """ask_registry on GEMM regions: an exact current row is a hit with its measured time, a
    row of a nearby shape is `near (D)`, a row from another toolchain is stale, the rest miss."""
    import dataclasses

    from fact_db.core import environment
    from fact_db.discovery.discover import discover_problem
    from fact_db.realization.realize import ask_registry, plan
    from fact_db.store.registry import KernelRecord, Registry
    rep = discover_problem(str(PROBLEMS / "gemm_bias_relu.py"), arch="sm90", policy="fp32")
    w = next(p.workload for p in plan(rep, "fp32") if p.workload is not None)
    arch, gpu = "sm90a", rep.gpu.lower()
    now = environment.current()

    def rec(key, nvcc=now.nvcc):
        return KernelRecord(key=key, template="gemm_sm90", config={"tile_m": 128}, time_ms=0.25, baseline="eager",
                            baseline_ms=0.5, rel_err=1e-7, baseline_rel_err=1e-7).stamped(now.with_(nvcc=nvcc))
    key = w.key(arch, gpu)
    answers = {}
    for row in ("hit", "near", "stale", "miss"):
        with Registry.open("memory") as reg:
            if row == "hit":
                reg.put(rec(key))
            elif row == "near":
                reg.put(rec(dataclasses.replace(key, m=key.m * 2)))
            elif row == "stale":
                reg.put(rec(key, nvcc="0.0.1"))
            ask_registry(rep, reg)
        answers[row] = (rep.regions[0].registry, rep.regions[0].measured_s)
        rep.regions[0].measured_s = None
    assert answers["hit"] == ("hit", pytest.approx(0.25e-3))
    assert answers["near"][0].startswith("near (") and answers["near"][1] is None
    assert answers["stale"] == ("stale", None) and answers["miss"] == ("miss", None)


def test_regions_inside_the_wrappers_are_left_to_eager_by_composition():
    """Composition cannot rewrite inside a higher-order op's body (HF Llama's rotary matmul
    under torch 2.11 stopped `factdb bench` with a ComposeError): discovery marks such
    regions not composable, with the reason, and the rewrite leaves them to eager; a region
    outside is still replaced and the model's answer kept."""
    import standins

    from fact_db.composition.compose import rewrite
    from fact_db.kernels.impl import Impl
    from fact_db.discovery.discover import discover
    from fact_db.realization.realize import plan

    torch.manual_seed(0)
    model, x = Wrapped(no_grad=False).eval(), torch.randn(8, 64)  # the second GEMM outside any wrapper
    r = discover(model, (x,))
    inner, outer = r.regions
    assert "." in inner.output and "body of a higher-order op" in inner.composable
    assert outer.composable == "" and "." not in outer.output
    impls = {i: Impl("gemm", "stand-in", standins.gemm_op(p.workload.epilogue), {"spec": {"epilogue": p.workload.epilogue}})
             for i, p in enumerate(plan(r, "fp32"))}
    gm, notes = rewrite(r.graph.program, r.regions, impls)
    assert len(notes) == 1 and "higher-order op" in notes[0]
    before = standins.CALLS.copy()
    with torch.no_grad():
        torch.testing.assert_close(gm(x), model(x), rtol=1e-5, atol=1e-5)
    assert standins.CALLS - before == {"gemm_bias_gelu": 1}


# ------------------------------------------------------------------------------------------
# What discovery leaves uncovered, with its share; einsums; rank-4 GEMM operands.

class _ConvLstm(nn.Module):
    """A grouped 3-D convolution (no rule takes groups > 1), an LSTM over its pooled features
    and a Linear head."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(4, 16, 3, padding=1, groups=2)
        self.lstm = nn.LSTM(16, 64, num_layers=2, batch_first=True)
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        f = torch.relu(self.conv(x)).mean(dim=(3, 4))   # B x 16 x T
        h, _ = self.lstm(f.transpose(1, 2))              # B x T x 64
        return self.head(h[:, -1])


def test_uncovered_lists_a_conv3d_and_an_lstm_with_their_shares():
    from fact_db.discovery import roofline
    from fact_db.core.device import device
    model, x = _ConvLstm().eval().to("meta"), torch.randn(8, 4, 32, 28, 28, device="meta")
    rep = fact_db.discover(model, (x,))
    assert regions(rep) == ["gemm-bias"]
    by_op = {u.op: u for u in rep.uncovered}
    assert {"aten.conv3d", "aten.lstm"} <= set(by_op)
    dev = device("h100")
    for op in ("aten.conv3d", "aten.lstm"):
        u = by_op[op]
        node = rep.graph[u.node]
        assert u.est_s == pytest.approx(roofline.node_time(node, dev, "fp32"))
        assert u.share == pytest.approx(u.est_s / rep.eager_s)
    # the LSTM has no rule and no family; the grouped convolution has rules that missed it
    assert "no rule matches aten.lstm" in by_op["aten.lstm"].reason and "no kernel family yet" in by_op["aten.lstm"].reason
    assert "no rule matched it" in by_op["aten.conv3d"].reason and "--explain" in by_op["aten.conv3d"].reason
    # the convolution is counted at its real cost, 2 * out * (C_in / groups) * 27 FLOPs (+ the bias); the LSTM,
    # 2 layers x 32 dependent steps, is the largest share
    conv = rep.graph[by_op["aten.conv3d"].node]
    assert roofline.node_flops(conv) == 2 * (8 * 16 * 32 * 28 * 28) * (2 * 27) + 8 * 16 * 32 * 28 * 28
    assert by_op["aten.lstm"].est_s == pytest.approx((2 * 32 + 1) * dev.launch_s)
    assert [u.op for u in rep.uncovered[:2]] == ["aten.lstm", "aten.conv3d"]
    # largest share first, and every op of the model is in a region, in the list or in the rest
    shares = [u.share for u in rep.uncovered]
    assert shares == sorted(shares, reverse=True)
    total = sum(r.share for r in rep.regions) + sum(shares) + rep.rest["share"]
    assert total == pytest.approx(1.0)
    d = rep.as_dict()
    assert {"node", "op", "reason", "share", "est_s", "source"} <= set(d["uncovered"][0])
    assert d["uncovered_rest"]["ops"] == rep.rest["ops"] > 0


def test_an_op_of_a_large_share_is_listed_and_small_glue_is_summed_in_the_rest():
    class Glue(nn.Module):
        def forward(self, x, y):
            return torch.exp(x) + y, x[:1, :16].sum()   # two passes over 2^26 elements, and a launch

    big = torch.randn(64, 1 << 20, device="meta")
    rep = fact_db.discover(Glue(), (big, big))
    by_op = {u.op: u for u in rep.uncovered}
    assert set(by_op) == {"aten.exp", "aten.add"} and all(u.share > 0.3 for u in by_op.values())
    assert by_op["aten.exp"].reason == "no rule matches aten.exp; it stays in eager PyTorch"
    assert "--explain" in by_op["aten.add"].reason  # rules name aten.add; none matched here
    assert rep.rest["ops"] == 1 and 0 < rep.rest["share"] < 0.05  # the sum: no more than its launch


def test_an_einsum_that_is_a_gemm_is_a_region_and_one_that_is_not_is_uncovered_with_the_reason():
    class Mix(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(8, 12))

        def forward(self, x, q, k):
            a = torch.einsum("bijl,lk->bijk", x, self.w)         # KernelBench L1-11's form
            s = torch.einsum("bhqd,bhkd->bhqk", q, k)
            c = torch.einsum("bhqk,bhkd,bhqd->bhqd", s, k, q)     # three operands
            return a, c

    rep = fact_db.discover(Mix(), (torch.randn(2, 3, 4, 8), torch.randn(2, 3, 5, 6), torch.randn(2, 3, 5, 6)))
    ein = [r for r in rep.regions if r.rule == "einsum-gemm"]
    assert [r.problem for r in ein] == [{"M": 24, "N": 12, "K": 8, "batch": 1}, {"M": 5, "N": 5, "K": 6, "batch": 6}]
    assert ein[1].layouts == {"a": "row", "b": "col"} and ein[1].composable == ""
    assert ein[0].attrs["einsum"]["out_shape"] == [2, 3, 4, 12]
    [u] = [u for u in rep.uncovered if u.op == "aten.einsum"]
    assert "not one GEMM: einsum `bhqk,bhkd,bhqd->bhqd` has 3 operands" in u.reason
    # the GEMM einsums are counted at 2 * batch * M * N * K
    assert ein[0].estimate.flops == 2 * 24 * 12 * 8


def test_explain_says_why_an_einsum_is_not_a_gemm(ruleset):
    class Chain(nn.Module):
        def forward(self, a, b, c):
            return torch.einsum("ij,jk,kl->il", a, b, c)
    rep = fact_db.discover(Chain(), (torch.randn(4, 5), torch.randn(5, 6), torch.randn(6, 7)))
    assert rep.regions == []
    assert "`is_gemm(gemm)` is false: einsum `ij,jk,kl->il` has 3 operands" in rep.misses["einsum-gemm"].reason


def test_rank4_gemm_operands_are_a_batched_gemm_and_composable():
    """q @ k.transpose(-2, -1) over [B, H, T, D] (KernelBench L3-50, Swin V2): the batched GEMM
    over B*H, no longer 'not composable'. k^T of a head-split view cannot merge B and H without a
    copy, so it is read row-major (the copy's layout)."""
    class Heads(nn.Module):
        def forward(self, x):
            B, T, C = x.shape
            q = x.view(B, T, 4, C // 4).transpose(1, 2)
            return (q @ q.transpose(-2, -1)) @ q

    rep = fact_db.discover(Heads(), (torch.randn(2, 16, 32),))
    assert regions(rep) == ["batched-gemm", "batched-gemm"]
    scores, out = rep.regions
    assert scores.problem == {"M": 16, "N": 16, "K": 8, "batch": 8}
    assert out.problem == {"M": 16, "N": 8, "K": 16, "batch": 8}
    assert scores.composable == out.composable == ""
    assert scores.layouts == {"a": "row", "b": "row"}
