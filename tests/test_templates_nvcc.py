"""The CUTLASS kernel templates in kernels_cpp/: they render, honour the realization
contract (StrictUndefined, a C ABI), and -- behind the `nvcc` marker -- compile.

The example parameter sets live in kernels_cpp/examples.yaml, which also documents which
gencode and include roots each template needs. The compile tests are opt-in because they
take about ten minutes on two cores:

    pytest -m nvcc tests/test_templates_nvcc.py
"""
from __future__ import annotations

import ctypes
import importlib.util
import re
import shutil
import subprocess
import time
from pathlib import Path

from fact_db.kernels.template import TemplateError
import pytest
import yaml

KERNELS = Path(__file__).resolve().parent.parent / "kernels_cpp"
EXAMPLES = yaml.safe_load((KERNELS / "examples.yaml").read_text())
TEMPLATES = sorted(p.name[: -len(".cu.j2")] for p in KERNELS.glob("*.cu.j2"))

ALL_CASES = [(name, case) for name in sorted(EXAMPLES) for case in EXAMPLES[name]["cases"]]
COMPILE_CASES = [(name, case) for name in sorted(EXAMPLES) for case in EXAMPLES[name]["compile"]]


def render(name: str, params: dict) -> str:
    from fact_db.kernels import template
    return template.render(name, params)


def params_of(name: str, case: str) -> dict:
    return dict(EXAMPLES[name]["cases"][case])


def test_every_template_has_example_parameters():
    assert TEMPLATES, "no templates found in kernels_cpp/"
    assert set(TEMPLATES) == set(EXAMPLES), "kernels_cpp/examples.yaml must have one entry per template"
    for name, entry in EXAMPLES.items():
        assert set(entry["compile"]) <= set(entry["cases"]), name


@pytest.mark.parametrize("name,case", ALL_CASES)
def test_example_renders_to_a_c_abi(name, case):
    src = render(name, params_of(name, case))
    assert 'extern "C"' in src
    assert re.search(rf"\bint fact_{name}_launch\(", src), f"fact_{name}_launch missing"
    assert re.search(rf"\bsize_t fact_{name}_workspace_size\(", src), f"fact_{name}_workspace_size missing"
    assert "cudaStream_t stream) {" in src, "the stream is the launch's last argument"
    assert "{{" not in src and "{%" not in src and "{#" not in src
    assert "#error" not in src


@pytest.mark.parametrize("name", TEMPLATES)
def test_doc_block_names_every_parameter(name):
    text = (KERNELS / f"{name}.cu.j2").read_text()
    assert text.startswith("{#"), "a template starts with a {# ... #} block documenting its parameters"
    doc = text[: text.index("#}")]
    first_case = next(iter(EXAMPLES[name]["cases"]))
    for param in params_of(name, first_case):
        assert re.search(rf"\b{param}\b", doc), f"{name}: parameter {param!r} is not documented"


@pytest.mark.parametrize("name", TEMPLATES)
def test_every_parameter_is_required(name):
    """Dropping any one parameter fails loudly instead of rendering a half-filled kernel."""
    first_case = next(iter(EXAMPLES[name]["cases"]))
    params = params_of(name, first_case)
    for param in params:
        partial = {k: v for k, v in params.items() if k != param}
        with pytest.raises(TemplateError, match=param):
            render(name, partial)


@pytest.mark.parametrize(
    "epilogue,fusion,activation",
    [
        ("none", "LinearCombination<", None),
        ("bias", "LinCombPerColBias<", None),
        ("residual", "LinCombPerColBias<", None),
        ("bias_relu", "LinCombPerColBiasEltAct<", "cutlass::epilogue::thread::ReLu,"),
        ("bias_gelu", "LinCombPerColBiasEltAct<", "cutlass::epilogue::thread::GELU,"),
        ("bias_gelu_tanh", "LinCombPerColBiasEltAct<", "cutlass::epilogue::thread::GELU_taylor,"),
        ("bias_silu", "LinCombPerColBiasEltAct<", "cutlass::epilogue::thread::SiLu,"),
    ],
)
def test_gemm_sm90_epilogue_adds_bias_along_n(epilogue, fusion, activation):
    # PyTorch's `x @ W.T + b` adds b[n] to every row: CUTLASS's per-*column* bias
    # (Sm90RowBroadcast). A per-row bias would index b by m and be silently wrong.
    params = params_of("gemm_sm90", "f16_none_with_c") | {"epilogue": epilogue}
    src = render("gemm_sm90", params)
    assert f"cutlass::epilogue::fusion::{fusion}" in src
    assert "PerRowBias" not in src
    if activation:
        assert activation in src
    if epilogue != "none":
        assert "fusion.bias_ptr" in src


def test_gemm_sm90_rejects_bad_choices_at_compile_time():
    base = params_of("gemm_sm90", "f16_none_noc")
    assert "#error" in render("gemm_sm90", base | {"epilogue": "bias_tanh"})
    assert "#error" in render("gemm_sm90", base | {"epilogue": "residual"})  # needs a C
    assert "#error" in render("gemm_sm90", base | {"tile_scheduler": "split_k"})


