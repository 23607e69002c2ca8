"""What the agent's tests share: the Linear -> ReLU module no shipped rule covers once
`gemm-bias-relu` is removed, and the environment without that rule (a copy of the shipped
rules, a fresh FACTDB_HOME, no LLM configured)."""
import shutil
from pathlib import Path

import torch
import torch.nn as nn

SHIPPED = Path(__file__).resolve().parent.parent / "rules"


class LinearRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 32)

    def forward(self, x):
        return torch.relu(self.fc(x))


def without_relu_rule(tmp_path, monkeypatch):
    """Shipped rules less gemm-bias-relu (so Linear -> ReLU is asked about), a fresh home."""
    root = tmp_path / "rules"
    shutil.copytree(SHIPPED, root, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "gemm_epilogue" / "gemm-bias-relu.yaml").unlink()
    (root / "gemm_epilogue" / "gemm-bias-relu.py").unlink()
    monkeypatch.setenv("FACTDB_RULES", str(root))
    monkeypatch.setenv("FACTDB_HOME", str(tmp_path / "home"))
    for k in ("FACTDB_LLM_BASE_URL", "FACTDB_LLM_MODEL", "FACTDB_LLM_API_KEY"):
        monkeypatch.delenv(k, raising=False)
    return tmp_path
