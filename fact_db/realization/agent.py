"""The agent: asks the language model (fact_db.realization.llm) only for what the rules and registry cannot
cover, and trusts nothing it says until it has been checked.

Asked for: heavy ops no region covers (discovery's `uncovered`) and matched regions whose rule
names a template that does not exist. Never asked when no client is configured.

A reply is JSON (REPLY_SCHEMA) holding one proposal:
  kind "rule":   `rule` (YAML text) and `fixture` (Python text). The YAML is read with
                 yaml.safe_load (tags such as !!python/object are refused), the id must be a
                 plain name and the fixture `<id>.py` (nothing is written outside the proposal's
                 own directory), the rule must pass rules.schema.json and `rules validate`
                 beside the shipped rules, its fixture must pass `rules test`, and it must match
                 the user's region. Then `realize(region)` (injected; default: none) decides.
  kind "kernel": `source` (C++/CUDA exporting the region ABI of fact_db/kernels/region/) and
                 `name`. The source policy is checked first (only CUDA/C++ standard, cutlass/ and
                 cute/ headers; no OS calls); then it is compiled in the worker subprocess under a
                 time limit, verified against the region's ATen ops in float64, timed against
                 eager, and stored in the registry (`region_kernels`, provenance `llm`, with its
                 source). Tests inject `kernel_hooks` or the pipeline's `runner`.
A region the registry already has an llm kernel for causes no call.
Every proposal is recorded with its outcome and reason in $FACTDB_HOME/agent/proposals.jsonl.
"""
from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field, asdict
from pathlib import Path

import jsonschema
import yaml

from fact_db.core import paths
from fact_db.core.errors import FactError, first_line
from fact_db.core.device import build_arch
from fact_db.kernels.region import family as region_family
from fact_db.realization.asks import Ask, asks, region_spec  # noqa: F401  (the agent's questions)
from fact_db.realization.llm import LLM, LLMError
from fact_db.kernels.region.source import ABI

OUTCOMES = ("accepted", "malformed", "schema-invalid", "refused", "no match", "fixture failed", "compile error",
            "wrong result", "slower than eager", "timeout", "no reply", "needs a GPU", "no toolchain")

REPLY_SCHEMA = {
    "type": "object",
    "required": ["kind"],
    "properties": {
        "kind": {"enum": ["rule", "kernel"]},
        "rule": {"type": "string", "maxLength": 20000},
        "fixture": {"type": "string", "maxLength": 50000},
        "source": {"type": "string", "maxLength": 200000},
        "name": {"type": "string", "pattern": "^[a-z][a-z0-9_]{0,63}$"},
        "explanation": {"type": "string"},
    },
    "allOf": [
        {"if": {"properties": {"kind": {"const": "rule"}}}, "then": {"required": ["rule", "fixture"]}},
        {"if": {"properties": {"kind": {"const": "kernel"}}}, "then": {"required": ["source", "name"]}},
    ],
    "additionalProperties": False,
}

_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")


@dataclass
class Proposal:
    region: str  # the output node (uncovered op or region output) it was asked for
    kind: str  # rule / kernel / ?
    outcome: str
    reason: str
    rule_id: str = ""
    files: list = field(default_factory=list)  # where an accepted rule was written
    cached: bool = False
    registry: str = ""  # an accepted kernel's registry digest (region_kernels), or the row that served the ask

    def as_dict(self) -> dict:
        return asdict(self)


SYSTEM = """You extend fact-db, a rule database that maps PyTorch ATen subgraphs to CUTLASS templates.
Answer with ONE JSON object and nothing else:
  {"kind": "rule", "rule": "<YAML of one rule, schema rules.schema.json>", "fixture": "<Python fixture module <id>.py with '# match: <id>' and '# no-match: <id>' cases>", "explanation": "..."}
or, only when no template can express the region:
  {"kind": "kernel", "name": "<snake_case>", "source": "<C++/CUDA source>", "explanation": "..."}
A rule must be realized through an existing template and epilogue (a constant scale is `alpha`).
A kernel source must export exactly this C ABI (the user message's `kernel_contract` gives the
region's inputs in order, their shapes, the element type and what the region computes):
""" + ABI + """
It may include only CUDA and C++ standard headers and cutlass/..., cute/...; no file, process
or network calls, no code that runs when the library loads.
Nothing you write is trusted until it validates, its fixture passes, it matches the region,
and the kernel compiles, verifies against float64 and beats eager PyTorch."""


