"""kernels_cpp/gemm_sm80.cu.j2, the CUTLASS 2.x Ampere GEMM family: every parameter lands in
the rendered source where it should, bad choices stop the build with a readable `#error`,
and -- behind the `nvcc` marker -- an sm_90a build compiles (Hopper cannot load sm_80 SASS)
and its machine code uses the math units the parameters ask for.

tests/test_templates_nvcc.py already renders every example case and compiles the ones that
examples.yaml lists under `compile:`; this file checks what is particular to this template:

    pytest -m nvcc tests/test_templates_sm80.py
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import jinja2
import pytest

from fact_db.kernels.template import TemplateError

from test_templates_nvcc import EXAMPLES, _nvcc_skip_reason, nvcc_command, params_of, render

NAME = "gemm_sm80"
CASES = EXAMPLES[NAME]["cases"]


def sm80(case: str, **overrides) -> str:
    return render(NAME, params_of(NAME, case) | overrides)


def errors(src: str) -> list[str]:
    return [line for line in src.splitlines() if line.startswith("#error")]


# ---------------------------------------------------------------------------------------
# rendering


def test_examples_cover_the_families_the_realization_stage_asks_for():
    kinds = {(p["op_class"].rsplit("::", 1)[1], p["math_operator"].rsplit("::", 1)[1], p["element_a"])
             for p in CASES.values()}
    assert ("OpClassTensorOp", "OpMultiplyAdd", "cutlass::half_t") in kinds
    assert ("OpClassTensorOp", "OpMultiplyAdd", "cutlass::bfloat16_t") in kinds
    assert ("OpClassTensorOp", "OpMultiplyAdd", "float") in kinds          # TF32
    assert ("OpClassTensorOp", "OpMultiplyAddFastF32", "float") in kinds   # 3xTF32
    assert ("OpClassSimt", "OpMultiplyAdd", "float") in kinds              # IEEE fp32
    assert {p["split_k_mode"] for p in CASES.values()} == {"none", "serial", "parallel"}
    assert {p["bias_axis"] for p in CASES.values()} == {"col", "row"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_parameter_value_is_echoed_in_the_generated_header(case):
    src = render(NAME, params_of(NAME, case))
    header = src[: src.index("#include")]
    for param, value in params_of(NAME, case).items():
        if param.startswith(("tile_", "warp_")):
            continue  # echoed as tile=MxNxK, warp=MxNxK
        assert f"{param}={value}" in header, param
    p = params_of(NAME, case)
    assert f"tile={p['tile_m']}x{p['tile_n']}x{p['tile_k']}" in header
    assert f"warp={p['warp_m']}x{p['warp_n']}x{p['warp_k']}" in header


def test_math_follows_op_class_element_type_and_math_operator():
    f16 = sm80("f16_bias_gelu_tanh")
    assert "using InstructionShape = cutlass::gemm::GemmShape<16, 8, 16>;" in f16
    assert "using MathOperator = cutlass::arch::OpMultiplyAdd;" in f16
    assert "constexpr int AlignmentA = 128 / cutlass::sizeof_bits<ElementA>::value;" in f16

    tf32 = sm80("tf32_none")
    assert "using InstructionShape = cutlass::gemm::GemmShape<16, 8, 8>;" in tf32
    assert "using MathOperator = cutlass::arch::OpMultiplyAdd;" in tf32

    tf32x3 = sm80("tf32x3_none")
    assert "using MathOperator = cutlass::arch::OpMultiplyAddFastF32;" in tf32x3
    assert "using InstructionShape = cutlass::gemm::GemmShape<16, 8, 8>;" in tf32x3
    assert "using ThreadblockShape = cutlass::gemm::GemmShape<128, 64, 16>;" in tf32x3
    assert "using WarpShape = cutlass::gemm::GemmShape<64, 32, 16>;" in tf32x3

    tf32_t = sm80("tf32_none", element_a="cutlass::tfloat32_t", element_b="cutlass::tfloat32_t")
    assert not errors(tf32_t)  # fact_db.kernels.template names fp32 operands tfloat32_t for Hopper
    assert "using InstructionShape = cutlass::gemm::GemmShape<16, 8, 8>;" in tf32_t

    simt = sm80("simt_f32_residual")
    assert "using OperatorClass = cutlass::arch::OpClassSimt;" in simt
    assert "using InstructionShape = cutlass::gemm::GemmShape<1, 1, 1>;" in simt
    assert "constexpr int AlignmentA = 1;" in simt and "constexpr int AlignmentC = 1;" in simt
    assert "DefaultEpilogueWithBroadcastSimt<" in simt


def test_layouts_and_tile_parameters_reach_the_kernel():
    src = sm80("bf16_bias_relu_linear")
    assert "using ElementA = cutlass::bfloat16_t;" in src
    assert "using LayoutA = cutlass::layout::RowMajor;" in src
    assert "using LayoutB = cutlass::layout::ColumnMajor;" in src  # a Linear weight, N x K
    assert "using LayoutC = cutlass::layout::RowMajor;" in src
    assert "constexpr int kStages = 4;" in src
    assert "using Swizzle = cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<8>;" in src
    assert "using ElementBias = cutlass::bfloat16_t;" in src


def test_split_k_modes():
    none = sm80("f16_bias_gelu_tanh")
    assert "kSplitKSlices" not in none and "ReduceSplitK" not in none
    assert "GemmUniversalMode::kBatched" in none  # batch > 1 is one kBatched launch
    workspace_fn = none[none.index("size_t fact_gemm_sm80_workspace_size("):]
    assert "return 0;" in workspace_fn[: workspace_fn.index("}")]

    serial = sm80("tf32x3_splitk_serial_bias")
    assert "constexpr int kSplitKSlices = 4;" in serial
    assert "GemmUniversalMode::kGemm, kSplitKSlices" in serial
    assert "GemmUniversalMode::kGemmSplitKParallel" not in serial and "ReduceSplitK" not in serial

    parallel = sm80("f16_splitk_parallel")
    assert "constexpr int kSplitKSlices = 4;" in parallel
    assert "GemmUniversalMode::kGemmSplitKParallel" in parallel
    assert "cutlass::reduction::device::ReduceSplitK<ReductionKernel>" in parallel
    # pass 1 writes fp32 partials; pass 2 applies the epilogue (GELU with the bias as source)
    assert "ElementAccumulator, LayoutC,  // ElementC, LayoutC" in parallel
    assert "LinearCombinationGeneric<\n    cutlass::epilogue::thread::GELU," in parallel
    # the reduction sums the slices that actually ran, not split_k_slices
    assert "get_tiled_shape().k()" in parallel


@pytest.mark.parametrize(
    "epilogue,activation",
    [
        ("bias", "cutlass::epilogue::thread::Identity"),
        ("residual", "cutlass::epilogue::thread::Identity"),
        ("bias_relu", "cutlass::epilogue::thread::ReLu"),
        ("bias_gelu", "cutlass::epilogue::thread::GELU"),
        ("bias_gelu_tanh", "cutlass::epilogue::thread::GELU_taylor"),
        ("bias_silu", "cutlass::epilogue::thread::SiLu"),
    ],
)
def test_bias_epilogues_broadcast_the_bias_along_the_right_axis(epilogue, activation):
    col = sm80("f16_residual_linear", epilogue=epilogue)
    assert "LinearCombinationBiasElementwise<" in col
    assert f"{activation}<ElementCompute>,  // ElementwiseOp" in col
    assert "const_cast<void*>(bias),                     // ptr_Vector" in col
    assert "0,                                           // ldr: 0 = every row reads bias[0, N)" in col
    assert "VisitorColBroadcast" not in col

    row = sm80("f16_residual_linear", epilogue=epilogue, bias_axis="row")
    assert "LinearCombinationBiasElementwise" not in row
    assert "VisitorColBroadcast<\n    OutputTileThreadMap, ElementBias, cute::Stride<_1, _0, int64_t>>" in row
    assert f"VisitorCompute<\n    {activation}, ElementD" in row
    assert "SourceC" in row  # element_c is set: beta * C stays in the tree


def test_none_is_a_plain_linear_combination():
    src = sm80("f16_batched_bmm")
    assert "cutlass::gemm::device::GemmUniversal<" in src
    assert "cutlass::epilogue::thread::LinearCombination<" in src
    assert "ptr_Vector" not in src and "Visitor" not in src
    assert "(void)bias; (void)batch_stride_bias;" in src


def test_residual_reads_c_and_bias_as_separate_operands():
    src = sm80("simt_f32_residual")
    assert "using ElementC = float;" in src
    assert "a, b, c, d,                                  // ptr_A, ptr_B, ptr_C, ptr_D" in src
    assert "c = nullptr" not in src
    void_c = sm80("f16_bias_gelu_tanh")
    assert "c = nullptr;  // element_c is void: never read C" in void_c


def test_positional_template_arguments_are_labelled():
    src = sm80("f16_bias_gelu_tanh")
    for label in ("ElementAccumulator", "OperatorClass", "ArchTag", "ThreadblockShape",
                  "WarpShape", "InstructionShape", "EpilogueOutputOp", "ThreadblockSwizzle",
                  "Stages", "Operator", "ElementwiseOp", "ElementVector"):
        assert re.search(rf"//[^\n]*\b{label}\b", src), label


@pytest.mark.parametrize(
    "case,overrides,message",
    [
        ("f16_bias_gelu_tanh", {"epilogue": "bias_tanh"}, "unknown epilogue 'bias_tanh'"),
        ("f16_bias_gelu_tanh", {"element_c": "void", "epilogue": "residual"}, "'residual' needs a non-void element_c"),
        ("f16_bias_gelu_tanh", {"split_k_mode": "stream_k"}, "split_k_mode must be"),
        ("f16_bias_gelu_tanh", {"split_k_slices": 4}, "1 with split_k_mode 'none'"),
        ("tf32x3_splitk_serial_bias", {"split_k_slices": 0}, "split_k_slices must be >= 1"),
        ("f16_bias_gelu_tanh", {"tile_m": "128"}, "must be ints"),
        ("f16_bias_gelu_tanh", {"warp_k": 16}, "warp_k == tile_k"),
        ("f16_bias_gelu_tanh", {"warp_m": 48}, "warp tile must divide"),
        ("f16_bias_gelu_tanh", {"stages": 2}, "stages must be >= 3"),
        ("f16_bias_gelu_tanh", {"tile_k": 16, "warp_k": 16}, "TensorOp needs tile_k a multiple of 32"),
        ("tf32x3_none", {"tile_k": 8, "warp_k": 8}, "TensorOp needs tile_k a multiple of 16"),
        ("f16_bias_gelu_tanh", {"math_operator": "cutlass::arch::OpMultiplyAddFastF32"}, "needs op_class OpClassTensorOp and float operands"),
        ("f16_bias_gelu_tanh", {"math_operator": "cutlass::arch::OpMultiplyAddFastF16"}, "math_operator must be"),
        ("simt_f32_residual", {"math_operator": "cutlass::arch::OpMultiplyAddFastF32"}, "needs op_class OpClassTensorOp"),
        ("tf32x3_none", {"element_a": "cutlass::tfloat32_t", "element_b": "cutlass::tfloat32_t"}, "not cutlass::tfloat32_t"),
        ("simt_f32_residual", {"element_a": "cutlass::tfloat32_t", "element_b": "cutlass::tfloat32_t"}, "OpClassSimt supports float operands only"),
        ("f16_bias_gelu_tanh", {"op_class": "cutlass::arch::OpClassSimt"}, "OpClassSimt supports float operands only"),
        ("f16_bias_gelu_tanh", {"op_class": "cutlass::arch::OpClassWmmaTensorOp"}, "op_class must be"),
        ("f16_bias_gelu_tanh", {"element_a": "cutlass::float_e4m3_t"}, "element_a must be"),
        ("f16_bias_gelu_tanh", {"element_b": "cutlass::bfloat16_t"}, "element_b must equal element_a"),
        ("f16_bias_gelu_tanh", {"element_c": "float"}, "element_c must be 'void' or equal element_d"),
        ("f16_bias_gelu_tanh", {"element_accumulator": "cutlass::half_t"}, "element_accumulator must be 'float'"),
        ("f16_bias_gelu_tanh", {"layout_a": "cutlass::layout::ColumnMajorInterleaved<32>"}, "layout_a must be"),
        ("f16_bias_gelu_tanh", {"layout_b": "cutlass::layout::RowMajorInterleaved<32>"}, "layout_b must be"),
        ("f16_bias_gelu_tanh", {"swizzle": "cutlass::gemm::threadblock::ThreadblockSwizzleStreamK"}, "swizzle must be"),
        ("f16_bias_gelu_tanh", {"bias_axis": "diag"}, "bias_axis must be 'col' or 'row'"),
        ("simt_f32_residual", {"bias_axis": "row"}, "bias_axis 'row' needs op_class OpClassTensorOp"),
        ("tf32x3_splitk_serial_bias", {"bias_axis": "row"}, "bias_axis 'row' needs split_k_mode 'none'"),
        ("f16_splitk_parallel", {"element_c": "cutlass::half_t"}, "split_k_mode 'parallel' with a bias epilogue"),
        ("f16_splitk_parallel", {"element_bias": "float"}, "split_k_mode 'parallel' with a bias epilogue"),
        ("f16_splitk_parallel", {"bias_axis": "row"}, "bias_axis 'row' needs split_k_mode 'none'"),
    ],
)
def test_bad_choices_stop_the_build_with_a_readable_error(case, overrides, message):
    errs = errors(sm80(case, **overrides))
    assert errs, f"{overrides} rendered without an #error"
    assert all(e.startswith('#error "gemm_sm80.cu.j2: ') for e in errs)
    assert any(message in e for e in errs), errs


def test_parallel_split_k_without_bias_accepts_a_c_tensor():
    src = sm80("f16_splitk_parallel", epilogue="none", element_c="cutlass::half_t")
    assert not errors(src)
    assert "const void* source = c_l;" in src


def test_a_missing_parameter_is_a_jinja_error_naming_it():
    params = params_of(NAME, "f16_splitk_parallel")
    del params["split_k_slices"]
    with pytest.raises((jinja2.UndefinedError, TemplateError), match="split_k_slices"):
        render(NAME, params)


# ---------------------------------------------------------------------------------------
# nvcc: opt-in (about a minute per build on two cores)

SM90A = "arch=compute_90a,code=sm_90a"


def _cuobjdump() -> str | None:
    return shutil.which("cuobjdump")


def _sass_skip_reason() -> str | None:
    if _cuobjdump() is None:
        return ("cuobjdump (with nvdisasm) is not on PATH: the CUDA toolkit's, or pip's "
                "nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm")
    return _nvcc_skip_reason()


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """Compiles a case for one gencode, once per module run; returns the .so path."""
    built: dict[tuple[str, str], Path] = {}
    root = tmp_path_factory.mktemp("gemm_sm80")

    def _build(case: str, gencode: str) -> Path:
        key = (case, gencode)
        if key in built:
            return built[key]
        arch = gencode.rsplit("=", 1)[1]
        cu, so = root / f"{case}_{arch}.cu", root / f"{case}_{arch}.so"
        cu.write_text(render(NAME, params_of(NAME, case)))
        cmd = nvcc_command(NAME, cu, so)
        cmd = [c for c in cmd if not c.startswith("-gencode=")]
        cmd.insert(1, f"-gencode={gencode}")
        start = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        seconds = time.monotonic() - start
        assert proc.returncode == 0, (
            f"nvcc failed on {NAME}/{case} ({arch}) after {seconds:.0f} s\n$ {' '.join(cmd)}\n"
            + (proc.stdout + proc.stderr)[-6000:])
        assert "warning" not in proc.stderr, proc.stderr[-3000:]
        print(f"{NAME}/{case} ({arch}): nvcc {seconds:.0f} s")
        built[key] = so
        return so

    return _build


@pytest.mark.nvcc
@pytest.mark.skipif(_nvcc_skip_reason() is not None, reason=_nvcc_skip_reason() or "")
def test_row_bias_case_compiles_for_hopper(build):
    # sm_80 SASS does not load on an H100: the realization stage builds sm80 kernels for sm_90a
    # there. The visitor-tree (row bias) path is the one examples.yaml's compile list skips.
    import ctypes

    so = build("bf16_row_bias_silu", SM90A)
    lib = ctypes.CDLL(str(so))
    assert lib.fact_gemm_sm80_launch and lib.fact_gemm_sm80_workspace_size


@pytest.mark.nvcc
@pytest.mark.skipif(_nvcc_skip_reason() is not None, reason=_nvcc_skip_reason() or "")
def test_split_k_workspace_size_needs_no_gpu(build):
    import ctypes

    lib = ctypes.CDLL(str(build("f16_splitk_parallel", SM90A)))
    size = lib.fact_gemm_sm80_workspace_size
    size.restype = ctypes.c_size_t
    size.argtypes = [ctypes.c_int64] * 4
    # parallel split-K: one fp32 m x n slab per K slice, reused by every batch entry
    assert size(256, 640, 4096, 1) == 4 * 256 * 640 * 4
    assert size(256, 640, 4096, 3) == 4 * 256 * 640 * 4
    # slices are rounded up to 8 halves of K: K = 20 in 4 slices runs as 3 slices of 8
    assert size(64, 64, 20, 1) == 4 * 64 * 64 * 3


@pytest.mark.nvcc
@pytest.mark.skipif(_sass_skip_reason() is not None, reason=_sass_skip_reason() or "")
@pytest.mark.parametrize(
    "case,gencode,tensor_cores",
    [("bf16_row_bias_silu", SM90A, True), ("f16_splitk_parallel", SM90A, True),
     ("simt_f32_residual", SM90A, False)],
)
def test_machine_code_uses_the_math_units_asked_for(build, case, gencode, tensor_cores):
    so = build(case, gencode)
    listing = subprocess.run([_cuobjdump(), "--list-elf", str(so)], capture_output=True, text=True)
    arch = gencode.rsplit("=", 1)[1]
    assert listing.returncode == 0 and f".{arch}.cubin" in listing.stdout, listing.stdout + listing.stderr
    sass = subprocess.run([_cuobjdump(), "-sass", str(so)], capture_output=True, text=True)
    assert sass.returncode == 0, sass.stderr[-2000:]
    hmma = len(re.findall(r"\bHMMA\.", sass.stdout))
    ffma = len(re.findall(r"\bFFMA\b", sass.stdout))
    if tensor_cores:
        assert hmma > 0, f"{case}: no HMMA in the SASS"
    else:
        assert hmma == 0 and ffma > 0, f"{case}: HMMA={hmma} FFMA={ffma}; SIMT must use FFMA only"
