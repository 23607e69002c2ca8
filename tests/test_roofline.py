"""The roofline: device names, and FLOPs and bytes of convolutions, recurrent ops and einsums
counted by hand (2 FLOPs per multiply-add)."""
import pytest
import torch
from torch import nn

from fact_db.discovery import roofline
from fact_db.discovery.trace import trace_module


def test_device_names_as_cuda_reports_them():
    """discover(gpu=torch.cuda.get_device_name()) on an H200 raised KeyError('nvidia h200')."""
    from fact_db.core.device import device
    assert device("NVIDIA H200").name == "H200"
    assert device("NVIDIA H100 80GB HBM3").name == "H100"
    assert device("h200").name == "H200" and device("A100-SXM4-80GB").name == "A100"
    assert device(None, "sm80").name == "A100" and device("RTX 4090").name == "H100"


# ------------------------------------------------------------------------------------------
# Convolutions, recurrent ops and einsums.


def _h100():
    from fact_db.core.device import device
    return device("h100")


def _node(module, *inputs, op):
    g = trace_module(module.eval(), inputs)
    return next(n for n in g.calls() if n.op == op), g


def test_convolution_flops_and_bytes():
    # conv2d, 2 groups, stride 2, no bias: out 2 x 8 x 4 x 4; each output sums C_in/groups * 3 * 3 = 18 inputs
    n, _ = _node(nn.Conv2d(4, 8, 3, stride=2, groups=2, bias=False), torch.randn(2, 4, 10, 10), op="aten.conv2d")
    assert roofline.node_flops(n) == 2 * (2 * 8 * 4 * 4) * (2 * 3 * 3)
    assert roofline.node_bytes(n) == 4 * (2 * 4 * 10 * 10 + 8 * 2 * 3 * 3 + 2 * 8 * 4 * 4)
    # conv1d with a bias: out 2 x 8 x 8, 4 * 3 inputs each, plus the bias add
    n, _ = _node(nn.Conv1d(4, 8, 3), torch.randn(2, 4, 10), op="aten.conv1d")
    assert roofline.node_flops(n) == 2 * (2 * 8 * 8) * (4 * 3) + 2 * 8 * 8
    # conv3d, padded: out 1 x 3 x 4 x 4 x 4, 2 * 27 inputs each, plus the bias
    n, _ = _node(nn.Conv3d(2, 3, 3, padding=1), torch.randn(1, 2, 4, 4, 4), op="aten.conv3d")
    assert roofline.node_flops(n) == 2 * (3 * 64) * (2 * 27) + 3 * 64


def test_transposed_convolution_scatters_every_input_element():
    # every input element (2 x 4 x 10 x 10) meets C_out/groups * 3 * 3 = 72 weights; out 2 x 8 x 21 x 21 gets the bias
    n, _ = _node(nn.ConvTranspose2d(4, 8, 3, stride=2), torch.randn(2, 4, 10, 10), op="aten.conv_transpose2d")
    assert tuple(n.shape) == (2, 8, 21, 21)
    assert roofline.node_flops(n) == 2 * (2 * 4 * 10 * 10) * (8 * 3 * 3) + 2 * 8 * 21 * 21
    n, _ = _node(nn.ConvTranspose1d(4, 6, 5, groups=2, bias=False), torch.randn(3, 4, 7), op="aten.conv_transpose1d")
    assert roofline.node_flops(n) == 2 * (3 * 4 * 7) * (3 * 5)


@pytest.mark.slow
def test_lstm_two_layers_bidirectional_batch_first():
    # batch 5, 7 steps, input 16, hidden 32: S = 35 rows, G = 4 gates, 2 layers, 2 directions
    lstm = nn.LSTM(16, 32, num_layers=2, bidirectional=True, batch_first=True)
    n, g = _node(lstm, torch.randn(5, 7, 16), op="aten.lstm")
    S, G, H, L, D = 35, 4, 32, 2, 2
    mats = D * (G * H * 16 + G * H * H) + D * (G * H * (D * H) + G * H * H)  # layer 0, then layer 1 (input D*H)
    vecs = L * D * 2 * G * H  # b_ih and b_hh
    assert roofline.node_flops(n) == 2 * S * mats + S * vecs + S * H * 28 * L * D
    states = 2 * (L * D * 5 * H) * 4  # h0 and c0, 4 bytes each element
    elems = S * D * H + 2 * S * G * H * L * D + 2 * S * D * H * (L - 1)
    assert roofline.node_bytes(n) == 4 * (5 * 7 * 16) + 4 * (mats + vecs) + 2 * states + 4 * elems
    # multi-output: the getitems that pick its outputs move nothing, and its dtype is its input's
    picks = [x for x in g.calls() if x.op == "python.getitem"]
    assert picks and all(roofline.node_time(x, _h100(), "fp32") == 0.0 for x in picks)
    assert n.dtype is None and roofline.node_dtype(n) == "float32"


