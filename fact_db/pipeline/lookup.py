"""What the registry holds for one region, ready to run: the torch.compile backend's only access
to the registry (lookup only: nothing is tuned or compiled here, unless `tune` asks).

    >>> found = kernel_for(registry, region, workload, arch="sm90a", gpu="h100")
    >>> found.impl.op if found.impl else found.why

A kernel is served only where its registry row is current for this environment and its
library is already in the build cache: a compile never waits on nvcc. This module is the one
place the backend touches the registry, through each family's exact lookup.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Found:
    """A region's kernel from the registry (`impl`), the row it came from, or why there is none."""

    impl: object = None   # kernels.impl.Impl of a fact-db kernel, or None
    row: str = ""         # what identifies the row used (registry key digest, build key), for the cache key
    why: str = ""


def _cached_so(source) -> tuple[str, str]:
    """(library path, build key) of a kernel source already built, else ("", "")."""
    from fact_db.kernels import build
    key = build.content_key(source)
    so = build.cache_dir() / key / "kernel.so"
    return (str(so), key) if so.is_file() else ("", "")


def _gemm(registry, region, w, arch: str, gpu: str) -> Found:
    from fact_db.kernels.gemm import family as gemm
    from fact_db.kernels.gemm.tune import from_registry
    res = from_registry(w, registry, arch=arch, gpu=gpu, cached_only=True)
    if res is None or res.winner is None:
        return Found(why="no current registry row with a built kernel")
    impl = gemm.impl_of(res, w, library=not (region.template or "").startswith("dual_gemm"))
    return Found(impl, f"{impl.record.get('registry_digest', '')}:{impl.record.get('build_key', '')}")


def _attention(registry, region, w, arch: str, gpu: str) -> Found:
    from fact_db.kernels.attention import family as attention
    from fact_db.kernels.attention import tune as attention_tune
    hit = attention_tune.from_registry(w, registry, arch, gpu)
    if hit is None:
        return Found(why="no registry row")
    if hit.kind == "library":
        # Where the model writes attention out (matmul, mask, softmax, matmul), the library
        # winner is a fact-db rewrite Inductor does not make itself: SDPA (one backend forced,
        # or its own choice) in place of the explicit ops. A model that calls SDPA already
        # keeps its own call.
        if region.rule == "sdpa-attention":
            return Found(why=f"the registry's winner is {hit.label}, the library the model already calls")
        best = {"kind": "sdpa" if hit.label == "sdpa" else "attention", "label": hit.label}
        return Found(attention.impl_of(best, w), f"attention:{hit.label}")
    if hit.kind != "kernel":
        return Found(why=f"the registry's winner is {hit.label}: the model's own form")
    fam = next((f for f in attention_tune.families() if f.TEMPLATE == hit.template), None)
    so, key = _cached_so(fam.source(w, hit.config)) if fam is not None else ("", "")
    if not so:
        return Found(why=f"the registry's kernel {hit.label} is not built here")
    impl = attention.impl_of({"kind": "kernel", "label": hit.label, "template": hit.template, "config": hit.config,
                              "so": so, "build_key": key}, w)
    return Found(impl, f"attention:{key}")


def _norm(registry, region, w, arch: str, gpu: str) -> Found:
    from fact_db.kernels import build
    from fact_db.kernels.norm import family as norm
    from fact_db.kernels.norm import tune as norm_tune
    hit = norm_tune.from_registry(w, registry, arch, gpu)
    if hit is None or hit.candidate is None:
        return Found(why="no current registry row" if hit is None else "the registry's winner is eager")
    so, key = _cached_so(build.Source(norm_tune.TEMPLATE, norm_tune.render(w, hit.candidate), arch))
    if not so:
        return Found(why=f"the registry's kernel {hit.label} is not built here")
    hit.so, hit.build_key = so, key
    return Found(norm.impl_of(w, hit), f"norm:{key}")


def _conv(registry, region, w, arch: str, gpu: str) -> Found:
    from fact_db.kernels.conv import family as conv
    from fact_db.kernels.conv import tune as conv_tune
    from fact_db.kernels.conv.kernel import source
    hit = conv_tune.from_registry(w, registry, arch, gpu)
    if hit is None or hit.config is None:
        return Found(why="no current registry row" if hit is None else "the registry's winner is cuDNN")
    so, key = _cached_so(source(w, hit.config, arch))
    if not so:
        return Found(why=f"the registry's kernel {hit.label} is not built here")
    hit.so, hit.build_key = so, key
    folds = "bn_mean" in (region.operands or {})
    return Found(conv.impl_of(w, hit, arch, gpu, folds), f"conv:{key}")


def kernel_for(registry, region, workload, *, arch: str, gpu: str, tune: bool = False) -> Found:
    """The fact-db kernel the registry holds for `region` (its `workload`), as an Impl; with
    `tune`, the region's family realizes it (registry first, then tuning on this GPU). A GEMM,
    norm or convolution library winner is not served: Inductor has its own (cuDNN, with the
    chain fused after it); an attention region written out by the model gets the SDPA backend
    that won (Inductor does not make that rewrite)."""
    from fact_db.kernels import families
    fam = families.of(workload)
    if fam is None:
        return Found(why="no kernel family realizes it")
    if tune:
        from fact_db.kernels.family import Context
        got = fam.realize(workload, region, Context(gpu=gpu, registry=registry, arch=arch))
        return Found(got.impl, f"{fam.NAME}:{got.impl.record.get('build_key', '')}") if got.impl.kernel else \
            Found(why=f"tuned: {got.impl.label or got.impl.note or 'the library won'}")
    finder = {"gemm": _gemm, "attention": _attention, "norm": _norm, "conv": _conv}.get(fam.NAME)
    if finder is None:
        return Found(why=f"the {fam.NAME} family's kernels are not looked up by the backend")
    found = finder(registry, region, workload, arch, gpu)
    if found.impl is not None and not found.impl.kernel and fam.NAME != "attention":
        return Found(why=f"the registry's winner is {found.impl.label or 'the library'}: Inductor has its own")
    return found


def tune_command(workload, policy: str) -> str:
    """The `factdb` command that would tune a workload the registry lacks."""
    from fact_db.kernels.attention.workload import AttentionWorkload
    from fact_db.kernels.gemm.workload import GemmWorkload
    if isinstance(workload, GemmWorkload):
        shape = f"{workload.m}x{workload.n}x{workload.k}" + (f"x{workload.batch}" if workload.batch > 1 else "")
        return (f"factdb tune --shape {shape} --policy {policy} --epilogue {workload.epilogue} "
                f"--layout-a {workload.layout_a} --layout-b {workload.layout_b}")
    if isinstance(workload, AttentionWorkload):
        w = workload
        return (f"factdb tune --op attention --shape {w.batch}x{w.heads}x{w.lq}x{w.lk}x{w.d} --kv-heads {w.kv_heads}"
                + (" --causal" if w.causal else "") + f" --policy {policy}")
    return f"factdb optimize YOUR_PROBLEM.py --policy {policy}"