def _template_catalogue(rules) -> list:
    out: dict = {}
    for r in rules:
        t = r.realize.get("template")
        if t:
            e = out.setdefault(t, {"template": t, "epilogues": set(), "params": set()})
            e["epilogues"].add("+".join(r.realize.get("epilogue") or []) or "none")
            e["params"].update((r.realize.get("params") or {}).keys())
    return [{"template": t, "epilogues": sorted(v["epilogues"]), "params": sorted(v["params"])} for t, v in sorted(out.items())]


EXCERPT_CHARS = 1200


def _excerpt(hit) -> str:
    """What a retrieved document says, for the prompt: a rule's YAML, an example's summary and
    the opening of its main source after the licence header."""
    path = hit.meta.get("path") or ""
    try:
        if hit.kind == "rule":
            p = Path(path) if Path(path).is_absolute() else paths.ROOT / path
            return p.read_text(errors="replace")[:EXCERPT_CHARS]
        text = hit.meta.get("summary") or ""
        main = Path(path) / hit.meta["main"] if path and hit.meta.get("main") else None
        if main is not None and main.is_file():
            lines = main.read_text(errors="replace").splitlines()
            start = next((i for i, ln in enumerate(lines) if ln.startswith("#include")), 0)
            text += "\n" + "\n".join(lines[max(0, start - 30):start + 20])
        return text[:EXCERPT_CHARS]
    except (OSError, KeyError):
        return ""


def retrieve(ask: Ask, report, n_rules: int = 3, n_examples: int = 2) -> tuple[list, str]:
    """The nearest rules and vetted CUTLASS examples in the search index (what `factdb query`
    answers, offline, filtered by the report's arch), each with an excerpt; and a note when
    the index could not answer (the prompt goes out without them then)."""
    from fact_db.store import index
    text = f"fused epilogue: {ask.why}; " + ", ".join(f"{o['op']} {o.get('dtype') or ''}".strip() for o in ask.ops)
    out = []
    try:
        for kind, n in (("rule", n_rules), ("example", n_examples)):
            for h in index.search(text, kind=kind, arch=report.arch, n=n).hits:
                out.append({"kind": h.kind, "id": h.id, "title": h.title, "path": h.meta.get("path", ""),
                            "ranked": h.why, "excerpt": _excerpt(h)})
    except (FactError, OSError) as e:
        return out, f"retrieval unavailable: {first_line(e)}"
    return out, ""


def prompt(ask: Ask, report, rules, retriever=retrieve) -> list:
    nearest = [{"rule": rid, "reason": m.reason} for rid, m in sorted(report.misses.items())
               if m is not None and m.node is not None and m.node.name in {o["name"] for o in ask.ops}][:6]
    retrieved, note = retriever(ask, report) if retriever is not None else ([], "retrieval off")
    spec, why = region_spec(ask, report)
    body = {
        "region": ask.ops, "why_uncovered": ask.why, "arch": report.arch, "gpu": report.gpu,
        "precision_policy": report.policy, "nearest_rules": nearest,
        "retrieved": retrieved, **({"retrieval_note": note} if note else {}),
        **({"kernel_contract": spec.contract()} if spec is not None else {"kernel_contract_note": why}),
        "templates": _template_catalogue(rules),
        "example_rule": _example_rule(),
    }
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": json.dumps(body, indent=1, default=str)}]


def _example_rule() -> str:
    p = paths.rules_dir() / "gemm_epilogue" / "gemm-bias-relu.yaml"
    return p.read_text() if p.exists() else ""


