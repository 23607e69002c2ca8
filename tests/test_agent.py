"""The agent against a real chat-completions server on loopback (stdlib http.server in a
thread, streaming off, scripted replies). Every bad reply ends in a recorded rejection, nothing
is written to the rules or the registry, and the region stays with eager PyTorch."""
import json
from pathlib import Path

import pytest
import torch

from fact_db.core import paths
from fact_db.realization.agent import Agent
from fact_db.realization.asks import asks
from fact_db.discovery.discover import discover
from fact_db.realization.llm import LLM, Config, load_config
from fact_db.discovery.rules import load_rules
from agent_env import SHIPPED, LinearRelu, without_relu_rule
from loopback_llm import Server

RELU_YAML = (SHIPPED / "gemm_epilogue" / "gemm-bias-relu.yaml").read_text()
RELU_FIX = (SHIPPED / "gemm_epilogue" / "gemm-bias-relu.py").read_text()


@pytest.fixture
def env(tmp_path, monkeypatch):
    return without_relu_rule(tmp_path, monkeypatch)


def _run(env, script, **kw):
    srv = Server(script)
    try:
        llm = LLM(Config(srv.url, "scripted", timeout_s=kw.pop("timeout_s", 30), backoff_s=0.01, retries=2))
        rules = load_rules()
        rep = discover(LinearRelu(), (torch.randn(8, 64),), rules=rules)
        kw.setdefault("retriever", None)  # retrieval has its own tests below; these are about the replies
        agent = Agent(llm, out_dir=env / "out", **kw)
        props = agent.run(rep, rules)
        return props, llm, srv
    finally:
        srv.close()


def _reply(**kw):
    return json.dumps(kw)


def _nothing_written(env):
    assert not (env / "out").exists() or not any((env / "out").rglob("*.yaml"))
    assert sorted(p.name for p in (env / "rules" / "gemm_epilogue").iterdir()) == \
        sorted(p.name for p in (SHIPPED / "gemm_epilogue").iterdir() if p.name not in ("gemm-bias-relu.yaml", "gemm-bias-relu.py", "__pycache__"))


def test_off_unless_configured(env):
    assert load_config() is None
    assert LLM.open() is None
    assert LLM.open(offline=True, config=Config("http://127.0.0.1:9/v1", "m")) is None


def test_config_file(env):
    home = Path(paths.home())
    home.mkdir(parents=True)
    (home / "llm.yaml").write_text("base_url: http://127.0.0.1:9/v1\nmodel: m\nmax_calls: 3\n")
    c = load_config()
    assert c.model == "m" and c.max_calls == 3


@pytest.mark.slow
def test_asks_the_unfused_relu_only(env):
    rules = load_rules()
    rep = discover(LinearRelu(), (torch.randn(8, 64),), rules=rules)
    a = asks(rep, rules)
    assert len(a) == 1 and "relu" in a[0].why


@pytest.mark.slow
def test_correct_rule_restores_fusion_and_rerun_is_cached(env):
    props, llm, srv = _run(env, [(200, _reply(kind="rule", rule=RELU_YAML, fixture=RELU_FIX), 0)])
    assert [p.outcome for p in props] == ["accepted"], props
    assert llm.usage.calls == 1
    files = [Path(f) for f in props[0].files]
    assert {f.name for f in files} == {"gemm-bias-relu.yaml", "gemm-bias-relu.py"}
    assert all(f.is_relative_to(env / "out") for f in files)
    # the rule file it wrote is the one proposed, and with it discovery fuses the ReLU again
    props2, llm2, srv2 = _run(env, [(500, "must not be called", 0)])
    assert llm2.usage.calls == 0 and llm2.usage.cached == 1 and props2[0].outcome == "accepted"
    assert srv2.requests == []


