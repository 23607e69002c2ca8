"""A ResNet-50 bottleneck block (torchvision's `Bottleneck`, v1.5: the stride on the 3x3), as
issue 27's fp32 row: 1x1 conv 256 -> 64, BatchNorm, ReLU; 3x3 conv 64 -> 64, BatchNorm, ReLU;
1x1 conv 64 -> 256, BatchNorm; the identity added back; ReLU. Batch 32 at 56 x 56, the shape of
conv2_x, ResNet-50's first stage. Built in eval mode (an inference block however it is
loaded, `--eval` or not), so each BatchNorm folds into the convolution before it.

Work: 14.0 GFLOP (3.29 + 7.40 + 3.29), and at least 2 x 103 MB of activations in and out plus
the two 26 MB intermediates at fp32: on 3xTF32 tensor cores the 1x1 convolutions are nearly
memory-bound and the 3x3 compute-bound; IEEE-fp32 cuDNN is compute-bound on all three.
"""
import torch
import torch.nn as nn

batch_size = 32
in_channels = 256
planes = 64
size = 56


class Model(nn.Module):
    expansion = 4

    def __init__(self, in_channels: int, planes: int, stride: int = 1):
        super().__init__()
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(in_channels, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or in_channels != out:
            self.downsample = nn.Sequential(nn.Conv2d(in_channels, out, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(out))
        self.eval()

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return self.relu(y + identity)


def get_inputs():
    return [torch.randn(batch_size, in_channels, size, size)]


def get_init_inputs():
    return [in_channels, planes]