def _parse(text: str):
    t = text.strip()
    m = re.match(r"^```(?:json)?\s*(.*?)\s*```$", t, re.S)
    if m:
        t = m.group(1)
    return json.loads(t)


class Agent:
    """Runs the asks of one discovery report through the model.

    realize(region) -> (outcome, reason): tunes the region a proposed rule matched and says
    whether it won ("accepted") or why not; default: accepted without realization (rules only).
    kernel_hooks: dict with compile(source, name) -> handle, verify(handle) -> bool or (bool, why),
    bench(handle) -> (kernel_s, eager_s), store(handle, source) -> None. Each may raise
    TimeoutError (or region.pipeline.NeedsGPU / NoToolchain). Without them, the real pipeline
    (region.pipeline.Pipeline: worker-subprocess compile, float64 verify, bench against eager,
    `registry` row) runs, its worker jobs through `runner(jobs) -> results` when one is given
    (as in the tuner's tests). `registry`: where accepted kernels go and where a region's
    kernel is looked up before any call (default: Registry.open(); False: none).
    """

    def __init__(self, llm: LLM, *, out_dir: Path | None = None, realize=None, kernel_hooks: dict | None = None,
                 log: Path | None = None, retriever=retrieve, registry=None, runner=None,
                 compile_timeout: float = 300.0):
        self.llm = llm
        self.retriever = retriever  # (ask, report) -> (documents, note); None: no retrieval
        self.out_dir = Path(out_dir) if out_dir else None
        self.realize = realize
        self.kernel_hooks = kernel_hooks
        self.runner = runner
        self.compile_timeout = compile_timeout
        self._registry = registry
        self._opened = None
        self.registry_note = ""
        self.log = Path(log) if log else paths.home() / "agent" / "proposals.jsonl"
        self.proposals: list = []

    def registry(self):
        if self._registry is False:
            return None
        if self._registry is None and self._opened is None:
            from fact_db.store.registry import Registry, RegistryError
            try:
                self._opened = Registry.open()
            except RegistryError as e:  # the model can still be asked; nothing is looked up or stored
                self._registry = False
                self.registry_note = f"registry unavailable: {e}"
                return None
        return self._registry or self._opened

    def _record(self, p: Proposal) -> Proposal:
        self.proposals.append(p)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("a") as f:
            f.write(json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **p.as_dict()}) + "\n")
        return p

    def run(self, report, rules, problem_spec: str | None = None) -> list:
        out = []
        try:
            for ask in asks(report, rules):
                out.append(self.one(ask, report, rules, problem_spec))
        finally:
            if self._opened is not None:
                self._opened.close()
                self._opened = None
        return out

    def _stored(self, ask: Ask, report) -> Proposal | None:
        """An accepted proposal from the registry's llm kernel for this region, if it has one."""
        spec, _ = region_spec(ask, report)
        reg = self.registry() if spec is not None else None
        row = region_family.stored(reg, spec, build_arch(report.arch), report.gpu) if reg is not None else None
        if row is None:
            return None
        return Proposal(ask.node, "kernel", "accepted", f"the registry has llm kernel {row.label} for this region "
                        f"({spec.summary()}, {row.device_name or row.key.gpu}: {_us(row.time_ms)} vs eager "
                        f"{_us(row.baseline_ms)}): no call", registry=row.digest)

    def one(self, ask: Ask, report, rules, problem_spec) -> Proposal:
        hit = self._stored(ask, report)
        if hit is not None:
            return self._record(hit)
        before = self.llm.usage.cached
        try:
            text = self.llm.chat(prompt(ask, report, rules, self.retriever), region=ask.node)
        except LLMError as e:
            return self._record(Proposal(ask.node, "?", "timeout" if e.reason == "timeout" else "no reply", str(e)))
        cached = self.llm.usage.cached > before
        try:
            reply = _parse(text)
        except (json.JSONDecodeError, ValueError) as e:
            return self._record(Proposal(ask.node, "?", "malformed", f"reply is not JSON: {e}", cached=cached))
        try:
            jsonschema.validate(reply, REPLY_SCHEMA)
        except jsonschema.ValidationError as e:
            where = "/".join(str(x) for x in e.absolute_path) or "(reply)"
            return self._record(Proposal(ask.node, str(reply.get("kind", "?")) if isinstance(reply, dict) else "?",
                                         "schema-invalid", f"reply field {where}: {e.message}", cached=cached))
        if reply["kind"] == "rule":
            p = self._rule(ask, reply, report, problem_spec)
        else:
            p = self._kernel(ask, reply, report)
        p.cached = cached
        return self._record(p)

    # -- rule proposals ---------------------------------------------------------------------
    def _rule(self, ask, reply, report, problem_spec) -> Proposal:
        from fact_db.discovery.discover import analyse
        from fact_db.discovery.fixture import run_rule_fixtures
        from fact_db.discovery.rules import _collect, load_rules, yaml_files

        try:
            data = yaml.safe_load(reply["rule"])
        except yaml.YAMLError as e:
            return Proposal(ask.node, "rule", "refused",
                            f"rule YAML refused (only plain YAML, no tags): {first_line(e, None)}")
        if not isinstance(data, dict):
            return Proposal(ask.node, "rule", "schema-invalid", "rule YAML is not a mapping")
        rid = data.get("id")
        if not isinstance(rid, str) or not _ID.match(rid):
            return Proposal(ask.node, "rule", "refused", f"rule id {rid!r} is not a plain name (a-z, 0-9, -); "
                            "it would name a file outside the proposal's directory")
        if not isinstance(data.get("fixture"), str):
            return Proposal(ask.node, "rule", "schema-invalid", f"rule {rid}: field `fixture` is missing; it must be `{rid}.py`", rid)
        if data.get("fixture") != f"{rid}.py":
            return Proposal(ask.node, "rule", "refused", f"rule {rid}: fixture {data.get('fixture')!r} must be `{rid}.py` "
                            "beside the rule; nothing is written outside the proposal's directory", rid)
        with tempfile.TemporaryDirectory(prefix="factdb-agent-") as tmp:
            root = Path(tmp) / "rules"
            shutil.copytree(paths.rules_dir(), root, ignore=shutil.ignore_patterns("__pycache__"))
            d = root / "agent"
            d.mkdir(exist_ok=True)
            (d / f"{rid}.yaml").write_text(reply["rule"])
            (d / f"{rid}.py").write_text(reply["fixture"])
            _, _, faults = _collect(yaml_files([root]))  # `rules validate` on the tree with the proposal
            if faults:
                msg = "; ".join(str(f) for f in faults[:3]).replace(str(root) + "/", "")
                return Proposal(ask.node, "rule", "schema-invalid", f"rule {rid} does not validate: {msg}", rid)
            rs = load_rules(root)
            rule = rs.get(rid)
            bad = [o for o in run_rule_fixtures(rs, [rule]) if not o.ok]
            if bad:
                return Proposal(ask.node, "rule", "fixture failed",
                                f"rule {rid}: {len(bad)} fixture case(s) fail, first: {bad[0].case.cls}: {bad[0].detail}", rid)
            rep = analyse(report.graph, rs, arch=report.arch, gpu=report.gpu, policy=report.policy)
            hit = [r for r in rep.regions if r.rule == rid and ask.node in r.nodes]
            if not hit:
                return Proposal(ask.node, "rule", "no match", f"rule {rid} passes its fixture but does not match "
                                f"the region at {ask.node} in this model")
            if self.realize is not None:
                outcome, reason = self.realize(hit[0])
                if outcome != "accepted":
                    return Proposal(ask.node, "rule", outcome, f"rule {rid}: {reason}", rid)
            files = []
            if self.out_dir is not None:
                dest = self.out_dir / "rules" / (rule.family if _ID.match(rule.family or "") else "agent")
                dest.mkdir(parents=True, exist_ok=True)
                for suffix in (".yaml", ".py"):
                    shutil.copyfile(d / f"{rid}{suffix}", dest / f"{rid}{suffix}")
                    files.append(str(dest / f"{rid}{suffix}"))
            return Proposal(ask.node, "rule", "accepted", f"rule {rid} validates, passes its fixture and matches "
                            f"{hit[0].output} ({hit[0].shape})", rid, files)

    # -- kernel proposals -------------------------------------------------------------------
    def _kernel(self, ask, reply, report) -> Proposal:
        from fact_db.kernels.region.pipeline import NeedsGPU, NoToolchain, Pipeline
        from fact_db.kernels.region.source import check_source
        name = reply["name"]
        why = check_source(reply["source"])
        if why:
            return Proposal(ask.node, "kernel", "refused", f"kernel {name} refused before compiling: {why}")
        pipe = None
        h = self.kernel_hooks
        if not h:
            spec, why = region_spec(ask, report)
            if spec is None:
                return Proposal(ask.node, "kernel", "refused", f"kernel {name}: {why}")
            pipe = Pipeline(spec, arch=build_arch(report.arch), gpu=report.gpu, registry=self.registry(),
                            runner=self.runner, compile_timeout=self.compile_timeout, model=self.llm.config.model,
                            explanation=reply.get("explanation", ""))
            h = pipe.hooks()
        try:
            try:
                handle = h["compile"](reply["source"], name)
            except (TimeoutError, NeedsGPU):
                raise
            except NoToolchain as e:
                return Proposal(ask.node, "kernel", "no toolchain", f"kernel {name} was not compiled: {e}")
            except Exception as e:  # noqa: BLE001  (the compiler's message is the outcome's reason)
                return Proposal(ask.node, "kernel", "compile error", f"kernel {name} does not compile: {str(e)[:1500]}")
            v = h["verify"](handle)
            ok, detail = v if isinstance(v, tuple) else (bool(v), "")
            if not ok:
                return Proposal(ask.node, "kernel", "wrong result", f"kernel {name} disagrees with the float64 "
                                f"reference" + (f": {detail}" if detail else ""))
            ks, es = h["bench"](handle)
            if ks >= es:
                return Proposal(ask.node, "kernel", "slower than eager", f"kernel {name}: {ks * 1e6:.1f} us, eager {es * 1e6:.1f} us")
            h["store"](handle, reply["source"])
            digest = ""
            if pipe is not None and pipe.registry is not None:
                digest = pipe.spec.digest(pipe.arch, pipe.result.get("device") or pipe.gpu)
            where = f"stored in the registry (region kernel {digest[:12]}) with provenance llm" if digest or \
                pipe is None else f"not stored ({self.registry_note or 'no registry'})"
            return Proposal(ask.node, "kernel", "accepted", f"kernel {name}: {ks * 1e6:.1f} us, eager {es * 1e6:.1f} us"
                            f"{'; ' + detail if detail else ''}; {where}", registry=digest)
        except TimeoutError as e:
            return Proposal(ask.node, "kernel", "timeout", f"kernel {name}: over its time limit ({e})")
        except NeedsGPU as e:
            return Proposal(ask.node, "kernel", "needs a GPU", f"kernel {name} compiled; {e}")
        finally:
            if pipe is not None:
                pipe.close()