@pytest.mark.slow
@pytest.mark.parametrize("reply,outcome,words", [
    ("this is not json {", "malformed", "not JSON"),
    (_reply(kind="rule", rule="id: x\n", fixture=""), "schema-invalid", "x.py"),
    (_reply(kind="rule", rule="id: gemm-bias-relu\nfixture: gemm-bias-relu.py\ntitle: t\n", fixture=RELU_FIX),
     "schema-invalid", "does not validate"),
    (_reply(kind="rule", rule=RELU_YAML, fixture=RELU_FIX.replace("torch.relu(self.fc(x))", "torch.sigmoid(self.fc(x))", 1)),
     "fixture failed", "LinearTorchRelu"),
    (_reply(kind="rule", rule=(SHIPPED / "gemm_epilogue" / "gemm-bias-silu.yaml").read_text().replace("gemm-bias-silu", "agent-silu"),
            fixture=(SHIPPED / "gemm_epilogue" / "gemm-bias-silu.py").read_text().replace("gemm-bias-silu", "agent-silu")),
     "no match", "does not match"),
    (_reply(kind="rule", rule="!!python/object/apply:os.system ['touch /tmp/factdb-agent-pwned']\n", fixture=""),
     "refused", "no tags"),
    (_reply(kind="rule", rule=RELU_YAML.replace("id: gemm-bias-relu", "id: ../../evil"), fixture=RELU_FIX),
     "refused", "outside"),
    (_reply(kind="rule", rule=RELU_YAML.replace("fixture: gemm-bias-relu.py", "fixture: ../../../evil.py"), fixture=RELU_FIX),
     "refused", "outside"),
    (_reply(kind="shell", cmd="rm -rf /"), "schema-invalid", "not allowed"),
])
def test_bad_rule_replies_are_rejected(env, reply, outcome, words):
    props, llm, _ = _run(env, [(200, reply, 0)])
    assert [p.outcome for p in props] == [outcome], props
    assert words in props[0].reason
    assert not Path("/tmp/factdb-agent-pwned").exists()
    _nothing_written(env)
    log = (Path(paths.home()) / "agent" / "proposals.jsonl").read_text().splitlines()
    assert json.loads(log[-1])["outcome"] == outcome


def _hooks(calls, *, compile_error=False, wrong=False, slow=False, timeout=False):
    def comp(src, name):
        calls.append("compile")
        if timeout:
            raise TimeoutError("compile over 300 s")
        if compile_error:
            raise RuntimeError("error: expected ';' before '}' token")
        return name

    return {"compile": comp, "verify": lambda h: not wrong,
            "bench": lambda h: (2e-5, 1e-5) if slow else (1e-5, 2e-5),
            "store": lambda h, src: calls.append("store")}


@pytest.mark.parametrize("kind,outcome", [("compile_error", "compile error"), ("wrong", "wrong result"),
                                          ("slow", "slower than eager"), ("timeout", "timeout"), (None, "accepted")])
def test_kernel_replies(env, kind, outcome):
    calls = []
    hooks = _hooks(calls, **({kind: True} if kind else {}))
    src = 'extern "C" int fact_region_launch(const void* const* i, const int64_t* const* s, const int64_t* const* t, ' \
          'const int* r, int n, void* o, const int64_t* os, int orank, cudaStream_t st) { return 0; }'
    props, _, _ = _run(env, [(200, _reply(kind="kernel", name="fused_relu", source=src), 0)], kernel_hooks=hooks,
                       registry=False)
    assert [p.outcome for p in props] == [outcome], props
    assert ("store" in calls) == (outcome == "accepted")
    _nothing_written(env)


def test_kernel_without_the_abi_is_refused(env):
    """Without hooks the real pipeline runs (tests/test_agent_kernels.py); a source without the
    region ABI's entry point is refused before anything compiles."""
    props, _, _ = _run(env, [(200, _reply(kind="kernel", name="k", source="x"), 0)], registry=False)
    assert props[0].outcome == "refused" and "fact_region_launch" in props[0].reason


def test_429_then_success(env):
    props, llm, srv = _run(env, [(429, "slow down", 0), (200, _reply(kind="rule", rule=RELU_YAML, fixture=RELU_FIX), 0)])
    assert props[0].outcome == "accepted" and llm.usage.calls == 2 and len(srv.requests) == 2


def test_500_forever(env):
    props, llm, srv = _run(env, [(500, "boom", 0)])
    assert props[0].outcome == "no reply" and "HTTP 500" in props[0].reason and "3 attempts" in props[0].reason
    assert len(srv.requests) == 3
    _nothing_written(env)


@pytest.mark.slow
def test_timeout(env):
    props, _, _ = _run(env, [(200, _reply(kind="rule", rule=RELU_YAML, fixture=RELU_FIX), 3)], timeout_s=0.5)
    assert props[0].outcome == "timeout" and "within" in props[0].reason
    _nothing_written(env)


def test_realize_hook_decides(env):
    props, _, _ = _run(env, [(200, _reply(kind="rule", rule=RELU_YAML, fixture=RELU_FIX), 0)],
                       realize=lambda region: ("slower than eager", f"{region.rule}: 1.2 ms vs eager 1.0 ms"))
    assert props[0].outcome == "slower than eager" and "gemm-bias-relu" in props[0].reason
    _nothing_written(env)


DATA = Path(__file__).resolve().parent / "data" / "agent"
PROBLEMS = Path(__file__).resolve().parent.parent / "benchmarks" / "problems"


