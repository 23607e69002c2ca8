"""benchmarks/ncu_profile.py's reading of Nsight Compute's CSV (`--csv --page details`), on the
CPU: the figures issue 28 asks for (duration, achieved TFLOP/s, SM and memory throughput, the
limiter), per profiled launch, whatever the program printed before ncu's table. The profiling
itself needs ncu and a GPU."""
from __future__ import annotations


import pytest

from conftest import benchmark_script

ncu = benchmark_script("ncu_profile")

HEAD = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
        '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def _row(i, section, name, unit, value, kernel="device_kernel"):
    return (f'"{i}","4242","python3","127.0.0.1","{kernel}","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0",'
            f'"{section}","{name}","{unit}","{value}"')


def test_the_main_figures_of_each_launch_and_its_limiter():
    text = "\n".join([
        "LABEL presplit promote/2 128x128x16 c1x1 coop persistent",
        "==PROF== Profiling \"device_kernel\" - 0: 0%....50%....100% - 38 passes",
        HEAD,
        _row(0, "GPU Speed Of Light Throughput", "Duration", "msecond", "3.02"),
        _row(0, "GPU Speed Of Light Throughput", "Compute (SM) Throughput", "%", "71.35"),
        _row(0, "GPU Speed Of Light Throughput", "Memory Throughput", "%", "48.10"),
        _row(0, "GPU Speed Of Light Throughput", "DRAM Throughput", "%", "22.5"),
        _row(0, "Compute Workload Analysis", "Issue Slots Busy", "%", "35.2"),
        _row(0, "Launch Statistics", "Registers Per Thread", "register/thread", "168"),
        _row(0, "Occupancy", "Achieved Occupancy", "%", "18.7"),
        _row(1, "GPU Speed Of Light Throughput", "Duration", "usecond", "1,250.5"),
        _row(1, "GPU Speed Of Light Throughput", "Compute (SM) Throughput", "%", "30.0"),
        _row(1, "GPU Speed Of Light Throughput", "Memory Throughput", "%", "82.0"),
    ])
    flops = 2.0 * 65536 * 768 * 3072
    first, second = ncu.parse_details(text, flops)
    assert first["kernel"] == "device_kernel" and first["duration_us"] == pytest.approx(3020.0)
    assert first["tflops"] == pytest.approx(flops / 3.02e-3 / 1e12)
    assert (first["sm_throughput_pct"], first["memory_throughput_pct"], first["limiter"]) == (71.35, 48.1, "compute (SM)")
    assert (first["issue_slots_busy_pct"], first["registers_per_thread"], first["achieved_occupancy_pct"]) == \
        (35.2, 168.0, 18.7)
    assert first["metrics"]["GPU Speed Of Light Throughput"]["Duration"] == {"value": 3.02, "unit": "msecond"}
    assert second["duration_us"] == pytest.approx(1250.5) and second["limiter"] == "memory"  # thousands separators


def test_no_table_is_no_launch():
    assert ncu.parse_details("==ERROR== Failed to initialize the profiler: LibraryNotLoaded\n") == []


def test_without_ncu_the_script_says_what_to_do(capsys):
    with pytest.raises(SystemExit, match="ncu not found"):
        ncu.main(["gemm", "--shape", "64x64x64", "--ncu", "/nonexistent/ncu"])


def test_the_raw_page_keeps_the_pipe_and_shared_memory_counters_of_each_launch():
    text = "\n".join([
        '"ID","Kernel Name","sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",'
        '"l1tex__data_pipe_lsu_wavefronts_mem_shared.sum","launch__grid_size","smsp__warp_issue_stalled_wait_per_warp_active.pct"',
        '"","","%","","",""',
        '"0","device_kernel","71.5","1,234,567","132","12.5"',
        '"1","device_kernel","n/a","10","264","3"',
    ])
    first, second = ncu.parse_raw(text)
    assert first == {"sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active": {"value": 71.5, "unit": "%"},
                     "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum": 1234567.0,
                     "smsp__warp_issue_stalled_wait_per_warp_active.pct": 12.5}  # launch__grid_size is not kept
    assert "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active" not in second  # not a number
    assert ncu.parse_raw("==ERROR== no report\n") == []


