"""CPU tests of the attention tuner, the fmha_sm90 family, the attention registry rows and
the worker job (run in-process here with a stand-in kernel)."""
from __future__ import annotations

import types

import pytest
import torch

from fact_db.kernels.attention import tune as at
from fact_db.kernels.attention import fmha_sm90
from fact_db.kernels.attention.workload import AttentionWorkload
from fact_db.store.registry import Registry


def W(**kw):
    base = dict(batch=2, heads=4, kv_heads=4, lq=64, lk=64, d=64, dv=64, causal=True, policy="bf16")
    return AttentionWorkload(**{**base, **kw})


@pytest.mark.parametrize("d", [64, 96, 128])
def test_fmha_sm90_configs_cover_head_dims(d):
    w = W(d=d, dv=d)
    assert fmha_sm90.applies(w, "sm90a") is None
    cfgs = fmha_sm90.configs(w, 8)
    assert cfgs and all(c["tile_d"] == (64 if d == 64 else 128) and c["causal"] for c in cfgs)
    assert fmha_sm90.label(cfgs[0]).startswith("fmha q128")
    src = fmha_sm90.source(w, cfgs[0])
    assert "CausalFusion" in src.code and "Int<%d>" % cfgs[0]["tile_d"] in src.code
    assert "fact_fmha_sm90_launch" in src.code and src.arch == "sm90a"
    assert "ResidualFusion" in fmha_sm90.source(W(causal=False), fmha_sm90.configs(W(causal=False), 1)[0]).code


@pytest.mark.parametrize("kw,why", [
    (dict(d=160, dv=160), "head dims"), (dict(d=60, dv=60), "multiples of 8"), (dict(d=64, dv=128), "equal"),
    (dict(policy="fp32"), "bfloat16/float16"), (dict(lq=1), "sequence length 1"),
    (dict(lq=128, lk=64), "lq <= lk"), (dict(lq=100, lk=100), "multiple of 8"),
])
def test_fmha_sm90_refuses_what_it_cannot_serve(kw, why):
    assert why in fmha_sm90.applies(W(**kw), "sm90a")


def test_fmha_sm90_refuses_other_arch():
    assert "Hopper" in fmha_sm90.applies(W(), "sm80")


def test_gqa_and_ragged_lengths_apply():
    assert fmha_sm90.applies(W(heads=8, kv_heads=2, lq=104, lk=110), "sm90a") is None


def test_candidates_are_library_backends_plus_family_kernels():
    cands, notes = at.candidates(W(), "sm90a", 8, fams=[fmha_sm90])
    labels = [c.label for c in cands]
    assert labels[:6] == ["explicit", "sdpa", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math"]
    assert [c.kind for c in cands[6:]] == ["kernel", "kernel"] and notes == []
    cands, notes = at.candidates(W(d=160, dv=160), "sm90a", 8, fams=[fmha_sm90])
    assert all(c.kind != "kernel" for c in cands) and "head dims" in notes[0]
    cands, _ = at.candidates(W(), "sm90a", 1, fams=[fmha_sm90])
    assert sum(c.kind == "kernel" for c in cands) == 1
    fp32 = W(policy="fp32")
    assert [c.label for c in at.candidates(fp32, "sm90a", 8, fams=[fmha_sm90])[0]] == [
        "explicit", "sdpa", "sdpa-efficient", "sdpa-math"]


def test_the_kernel_budget_goes_round_robin_over_the_families_that_apply():
    """Both fp32 families serve minGPT's attention: a budget of 3 takes each one's best guess
    before either's second, so neither shuts the other out."""
    from fact_db.kernels.attention import fmha_fp32tc, fmha_fp32wg
    w = W(policy="fp32", dtype="float32", batch=128, heads=8, kv_heads=8, lq=512, lk=512, d=96, dv=96)
    kernels = [c for c in at.candidates(w, "sm90a", 3)[0] if c.kind == "kernel"]
    assert [c.template for c in kernels] == ["fmha_fp32wg_sm90", "fmha_fp32tc_sm90", "fmha_fp32wg_sm90"]
    assert kernels[0].config == fmha_fp32wg.configs(w, 1)[0] and kernels[1].config == fmha_fp32tc.configs(w, 1)[0]
    assert kernels[2].config == fmha_fp32wg.configs(w, 2)[1]
    # one family that applies: the whole budget is its own, in its order
    assert [c.config for c in at.candidates(w, "sm90a", 3, fams=[fmha_fp32tc])[0] if c.kind == "kernel"] == \
        fmha_fp32tc.configs(w, 3)
    # bf16: only fmha_sm90 applies, the fp32 families say why not
    _, notes = at.candidates(W(), "sm90a", 3)
    assert any(n.startswith("fmha_fp32wg_sm90:") for n in notes) and any(n.startswith("fmha_fp32tc_sm90:") for n in notes)


class _Kernel:
    """A stand-in AttentionKernel: the right answer, or one that ignores the causal mask."""

    def __init__(self, ignore_mask: bool):
        self.ignore_mask = ignore_mask

    def __call__(self, q, k, v, scale, causal):
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=causal and not self.ignore_mask, scale=scale,
            enable_gqa=q.shape[1] != k.shape[1])