def test_gemm_sm90_labels_positional_template_arguments():
    src = render("gemm_sm90", params_of("gemm_sm90", "f16_bias"))
    for label in ("// ElementA", "// LayoutB", "// TileShape", "// ClusterShape",
                  "// KernelScheduleType", "// EpilogueScheduleType", "// TileScheduler"):
        assert re.search(rf"//[^\n]*\b{label[3:]}\b", src), label


# ---------------------------------------------------------------------------------------
# nvcc: opt-in


def _cutlass_source() -> Path | None:
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "source"
    return path if (path / "include" / "cutlass").is_dir() else None


def _nvcc_skip_reason() -> str | None:
    if shutil.which("nvcc") is None:
        return "nvcc is not on PATH (install the CUDA toolkit, 12.4 or newer for sm_90a)"
    if _cutlass_source() is None:
        return "the nvidia-cutlass package (cutlass_library with its C++ source) is not installed"
    return None


def nvcc_command(name: str, cu: Path, so: Path) -> list[str]:
    """The project's build flags, plus the include roots examples.yaml names."""
    cutlass = _cutlass_source()
    roots = {"cutlass_examples": cutlass / "examples", "kernels_cpp_include": KERNELS / "include",
             "cutlass_example_88": cutlass / "examples" / "88_hopper_fmha"}
    entry = EXAMPLES[name]
    cmd = ["nvcc", "-std=c++17", "-O3", "-DNDEBUG", "--expt-relaxed-constexpr",
           "-Xcompiler=-fPIC", "-shared"]
    cmd += [f"-gencode={g}" for g in entry["gencode"]]
    cmd += [f"-I{cutlass / 'include'}", f"-I{cutlass / 'tools' / 'util' / 'include'}"]
    cmd += [f"-I{roots[r]}" for r in entry["includes"]]
    cmd += ["-o", str(so), str(cu)]
    return cmd


@pytest.mark.nvcc
@pytest.mark.skipif(_nvcc_skip_reason() is not None, reason=_nvcc_skip_reason() or "")
@pytest.mark.parametrize("name,case", COMPILE_CASES)
def test_example_compiles(name, case, tmp_path):
    cu = tmp_path / f"{name}_{case}.cu"
    so = tmp_path / f"{name}_{case}.so"
    cu.write_text(render(name, params_of(name, case)))
    cmd = nvcc_command(name, cu, so)
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    seconds = time.monotonic() - start
    assert proc.returncode == 0, (
        f"nvcc failed on {name}/{case} after {seconds:.0f} s\n$ {' '.join(cmd)}\n"
        + (proc.stdout + proc.stderr)[-6000:])
    print(f"{name}/{case}: nvcc {seconds:.0f} s")

    # The .so loads without a GPU (cudart is static) and exports the C ABI.
    lib = ctypes.CDLL(str(so))
    launch = getattr(lib, f"fact_{name}_launch")
    workspace_size = getattr(lib, f"fact_{name}_workspace_size")
    assert launch and workspace_size
    workspace_size.restype = ctypes.c_size_t
    if name == "gemm_softmax_sm80":
        # D (2 x 256 x 512 halves) + row maxima and sums (2 x 4 n-tiles x 256 floats each)
        workspace_size.argtypes = [ctypes.c_int64] * 4
        assert workspace_size(256, 512, 64, 2) == 2 * 256 * 512 * 2 + 2 * (2 * 4 * 256 * 4)
    if name == "conv_sm90":
        # geometry n, c, k, input[3], filter[3], output[3], stride[3], padding[3], dilation[3]: 8 x 64 x 64 x 64
        # images, 3x3. split3 writes [x, x, lo(x)] (3 x 64 floats a pixel) into the workspace first.
        workspace_size.argtypes = [ctypes.c_void_p]
        geo = (ctypes.c_int64 * 21)(8, 64, 128, 64, 64, 1, 3, 3, 1, 62, 62, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1)
        split = params_of(name, case)["split3"]
        assert workspace_size(ctypes.addressof(geo)) == (8 * 64 * 64 * 3 * 64 * 4 if split else 0)
    if name == "conv_gemm_sm90":
        # the pointwise GEMM: B's lo parts come with the weight, A is split in registers, so the
        # workspace is the persistent scheduler's alone: nothing the size of the activation
        workspace_size.argtypes = [ctypes.c_void_p]
        geo = (ctypes.c_int64 * 21)(8, 64, 128, 64, 64, 1, 1, 1, 1, 64, 64, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1)
        assert workspace_size(ctypes.addressof(geo)) < 8 * 64 * 64 * 64 * 4
    if name == "fmha_sm80":
        # head dim 64 <= keys_per_block: O stays in registers, no fp32 accumulator buffer
        workspace_size.argtypes = [ctypes.c_int64] * 4
        assert workspace_size(2, 8, 1024, 64) == 0