@pytest.mark.slow
def test_kernelbench_gemm_div_gelu_rule_accepted_then_cached(tmp_path, monkeypatch):
    from fact_db.discovery.discover import discover_problem

    monkeypatch.setenv("FACTDB_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("FACTDB_RULES", raising=False)
    reply = _reply(kind="rule", rule=(DATA / "gemm-bias-div-gelu.yaml").read_text(),
                   fixture=(DATA / "gemm-bias-div-gelu.py").read_text())
    seen = []
    for run in range(2):
        srv = Server([(200, reply, 0)])
        try:
            llm = LLM(Config(srv.url, "scripted", backoff_s=0.01))
            rules = load_rules()
            rep = discover_problem(str(PROBLEMS / "gemm_div_gelu.py"), rules=rules)
            assert [r.rule for r in rep.regions] == ["gemm-bias-scale"]  # the GELU after it is left to eager
            props = Agent(llm, out_dir=tmp_path / "out", realize=lambda r: (seen.append(r) or ("accepted", "won"))).run(rep, rules)
        finally:
            srv.close()
        assert [p.outcome for p in props] == ["accepted"], props
        assert llm.usage.calls == (1 if run == 0 else 0)
        assert len(srv.requests) == (1 if run == 0 else 0)
    assert seen[0].rule == "gemm-bias-div-gelu" and seen[0].epilogue == ["bias", "scale", "gelu"]
    assert seen[0].problem["M"] == 1024 if "M" in seen[0].problem else True
    assert (tmp_path / "out" / "rules" / "agent" / "gemm-bias-div-gelu.yaml").exists()


@pytest.mark.slow
def test_shipped_problems_ask_nothing(tmp_path, monkeypatch):
    """Benchmark problems the shipped rules cover make no call: only the three KernelBench
    problems added for the agent leave a region to ask about (OPT's scaled q projection is
    the shipped gemm-bias-scale), and the ReLU self-attention, whose mask and ReLU between two
    batched GEMMs no rule fuses."""
    from fact_db.discovery.discover import discover_problem

    monkeypatch.delenv("FACTDB_RULES", raising=False)
    rules = load_rules()
    asked = {}
    for p in sorted(PROBLEMS.glob("*.py")):
        rep = discover_problem(str(p), rules=rules)
        asked[p.stem] = len(asks(rep, rules))
    assert {k for k, v in asked.items() if v} == {"gemm_div_gelu", "gemm_swish_scale", "gemm_relu_div",
                                                  "relu_self_attention"}, asked


@pytest.mark.slow
def test_restored_rule_is_realized_through_the_tuner(env):
    """The proposal is tuned like any region (GPU steps through the injected runner): a winner
    that beats eager accepts it; eager winning rejects it."""
    from fact_db.realization.agent import region_realizer

    def runner(fast):
        def run(jobs):
            return [{"id": j["id"], "status": "ok", "device": "NVIDIA H100 80GB HBM3", "err": 1e-4,
                     "time_ms": 1.0 if j["kind"] == "eager" else (0.8 if fast else 1.5) + 0.01 * j["id"]} for j in jobs]
        return run

    for fast, outcome in ((True, "accepted"), (False, "slower than eager")):
        srv = Server([(200, _reply(kind="rule", rule=RELU_YAML, fixture=RELU_FIX), 0)])
        try:
            llm = LLM(Config(srv.url, "scripted", backoff_s=0.01))
            rules = load_rules()
            rep = discover(LinearRelu(), (torch.randn(8, 64),), rules=rules)
            hook = region_realizer(rep, "fp32", gpu="h100", runner=runner(fast))
            props = Agent(llm, out_dir=env / f"out{fast}", realize=hook).run(rep, rules)
        finally:
            srv.close()
        assert [p.outcome for p in props] == [outcome], props
        rz = hook.results[0]
        assert rz.region.rule == "gemm-bias-relu" and rz.workload.epilogue == "bias_relu"
        assert (outcome == "accepted") == bool(props[0].files)


@pytest.mark.slow
def test_rules_propose_cli(env, monkeypatch):
    from click.testing import CliRunner
    from fact_db.cli.main import cli

    (env / "p.py").write_text("import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n"
                              "    def __init__(self):\n        super().__init__(); self.fc = nn.Linear(64, 32)\n"
                              "    def forward(self, x):\n        return torch.relu(self.fc(x))\n\n"
                              "def get_inputs():\n    return [torch.randn(8, 64)]\n\ndef get_init_inputs():\n    return []\n")
    res = CliRunner().invoke(cli, ["rules", "propose", str(env / "p.py"), "--out", str(env / "o")])
    assert res.exit_code != 0 and "no language model configured" in res.output
    srv = Server([(200, _reply(kind="rule", rule=RELU_YAML, fixture=RELU_FIX), 0)])
    try:
        monkeypatch.setenv("FACTDB_LLM_BASE_URL", srv.url)
        monkeypatch.setenv("FACTDB_LLM_MODEL", "scripted")
        res = CliRunner().invoke(cli, ["rules", "propose", str(env / "p.py"), "--out", str(env / "o"), "--json"])
    finally:
        srv.close()
    assert res.exit_code == 0, res.output
    out = json.loads(res.output[res.output.index("{"):])
    assert out["llm"]["calls"] == 1 and out["proposals"][0]["outcome"] == "accepted"
    assert (env / "o" / "rules" / "agent" / "gemm-bias-relu.yaml").read_text() == RELU_YAML


@pytest.mark.slow
def test_the_prompt_carries_the_nearest_rules_and_examples_with_excerpts(env):
    """Grounding: the index's nearest rules and vetted CUTLASS examples (what `factdb query`
    answers, offline), each with its path and an excerpt, go into the prompt."""
    from fact_db.realization.agent import retrieve
    props, _, srv = _run(env, [(200, _reply(kind="rule", rule=RELU_YAML, fixture=RELU_FIX), 0)], retriever=retrieve)
    assert props[0].outcome == "accepted"
    body = json.loads(srv.requests[0]["messages"][1]["content"])
    got = body["retrieved"]
    rules_ = [d for d in got if d["kind"] == "rule"]
    examples = [d for d in got if d["kind"] == "example"]
    assert len(rules_) == 3 and len(examples) == 2 and "retrieval_note" not in body
    assert all(d["excerpt"].startswith(f"id: {d['id']}") and d["path"].endswith(f"/{d['id']}.yaml") for d in rules_)
    assert all(d["id"].startswith("examples/") and len(d["excerpt"]) > 40 for d in examples)
    assert "gemm-bias-relu" not in {d["id"] for d in rules_}  # removed from this rule set, so not in its index


@pytest.mark.slow
def test_a_prompt_goes_out_without_retrieval_when_the_index_cannot_answer(env, monkeypatch):
    from fact_db.store import index
    from fact_db.realization.agent import retrieve

    def broken(*a, **kw):
        raise index.IndexError_("the index file is damaged")
    monkeypatch.setattr(index, "search", broken)
    props, _, srv = _run(env, [(200, _reply(kind="rule", rule=RELU_YAML, fixture=RELU_FIX), 0)], retriever=retrieve)
    body = json.loads(srv.requests[0]["messages"][1]["content"])
    assert body["retrieved"] == [] and body["retrieval_note"] == "retrieval unavailable: the index file is damaged"
    assert props[0].outcome == "accepted"


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the plan printed where no GPU is present")
def test_optimize_llm_discovers_and_plans_with_the_accepted_rule(env, monkeypatch):
    """`factdb optimize --llm`: the accepted rule joins the rule set optimize discovers with, so
    its region is realized and composed like a shipped rule's (here, without a GPU: planned,
    the division as the GEMM's alpha); a second run makes no call and plans the same."""
    from click.testing import CliRunner
    from fact_db.cli.main import cli
    reply = _reply(kind="rule", rule=(DATA / "gemm-bias-div-gelu.yaml").read_text(),
                   fixture=(DATA / "gemm-bias-div-gelu.py").read_text())
    for run in range(2):
        srv = Server([(200, reply, 0)])
        try:
            monkeypatch.setenv("FACTDB_LLM_BASE_URL", srv.url)
            monkeypatch.setenv("FACTDB_LLM_MODEL", "scripted")
            res = CliRunner().invoke(cli, ["optimize", str(PROBLEMS / "gemm_div_gelu.py"), "--llm", "--json"])
        finally:
            srv.close()
        assert res.exit_code == 0, res.output
        llm = json.loads(res.stderr)["llm"]
        assert llm["calls"] == (1 if run == 0 else 0) and [p["outcome"] for p in llm["proposals"]] == ["accepted"]
        assert llm["rule_files"] == [str(env / "home" / "agent" / "accepted" / "rules" / "agent" /
                                         "gemm-bias-div-gelu.yaml")]
        d = json.loads(res.stdout)
        [r] = d["regions"]
        assert r["rule"] == "gemm-bias-div-gelu" and r["how"] == "planned"
        assert r["workload"]["epilogue"] == "bias_gelu"