def test_attention_flops_count_both_products_under_the_causal_mask():
    """The attention family's achieved TFLOP/s divides by Q K^T and P V, each 2 B H L^2 D and
    half of it under the causal mask: 2 B H L^2 D in all (minGPT's shape: 51.5 GFLOP)."""
    import argparse
    a = argparse.Namespace(family="attention", shape="128x8x512x96")
    flops, shape = ncu._flops(a)
    assert flops == 2.0 * 128 * 8 * 512 * 512 * 96
    assert shape == "128x8x512x96 causal"
    assert ncu.KERNEL_NAMES["attention"] == "fmha_kernel"
    assert set(ncu.CHILDREN) == {"gemm", "conv", "attention", "gemm-op"}


def test_gemm_op_reads_a_batched_shape_and_counts_every_product():
    """`gemm-op`'s --shape is the tuner's workload: MxNxK or MxNxKxBATCH, B as --layout-b says,
    under --policy; its FLOPs count every batch; a malformed shape is refused by name."""
    import argparse
    a = argparse.Namespace(family="gemm-op", shape="512x2048x1024x128", layout_b="row", policy="tf32x3")
    w = ncu.gemm_op_workload(a)
    assert (w.m, w.n, w.k, w.batch, w.layout_b, w.policy) == (512, 2048, 1024, 128, "row", "tf32x3")
    assert ncu._flops(a) == (2.0 * 128 * 512 * 2048 * 1024, f"{w.shape} B row")
    one = ncu.gemm_op_workload(argparse.Namespace(shape="65536x768x3072", layout_b="col", policy="tf32"))
    assert (one.batch, one.layout_b) == (1, "col")
    with pytest.raises(SystemExit, match="MxNxK or MxNxKxBATCH"):
        ncu.gemm_op_workload(argparse.Namespace(shape="64x64", layout_b="col", policy="fp32"))


SOURCE_HEAD = ('"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)",'
               '"Instructions Executed"')


def test_where_the_warps_waited_by_instruction_and_by_opcode():
    """`--source`: ncu's source page (a row per SASS instruction with its warp-stall samples) read
    into the instructions with most samples and the samples summed by opcode, predicates and
    modifiers dropped; rows without samples are not listed; a page without the samples column
    reads as nothing (the JSON then keeps the page's start)."""
    text = "\n".join([
        "LABEL fmha_fp32wg q128 k32 hd96 p32 smemsplit ws",
        '"Kernel Name","fmha_kernel"',
        SOURCE_HEAD,
        '"0x7f00","MOV R1, c[0x0][0x28]","0","0","384"',
        '"0x7f10","@P0 SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR4+0x20], R3","300","290","1,024"',
        '"0x7f20","HGMMA.64x32x8.F32.TF32 R24, gdesc[UR8], R24","120","20","4096"',
        '"0x7f30","WARPGROUP.DEPBAR.LE gsb0, 0x0","500","500","2048"',
        '"0x7f40","MUFU.EX2 R5, R5","60","10","8192"',
        '"0x7f50","@!P2 BAR.SYNC.DEFER_BLOCKING 0x9, 0x80","20","20","512"',
        '"0x7f60","@!P1 BRA 0x7f10","40","30","900"',
        '"0x7f70","BRA 0x7fff","5","5","9"',
    ])
    got = ncu.parse_source(text, top=3)
    assert got["samples"] == 1045
    assert got["by_opcode"][:3] == [["WARPGROUP.DEPBAR", 500, 0.4785], ["SYNCS", 300, 0.2871], ["HGMMA", 120, 0.1148]]
    assert [op for op, _, _ in got["by_opcode"]] == ["WARPGROUP.DEPBAR", "SYNCS", "HGMMA", "MUFU", "BRA", "BAR"]
    assert [t["address"] for t in got["top"]] == ["0x7f30", "0x7f10", "0x7f20"]
    # a branch names the instruction it goes to (an mbarrier wait's retry loop names its barrier);
    # one whose target is not on the page names none
    every = {t["address"]: t for t in ncu.parse_source(text, top=9)["top"]}
    assert every["0x7f60"]["target"].startswith("@P0 SYNCS.PHASECHK") and "target" not in every["0x7f70"]
    assert "target" not in every["0x7f30"]
    assert got["top"][1]["not_issued"] == 290 and got["top"][1]["sass"].startswith("@P0 SYNCS")
    assert ncu.parse_source(text.replace("Warp Stall Sampling", "Stall Samples")) == {}
    assert ncu.parse_source(SOURCE_HEAD + '\n"0x0","NOP","0","0","1"') == {}
