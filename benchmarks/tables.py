#!/usr/bin/env python3
"""Regenerate the results tables in the docs from benchmarks/results/*.json.

A table lives in a markdown file between two markers, and everything between them is
this script's output:

    <!-- table:e2e -->
    ...
    <!-- /table:e2e -->

so a figure has one owner: its results JSON. Edit the JSON (or the table's definition
below), never the block.

    python benchmarks/tables.py                  # rewrite the blocks of README.md and docs/*.md
    python benchmarks/tables.py --check          # exit 1 naming each block that differs from the JSON
    python benchmarks/tables.py --check docs/kernels.md
    python benchmarks/tables.py --list           # the tables this script knows, and their JSON files

Standard library only: the docs test runs it without torch or a GPU.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import posixpath
import re
import string
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
POLICY_ORDER = ["fp32", "tf32x3", "tf32", "bf16", "fp16"]
DASH = "–"

# --------------------------------------------------------------------------------------
# The tables, as data: which JSON files, how rows are read from them (`rows`, a reader
# below), which rows are kept (`select`), their order, and the columns (header, cell
# template over the row's fields; `{x:ms}` and friends are the formats in _Cells).
# Every table ends with the GPU (or machine), the date and a link to the JSON file.
# --------------------------------------------------------------------------------------

_E2E_FILES = ["*-e2e*.json"]
# A warm re-run times the registry answering, not tuning; `--no-split-weights` is an
# ablation of a default option. Both stay in the history table, not in the latest one.
_E2E_NOT_LATEST = ["*-warm-rerun.json", "*-no-split-weights.json"]
_HEADLINE_PROBLEMS = ["mingpt_block", "llama_block", "hf_llama_decoder", "hf_gpt2_block",
                      "hf_opt_decoder", "hf_vit_layer", "hf_bert_layer", "square_gemm_fp32"]
_WHERE = [("GPU", "{gpu}"), ("date", "{date}"), ("JSON", "{link}")]
_WHERE_CPU = [("machine", "{gpu}"), ("date", "{date}"), ("JSON", "{link}")]

# the KernelBench tables' columns: per level and policy
_KB_COLUMNS = [("level", "{level}"), ("policy", "`{policy}`"), ("problems", "{problems}"),
               ("answered (no traceback, internal error or time-out)", "{answered}"),
               ("with a region", "{with_regions}"), ("correct (KernelBench's check)", "{correct}"),
               ("fast_p vs eager, p = 0 / 1 / 1.5 / 2", "{fast_eager}"),
               ("fast_p vs torch.compile, p = 0 / 1 / 1.5 / 2", "{fast_compile}"),
               ("geometric mean of the correct rows: vs eager / vs torch.compile", "{geomean}"), *_WHERE_CPU]

TABLES: dict[str, dict] = {
    "e2e": {
        "about": "end to end, the newest run per problem and policy, less a warm re-run and an ablation",
        "files": _E2E_FILES, "exclude": _E2E_NOT_LATEST, "rows": "e2e",
        "select": "newest per problem, policy", "order": ["problem", "policy_rank"],
        "columns": [("problem", "`{problem}`"), ("policy", "`{policy}`"),
                    ("eager at the policy ms", "{baseline_ms:ms}"),
                    ("best torch.compile ms", "{peer}"), ("fact-db ms", "{fdb}"),
                    ("fact-db under torch.compile ms", "{fdb_compiled_ms:ms}"),
                    ("speedup", "**{speedup:x}**"), ("vs eager fp32", "{vs_fp32:x}"),
                    ("vs torch.compile", "{vs_peer:x}"), ("error vs float64 (eager's)", "{err}"),
                    ("peak MiB, held counted (of it held)", "{peak}"), ("eager peak MiB", "{eager_peak_mib:mib}"),
                    *_WHERE],
    },
    "e2e-history": {
        "about": "end to end, every row of every e2e JSON, oldest first",
        "files": _E2E_FILES, "rows": "e2e", "order": ["date", "stamp"],
        "columns": [("problem", "`{problem}`"), ("policy", "`{policy}`"),
                    ("eager at the policy ms", "{baseline_ms:ms}"), ("best torch.compile ms", "{peer}"),
                    ("fact-db ms", "{fdb}"), ("speedup", "{speedup:x}"),
                    ("error vs float64 (eager's)", "{err}"), ("peak MiB (held)", "{peak}"),
                    ("eager peak MiB", "{eager_peak_mib:mib}"), ("candidates a region", "{max_candidates}"),
                    ("commit", "{commit}"), *_WHERE],
    },
    "gemm-h100": {
        "about": "GEMM realization per problem and policy (`benchmarks/gemm_realize.py`)",
        "files": ["h100-2026-11-23.json"], "rows": "gemm",
        "columns": [("problem", "`{problem}`"), ("shape", "{shape}"), ("policy", "`{policy}`"),
                    ("epilogue", "{epilogue}"), ("fact-db ms", "{factdb_ms:ms}"),
                    ("baseline", "{baseline}"), ("baseline ms", "{baseline_ms:ms}"),
                    ("speedup", "**{speedup:x}**"), ("error (baseline's)", "{rel_err:err} ({baseline_rel_err:err})"),
                    ("winner", "{kernel}"), ("GPU", "{gpu}"), ("date", "{date}"), ("JSON", "{link}")],
    },
    "fp32tc-presplit": {
        "about": "fp32-operand GEMM variants on TF32 tensor cores (`benchmarks/fp32tc_variants.py`)",
        "files": ["*-fp32tc-presplit.json"], "rows": "results",
        "columns": [("problem", "`{problem}`"), ("shape", "{shape}"), ("policy", "`{policy}`"),
                    ("kernel", "{kernel}"), ("ms", "{ms:ms}"), ("over eager", "{speedup:x}"),
                    ("error (eager's)", "{rel_err:err} ({eager_rel_err:err})"), ("status", "{status}"),
                    *_WHERE],
    },
    "ncu-fp32tc": {
        "about": "Nsight Compute's figures for one fp32-class GEMM launch (`benchmarks/ncu_profile.py gemm`)",
        "files": ["*-ncu-mingpt_*.json", "*-ncu-square4096*.json"], "rows": "ncu", "order": ["shape", "kernel"],
        "columns": [("shape", "{shape}"), ("kernel", "{kernel}"), ("us", "{us:frac}"),
                    ("TFLOP/s (fp32 results)", "{tflops:frac}"), ("tensor pipe busy %", "{tensor_pct:frac}"),
                    ("LSU wavefronts % of peak", "{lsu_pct:frac}"), ("L2 %", "{l2_pct:frac}"),
                    ("DRAM %", "{dram_pct:frac}"),
                    ("SM clock GHz", "{ghz:frac}"), ("ncu's limiter", "{limiter}"), *_WHERE],
    },
    "ncu-gemm-op": {
        "about": "Nsight Compute's figures for every launch of one GEMM call as the tuner times it "
                 "(`benchmarks/ncu_profile.py gemm-op`: a pass, a copy, the kernel, a reduction; cuBLAS as `eager`)",
        "files": ["*-ncu-op-*.json"], "rows": "ncu", "order": ["shape", "policy", "kernel"],
        "columns": [("shape", "{shape}"), ("policy", "`{policy}`"), ("call", "{kernel}"), ("launch", "{launch}"),
                    ("us", "{us:frac}"), ("call us", "{total_us:frac}"), ("call TFLOP/s", "{total_tflops:frac}"),
                    ("tensor pipe busy %", "{tensor_pct:frac}"), ("issue slots busy %", "{issue_pct:frac}"),
                    ("DRAM %", "{dram_pct:frac}"), ("L1 %", "{l1_pct:frac}"), ("ncu's limiter", "{limiter}"),
                    *_WHERE],
    },
    "multi-gpu": {
        "about": "the verify-and-time phase of one tune on one and two GPUs (`benchmarks/multi_gpu_sweep.py`)",
        "files": ["*-multigpu.json"], "rows": "multigpu",
        "columns": [("problem", "{problem}"), ("policy", "`{policy}`"), ("candidates", "{candidates}"),
                    ("1 GPU s", "{one_gpu_s:s}"), ("2 GPUs s", "{two_gpu_s:s}"), ("speedup", "**{speedup:x}**"),
                    ("target", ">= {target:x}"), ("each call starting its own workers", "{cold_speedup:x}"),
                    ("winner, 1 GPU / 2 GPUs", "{winner_one_gpu} / {winner_two_gpu}"), *_WHERE],
    },
    "fmha-fp32tc": {
        "about": "fp32 attention on TF32 tensor cores (`benchmarks/fmha_fp32tc_check.py`)",
        "files": ["*-fmha-fp32tc.json"], "rows": "fmha_fp32tc", "select": "newest file per gpu",
        "columns": [("variant", "{name}"), ("ms", "{ms:ms}"), ("vs SDPA fp32", "{vs_sdpa:x}"),
                    ("worst error / eager fp32's", "{worst:ratio}"), ("checks", "{checks}"),
                    ("every check in the fp32 bound", "{fp32_bound}"),
                    ("every check in the tf32x3 bound", "{tf32x3_bound}"), *_WHERE],
    },
    "attention-bf16": {
        "about": "bf16 attention: SDPA against the fmha_sm90 family (`benchmarks/attention_realize.py`)",
        "files": ["*-attention.json"], "rows": "attention",
        "columns": [("shape (causal, bf16)", "{shape} ({workload})"), ("SDPA ms (TFLOP/s)", "{sdpa_ms:ms} ({sdpa_tflops:tflops})"),
                    ("best fmha_sm90 ms", "{fmha_ms:ms} ({fmha})"), ("fmha vs SDPA", "{fmha_vs_sdpa:x}"),
                    ("fastest candidate", "{fastest}"), *_WHERE],
    },
    "norm": {
        "about": "residual add + LayerNorm / RMSNorm against eager (`benchmarks/norm_realize.py`)",
        "files": ["*-norm.json"], "rows": "norm",
        "columns": [("workload", "{workload}"), ("eager ms", "{eager_ms:ms}"), ("fact-db ms", "{best_ms:ms}"),
                    ("speedup", "**{speedup:x}**"), ("kernel", "{kernel}"), ("error (eager's)", "{err:err} ({eager_err:err})"),
                    *_WHERE],
    },
    "agent": {
        "about": "the agent's kernel proposals on a GPU (`benchmarks/agent_demo.py --part kernel`)",
        "files": ["*-agent*.json"], "rows": "agent",
        "columns": [("run", "{run}"), ("shape M x K -> N", "{shape}"), ("model calls", "{calls}"),
                    ("outcome", "{outcome}"), ("kernel us", "{time_us:us}"), ("eager us", "{eager_us:us}"),
                    ("error (eager's)", "{rel_err:err} ({eager_rel_err:err})"), ("wall s", "{wall_s:s}"), *_WHERE],
    },
    "agent-compose": {
        "about": "the accepted agent kernel composed end to end (`benchmarks/agent_demo.py --part kernel`)",
        "files": ["*-agent-kernel-compose.json"], "rows": "agent_compose",
        "columns": [("variant", "{name}"), ("ms", "{ms:ms}"), ("error vs float64", "{err:err}"), *_WHERE],
    },
    "kernelbench": {
        "about": "KernelBench per level and policy: the scoreboard (`factdb bench --kernelbench`) and the CPU plan "
                 "sweep (`benchmarks/kernelbench_cpu_sweep.py`)",
        "files": ["*-kernelbench*.json"], "rows": "kernelbench",
        "select": "newest per level, policy, timed", "order": ["timed", "level", "policy_rank"],
        "columns": _KB_COLUMNS,
    },
    "kernelbench-gpu": {
        "about": "KernelBench per level and policy, the GPU scoreboard's rows only (the README's; the CPU plan's "
                 "with them in docs/benchmarks.md)",
        "files": ["*-kernelbench*.json"], "rows": "kernelbench", "timed_only": True,
        "select": "newest per level, policy, timed", "order": ["level", "policy_rank"],
        "columns": _KB_COLUMNS,
    },
    "kernelbench-conv-l1": {
        "about": "KernelBench's level 1 convolutions, problem by problem, from the GPU scoreboards: times, what "
                 "fact-db returned and what ran each convolution",
        "files": ["*-kernelbench-*.json"], "rows": "kernelbench_conv",
        "select": "newest per problem, policy", "order": ["policy_rank", "number"],
        "columns": [("problem", "{id} `{short}`"), ("policy", "`{policy}`"), ("eager ms", "{eager_ms:ms}"),
                    ("torch.compile ms", "{compile_ms:ms}"), ("fact-db ms", "{factdb_ms:ms}"),
                    ("vs eager", "{speedup:x}"), ("vs torch.compile", "{speedup_vs_compile:x}"),
                    ("returned", "{returned}"), ("the convolution ran on", "{ran}"), *_WHERE],
    },
    "discover": {
        "about": "cold `factdb discover` and in-process discovery (`benchmarks/discover_speed.py`)",
        "files": ["discover-*.json"], "rows": "discover", "order": ["date", "file", "problem"],
        "columns": [("problem", "`{problem}`"), ("cold CLI s, median", "{cold_cli_s:s}"),
                    ("min-max s", "{cold_range}"), ("load average", "{load}"),
                    ("in process, first s", "{first_s:s}"), ("in process, later s", "{warm_s:s}"),
                    ("commit", "{commit}"), *_WHERE_CPU],
    },
    "retrieval": {
        "about": "recall of `factdb query` on 50 queries (`benchmarks/retrieval.py`)",
        "files": ["retrieval-*.json"], "rows": "retrieval",
        "columns": [("index", "{index}"), ("method", "{method}"), ("recall@1", "{r1:frac}"),
                    ("recall@5", "{r5:frac}"), ("MRR", "{mrr:frac}"),
                    ("target (hybrid)", "{target}"), *_WHERE_CPU],
    },
    "index-speed": {
        "about": "index build and query times (`benchmarks/index_speed.py`)",
        "files": ["index-*.json"], "rows": "measures",
        "measures": [
            ("`factdb index build`, rules and examples, cold", "build_cold_s", "s", "targets.build_cold_s"),
            ("the same with 100,000 kernels", "build_with_kernels.s", "s", None),
            ("`factdb query` with text, cold, model load included (median)", "cli_text_s.median_s", "s", "targets.cli_text_s"),
            ("`factdb query --op gemm --shape ...`, 100,000 kernels, whole CLI call (median)",
             "cli_lookup_s.median_s", "s", "targets.cli_lookup_s"),
            ("in-process search over 100,000 kernels, median", "search_ms.median", "msv", "targets.search_median_ms"),
            ("the same, p90", "search_ms.p90", "msv", None),
        ],
        "columns": [("measure", "{label}"), ("result", "{value}"), ("target", "{target}"), *_WHERE_CPU],
    },
    "team-registry": {
        "about": "a team registry: its local cache and its PostgreSQL server on loopback (`benchmarks/registry_shared_speed.py`)",
        "files": ["team-registry-*.json"], "rows": "measures",
        "measures": [
            ("a lookup answered by the cache, its connection open from the call before (median)",
             "cache_hit_ms.median", "msv", "targets.cache_hit_ms"),
            ("the same, the cache's file opened again after 2 s idle (median)", "cache_hit_cold_ms.median", "msv", None),
            ("a lookup answered by the server, loopback, pooled connection (median)", "server_hit_ms.median", "msv",
             "targets.server_hit_ms"),
            ("a cache miss answered by the server, the row written into the cache (median)", "cache_miss_ms.median",
             "msv", None),
            ("a put: merged in the server, copied into the cache (median)", "put_ms.median", "msv", None),
            ("taking and releasing a lease (median)", "claim_ms.median", "msv", None),
        ],
        "columns": [("measure", "{label}"), ("result", "{value}"), ("target", "{target}"), *_WHERE_CPU],
    },
    "compile-peers": {
        "about": "issue 25: fact-db against its peers in one process (benchmarks/compile_peers.py), the newest "
                 "run per problem and policy",
        "files": ["*-compile-peers-*.json"], "rows": "compile_peers", "select": "newest per problem, policy",
        "order": ["problem", "policy_rank"],
        "columns": [("problem", "`{problem}`"), ("policy", "`{policy}`"), ("eager ms", "{eager_ms:ms}"),
                    ("best peer ms", "{best_peer}"), ("fact-db ms (what it returned)", "{fdb}"),
                    ("vs eager", "{vs_eager:x}"), ("vs torch.compile", "{vs_compile:x}"),
                    ("vs best peer", "**{vs_best:x}**"), ('backend="factdb" ms: default / max-autotune', "{backend}"),
                    ("compile s: torch.compile / backend", "{compile_s}"), ("error (eager's)", "{err}"),
                    ("held MiB", "{held:mib}"), *_WHERE],
    },
    "compile-peers-coverage": {
        "about": "issue 25: every pair of benchmarks/peers_set.txt (each problem at the policies it runs), its newest "
                 "compile_peers.py row against the best peer, or none yet",
        "files": ["*-compile-peers-*.json"], "rows": "compile_peers", "select": "newest per problem, policy",
        "set": "benchmarks/peers_set.txt", "order": ["problem", "policy_rank"],
        "columns": [("problem", "`{problem}`"), ("policy", "`{policy}`"), ("fact-db returned", "{returned}"),
                    ("vs best peer", "{vs_best:x3}"), ("at least 0.98x", "{status}"), *_WHERE],
    },
    "compile-peers-history": {
        "about": "issue 25: every compile_peers.py run, oldest first",
        "files": ["*-compile-peers-*.json"], "rows": "compile_peers", "order": ["date", "problem", "policy_rank"],
        "columns": [("problem", "`{problem}`"), ("policy", "`{policy}`"), ("eager ms", "{eager_ms:ms}"),
                    ("torch.compile ms", "{compile_ms:ms}"), ("fact-db ms (what it returned)", "{fdb}"),
                    ("vs torch.compile", "{vs_compile:x}"), ('backend="factdb" ms', "{backend_ms:ms}"),
                    ("compile s: torch.compile / backend", "{compile_s}"), ("error (eager's)", "{err}"),
                    ("held MiB", "{held:mib}"), *_WHERE],
    },
    "registry-speed": {
        "about": "registry lookups with 100,000 rows (`benchmarks/registry_speed.py`)",
        "files": ["registry-*.json"], "rows": "measures",
        "measures": [
            ("lookup, opening the file each time (median)", "lookup_ms.per_call.median", "msv", "lookup_ms.target_median_ms"),
            ("lookup inside `Registry.pinned()` (median)", "lookup_ms.pinned.median", "msv", None),
            ("fresh process: import the registry, open, look up one key (median)",
             "process_s.registry_only.wall_median_s", "s", "process_s.target_s"),
            ("`import fact_db` (torch too), open, look up (median)", "process_s.via_import_fact_db.wall_median_s", "s", None),
            ("write one kernel row (median)", "write_ms.put_kernel.median", "msv", None),
            ("import 1,000 rows", "write_ms.import_1000_rows_s", "s", None),
        ],
        "columns": [("measure", "{label}"), ("result", "{value}"), ("target", "{target}"), *_WHERE_CPU],
    },
}


# --------------------------------------------------------------------------------------
# Readers: one JSON document -> rows (flat dicts). Every row gets gpu, date, file.
# --------------------------------------------------------------------------------------

def _date(doc: dict, name: str) -> str:
    d = doc.get("date")
    if isinstance(d, str) and re.match(r"\d{4}-\d{2}-\d{2}", d):
        return d[:10]
    m = re.search(r"\d{4}-\d{2}-\d{2}", name)
    return f"{m.group(0)} (file name)" if m else DASH


def _gpu(doc: dict) -> str:
    machine = doc.get("machine") if isinstance(doc.get("machine"), dict) else {}
    dev = doc.get("device") or ""
    if not dev and isinstance(doc.get("gpu"), str) and doc["gpu"].startswith("NVIDIA"):
        dev = doc["gpu"]
    if dev and dev != "cpu":
        dev = dev.replace("NVIDIA ", "")
        n = doc.get("gpus")
        return f"{n}x {dev}" if isinstance(n, int) and n > 1 else dev
    if machine:
        return f"{machine.get('cpu', 'CPU')}, {machine.get('cores', '?')} cores"
    return DASH


def _short(commit) -> str:
    if not isinstance(commit, str) or not commit:
        return DASH
    m = re.match(r"[0-9a-f]{7,40}", commit)
    if not m:
        return commit
    return m.group(0)[:7] + ("+dirty" if "dirty" in commit or "uncommitted" in commit else "")


def _get(doc, path: str):
    for part in path.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return None
        doc = doc[part]
    return doc


def _base(doc: dict, name: str) -> dict:
    return {"gpu": _gpu(doc), "date": _date(doc, name), "file": name}


def _variant(r: dict, name: str):
    for v in r.get("variants") or []:
        if v.get("name") == name:
            return v.get("ms")
    return None


def rows_e2e(doc, name):
    for r in doc["results"]:
        row = {**r, **_base(doc, name)}
        m = re.search(r"(\d{8}-\d{6})$", r.get("artifact") or "")
        row["stamp"] = m.group(1) if m else ""
        row["commit"] = _short(r.get("commit") or doc.get("commit"))
        row["max_candidates"] = doc.get("max_candidates", DASH)
        peers = [(v["ms"], v["name"][len("torch.compile"):].strip() or "default")
                 for v in r.get("variants") or [] if v.get("name", "").startswith("torch.compile") and v.get("ms")]
        best = min(peers) if peers else None
        row["peer_ms"] = best[0] if best else None
        row["peer"] = f"{_fmt_ms(best[0])} ({best[1]})" if best else DASH
        row["vs_peer"] = best[0] / r["factdb_ms"] if best and r.get("factdb_ms") else None
        row["fdb_compiled_ms"] = _variant(r, "fact-db + torch.compile")
        graph = r.get("cuda_graph")
        op_by_op = _variant(r, "fact-db, no CUDA graph")
        # what the returned module ran: the run's own word (`returned`, since the choice among
        # eager, torch.compile and the composed module), else eager where a variant says the
        # composed module was not returned (older runs)
        returned = r.get("returned") or ""
        if returned:
            returned_eager = returned.split(" (")[0] == "eager"  # not "eager, CUDA graph": a module of its own
            tag = "" if returned in ("composed", "composed, CUDA graph") else f" ({returned} returned)"
        else:
            returned_eager = any("not returned" in (v.get("name") or "") for v in r.get("variants") or [])
            tag = " (eager returned)" if returned_eager else ""
        short = tag or (" (CUDA graph)" if graph else "")
        long = f" (CUDA graph; {_fmt_ms(op_by_op)} op by op)" if graph and op_by_op and not returned_eager else short
        if r.get("verified") is False:
            short = long = " (failed verification: eager returned)"
        row["graph_tag"] = short
        row["fdb"] = _fmt_ms(r.get("factdb_ms")) + long
        row["err"] = f"{_fmt_err(r.get('rel_err'))} ({_fmt_err(r.get('baseline_rel_err'))})"
        held = r.get("held_mib")
        row["peak"] = (f"{_fmt_mib(r.get('peak_mib'))} ({_fmt_mib(held)})" if held is not None
                       else f"{_fmt_mib(r.get('peak_mib'))} (not counted)")
        yield row


def rows_gemm(doc, name):
    for r in doc["results"]:
        row = {**r, **_base(doc, name)}
        m = re.search(r"\d{4}-\d{2}-\d{2}", r.get("run") or "")
        if m and m.group(0) != row["date"]:
            row["date"] = f"{row['date']} (row measured {m.group(0)})"
        yield row


def rows_results(doc, name):
    for r in doc["results"]:
        yield {**r, **_base(doc, name)}


def _launch_name(one) -> str:
    """A profiled launch's kernel, short: CUTLASS's device_kernel as such, others up to their
    argument list (cuBLAS's names say their algorithm and tile)."""
    k = (one.get("kernel") or "").removeprefix("void ")
    if k.startswith(("cutlass::device_kernel", "device_kernel")):
        return "CUTLASS device_kernel"
    return k.split("(")[0][:70]


def rows_ncu(doc, name):
    """One row per profiled launch of benchmarks/ncu_profile.py: the sections' figures and the
    counters that say which unit binds (tensor pipe busy, shared-memory wavefronts, SM clock)."""
    for one in doc["launches"]:
        c = one.get("counters") or {}

        def counter(key):
            v = c.get(key)
            return v.get("value") if isinstance(v, dict) else v
        clock = counter("gpc__cycles_elapsed.avg.per_second")
        yield {**_base(doc, name), "kernel": doc["kernel"], "launch": _launch_name(one),
               "policy": doc.get("policy", DASH), "total_us": doc.get("total_us"),
               "total_tflops": doc.get("total_tflops"), "issue_pct": one.get("issue_slots_busy_pct"),
               "l1_pct": one.get("l1_throughput_pct"), "shape": doc["shape"], "us": one.get("duration_us"),
               "tflops": one.get("tflops"),
               "tensor_pct": counter("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"),
               "lsu_pct": counter("l1tex__data_pipe_lsu_wavefronts.avg.pct_of_peak_sustained_elapsed"),
               "dram_pct": one.get("dram_throughput_pct"), "l2_pct": one.get("l2_throughput_pct"),
               "limiter": one.get("limiter"),
               "ghz": clock if clock is None or clock < 10 else clock / 1e9}


def rows_multigpu(doc, name):
    for r in doc["results"]:
        yield {**r, **_base(doc, name), "cold_speedup": _get(r, "cold_pools.speedup")}


def rows_fmha_fp32tc(doc, name):
    checks: dict[str, list] = {}
    for c in doc.get("checks") or []:
        checks.setdefault(c["variant"], []).append(c)
    # each shape's SDPA fp32 (timings without a shape are minGPT's, the first files')
    sdpa_of = {t.get("shape", "mingpt"): t["ms"] for t in doc["timings"] if t["name"].startswith("sdpa_fp32")}
    for t in doc["timings"]:
        cs = checks.get(t["name"].split(" @")[0], [])   # a variant's checks, whatever shape it is timed at
        sdpa = sdpa_of.get(t.get("shape", "mingpt"))
        yield {**_base(doc, name), "name": t["name"], "ms": t["ms"],
               "vs_sdpa": sdpa / t["ms"] if sdpa else None,
               "worst": max((c["err"] / c["eager_fp32_err"] for c in cs), default=None),
               "checks": len(cs) if cs else DASH,
               "fp32_bound": ("yes" if all(c["fp32_bound"] for c in cs) else "no") if cs else DASH,
               "tf32x3_bound": ("yes" if all(c["tf32x3_bound"] for c in cs) else "no") if cs else DASH}


def rows_attention(doc, name):
    shapes: dict[str, list] = {}
    for r in doc["results"]:
        shapes.setdefault(r["shape"], []).append(r)
    for shape, rs in shapes.items():
        ok = [r for r in rs if r.get("status") == "ok" and r.get("ms")]
        w = rs[0]["workload"]
        sdpa = next((r for r in ok if r["candidate"] == "sdpa"), None)
        fmha = min((r for r in ok if r["candidate"].startswith("fmha")), key=lambda r: r["ms"], default=None)
        fastest = min(ok, key=lambda r: r["ms"], default=None)
        heads = f"{w['heads']}" if w["heads"] == w["kv_heads"] else f"{w['heads']}/{w['kv_heads']}"
        yield {**_base(doc, name), "shape": shape,
               "workload": f"{w['batch']}x{heads} heads, {w['lq']} tokens, d={w['d']}",
               "sdpa_ms": sdpa and sdpa["ms"], "sdpa_tflops": sdpa and sdpa.get("tflops"),
               "fmha_ms": fmha and fmha["ms"], "fmha": fmha["candidate"] if fmha else DASH,
               "fmha_vs_sdpa": fmha["ms"] and sdpa["ms"] / fmha["ms"] if fmha and sdpa else None,
               "fastest": fastest["candidate"] if fastest else DASH}


def rows_norm(doc, name):
    for r in doc["results"]:
        w = r["workload"]
        what = f"{'residual add + ' if w['residual'] else ''}{w['kind']}"
        extra = ", sum written" if w.get("write_sum") else ""
        yield {**r, **_base(doc, name),
               "workload": f"{what}, {w['rows']}x{w['width']}, {w['dtype']}{extra}"}


def rows_agent(doc, name):
    for r in doc.get("runs") or []:
        if r.get("part") != "kernel":
            continue
        reg = (r.get("registry") or [{}])[0]
        props = r.get("proposals") or [{}]
        m, k, n = (r.get("shape") or [None] * 3)[:3]
        yield {**_base(doc, name), "run": r.get("run"), "shape": f"{m}x{k} -> {n}",
               "calls": r.get("calls"), "outcome": props[0].get("outcome", DASH),
               "time_us": reg.get("time_ms"), "eager_us": reg.get("eager_ms"),
               "rel_err": reg.get("rel_err"), "eager_rel_err": reg.get("eager_rel_err"), "wall_s": r.get("wall_s")}


def rows_agent_compose(doc, name):
    for r in doc.get("runs") or []:
        if r.get("part") == "compose":
            for v in r.get("variants") or []:
                yield {**_base(doc, name), **v}


def _fast(d) -> str:
    if not d:
        return "not timed (no GPU)"
    return " / ".join(DASH if d.get(p) is None else f"{d[p]:.2f}" for p in ("0", "1", "1.5", "2"))


def _geomean(g) -> str:
    """A level's geometric means (scoreboard.summary): `1.80x / 0.97x`, with the mean against
    torch.compile without the rows whose torch.compile fact-db refused where there are any."""
    if not g or g.get("vs_eager") is None:
        return DASH if g else "not in this file's summary (merge it again)"
    out = f"{g['vs_eager']:.2f}x / {g['vs_compile']:.2f}x" if g.get("vs_compile") else f"{g['vs_eager']:.2f}x / {DASH}"
    if g.get("compile_refused") and g.get("vs_compile_verified"):
        out += f" ({g['vs_compile_verified']:.2f}x without the {g['compile_refused']} whose torch.compile failed verification)"
    return out


def _gpu_model(device: str, default: str) -> str:
    """The GPU model in a device name (NVIDIA H100 80GB HBM3 -> H100), else `default`."""
    m = re.search(r"\b([A-Z]\d{2,4}[A-Z]?)\b", device or "")
    return m.group(1) if m else default


def _kb_devices(doc, level, policy) -> dict:
    """{"gpu": ...} from a level's rows: where they ran on more than one GPU model (parts on other
    hosts) each with its row count, as `H200 (28), H100 (11)`; where on one, that model (a
    merged scoreboard's own device is its newest part's, which may not have run this level);
    {} where no row names its device."""
    import re
    count: dict = {}
    for r in doc.get("results") or []:
        if str(r.get("level")) == str(level) and r.get("policy") == policy and r.get("device"):
            gpu = _gpu_model(r["device"], r["device"])
            count[gpu] = count.get(gpu, 0) + 1
    if not count:
        return {}
    if len(count) == 1:
        return {"gpu": next(iter(count))}
    return {"gpu": ", ".join(f"{g} ({n})" for g, n in sorted(count.items(), key=lambda kv: -kv[1]))}


def rows_kernelbench(doc, name):
    """A scoreboard JSON (its `levels` summary), or the CPU plan sweep's (counted from its rows)."""
    base = _base(doc, name)
    if "levels" in doc:
        for pol, levels in doc["levels"].items():
            for level, s in levels.items():
                timed = s["fast_p"]["vs_eager"] is not None
                size = (doc.get("set_size") or {}).get(level)  # a part of a set: how much of it has run
                rerun = sum(1 for r in doc.get("to_rerun") or [] if r["id"].startswith(f"L{level}-"))
                yield {**base, **_kb_devices(doc, level, pol), "level": int(level), "policy": pol,
                       "problems": f"{s['problems']} of {size} (a part)" if size and size > s["problems"] else s["problems"],
                       "answered": f"{s['problems'] - s['failed']}" + (f" ({rerun} more to rerun)" if rerun else ""),
                       "with_regions": s["with_regions"],
                       "correct": s["correct"] if timed else "– (no GPU)", "timed": timed,
                       "fast_eager": _fast(s["fast_p"]["vs_eager"]), "fast_compile": _fast(s["fast_p"]["vs_compile"]),
                       "geomean": _geomean(s.get("geomean")) if timed else "not timed (no GPU)"}
        return
    groups: dict[tuple, list] = {}
    for r in doc["results"]:
        groups.setdefault((r["level"], r["policy"]), []).append(r)
    for (level, pol), rs in sorted(groups.items()):
        ok = [r for r in rs if r["exit_code"] == 0 and not (r["timed_out"] or r["traceback"] or r["internal_error"])]
        yield {**base, "level": level, "policy": pol, "problems": len(rs),
               "answered": f"{len(ok)} (plan, at most {max(r['seconds'] for r in rs):.0f} s)",
               "with_regions": sum(1 for r in rs if r.get("regions")), "correct": "– (no GPU)", "timed": False,
               "fast_eager": _fast(None), "fast_compile": _fast(None), "geomean": "not timed (no GPU)"}


def rows_kernelbench_conv(doc, name):
    """A GPU scoreboard's level 1 convolution rows, one per problem and policy (its own row's
    date and commit where it carries them: a merged scoreboard holds several runs)."""
    if not doc.get("timed"):
        return
    base = _base(doc, name)
    for r in doc.get("results") or []:
        if r.get("level") != 1 or "conv" not in r.get("name", ""):
            continue
        did = r.get("did") or {}
        regions = did.get("per_region") or []
        if r.get("status") != "ok":
            ran = f"not answered: {r.get('reason', '').split(' (')[0].split('; ')[0]}"
        elif not regions:
            ran = "no region (grouped or depthwise: cuDNN)"
        else:
            ran = "; ".join(dict.fromkeys(
                (p["runs"] if p["runs"].startswith("conv") else "cuDNN" + (f" ({p['note'].split(':')[1].strip()[:90]})"
                                                                          if p["note"].startswith("cuDNN only") else ""))
                for p in regions))
        yield {**base, "gpu": _gpu_model(r.get("device"), base["gpu"]),
               "date": r.get("date") or base["date"],
               "stamp": r.get("commit") or "", "id": r["id"],
               "number": int(r["id"].split("-")[1]), "short": r["name"].split("_", 1)[1][:48],
               "problem": r["id"], "policy": r["policy"], "eager_ms": r.get("eager_ms"),
               "compile_ms": r.get("compile_ms"), "factdb_ms": r.get("factdb_ms"), "speedup": r.get("speedup"),
               "speedup_vs_compile": r.get("speedup_vs_compile"),
               "returned": (did.get("returned") or DASH).split(" (")[0], "ran": ran}


def rows_discover(doc, name):
    for r in doc["results"]:
        runs = r.get("cold_cli_runs") or []
        walls = [x["wall_s"] for x in runs]
        loads = [x["loadavg_1m"] for x in runs if x.get("loadavg_1m") is not None]
        yield {**r, **_base(doc, name), "commit": _short(doc.get("commit")),
               "cold_range": f"{min(walls):.2f}-{max(walls):.2f}" if walls else DASH,
               "load": f"{min(loads):.2f}-{max(loads):.2f}" if loads else DASH}


def rows_retrieval(doc, name):
    t = doc.get("targets_hybrid") or {}
    notes = "" if doc.get("curated_notes", True) else ", without the curated notes"
    base = doc.get("index", {}).get("docs", {})
    sets = [(f"rules and examples ({sum(base.values())} docs){notes}", doc.get("results"))]
    if doc.get("with_kernels"):
        sets.append((f"the same + {doc['with_kernels']['docs'].get('kernel', 0):,} kernels", doc["with_kernels"].get("results")))
    for label, res in sets:
        for method in ("lexical", "vector", "hybrid"):
            x = (res or {}).get(method)
            if x:
                yield {**_base(doc, name), "index": label, "method": method, "r1": x["recall@1"],
                       "r5": x["recall@5"], "mrr": x.get("mrr"),
                       "target": f">= {t['recall@1']} / {t['recall@5']}" if method == "hybrid" and t else ""}


def rows_measures(doc, name, spec):
    units = {"s": _fmt_s, "msv": lambda v: f"{_fmt_ms(v)} ms"}
    for label, path, unit, target in spec["measures"]:
        v, tv = _get(doc, path), _get(doc, target) if target else None
        fmt = units[unit]
        yield {**_base(doc, name), "label": label, "value": fmt(v) if v is not None else DASH,
               "target": f"<= {fmt(tv)}" if tv is not None else ""}


def rows_compile_peers(doc, name):
    """One row per compile_peers.py run: eager, torch.compile, what optimize returned, and
    torch.compile(backend="factdb"), timed in one process."""
    by = {v.get("name", ""): v for v in doc.get("variants") or []}
    fdb = next((v for n, v in by.items() if n.startswith("fact-db")), {})
    tc, eager, backend = by.get("torch.compile", {}), by.get("eager", {}), by.get('torch.compile(backend="factdb")', {})
    row = {**_base(doc, name), "problem": doc.get("problem"), "policy": doc.get("policy")}
    row["policy_rank"] = _rank(POLICY_ORDER, row["policy"])
    row["eager_ms"], row["compile_ms"], row["backend_ms"] = eager.get("ms"), tc.get("ms"), backend.get("ms")
    row["fdb"] = f"{_fmt_ms(fdb.get('ms'))} ({doc.get('returned', DASH)})"
    row["vs_compile"] = tc["ms"] / fdb["ms"] if tc.get("ms") and fdb.get("ms") else None
    row["vs_eager"] = eager["ms"] / fdb["ms"] if eager.get("ms") and fdb.get("ms") else None
    # The best of what the user already has: eager at the policy and torch.compile's modes
    # (PyTorch's TF32 default at fp32 is another precision, not a peer).
    peers = [(n, v["ms"]) for n, v in by.items() if v.get("ms") and (n == "eager" or n.startswith("torch.compile"))
             and "factdb" not in n]
    best = min(peers, key=lambda x: x[1]) if peers else None
    row["best_peer"] = f"{_fmt_ms(best[1])} ({best[0]})" if best else DASH
    row["vs_best"] = best[1] / fdb["ms"] if best and fdb.get("ms") else None
    auto = by.get('torch.compile(backend="factdb") max-autotune-no-cudagraphs', {})
    row["backend"] = f"{_fmt_ms(backend.get('ms'))} / {_fmt_ms(auto.get('ms'))}"
    # which of one day's runs is newer: the time the run wrote (runs before 2026-11-27 evening have
    # none, and sort first); a commit hash says nothing about order
    row["stamp"] = doc.get("time") or ""
    if tc.get("compile_cold_s") is not None and backend.get("compile_cold_s") is not None:
        # both from nothing, in fresh processes (compile_peers.py's compile_cold_s): like with like
        # timed from the torch.compile call since 2026-11-29 (compile_peers.py's "compile_cold_from");
        # before, from the first call, after plain torch.compile had imported Inductor when called
        how = "both cold" if doc.get("compile_cold_from") == "the torch.compile call" else \
            "both cold; torch.compile's Inductor import not counted"
        row["compile_s"] = f"{_fmt_s(tc['compile_cold_s'])} / {_fmt_s(backend['compile_cold_s'])} ({how})"
    else:  # the first call in the run: torch.compile's graph warm in Inductor's cache from optimize's choice
        row["compile_s"] = f"{_fmt_s(tc.get('compile_s'))} / {_fmt_s(backend.get('compile_s'))} (torch.compile warm)"
    row["err"] = f"{_fmt_err(fdb.get('err'))} ({_fmt_err(eager.get('err'))})"
    row["held"] = fdb.get("held_mib")
    row["returned"] = doc.get("returned")
    row["status"] = DASH if row["vs_best"] is None else "met" if row["vs_best"] >= 0.98 else "**missed**"
    yield row


def peers_set(path: Path) -> list[tuple[str, str]]:
    """The (problem, policy) pairs of a set file (benchmarks/peers_set.txt): a problem and its
    policies a line, `#` comments."""
    pairs = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if len(words) == 1:
            raise SystemExit(f"tables.py: {path}:{n}: `{words[0]}` names no policy (a line is: problem policy...)")
        pairs += [(words[0], pol) for pol in words[1:]]
    return pairs


READERS = {"e2e": rows_e2e, "gemm": rows_gemm, "results": rows_results, "multigpu": rows_multigpu,
           "fmha_fp32tc": rows_fmha_fp32tc, "attention": rows_attention, "norm": rows_norm,
           "agent": rows_agent, "agent_compose": rows_agent_compose, "discover": rows_discover,
           "retrieval": rows_retrieval, "measures": rows_measures,
           "compile_peers": rows_compile_peers, "kernelbench": rows_kernelbench, "ncu": rows_ncu,
           "kernelbench_conv": rows_kernelbench_conv}


# --------------------------------------------------------------------------------------
# Formats
# --------------------------------------------------------------------------------------

def _fmt_ms(v) -> str:
    return DASH if v is None else f"{v:.4g}"


def _fmt_s(v) -> str:
    return DASH if v is None else f"{v:.3g} s"


def _fmt_err(v) -> str:
    return DASH if v is None else f"{v:.1e}"


def _fmt_mib(v) -> str:
    return DASH if v is None else f"{v:.0f}"


class _Cells(string.Formatter):
    """`{x:ms}` milliseconds, `{x:x}` a speedup, `{x:err}` an error, `{x:s}` seconds,
    `{x:us}` milliseconds shown in microseconds, `{x:mib}`, `{x:frac}`, `{x:ratio}`, `{x:x3}`,
    `{x:tflops}`; a missing value is a dash whatever the format."""

    FORMATS = {"ms": _fmt_ms, "x": lambda v: f"{v:.2f}x", "err": _fmt_err, "s": _fmt_s,
               "us": lambda v: f"{v * 1000:.1f}", "mib": _fmt_mib, "frac": lambda v: f"{v:.2f}",
               "ratio": lambda v: f"{v:.2f}x", "x3": lambda v: f"{v:.3f}x", "tflops": lambda v: f"{v:.0f} TFLOP/s"}

    def format_field(self, value, spec):
        if value is None or value == "":
            return DASH if spec else ""
        if spec in self.FORMATS:
            return self.FORMATS[spec](value)
        return format(value, spec)

    def get_value(self, key, args, kwargs):
        return kwargs.get(key)


def _rank(values, v):
    return values.index(v) if v in values else len(values)


def files_for(spec: dict, results: Path) -> list[Path]:
    """The JSON files a table reads: its globs, less its exclusions, sorted by name."""
    files = sorted({p for pat in spec["files"] for p in results.glob(pat)})
    return [p for p in files if not any(fnmatch.fnmatch(p.name, x) for x in spec.get("exclude", []))]


def rows_for(name: str, results: Path) -> list[dict]:
    spec = TABLES[name]
    files = files_for(spec, results)
    if not files:
        raise SystemExit(f"tables.py: table {name}: no file in {results} matches {spec['files']}")
    reader = READERS[spec["rows"]]
    rows = []
    for p in files:
        doc = json.loads(p.read_text())
        got = reader(doc, p.name, spec) if spec["rows"] == "measures" else reader(doc, p.name)
        rows.extend(got)
    if spec.get("problems"):
        rows = [r for r in rows if r.get("problem") in spec["problems"]]
    if spec.get("timed_only"):
        rows = [r for r in rows if r.get("timed")]
    if spec.get("select") == "newest per level, policy, timed":
        newest: dict[tuple, dict] = {}
        for r in rows:
            k = (r["level"], r["policy"], r["timed"])
            if k not in newest or (r["date"], r["file"]) >= (newest[k]["date"], newest[k]["file"]):
                newest[k] = r
        rows = list(newest.values())
    if spec.get("select") == "newest per problem, policy":
        newest: dict[tuple, dict] = {}
        for r in rows:
            k = (r["problem"], r["policy"])
            if k not in newest or (r["date"], r["stamp"]) >= (newest[k]["date"], newest[k]["stamp"]):
                newest[k] = r
        rows = list(newest.values())
    if spec.get("select") == "newest file per gpu":   # a check's every variant, from its newest run on each GPU
        newest_file: dict[str, tuple] = {}
        for r in rows:
            newest_file[r["gpu"]] = max(newest_file.get(r["gpu"], ("", "")), (r["date"], r["file"]))
        rows = [r for r in rows if (r["date"], r["file"]) == newest_file[r["gpu"]]]
    if spec.get("set"):   # every pair of the set: its row, or one saying it has none
        have = {(r["problem"], r["policy"]): r for r in rows}
        rows = [have.get(pair) or {"problem": pair[0], "policy": pair[1], "file": None, "status": "not yet run"}
                for pair in peers_set(ROOT / spec["set"])]
    for r in rows:
        r["problem_rank"] = _rank(spec.get("problems") or [], r.get("problem"))
        r["policy_rank"] = _rank(POLICY_ORDER, r.get("policy"))
    if spec.get("order"):
        rows.sort(key=lambda r: tuple(r.get(k) if r.get(k) is not None else "" for k in spec["order"]))
    return rows


def render(name: str, md_path: Path, root: Path, results: Path) -> str:
    """The block's body for `name` as it should read in md_path (links relative to it)."""
    spec = TABLES[name]
    cells = _Cells()
    md_dir = posixpath.relpath(md_path.resolve().parent.as_posix(), root.resolve().as_posix())
    head = [h for h, _ in spec["columns"]]
    lines = [f"<!-- generated by benchmarks/tables.py from benchmarks/results/{', '.join(spec['files'])}: "
             f"edit the JSON or the script, not this block -->",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows = rows_for(name, results)
    fields = {f for _, tpl in spec["columns"] for _, f, _, _ in string.Formatter().parse(tpl) if f}
    unknown = sorted(f for f in fields - {"link"} if not any(f in r for r in rows))
    if unknown:  # a misspelt field would otherwise print as a dash in every row
        raise SystemExit(f"tables.py: table {name}: no row has {', '.join(unknown)}")
    for r in rows:
        link = posixpath.relpath(f"benchmarks/results/{r['file']}", md_dir) if r.get("file") else ""
        vals = {**r, "link": f"[{r['file']}]({link})" if link else ""}
        row = [cells.format(tpl, **vals).replace("|", "\\|") for _, tpl in spec["columns"]]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


BLOCK = re.compile(r"<!-- table:([\w-]+) -->\n(.*?)<!-- /table:([\w-]+) -->", re.S)


def refresh(md_path: Path, root: Path, results: Path) -> tuple[str, list[str], list[str]]:
    """The file's text with every block regenerated, the names of stale blocks, and errors."""
    text = md_path.read_text()
    stale, errors = [], []

    def sub(m):
        name, body, close = m.group(1), m.group(2), m.group(3)
        if name != close:
            errors.append(f"{md_path}: block table:{name} is closed by /table:{close}")
            return m.group(0)
        if name not in TABLES:
            errors.append(f"{md_path}: unknown table {name!r} (known: {', '.join(TABLES)})")
            return m.group(0)
        new = render(name, md_path, root, results) + "\n"
        if body != new:
            stale.append(name)
        return f"<!-- table:{name} -->\n{new}<!-- /table:{name} -->"

    out = BLOCK.sub(sub, text)
    opened = re.findall(r"<!-- table:([\w-]+) -->", text)
    closed = re.findall(r"<!-- /table:([\w-]+) -->", text)
    if sorted(opened) != sorted(closed):
        errors.append(f"{md_path}: table markers do not pair up (opened {opened}, closed {closed})")
    return out, stale, errors


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path, help="markdown files (default: README.md and docs/*.md)")
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 naming each stale block")
    ap.add_argument("--list", action="store_true", help="list the tables and the JSON files they read")
    ap.add_argument("--root", type=Path, default=ROOT, help="repository root (links are relative to it)")
    ap.add_argument("--results", type=Path, default=None, help="results folder (default: ROOT/benchmarks/results)")
    a = ap.parse_args(argv)
    results = a.results or a.root / "benchmarks" / "results"
    if a.list:
        for name, spec in TABLES.items():
            print(f"{name}: {spec['about']}\n    {', '.join(p.name for p in files_for(spec, results))}")
        return 0
    files = a.files or [a.root / "README.md", *sorted((a.root / "docs").glob("*.md"))]
    bad = 0
    for f in files:
        if not f.exists():
            continue
        out, stale, errors = refresh(f, a.root, results)
        for e in errors:
            print(e, file=sys.stderr)
        bad |= bool(errors)
        if a.check:
            for name in stale:
                print(f"{f}: table {name} is stale: run python benchmarks/tables.py", file=sys.stderr)
            bad |= bool(stale)
        elif stale and not errors:
            f.write_text(out)
            print(f"{f}: rewrote {', '.join(stale)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
