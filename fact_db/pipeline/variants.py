"""Other input shapes: a composed module's variants, composed again for a new signature from
the kernels the registry holds for exactly those shapes (nothing compiles during a call).
"""
from __future__ import annotations


def variant_factory(model_p, policy: str, registry, realized, info, split_weights: bool = True,
                     derived: dict | None = None):
    """variants(sig, args, kwargs) -> (module | None, why), for ComposedModule: the model
    composed again for the new input shapes from kernels the registry has for exactly those
    shapes (built already: nothing compiles during a call) and the library attention chosen
    before; everything else eager. `derived` is the first composition's (rewrite): a variant
    shares the weights it concatenated, transposed or split."""
    gpu = info.get("gpu")
    attention = {z.region.rule: z.impl for z in realized if z.impl.kind in ("sdpa", "attention")}

    def make(sig, args, kwargs):
        if registry is None or gpu is None or kwargs:
            return None, "no registry to look the new shapes up in"
        from fact_db.composition.compose import rewrite
        from fact_db.composition.module import cast_floats, policy_dtype
        from fact_db.discovery.discover import discover
        from fact_db.kernels.gemm.family import impl_of as gemm_impl
        from fact_db.realization.realize import plan
        from fact_db.kernels.gemm.tune import from_registry
        dt = policy_dtype(policy)
        xs = cast_floats(tuple(args), dt) if dt else tuple(args)
        disc = discover(model_p, xs, arch="sm90", gpu=gpu, policy=policy)
        impls, used = {}, 0
        for i, p in enumerate(plan(disc, policy)):
            if p.workload is not None and not p.region.composable:
                res = from_registry(p.workload, registry, gpu=gpu, cached_only=True)
                if res is not None and res.winner is not None:
                    impls[i] = gemm_impl(res, p.workload,
                                         library=not (p.region.template or "").startswith("dual_gemm"))
                    used += impls[i].kind != "eager"
            elif p.region.rule in attention and not p.region.composable:
                impls[i] = attention[p.region.rule]
                used += 1
        if not used:
            return None, "the registry has no built kernel for these shapes"
        gm, _ = rewrite(disc.graph.program, disc.regions, impls, split_weights=split_weights, derived=derived)
        return gm, f"{used} of {len(disc.regions)} regions from kernels the registry has for these shapes, the rest eager"
    return make
