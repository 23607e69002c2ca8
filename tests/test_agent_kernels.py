"""Kernel proposals through the real pipeline (fact_db/kernels/region/), against the loopback
chat-completions server: the source policy, a compile in the worker subprocess (real nvcc where
marked), verification and timing (injected through the pipeline's `runner`, as the tuner's
tests inject the GPU steps, or "needs a GPU" where none is present), and the registry row with
provenance `llm`. Every rejection is recorded, writes nothing to the registry, and leaves the
region to eager PyTorch."""
import json
import shutil
from pathlib import Path

import pytest
import torch

from fact_db.core import paths
from fact_db.realization.agent import Agent
from fact_db.kernels.region import rows as region_rows
from fact_db.realization.asks import asks, region_spec
from fact_db.discovery.discover import discover
from fact_db.realization.llm import LLM, Config
from fact_db.kernels.region.source import ABI, check_source
from fact_db.kernels.region.spec import RegionSpec
from fact_db.store.registry import Registry
from fact_db.discovery.rules import load_rules
from agent_env import LinearRelu, without_relu_rule
from loopback_llm import Server

KERNEL = (Path(__file__).resolve().parent / "data" / "agent" / "linear_relu_kernel.cu").read_text()
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler)")


@pytest.fixture
def env(tmp_path, monkeypatch):
    return without_relu_rule(tmp_path, monkeypatch)


def _reply(source=KERNEL, name="linear_relu"):
    return json.dumps({"kind": "kernel", "name": name, "source": source, "explanation": "one thread per output"})


def _run(env, script, **kw):
    srv = Server(script)
    reg = Registry.open(str(env / "reg.duckdb"))
    try:
        llm = LLM(Config(srv.url, "scripted", backoff_s=0.01, retries=1))
        rules = load_rules()
        rep = discover(LinearRelu(), (torch.randn(8, 64),), rules=rules)
        props = Agent(llm, retriever=None, registry=reg, **kw).run(rep, rules)
        return props, llm, srv, reg
    finally:
        srv.close()


def _recorded(outcome):
    log = (Path(paths.home()) / "agent" / "proposals.jsonl").read_text().splitlines()
    assert json.loads(log[-1])["outcome"] == outcome


class Runner:
    """The worker's answers: compile jobs as given (or passed on to `compile`), run jobs as given."""

    def __init__(self, run=None, compile=None):
        self.jobs, self._run, self._compile = [], run, compile

    def __call__(self, jobs):
        out = []
        for j in jobs:
            self.jobs.append(j)
            if j["kind"] == "region_compile":
                out.append(self._compile(j) if callable(self._compile) else
                           {"id": j["id"], "status": "ok", "so": "/nonexistent/kernel.so", "build_key": "k" * 24,
                            "command": "nvcc ...", "error": ""})
            else:
                out.append({"id": j["id"], "device": "NVIDIA H100 80GB HBM3", **self._run})
        return out


FAST = {"status": "ok", "err": 2e-7, "eager_err": 1.5e-7, "time_ms": 0.004, "eager_ms": 0.009, "error": ""}


# ------------------------------------------------------------------------------------------
# The region as data, and the contract the model sees.

def test_region_spec_reference_and_eager_follow_the_module(env):
    """The region's ATen ops, evaluated from the spec alone, give the module's own output:
    in float64 (the reference) and at the policy's dtype (eager)."""
    rules = load_rules()
    m = LinearRelu()
    rep = discover(m, (torch.randn(8, 64),), rules=rules)
    [ask] = asks(rep, rules)
    spec, why = region_spec(ask, rep)
    assert why == "" and spec.summary() == "aten.linear -> aten.relu"
    assert [x["kind"] for x in spec.inputs] == ["input", "parameter", "parameter"]
    assert spec.out_shape == [8, 32] and spec.dtype == "float32"
    spec = RegionSpec.from_dict(json.loads(json.dumps(spec.as_dict())))  # what a worker receives
    x = torch.randn(8, 64)
    inputs = dict(zip([i["name"] for i in spec.inputs], [x, m.fc.weight.detach(), m.fc.bias.detach()]))
    want = m(x).detach()
    assert torch.equal(spec.eager(inputs), want)
    ref = spec.reference(inputs)
    assert ref.dtype == torch.float64 and torch.allclose(ref, want.double(), atol=1e-5)
    # the key ignores node names and parameters' values, not shapes or the policy
    assert spec.digest("sm90a", "H100") == spec.digest("sm90a", "NVIDIA H100 80GB HBM3")
    assert spec.digest("sm90a", "h100") != RegionSpec(**{**spec.as_dict(), "policy": "tf32"}).digest("sm90a", "h100")