def _us(ms) -> str:
    return f"{ms * 1e3:.1f} us" if ms is not None else "?"


def consult(problem: str, *, policy: str = "fp32", arch: str = "sm90", offline: bool = False,
            out_dir: Path | None = None, realize=None, registry=None, runner=None) -> dict:
    """`--llm` on optimize and realize: ask the configured model about what PROBLEM leaves to
    eager, before any tuning. Returns {configured, calls, cached, tokens, served, proposals,
    rule_files}: `rule_files` are the accepted rules' YAML files (written under `out_dir`,
    default $FACTDB_HOME/agent/accepted/), which the caller adds to the rule set it discovers
    with, so the accepted fusion is realized and composed like a shipped rule's. `kernels` are
    the accepted kernel proposals (stored in `registry`, default Registry.open(), table
    region_kernels; False: none), which `optimize` composes from the registry
    (realize.realize_region_kernels) where they beat what the rules realize."""
    from fact_db.discovery.discover import discover_problem
    from fact_db.discovery.rules import load_rules

    llm = LLM.open(offline=offline)
    if llm is None:
        return {"configured": False, "calls": 0, "cached": 0, "tokens": 0, "served": [], "proposals": [],
                "rule_files": [], "kernels": [],
                "note": "offline" if offline else "no language model configured (FACTDB_LLM_BASE_URL/FACTDB_LLM_MODEL or $FACTDB_HOME/llm.yaml)"}
    rs = load_rules()
    report = discover_problem(problem, arch=arch, policy=policy, rules=rs)
    out_dir = Path(out_dir) if out_dir else paths.home() / "agent" / "accepted"
    props = Agent(llm, out_dir=out_dir, realize=realize, registry=registry, runner=runner).run(report, rs, problem)
    files = [f for p in props if p.outcome == "accepted" for f in p.files if f.endswith(".yaml")]
    kernels = [{"region": p.region, "registry": p.registry, "reason": p.reason} for p in props
               if p.outcome == "accepted" and p.kind == "kernel"]
    return {"configured": True, **llm.usage.as_dict(), "proposals": [p.as_dict() for p in props],
            "rule_files": files, "kernels": kernels}


