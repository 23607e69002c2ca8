"""Artifact: an optimized model on disk, loadable without tuning anything.

    >>> path = save(Path("out/mingpt-fp32"), fast, discovery, report, module=model, example_inputs=(x,))
    >>> fast = load(path)        # the same composed module; `fast.load_notes` says what happened

A directory holding:

    manifest.json     format, fact-db version, problem, policy, device, toolchain, the input
                      signature, per region its rule, nodes, operands and implementation
                      (registry key, config, build key, op name, file hashes), file hashes
    program.pt2       the exported program (weights included) the regions refer to
    fallback.pt2      the same model exported with dynamic shapes: eager PyTorch for inputs
                      of other shapes (absent when the model would not export that way)
    kernels/<build key>/kernel.cu, kernel.so
    report.json, report.md, report.png

Saving writes a temporary directory and renames it into place, so an interrupted save
leaves the previous artifact (or nothing), never half of one. Loading checks every file
against its recorded hash: an edited program is refused; a kernel whose library is missing
or edited, or that was built on another GPU or toolchain, is rebuilt from its source and
verified again, or runs eager, and `load_notes` says which. Op names come from build keys,
never from paths.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import types
from datetime import datetime, timezone
from pathlib import Path

from fact_db.composition.report import clean, write_all
from fact_db.core import paths
from fact_db.core.errors import FactError, first_line
from fact_db.kernels import families
from fact_db.kernels.impl import Impl

FORMAT = 1


class ArtifactError(FactError):
    """An artifact directory cannot be written or read (missing, edited, another format)."""


def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def default_dir(name: str, policy: str) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return paths.home() / "artifacts" / f"{safe}-{policy}-{stamp}"


def _region_entry(z) -> dict:
    r = z.region
    return {"index": z.index + 1, "rule": r.rule, "template": r.template, "nodes": list(r.nodes), "output": r.output,
            "operands": dict(r.operands), "attrs": dict(r.attrs), "epilogue": list(r.epilogue),
            "composable": r.composable, "shape": r.shape,
            "impl": {"kind": z.impl.kind, "label": z.impl.label, "note": z.impl.note, **z.impl.record},
            "eager_ms": z.eager_ms, "ms": z.ms, "how": z.how}


def _dynamic_export(module, example_inputs):
    import torch
    from torch.export import Dim
    dyn = tuple({i: Dim.AUTO for i in range(x.dim())} if isinstance(x, torch.Tensor) else None for x in example_inputs)
    from fact_db.discovery.trace import _quiet
    with _quiet():
        return torch.export.export(module, tuple(example_inputs), dynamic_shapes=dyn, strict=False)


def save(directory: Path, fast, discovery, report, *, module=None, example_inputs=None) -> Path:
    """Write the artifact of composed module `fast` (see module docstring); returns its path."""
    import torch
    directory = Path(directory)
    if directory.exists() and not (directory / "manifest.json").is_file() and any(directory.iterdir()):
        raise ArtifactError(f"`{directory}` exists and is not a fact-db artifact; choose another --out or remove it")
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = directory.parent / f".{directory.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    notes = []
    try:
        torch.export.save(discovery.graph.program, tmp / "program.pt2")
        files = {"program": {"file": "program.pt2", "sha256": _sha(tmp / "program.pt2")}}
        if module is not None and example_inputs is not None:
            try:
                torch.export.save(_dynamic_export(module, example_inputs), tmp / "fallback.pt2")
                files["fallback"] = {"file": "fallback.pt2", "sha256": _sha(tmp / "fallback.pt2")}
            except Exception as e:  # noqa: BLE001  (the artifact still works for the shapes it was optimized for)
                notes.append(f"no eager fallback for other input shapes: exporting with dynamic shapes failed "
                             f"({first_line(e, 160, typed=True)})")
        regions = []
        for z in report.regions:
            entry = _region_entry(z)
            impl = entry["impl"]
            if families.for_impl(impl["kind"]) is not None and impl.get("so"):  # a kernel: its library and source
                so = Path(impl["so"])
                key = impl["build_key"]
                kdir = tmp / "kernels" / key
                kdir.mkdir(parents=True, exist_ok=True)
                shutil.copy2(so, kdir / "kernel.so")
                src = so.parent / "kernel.cu"
                if src.is_file():
                    shutil.copy2(src, kdir / "kernel.cu")
                    impl["source"], impl["source_sha256"] = f"kernels/{key}/kernel.cu", _sha(kdir / "kernel.cu")
                impl["so"], impl["so_sha256"] = f"kernels/{key}/kernel.so", _sha(kdir / "kernel.so")
            regions.append(entry)
        manifest = {
            "format": FORMAT, "factdb_version": report.toolchain.get("factdb"), "created": datetime.now(
                timezone.utc).isoformat(timespec="seconds"), "problem": report.problem, "policy": report.policy,
            "device": report.device, "toolchain": report.toolchain, "signature": fast.optimized_for,
            "also_for": list(fast.also_for), "cuda_graph": bool(getattr(fast, "cuda_graph", False)),
            "split_weights": bool(getattr(fast, "split_weights", True)),
            "prefer_eager": bool(getattr(fast, "prefer_eager", False)),
            "choice": getattr(fast, "choice", None), "compile_mode": getattr(fast, "compile_mode", None),
            "files": files, "regions": regions,
            "verification": report.verification.as_dict() if report.verification is not None else None,
            "notes": notes,
        }
        report.notes += notes
        write_all(report, tmp)
        (tmp / "manifest.json").write_text(json.dumps(clean(manifest), indent=1))
        old = None
        if directory.exists():
            old = directory.parent / f".{directory.name}.old-{os.getpid()}"
            os.replace(directory, old)
        os.replace(tmp, directory)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


# ------------------------------------------------------------------------------------------

def read_manifest(directory: Path) -> dict:
    directory = Path(directory)
    mf = directory / "manifest.json"
    if not directory.is_dir():
        raise ArtifactError(f"`{directory}` is not a directory; pass the directory `factdb optimize --out` wrote")
    if not mf.is_file():
        raise ArtifactError(f"`{directory}` is not a fact-db artifact: it has no manifest.json")
    try:
        manifest = json.loads(mf.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ArtifactError(f"`{mf}` is not valid JSON ({e}); the artifact was edited or damaged: optimize again") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        got = manifest.get("format") if isinstance(manifest, dict) else None
        raise ArtifactError(f"`{mf}` has format {got!r}; this fact-db reads format {FORMAT}: optimize again with "
                            "this version")
    return manifest


def _checked(directory: Path, entry: dict, what: str) -> Path:
    path = directory / entry["file"]
    if not path.is_file():
        raise ArtifactError(f"`{path}` is missing: the artifact is incomplete; optimize again")
    if _sha(path) != entry["sha256"]:
        raise ArtifactError(f"`{path}` ({what}) was changed after it was saved (its sha256 differs from the "
                            "manifest's); optimize again rather than edit an artifact")
    return path


def _kernel_impl(directory: Path, entry: dict, gpu_now, cap_now, tc_now, made_on: dict, made_with: dict):
    """(Impl, what happened) for a region of the artifact served by a kernel (GEMM, attention
    or norm): its saved library where it was built on this GPU with this toolchain and its
    hash matches; else rebuilt from its saved source (or its library kept) and verified again
    against float64 here; else eager."""
    impl = entry["impl"]
    fam = families.for_impl(impl["kind"])
    label = impl.get("label", "")
    if cap_now != "9.0":
        return Impl.eager(f"no sm90 GPU here ({gpu_now or 'none'})"), f"eager: no sm90 GPU here ({gpu_now or 'none'})"
    so = directory / impl.get("so", "")
    src = directory / impl["source"] if impl.get("source") else None
    so_ok = so.is_file() and _sha(so) == impl.get("so_sha256")
    src_ok = src is not None and src.is_file() and _sha(src) == impl.get("source_sha256")
    same = gpu_now == made_on.get("gpu") and all(tc_now.get(k) == made_with.get(k) for k in ("cutlass", "nvcc"))
    if so_ok and same:
        return fam.load(so, impl), "loaded"
    why = ("built on " + str(made_on.get("gpu")) + " with nvcc " + str(made_with.get("nvcc"))) if not same else \
        "its library is missing or was changed"
    path = None
    if src_ok:
        from fact_db.kernels import build as build_mod
        try:
            [b] = build_mod.build([build_mod.Source(impl["template"], src.read_text(), "sm90a")], progress=False)
            path = b.path if b.ok else None
            how = "rebuilt from source" if b.ok else f"rebuilding failed ({b.error})"
        except build_mod.BuildError as e:
            how = f"cannot rebuild ({e})"
    else:
        how = "its source is missing or was changed"
    if path is None and so_ok:
        path, how = so, "kept its library"
    if path is None:
        return Impl.eager(f"{why}; {how}"), f"eager: {why}; {how}"
    k_impl = fam.load(path, impl)
    try:
        ok, err = fam.reverify(path, k_impl, impl)
    except (KeyError, TypeError) as e:  # a manifest without what re-verification needs (an older format)
        ok, err = False, f"the manifest lacks the workload to verify it with ({e})"
    if not ok:
        return Impl.eager(f"{why}; {how}; re-verification failed: {err}"), f"eager: {why}; {how}; re-verification failed: {err}"
    return k_impl, f"{how} and re-verified ({why}){'; ' + label if label else ''}"


def _warm_inputs(sig) -> tuple | None:
    """Random inputs of a signature of positional tensors on devices this machine has, else None."""
    import torch
    head, leaves = sig
    if head != f"{len(leaves)} args; kwargs []" or any(x[0] != "T" for x in leaves):
        return None
    if any(x[3] == "cuda" for x in leaves) and not torch.cuda.is_available():
        return None
    out = []
    for _, shape, dtype, dev in leaves:
        dt = getattr(torch, dtype)
        out.append(torch.randn(shape, dtype=dt, device=dev) if dt.is_floating_point else
                   torch.zeros(shape, dtype=dt, device=dev))
    return tuple(out)


def _restore_choice(fast, choice: str) -> str:
    """Make `fast` run what optimize chose; a compiled choice is compiled again here, once, on
    random inputs of its signature (from Inductor's caches where they hold it: the same graph
    and config make the same keys). Returns the load note, with the compile time."""
    import time

    from fact_db.composition.module import CHOICES, compiled_target
    if choice not in CHOICES:
        return f"the manifest's choice {choice!r} is unknown here: runs {fast.choice}"
    if not CHOICES[choice]:
        fast.use(choice)
        return f"runs {choice}, as optimize chose"
    model = fast.fallback if choice.startswith("torch.compile") else fast.gm
    t0 = time.perf_counter()
    try:
        fast.use(choice, compiled_target(model, CHOICES[choice], fullgraph=model is fast.gm))
        xs = _warm_inputs(fast.optimized_for)
        if xs is None:
            return f"runs {choice}, as optimize chose; it compiles on its first call (no inputs to warm it with here)"
        fast(*xs)
    except Exception as e:  # noqa: BLE001  (Inductor failing here: the composed graph still runs, verified at optimize)
        fast.use("composed")
        return f"runs composed: recompiling {choice} failed on load ({first_line(e, 200, typed=True)})"
    fast.load_s = time.perf_counter() - t0
    return f"runs {choice}, as optimize chose: compiled again in {fast.load_s:.1f} s on load (Inductor's caches)"


def load(directory, *, loader=None):
    """The composed module saved in `directory`, tuning nothing (see module docstring).

    `loader(impl_record) -> Impl | None` loads implementations this module does not know
    (tests use it for stand-in ops). The module's `load_notes` lists, per region, what
    happened: loaded, rebuilt, re-verified, or eager and why.
    """
    import warnings

    import torch

    from fact_db.composition.compose import rewrite
    from fact_db.composition.module import ComposedModule, signature_from_json
    directory = Path(directory)
    manifest = read_manifest(directory)
    files = manifest.get("files", {})
    program = torch.export.load(_checked(directory, files["program"], "the exported program"))
    fallback_ep = torch.export.load(_checked(directory, files["fallback"], "the eager fallback")) \
        if "fallback" in files else None
    from fact_db.core.environment import device_info, toolchain_info
    dev = device_info(torch.device("cuda")) if torch.cuda.is_available() else {"gpu": None, "capability": None}
    tc = toolchain_info()
    notes = []
    if manifest.get("factdb_version") != tc.get("factdb"):
        notes.append(f"made by fact-db {manifest.get('factdb_version')}, loaded by {tc.get('factdb')}")
    regions, impls = [], {}
    for i, entry in enumerate(manifest["regions"]):
        regions.append(types.SimpleNamespace(**{k: entry.get(k) for k in ("rule", "template", "nodes", "output",
                                                                          "operands", "attrs", "composable",
                                                                          "epilogue")}))
        rec = entry["impl"]
        impl = loader(rec) if loader is not None else None
        what = "loaded"
        if impl is None:
            kind = rec.get("kind")
            fam = families.for_impl(kind)
            lib = fam.library(rec) if fam is not None else None
            if kind == "eager":
                impl, what = Impl.eager(rec.get("note", "")), "eager"
            elif lib is not None:
                impl = lib
            elif fam is not None and rec.get("template"):
                impl, what = _kernel_impl(directory, entry, dev.get("gpu"), dev.get("capability"), tc,
                                          manifest.get("device") or {}, manifest.get("toolchain") or {})
            else:
                impl, what = Impl.eager(f"unknown implementation kind {kind!r}"), f"eager: unknown kind {kind!r}"
        impls[i] = impl
        notes.append(f"region {entry['index']} {entry['rule']}: {what}")
    split = bool(manifest.get("split_weights", True))
    gm, rnotes = rewrite(program, regions, impls, split_weights=split)
    notes += rnotes
    fallback = fallback_ep.module() if fallback_ep is not None else program.module()
    if fallback_ep is None:
        notes.append("no eager fallback for other input shapes was saved: calls with other shapes will fail")
    fast = ComposedModule(gm, fallback, policy=manifest["policy"], name=manifest.get("problem", "model"),
                          optimized_for=signature_from_json(manifest["signature"]),
                          also_for=[signature_from_json(s) for s in manifest.get("also_for", [])],
                          regions=[(r.rule, impls[i]) for i, r in enumerate(regions)],
                          cuda_graph=bool(manifest.get("cuda_graph", False)), split_weights=split)
    fast.prefer_eager = bool(manifest.get("prefer_eager", False))
    if manifest.get("choice"):
        notes.append(_restore_choice(fast, manifest["choice"]))
    fast.load_notes = notes
    fast.manifest = manifest
    eager = [n for n in notes if ": eager:" in n]
    if eager:
        warnings.warn(f"fact-db: {len(eager)} region(s) of {directory} run eager: " + "; ".join(eager), stacklevel=2)
    return fast