def test_the_prompt_carries_the_abi_and_the_regions_inputs(env):
    props, _, srv, _ = _run(env, [(200, _reply(source="int x;"), 0)])
    system, user = srv.requests[0]["messages"][0]["content"], json.loads(srv.requests[0]["messages"][1]["content"])
    assert ABI in system
    c = user["kernel_contract"]
    assert c["entry"] == "fact_region_launch" and c["element_type"] == "float"
    assert [i["shape"] for i in c["inputs"]] == [[8, 64], [32, 64], [32]] and c["output"]["shape"] == [8, 32]
    assert c["computes"][1].startswith("relu = aten.relu.default(self=linear")
    assert props[0].outcome == "refused" and "does not define" in props[0].reason


# ------------------------------------------------------------------------------------------
# The source policy: refused before anything compiles.

@pytest.mark.slow
@pytest.mark.parametrize("bad,words", [
    ('#include "/etc/passwd"\n', "only `#include <header>`"),
    ("#include </etc/passwd>\n", "outside the allowed headers"),
    ("#include <../../../../etc/shadow>\n", "outside the allowed headers"),
    ("#include <sys/socket.h>\n", "outside the allowed headers"),
    ("#define P </etc/passwd>\n#include P\n", "only `#include <header>`"),
    ('static int pwn = system("touch /tmp/factdb-kernel-pwned");\n', "calls `system(`"),
    ('void f() { popen("sh", "r"); }\n', "calls `popen(`"),
    ("__attribute__((constructor)) void at_load() {}\n", "would run when the library loads"),
    ("#include_next <cmath>\n", "directive `#include_next`"),
    ("#embed </etc/passwd>\n", "directive `#embed`"),
    ('#/**/include "/etc/passwd"\n', "only `#include <header>`"),
    ('#inc\\\nlude "/etc/passwd"\n', "only `#include <header>`"),
    ('asm(".incbin \\"/etc/passwd\\"");\n', "reads a file"),
    ('_Pragma("GCC poison x")\n', "_Pragma"),
])
def test_sources_outside_the_policy_are_refused_before_compiling(env, bad, words):
    runner = Runner(run=FAST)
    props, llm, _, reg = _run(env, [(200, _reply(source=bad + KERNEL), 0)], runner=runner)
    assert [p.outcome for p in props] == ["refused"], props
    assert words in props[0].reason and "before compiling" in props[0].reason
    assert runner.jobs == []  # nothing compiled, nothing ran
    assert list(reg.rows("region")) == []
    assert not Path("/tmp/factdb-kernel-pwned").exists()
    _recorded("refused")


def test_the_policy_allows_cuda_cpp_and_cutlass_headers():
    ok = "#include <cuda_bf16.h>\n#include <cute/tensor.hpp>\n#include <cutlass/numeric_types.h>\n#include <cmath>\n" \
         "#pragma unroll\n" + KERNEL
    assert check_source(ok) == ""
    assert "line 2" in check_source("#include <cmath>\n#include <fstream>\n" + KERNEL)


# ------------------------------------------------------------------------------------------
# Verification and timing injected (the worker's answers), compile injected too: CPU CI.