def test_lstm_with_a_projection_counts_the_projection_and_outputs_of_its_size():
    n, _ = _node(nn.LSTM(16, 32, proj_size=8), torch.randn(7, 3, 16), op="aten.lstm")
    S, G, H, P = 21, 4, 32, 8
    mats = G * H * 16 + G * H * P + P * H  # w_ih, w_hh (G*H x P), w_hr
    assert roofline.node_flops(n) == 2 * S * mats + S * 2 * G * H + S * H * 28


def test_gru_and_rnn_flops():
    n, _ = _node(nn.GRU(16, 32), torch.randn(7, 3, 16), op="aten.gru")
    S, G, H = 21, 3, 32
    assert roofline.node_flops(n) == 2 * S * (G * H * 16 + G * H * H) + S * 2 * G * H + S * H * 20
    n, _ = _node(nn.RNN(16, 32, nonlinearity="relu", bias=False), torch.randn(7, 3, 16), op="aten.rnn_relu")
    assert roofline.node_flops(n) == 2 * S * (H * 16 + H * H) + S * H * 2
    n, _ = _node(nn.RNN(16, 32), torch.randn(3, 16), op="aten.rnn_tanh")  # unbatched: 3 steps of one row
    assert roofline.node_flops(n) == 2 * 3 * (H * 16 + H * H) + 3 * 2 * H + 3 * H * 5


def test_einsum_flops_as_a_gemm_and_as_a_chain():
    class E(nn.Module):
        def forward(self, a, b, c):
            return torch.einsum("bik,bkj->bij", a, b), torch.einsum("ij,jk,kl->il", a[0], b[0], c)
    g = trace_module(E(), (torch.randn(2, 3, 4), torch.randn(2, 4, 5), torch.randn(5, 6)))
    gemm, chain = [n for n in g.calls() if n.op == "aten.einsum"]
    assert roofline.node_flops(gemm) == 2 * 2 * 3 * 5 * 4
    assert roofline.node_flops(chain) == 2 * 3 * 4 * 5 + 2 * 3 * 5 * 6
    assert roofline.node_bytes(chain) == 4 * (3 * 4 + 4 * 5 + 5 * 6 + 3 * 6) + 2 * 4 * (3 * 5)  # + the intermediate


def test_a_big_model_of_convolutions_is_compute_bound_at_the_convolutions_real_cost():
    """The sweep's finding: one FLOP per output element put ResNet101 at 2.7 ms. A 3x3 conv over
    a 256-channel 56 x 56 map for a batch of 10 does 2 * 10*256*56*56 * 256*9 FLOPs."""
    n, _ = _node(nn.Conv2d(256, 256, 3, padding=1), torch.randn(10, 256, 56, 56, device="meta"), op="aten.conv2d")
    dev = _h100()
    f = 2.0 * 10 * 256 * 56 * 56 * 256 * 9 + 10 * 256 * 56 * 56
    assert roofline.node_flops(n) == f
    assert roofline.node_time(n, dev, "fp32") == pytest.approx(f / (dev.tflops["fp32"] * 1e12) + dev.launch_s)


@pytest.mark.slow
def test_a_recurrent_layer_takes_at_least_a_launch_per_step_and_layer():
    """Each step of each layer waits for the one before. KernelBench L3-39's GRU (6 layers, 512
    steps of batch 10) is 0.46 ms of FLOPs and bytes on an H100 and 9.2 ms of chain; eager
    PyTorch ran it in 34 ms (fp32, 2026-11). Two of its layers here, to trace quickly."""
    gru = nn.GRU(128, 256, num_layers=2).to("meta")
    n, _ = _node(gru, torch.randn(512, 10, 128, device="meta"), op="aten.gru")
    dev = _h100()
    work = max(roofline.node_flops(n) / (dev.tflops["fp32"] * 1e12), roofline.node_bytes(n) / dev.bandwidth)
    assert work < 512 * 2 * dev.launch_s / 10
    assert roofline.node_time(n, dev, "fp32") == pytest.approx(512 * 2 * dev.launch_s + dev.launch_s)
    # batch_first: the steps are the second dimension; two directions run side by side
    lstm = nn.LSTM(16, 32, num_layers=2, bidirectional=True, batch_first=True)
    n, _ = _node(lstm, torch.randn(5, 7, 16), op="aten.lstm")
    assert roofline.recurrent_chain_s(n, dev) == 7 * 2 * dev.launch_s
