"""Layout planning for convolutions: fact-db's conv kernels read and write channels-last
(NHWC) activations, so a conversion is needed only where a kernel's activation (or residual)
does not come from another fact-db convolution through ops that keep channels-last.

    >>> arrives_channels_last(x_node, producer_is_kernel)   # walks back through ReLU, adds, pooling
    False
    >>> converted_anyway(x_node, other_users, is_kernel)     # another fact-db convolution reads it too
    True

Both stages ask this one question: realization (the workload's `layout`, so a kernel that
will read channels-last is timed that way) on the discovery graph, and composition (where it
inserts the conversions it counts) on the FX graph; `op_of` and `first_input` read a node of
either.
"""
from __future__ import annotations

# Ops whose output keeps their first tensor input's memory format (PyTorch's element-wise ops
# follow the first operand's layout where operands differ; pooling and batch_norm keep
# channels-last). Views and reshapes are not here: on a channels-last tensor they may copy to
# contiguous.
KEEP_LAYOUT = frozenset({
    "aten.relu", "aten.relu_", "aten.relu6", "aten.leaky_relu", "aten.leaky_relu_", "aten.gelu", "aten.silu",
    "aten.silu_", "aten.mish", "aten.mish_", "aten.hardswish", "aten.hardswish_", "aten.hardtanh", "aten.hardtanh_",
    "aten.tanh", "aten.sigmoid", "aten.clamp", "aten.clamp_min", "aten.clamp_max", "aten.add", "aten.add_",
    "aten.sub", "aten.sub_", "aten.mul", "aten.mul_", "aten.div", "aten.div_", "aten.batch_norm",
    "aten.max_pool1d", "aten.max_pool2d", "aten.max_pool3d", "aten.avg_pool1d", "aten.avg_pool2d", "aten.avg_pool3d",
    "aten.dropout", "aten.alias", "aten.detach",
})


def arrives_channels_last(node, is_kernel, op_of, first_input, limit: int = 64) -> bool:
    """Whether the value of `node` is channels-last when it reaches a consumer: it is a fact-db
    conv kernel's output (`is_kernel(node)`), or an op of KEEP_LAYOUT applied to such a value
    (its first tensor input, `first_input(node)`), at most `limit` ops back."""
    for _ in range(limit):
        if node is None:
            return False
        if is_kernel(node):
            return True
        if op_of(node) not in KEEP_LAYOUT:
            return False
        node = first_input(node)
    return False


# Element-wise ops through which a tensor reaches a convolution's chain as its residual.
RESIDUAL_OPS = frozenset({"aten.add", "aten.add_", "aten.sub", "aten.sub_", "aten.mul", "aten.mul_", "aten.div",
                          "aten.div_"})


def converted_anyway(node, others, is_kernel, op_of, first_input) -> bool:
    """Whether a value that is not channels-last is read, among its users `others`, by another
    fact-db convolution: as that convolution's activation (`is_kernel(user)`, the value its
    first input), or as the residual of its chain (an element-wise op whose other operand
    arrives channels-last from a fact-db convolution: ResNet's block input, read by the first
    1x1 convolution and added back after the last). Composition converts such a value once and
    every fact-db convolution reading it shares the conversion (fact_db/composition/compose.py),
    so realization does not charge it to any one of them."""
    for u in others:
        if is_kernel(u) and first_input(u) is node:
            return True
        if op_of(u) in RESIDUAL_OPS:
            rest = [a for a in u.tensor_inputs() if a is not node]
            if any(arrives_channels_last(a, is_kernel, op_of, first_input) for a in rest):
                return True
    return False