@pytest.mark.parametrize("run,outcome,words", [
    ({"status": "verify_failed", "err": 0.02, "eager_err": 1e-7,
      "error": "error 0.02 on randn inputs exceeds the fp32 bound 4e-07 (eager fp32: 1e-07)"}, "wrong result", "exceeds"),
    ({"status": "launch_error", "error": "launch failed: region kernel refused or failed the launch: status 2"},
     "wrong result", "status 2"),
    ({**FAST, "time_ms": 0.012}, "slower than eager", "12.0 us, eager 9.0 us"),
    ({"status": "timeout", "error": "no result within 120 s (hung or too slow); worker killed"}, "timeout", "hung"),
    ({"status": "needs_gpu", "error": "needs a GPU: no CUDA device is visible to the worker"}, "needs a GPU",
     "compiled; needs a GPU"),
])
def test_rejected_kernels_leave_the_registry_empty(env, run, outcome, words):
    runner = Runner(run=run)
    props, _, _, reg = _run(env, [(200, _reply(), 0)], runner=runner)
    assert [p.outcome for p in props] == [outcome], props
    assert words in props[0].reason
    assert [j["kind"] for j in runner.jobs] == ["region_compile", "region_run"]
    assert runner.jobs[0]["source"] == KERNEL and runner.jobs[0]["arch"] == "sm90a"
    assert runner.jobs[1]["region"]["ops"][0]["op"] == "aten.linear"
    assert list(reg.rows("region")) == []
    _recorded(outcome)


def test_compile_error_reported_by_the_worker(env):
    runner = Runner(run=FAST, compile=lambda j: {"id": j["id"], "status": "compile_error", "command": "nvcc -O3 k.cu",
                                                 "error": "kernel.cu(3): error: expected a \";\""})
    props, _, _, reg = _run(env, [(200, _reply(), 0)], runner=runner)
    assert props[0].outcome == "compile error" and 'expected a ";"' in props[0].reason and "$ nvcc" in props[0].reason
    assert [j["kind"] for j in runner.jobs] == ["region_compile"] and list(reg.rows("region")) == []


@pytest.mark.slow
def test_accepted_kernel_is_stored_with_its_source_then_served_without_a_call(env):
    runner = Runner(run=FAST)
    props, llm, srv, reg = _run(env, [(200, _reply(), 0)], runner=runner)
    assert [p.outcome for p in props] == ["accepted"], props
    assert "4.0 us, eager 9.0 us" in props[0].reason and "provenance llm" in props[0].reason
    [row] = reg.rows("region")
    assert row.provenance == "llm" and row.status == "verified" and row.source == KERNEL
    assert row.label == "linear_relu" and row.key.gpu == "h100" and row.template == "llm_region"
    assert "aten.linear" in row.key.ops and "aten.relu" in row.key.ops
    assert row.time_ms == 0.004 and row.baseline_ms == 0.009 and row.rel_err == 2e-7
    assert row.config["model"] == "scripted" and row.notes == "one thread per output"
    assert props[0].registry == row.digest and llm.usage.calls == 1
    reg.close()
    # a second run: the registry answers, the model is not asked (not even its reply cache)
    runner2 = Runner(run=FAST)
    props2, llm2, srv2, reg2 = _run(env, [(500, "must not be called", 0)], runner=runner2)
    assert [p.outcome for p in props2] == ["accepted"] and "no call" in props2[0].reason
    assert props2[0].registry == row.digest
    assert srv2.requests == [] and llm2.usage.calls == 0 and llm2.usage.cached == 0 and runner2.jobs == []


def test_injected_hooks_still_decide(env):
    """kernel_hooks replace the pipeline (the source policy still applies first)."""
    calls = []
    hooks = {"compile": lambda src, name: calls.append("compile") or name, "verify": lambda h: (True, "err 1e-7"),
             "bench": lambda h: (1e-5, 2e-5), "store": lambda h, src: calls.append("store")}
    props, _, _, reg = _run(env, [(200, _reply(), 0)], kernel_hooks=hooks)
    assert props[0].outcome == "accepted" and calls == ["compile", "store"] and list(reg.rows("region")) == []


# ------------------------------------------------------------------------------------------
# Real nvcc in the real worker subprocess.

