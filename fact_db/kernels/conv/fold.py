"""BatchNorm folding: an eval-mode BatchNorm after a convolution becomes the convolution's own
weight and bias, computed once when composing (in float64, rounded to the weight's dtype).

    w' = w * gamma / sqrt(var + eps)            (per output channel)
    b' = (b - mean) * gamma / sqrt(var + eps) + beta

>>> w2, b2 = fold_bn(conv.weight, conv.bias, bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.eps)
>>> torch.allclose(F.conv2d(x, w2, b2), bn(conv(x)), atol=1e-5)
True
"""
from __future__ import annotations


def fold_bn(w, b, gamma, beta, mean, var, eps: float, transposed: bool = False, groups: int = 1):
    """(w', b') of conv(w, b) followed by BatchNorm(gamma, beta, mean, var, eps) in eval mode.
    `b`, `gamma` and `beta` may be None (no bias, no affine). A transposed convolution's weight
    is C_in x K/groups x ...: its output channels are along dim 1, per group."""
    import torch
    dt = w.dtype
    f64 = lambda t: t.detach().to(torch.float64)  # noqa: E731
    k = mean.numel()
    scale = f64(var).add(eps).rsqrt()
    if gamma is not None:
        scale = scale * f64(gamma)
    shift = -f64(mean) * scale
    if b is not None:
        shift = shift + f64(b) * scale
    if beta is not None:
        shift = shift + f64(beta)
    w64 = f64(w)
    if transposed:
        cin, kg = w64.shape[0], w64.shape[1]
        s = scale.view(groups, 1, kg).expand(groups, cin // groups, kg).reshape(cin, kg)
        w64 = w64 * s.view(cin, kg, *([1] * (w64.dim() - 2)))
    else:
        w64 = w64 * scale.view(k, *([1] * (w64.dim() - 1)))
    return w64.to(dt), shift.to(dt)