def summary_line(info: dict) -> str:
    if not info["configured"]:
        return f"llm: not used ({info['note']})"
    acc = [p for p in info["proposals"] if p["outcome"] == "accepted"]
    return (f"llm: {info['calls']} call(s), {info['cached']} from cache, {info['tokens']} tokens; served "
            f"{', '.join(info['served']) or 'no region'}; {len(info['proposals'])} proposal(s), {len(acc)} accepted"
            + "".join(f"\n  {p['region']}: {p['outcome']}: {p['reason']}" for p in info["proposals"])
            + "".join(f"\n  {k['region']}: accepted llm kernel {k['registry'][:12]} is in the registry; "
                      "optimize composes it where it beats the rule kernels of its region"
                      for k in info.get("kernels", []) if k["registry"]))


def region_realizer(report, policy: str, *, registry=None, arch: str = "sm90a", gpu: str | None = None,
                    max_candidates: int = 4, runner=None, progress: bool = False):
    """A `realize` hook for Agent: tunes the region a proposed rule matched (through
    realize.realize_regions, so `runner` injects the GPU steps as in the tuner's tests) and
    accepts the rule only if a kernel verified and beat eager. Winners are stored in `registry`
    by the tuner as for any region. The Realized of each call is kept in `.results`."""
    import dataclasses

    from fact_db.realization.realize import realize_regions

    def hook(region):
        rep = dataclasses.replace(report, regions=[region])
        rz = realize_regions(rep, policy, registry=registry, arch=arch, gpu=gpu, max_candidates=max_candidates,
                             runner=runner, progress=progress)[0]
        hook.results.append(rz)
        if rz.workload is None:
            return "refused", f"no GEMM template realizes it: {'; '.join(rz.notes) or 'not a GEMM-family region'}"
        if not rz.impl.kernel or rz.ms is None:
            why = "; ".join(n for n in [rz.impl.note, *rz.notes] if n) or "no candidate verified and beat eager"
            return "slower than eager", f"{rz.region.shape}: eager serves it ({why})"
        return "accepted", (f"{rz.region.shape}: {rz.impl.label} {rz.ms:.3f} ms vs eager "
                            f"{rz.eager_ms:.3f} ms" if rz.eager_ms else f"{rz.impl.label} {rz.ms:.3f} ms")

    hook.results = []
    return hook