@pytest.mark.slow
@pytest.mark.nvcc
@needs_nvcc
def test_cpp_that_does_not_compile_is_a_recorded_compile_error(env):
    bad = KERNEL.replace("float acc = 0.f;", "float acc = 0.f")
    props, _, _, reg = _run(env, [(200, _reply(source=bad), 0)], compile_timeout=120)
    assert [p.outcome for p in props] == ["compile error"], props
    assert "error" in props[0].reason and "nvcc" in props[0].reason and "kernel.cu" in props[0].reason
    assert list(reg.rows("region")) == []
    _recorded("compile error")


@pytest.mark.slow
@pytest.mark.nvcc
@needs_nvcc
def test_compile_timeout_is_recorded_and_not_cached(env):
    heavy = "#include <cute/tensor.hpp>\n#include <cutlass/gemm/device/gemm_universal_adapter.h>\n" + KERNEL
    props, _, _, reg = _run(env, [(200, _reply(source=heavy), 0)], compile_timeout=1)
    assert [p.outcome for p in props] == ["timeout"], props
    assert "compile over 1 s" in props[0].reason and "nvcc timed out" in props[0].reason
    assert list(reg.rows("region")) == []
    assert not list((Path(paths.home()) / "build").glob("*/error.txt"))  # a longer limit may build it
    _recorded("timeout")


@pytest.mark.slow
@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the outcome where no GPU is present")
def test_without_a_gpu_the_kernel_compiles_in_the_worker_and_waits_for_one(env):
    props, _, _, reg = _run(env, [(200, _reply(), 0)], compile_timeout=120)
    assert [p.outcome for p in props] == ["needs a GPU"], props
    assert "compiled" in props[0].reason and "needs a GPU" in props[0].reason
    assert list((Path(paths.home()) / "build").glob("*/kernel.so"))  # built by the worker, in the build cache
    assert list(reg.rows("region")) == []
    _recorded("needs a GPU")


@pytest.mark.slow
def test_consult_reports_the_accepted_kernel_and_where_it_is_stored(env, monkeypatch):
    """`optimize --llm`'s consult: the accepted kernel is listed (with its registry row, the
    registry the command was given) and the summary says optimize composes it."""
    from fact_db.realization.agent import consult, summary_line
    (env / "p.py").write_text("import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n"
                              "    def __init__(self):\n        super().__init__(); self.fc = nn.Linear(64, 32)\n"
                              "    def forward(self, x):\n        return torch.relu(self.fc(x))\n\n"
                              "def get_inputs():\n    return [torch.randn(8, 64)]\n\ndef get_init_inputs():\n    return []\n")
    srv = Server([(200, _reply(), 0)])
    reg = Registry.open(str(env / "reg.duckdb"))
    try:
        monkeypatch.setenv("FACTDB_LLM_BASE_URL", srv.url)
        monkeypatch.setenv("FACTDB_LLM_MODEL", "scripted")
        info = consult(str(env / "p.py"), registry=reg, runner=Runner(run=FAST))
    finally:
        srv.close()
    [row] = reg.rows("region")
    assert info["calls"] == 1 and info["rule_files"] == []
    assert info["kernels"] == [{"region": "linear", "registry": row.digest, "reason": info["proposals"][0]["reason"]}]
    line = summary_line(info)
    assert f"accepted llm kernel {row.digest[:12]} is in the registry" in line and "optimize composes it" in line


# ------------------------------------------------------------------------------------------
# Composition: optimize composes the llm kernels the registry holds (no model call).

def _stored_row(env, reg, time_ms=0.004, eager_ms=0.009):
    rules = load_rules()
    rep = discover(LinearRelu(), (torch.randn(8, 64),), rules=rules)
    [ask] = asks(rep, rules)
    spec, _ = region_spec(ask, rep)
    region_rows.store(reg, spec, "sm90a", "h100", name="linear_relu", source=KERNEL, build_key="k" * 24, time_ms=time_ms,
                   eager_ms=eager_ms, rel_err=2e-7, eager_rel_err=1.5e-7, model="scripted")
    return spec


def _standin_loader(row, spec):
    import standins
    from fact_db.kernels.impl import Impl
    return Impl("region", f"llm kernel {row.label}", standins.region_op(spec),
                {"region": spec.as_dict(), "standin_region": True}), "stand-in"