def _run_on_cpu(monkeypatch, job, kernel):
    import fact_db.kernels.attention.kernel as ak
    monkeypatch.setattr(ak, "AttentionKernel", lambda *a, **k: kernel)
    real = AttentionWorkload.make_inputs
    monkeypatch.setattr(AttentionWorkload, "make_inputs",
                        lambda self, dist, device="cuda", generator=None: real(self, dist, "cpu", None))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "cpu")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch, "Generator", lambda device=None: types.SimpleNamespace(manual_seed=lambda s: None))
    import fact_db.kernels.bench as bench
    monkeypatch.setattr(bench, "time_cuda", lambda fn, sets, reps=20: (
        [fn(s) for s in sets], types.SimpleNamespace(median_ms=1.0, p10_ms=0.9, p90_ms=1.1))[1])
    return at.run_job(job, {})


@pytest.mark.parametrize("kw", [dict(), dict(heads=4, kv_heads=2, lq=40, lk=40), dict(causal=False, lq=33, lk=70)])
def test_run_job_passes_a_correct_kernel(monkeypatch, kw):
    w = W(policy="fp32", **kw)
    c = at.AttnCandidate("k", "kernel", template="fmha_sm90", so="x.so")
    res = _run_on_cpu(monkeypatch, at.job_for(c, w, trials=2), _Kernel(False))
    assert res["status"] == "ok" and res["time_ms"] == 1.0, res


def test_run_job_fails_a_kernel_that_ignores_the_causal_mask(monkeypatch):
    w = W(policy="fp32")
    c = at.AttnCandidate("k", "kernel", template="fmha_sm90", so="x.so")
    res = _run_on_cpu(monkeypatch, at.job_for(c, w, trials=2), _Kernel(True))
    assert res["status"] == "verify_failed" and "bound" in res["error"]


def test_tune_picks_fastest_verified_and_writes_the_registry(monkeypatch):
    w = W()
    times = {"explicit": 3.0, "sdpa": 1.6, "sdpa-flash": 1.5, "sdpa-efficient": 2.0, "sdpa-cudnn": None, "sdpa-math": 9.0,
             "fmha q128 k64 hd64 coop": 1.0, "fmha q128 k64 hd64 pingpong": 0.5}

    class Pool:
        def run(self, jobs):
            return [{"status": "verify_failed" if "pingpong" in j["so"] else
                     ("launch_error" if times[self.label(j)] is None else "ok"),
                     "time_ms": times[self.label(j)], "err": 0.01} for j in jobs]

        def label(self, j):
            return j["so"] or ("explicit" if j["cand"] == "eager" else "sdpa-" + j["backend"] if j["backend"] else "sdpa")

    def fake_build(cands, jobs=None, progress=False):
        for c in cands:
            if c.kind == "kernel":
                c.so, c.build_key = c.label, "bk-" + c.label
        return []
    monkeypatch.setattr(at, "build_all", fake_build)
    reg = Registry.memory(seed=False)
    res = at.tune(w, gpu="h100", pool=Pool(), registry=reg, fams=[fmha_sm90])
    assert res.best.label == "fmha q128 k64 hd64 coop"  # pingpong was faster but failed verification
    hit = at.from_registry(w, reg, "sm90a", "h100")
    assert hit.label == res.best.label and hit.config["tile_kv"] == 64 and hit.time_ms == 1.0
    rec = reg.get(w.key("sm90a", "h100"))
    assert rec.template == "fmha_sm90" and rec.baseline_ms == 3.0  # the explicit form is the baseline
    assert len(reg.trials(w.key("sm90a", "h100"))) == len(res.trials)  # every candidate, failures included
    assert at.from_registry(w, reg, "sm90a", "h200") is None  # a winner timed on one GPU never serves another
    assert at.from_registry(w.with_(causal=False), reg, "sm90a", "h100") is None
    assert at.from_registry(w.with_(scale=0.5), reg, "sm90a", "h100") is None  # the scale is part of the key
    again = at.tune(w, gpu="h100", pool=None, registry=reg, fams=[fmha_sm90])
    assert again.notes == ["registry hit"] and again.best.label == res.best.label


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message where no GPU is present")
def test_tune_with_a_registry_needs_the_gpu_it_keys_rows_by():
    from fact_db.kernels.abi import NoGPU
    with pytest.raises(NoGPU, match="no CUDA GPU"):
        at.tune(W(), registry=Registry.memory(seed=False), fams=[fmha_sm90])