def _gemm_realizer(ms=None, eager_ms=None):
    """The GEMM region: eager (ms None) or a stand-in kernel timed at `ms`."""
    import standins
    from fact_db.kernels.impl import Impl
    from fact_db.realization.realize import Realized, plan

    def realize(disc, policy):
        out = []
        for i, (r, p) in enumerate(zip(disc.regions, plan(disc, policy))):
            impl = Impl.eager("not realized in this test") if ms is None else Impl(
                "gemm", "stand-in bias", standins.gemm_op("bias"), {"spec": {"epilogue": "bias"}, "standin": "bias"})
            out.append(Realized(i, r, p.workload, impl, "eager" if ms is None else "tuned", eager_ms=eager_ms, ms=ms))
        return out
    return realize


def _optimize_linear_relu(env, reg, **kw):
    import standins
    from fact_db.pipeline import optimize
    torch.manual_seed(0)
    m = LinearRelu().eval()
    x = torch.randn(8, 64)
    fast = optimize(m, (x,), registry=reg, rules=load_rules(), timer=standins.composed_faster, peers=(), progress=False,
                    out=env / "art", **kw)
    return m, x, fast


def test_optimize_composes_the_llm_kernel_the_registry_holds(env):
    import standins
    from fact_db.composition.artifact import load
    from fact_db.kernels.impl import Impl
    reg = Registry.open(str(env / "reg.duckdb"))
    spec = _stored_row(env, reg)
    m, x, fast = _optimize_linear_relu(env, reg, realizer=_gemm_realizer(), region_kernels=_standin_loader)
    r = fast.report
    assert r.verification.ok
    gemm, llm = r.regions
    assert gemm.impl.kind == "eager" and any("served by llm kernel linear_relu" in n for n in gemm.notes)
    assert llm.region.rule == "llm-kernel" and llm.impl.kind == "region" and llm.how == "registry"
    assert llm.region.nodes == ["linear", "relu"] and llm.ms == 0.004 and llm.eager_ms == 0.009
    from fact_db.composition.report import skipped
    assert skipped(r) == []  # the GEMM region is served by the llm kernel, not left to eager
    before = standins.CALLS["region"]
    assert torch.allclose(fast(x), m(x), atol=1e-6)
    assert standins.CALLS["region"] == before + 1  # the region ran as the kernel op, linear and relu are gone
    ops = [str(n.target) for n in fast.gm.graph.nodes if n.op == "call_function"]
    assert not any("linear" in o or "relu" in o for o in ops), ops
    # the artifact records it and loads it again
    d = json.loads((Path(fast.artifact) / "manifest.json").read_text())
    entry = d["regions"][1]
    assert entry["rule"] == "llm-kernel" and entry["impl"]["kind"] == "region"
    assert entry["impl"]["region"]["inputs"] == spec.as_dict()["inputs"]
    back = load(fast.artifact, loader=lambda rec: Impl("region", rec["label"], standins.region_op(spec), rec)
                if rec.get("standin_region") else None)
    before = standins.CALLS["region"]
    assert torch.allclose(back(x), m(x), atol=1e-6) and standins.CALLS["region"] == before + 1
    reg.close()


@pytest.mark.slow
def test_a_faster_rule_kernel_keeps_its_region_and_region_kernels_false_leaves_them_out(env):
    import standins
    reg = Registry.open(str(env / "reg.duckdb"))
    _stored_row(env, reg, time_ms=0.004, eager_ms=0.009)
    # GEMM kernel 0.001 ms + the eager ReLU (0.009 - 0.008) = 0.002 ms beats the llm kernel's 0.004
    _, x, fast = _optimize_linear_relu(env, reg, realizer=_gemm_realizer(ms=0.001, eager_ms=0.008),
                                       region_kernels=_standin_loader, save=False)
    [gemm] = fast.report.regions
    assert gemm.impl.kind == "gemm" and any("llm kernel linear_relu covers this region" in n for n in gemm.notes)
    # 0.003 + 0.001 = 0.004 ms: a tie keeps the rule's kernel
    _, _, fast = _optimize_linear_relu(env, reg, realizer=_gemm_realizer(ms=0.003, eager_ms=0.008),
                                       region_kernels=_standin_loader, save=False)
    assert [z.impl.kind for z in fast.report.regions] == ["gemm"]
    # 0.006 + 0.001 ms: the llm kernel wins
    _, _, fast = _optimize_linear_relu(env, reg, realizer=_gemm_realizer(ms=0.006, eager_ms=0.008),
                                       region_kernels=_standin_loader, save=False)
    assert [z.impl.kind for z in fast.report.regions] == ["eager", "region"]
    before = standins.CALLS["region"]
    fast(x)
    assert standins.CALLS["region"] == before + 1
    _, _, fast = _optimize_linear_relu(env, reg, realizer=_gemm_realizer(), region_kernels=False, save=False)
    assert [z.impl.kind for z in fast.report.regions] == ["eager"]
    reg.close()


def test_a_region_kernel_for_other_shapes_is_not_used(env):
    reg = Registry.open(str(env / "reg.duckdb"))
    rules = load_rules()
    rep = discover(LinearRelu(), (torch.randn(16, 64),), rules=rules)  # stored for 16 rows, optimized for 8
    spec, _ = region_spec(asks(rep, rules)[0], rep)
    region_rows.store(reg, spec, "sm90a", "h100", name="linear_relu", source=KERNEL, time_ms=0.001, eager_ms=0.009)
    _, _, fast = _optimize_linear_relu(env, reg, realizer=_gemm_realizer(), region_kernels=_standin_loader, save=False)
    assert [z.impl.kind for z in fast.report.regions] == ["eager"]
    reg.close()


@pytest.mark.skipif(not torch.cuda.is_available() or shutil.which("nvcc") is None, reason="needs a GPU and nvcc")
@pytest.mark.parametrize("source", ["kernel", "tiled"])
def test_the_region_kernel_op_on_the_gpu_eager_compiled_and_graphed(env, source):
    """The real kernels (tests/data/agent/linear_relu_<source>.cu) compiled in the worker, as a
    custom op: the module's answer, under torch.compile(fullgraph=True), in a CUDA graph."""
    from fact_db.kernels.region.pipeline import Pipeline
    from fact_db.kernels.region.kernel import RegionKernel
    rules = load_rules()
    m = LinearRelu().cuda()
    x = torch.randn(8, 64, device="cuda")
    rep = discover(m, (x,), rules=rules)
    spec, _ = region_spec(asks(rep, rules)[0], rep)
    pipe = Pipeline(spec, compile_timeout=240)
    try:
        handle = pipe.compile((Path(__file__).resolve().parent / "data" / "agent" / f"linear_relu_{source}.cu")
                              .read_text(), "linear_relu")
    finally:
        pipe.close()
    op = RegionKernel(handle["so"], spec, build_key=handle["build_key"]).as_op()
    assert RegionKernel(handle["so"], spec, build_key=handle["build_key"]).as_op() is op  # one registration
    w, b = m.fc.weight.detach(), m.fc.bias.detach()
    want = m(x).detach()
    assert torch.allclose(op([x, w, b]), want, atol=1e-5, rtol=1e-5)
    assert torch.allclose(op([x.t().contiguous().t(), w, b]), want, atol=1e-5, rtol=1e-5)  # strided: made contiguous
    f = torch.compile(lambda a: op([a, w, b]) * 2.0, fullgraph=True)
    assert torch.allclose(f(x), want * 2.0, atol=1e-5, rtol=1e-5)
    static = x.clone()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        op([static, w, b])
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        y = op([static, w, b])
    x2 = torch.randn(8, 64, device="cuda")
    static.copy_(x2)
    g.replay()
    torch.cuda.synchronize()
    assert torch.allclose(y, m(x2).detach(), atol=1e-5, rtol=1e-5)
    with pytest.raises(Exception, match="takes inputs of shapes"):
        op([torch.randn(4, 64, device="cuda"), w, b])