def test_cli_tune_attention_refuses_a_bad_shape_and_documents_itself():
    from click.testing import CliRunner

    from fact_db.cli.main import cli
    r = CliRunner().invoke(cli, ["tune", "--op", "attention", "--shape", "128x8x512", "--causal"])
    assert r.exit_code != 0 and "BxHxLQxLKxD" in r.output
    r = CliRunner().invoke(cli, ["tune", "--help"])
    assert "factdb tune --op attention --shape 128x8x512x512x96 --causal" in r.output


def test_cli_tune_attention_runs_the_tuner(monkeypatch):
    from click.testing import CliRunner

    from fact_db.cli.main import cli
    seen = {}

    def fake_tune(w, **kw):
        seen["w"] = w
        return at.AttnResult(w, [at.AttnTrial("sdpa-flash", "library", "ok", 1.25, 0.01)], ["fmha_sm90: x"])
    monkeypatch.setattr(at, "tune", fake_tune)
    r = CliRunner().invoke(cli, ["tune", "--op", "attention", "--shape", "2x8x100x100x96", "--kv-heads", "2",
                                 "--causal", "--policy", "bf16", "--no-registry", "--json"])
    assert r.exit_code == 0, r.output
    w = seen["w"]
    assert (w.batch, w.heads, w.kv_heads, w.lq, w.lk, w.d, w.causal, w.dtype) == (2, 8, 2, 100, 100, 96, True, "bfloat16")
    assert '"sdpa-flash"' in r.output


def test_run_job_reports_a_kernel_that_refuses_the_launch(monkeypatch):
    from fact_db.kernels.abi import KernelError

    class Refuses:
        def __call__(self, *a, **k):
            raise KernelError("fmha_sm90 attention kernel x refused or failed the launch: not supported")
    c = at.AttnCandidate("k", "kernel", template="fmha_sm90", so="x.so")
    res = _run_on_cpu(monkeypatch, at.job_for(c, W(policy="fp32"), trials=2), Refuses())
    assert res["status"] == "launch_error" and "not supported" in res["error"]


def test_realize_maps_a_kernel_winner_to_its_op(monkeypatch):
    from fact_db.kernels.attention import family
    from fact_db.kernels.attention import kernel as attention_kernel
    from fact_db.kernels.family import Context
    w = W()
    trials = [at.AttnTrial("sdpa-flash", "library", "ok", 2.0, 0.01),
              at.AttnTrial("fmha q128 k64 hd64 coop", "kernel", "ok", 1.0, 0.01, template="fmha_sm90",
                           config={"tile_d": 64}, so="/x/kernel.so", build_key="bk"),
              at.AttnTrial("explicit", "eager", "ok", 5.0, 0.02)]
    monkeypatch.setattr(at, "tune", lambda w, **kw: at.AttnResult(w, trials, ["fmha_fp32tc: fp32 only"]))

    class K:
        def __init__(self, path, template, build_key=""):
            self.path, self.template, self.build_key = path, template, build_key
            self.op_name = "attn_test"

        def as_op(self):
            return "the-op"
    monkeypatch.setattr(attention_kernel, "AttentionKernel", K)
    rows, best = family.tune_rows(w, Context())
    assert best["label"] == "fmha q128 k64 hd64 coop" and best["so"] == "/x/kernel.so"
    assert [r["kind"] for r in rows] == ["attention", "kernel", "eager", "note"]
    impl = family.impl_of(best)
    assert impl.kind == "attention" and impl.op == "the-op"
    assert impl.record["op"] == "factdb::attn_test" and impl.record["build_key"] == "bk"
    assert "/x/" not in impl.record["op"]
