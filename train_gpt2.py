"""
GPT-2 pretraining in one file: model, data loader, schedule, DDP training loop, evaluation, checkpoints.

Run it (see README.md for the full recipe):
    python fineweb.py --local input.txt --out_dir data/shakespeare     # tokenise the built-in corpus
    python train_gpt2.py --preset shakespeare                          # a small model, CPU-friendly
    torchrun --standalone --nproc_per_node=8 train_gpt2.py --preset gpt2-124M   # the 10B-token recipe
    python train_gpt2.py sample --init_from gpt2 --prompt "Hello, I'm a language model,"
    python train_gpt2.py plot log/          # write log/curves.png
    python train_gpt2.py export log/model_19073.pt out/gpt2-ours   # a Hugging Face directory

Data comes from fineweb.py: uint16 `.npy` token shards named `{prefix}_{val|train}_{index:06d}.npy`.
Importing this module does nothing but define things.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import functools
import hashlib
import json
import math
import os
import platform
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent

# ----------------------------------------------------------------------------------------------------------
# Tokenizer: the GPT-2 BPE built from a vendored vocabulary file, so it never touches the network.

GPT2_VOCAB_FILE = HERE / "assets" / "gpt2.tiktoken"  # == tiktoken's r50k_base ranks, from openai-whisper
GPT2_VOCAB_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
GPT2_SPLIT_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
EOT_TOKEN = 50256  # <|endoftext|>: delimits documents
GPT2_VOCAB_SIZE = 50257  # real token ids; a padded model (50304) never samples the ids above this


@functools.lru_cache(maxsize=None)
def get_tokenizer(vocab_file: str | os.PathLike = GPT2_VOCAB_FILE):
    """The GPT-2 encoding (identical to tiktoken.get_encoding('gpt2')), built offline."""
    import tiktoken

    data = Path(vocab_file).read_bytes()
    if hashlib.sha256(data).hexdigest() != GPT2_VOCAB_SHA256:
        raise ValueError(f"{vocab_file} is not the GPT-2 vocabulary (sha256 mismatch); restore it from git")
    ranks = {base64.b64decode(tok): int(rank) for tok, rank in (line.split() for line in data.splitlines() if line)}
    return tiktoken.Encoding(
        name="gpt2",
        pat_str=GPT2_SPLIT_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": EOT_TOKEN},
        explicit_n_vocab=GPT2_VOCAB_SIZE,
    )


# ----------------------------------------------------------------------------------------------------------
# Model


@dataclass
class GPTConfig:
    block_size: int = 1024  # maximum context length (rows of the position table)
    vocab_size: int = 50257  # rows of the token table; 50304 (a multiple of 128) trains faster from scratch
    n_layer: int = 12  # transformer blocks
    n_head: int = 12  # attention heads per block
    n_embd: int = 768  # residual stream width

    def __post_init__(self):
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"GPTConfig.{name} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")


class KVCache:
    """Keys and values of the tokens generated so far, preallocated for `block_size` positions."""

    def __init__(self, config: GPTConfig, batch_size: int, device, dtype):
        shape = (config.n_layer, batch_size, config.n_head, config.block_size, config.n_embd // config.n_head)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.pos = 0  # number of positions already cached

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Store k, v (B, nh, T, hs) after the cached positions; return all keys and values so far."""
        end = self.pos + k.size(2)
        self.k[layer, :, :, self.pos : end] = k
        self.v[layer, :, :, self.pos : end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        self.n_head = config.n_head
        self.layer = layer  # index into a KVCache
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)  # q, k, v for all heads in one matmul
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor, kv_cache: Optional[KVCache] = None) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        # With a cache, either prefill (nothing cached yet: ordinary causal attention) or decode one token,
        # whose query may see every cached key: is_causal=True would align the mask top-left and hide them.
        is_causal = kv_cache is None or kv_cache.pos == 0
        if kv_cache is not None:
            k, v = kv_cache.update(self.layer, k, v)  # (B, nh, pos+T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # merge heads
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.gelu = nn.GELU(approximate="tanh")  # GPT-2 used the tanh approximation
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config, layer)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, kv_cache: Optional[KVCache] = None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), kv_cache)  # pre-norm: the residual stream itself is never normalised
        x = x + self.mlp(self.ln_2(x))
        return x


# The four weights that Hugging Face stores as Conv1D, i.e. (in, out): transposed relative to nn.Linear.
HF_TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
HF_HUB_MODELS = {  # name -> (n_layer, n_head, n_embd)
    "gpt2": (12, 12, 768),  # 124M
    "gpt2-medium": (24, 16, 1024),  # 350M
    "gpt2-large": (36, 20, 1280),  # 774M
    "gpt2-xl": (48, 25, 1600),  # 1558M
}


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # weight tying: one Parameter, two uses
        self.apply(self._init_weights)
        # Each block adds two projections to the residual stream; scale them so its variance stays O(1).
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 * (2 * config.n_layer) ** -0.5)

    @staticmethod
    def _init_weights(module: nn.Module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: Optional[torch.Tensor] = None, kv_cache: Optional[KVCache] = None):
        """idx (B, T) token ids -> (logits (B, T, vocab), mean cross-entropy over targets != -100, or None)."""
        if idx.dim() != 2 or idx.size(1) == 0:
            raise ValueError(f"idx must be a non-empty (B, T) tensor of token ids, got shape {tuple(idx.shape)}")
        B, T = idx.size()
        start = 0 if kv_cache is None else kv_cache.pos
        if start + T > self.config.block_size:
            raise ValueError(f"sequence length {start + T} exceeds block_size {self.config.block_size}")
        if kv_cache is not None and start > 0 and T != 1:
            raise ValueError("with a non-empty KV cache, feed one token at a time")
        pos = torch.arange(start, start + T, dtype=torch.long, device=idx.device)  # (T,)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)  # (B, T, C)
        for block in self.transformer.h:
            x = block(x, kv_cache)
        if kv_cache is not None:
            kv_cache.pos += T
        logits = self.lm_head(self.transformer.ln_f(x))  # (B, T, vocab)
        loss = None
        if targets is not None:
            # fp32 softmax; positions whose target is -100 (padding) are left out of the mean
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1), ignore_index=-100)
        return logits, loss

    def num_params(self, exclude_embeddings: bool = False) -> int:
        """Unique parameters (the tied token table counted once). exclude_embeddings drops the position
        table only: the token table is also the output projection, so it does real work per token."""
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            n -= self.transformer.wpe.weight.numel()
        return n

    def crop_block_size(self, block_size: int):
        """Shorten the context of a (loaded) model: keep the first `block_size` rows of the position table."""
        if not 0 < block_size <= self.config.block_size:
            raise ValueError(f"crop_block_size: need 0 < {block_size} <= {self.config.block_size}")
        self.config = dataclasses.replace(self.config, block_size=block_size)
        self.transformer.wpe.weight = nn.Parameter(self.transformer.wpe.weight[:block_size].detach().clone())

    def configure_optimizers(self, weight_decay: float, learning_rate: float, device_type: str):
        """AdamW with decay on matrices/embeddings (dim >= 2) only; biases and LayerNorm gains are not decayed."""
        params = list(self.parameters())  # unique: the tied table appears once
        decay = [p for p in params if p.requires_grad and p.dim() >= 2]
        no_decay = [p for p in params if p.requires_grad and p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=(0.9, 0.95), eps=1e-8, fused=device_type == "cuda")

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: Optional[int] = None,
        generator: Optional[torch.Generator] = None,
        use_cache: bool = True,
        vocab_limit: Optional[int] = None,
    ) -> torch.Tensor:
        """Extend idx (B, T) by max_new_tokens sampled tokens (greedy when temperature == 0).

        The context is cropped to the last block_size tokens. The KV cache is exact: while the sequence fits,
        each step feeds one token; past block_size every position shifts, so the window is re-run from scratch
        (what the no-cache path does every step). vocab_limit masks padded ids (e.g. >= 50257) out."""
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if top_k is not None and top_k <= 0:
            raise ValueError(f"top_k must be positive, got {top_k}")
        block_size = self.config.block_size
        cache = None
        for _ in range(max_new_tokens):
            if use_cache and cache is not None and idx.size(1) <= block_size:
                logits, _ = self(idx[:, -1:], kv_cache=cache)  # decode: only the newest token is new
            elif use_cache and idx.size(1) < block_size:
                cache = KVCache(self.config, idx.size(0), idx.device, self.transformer.wte.weight.dtype)
                logits, _ = self(idx, kv_cache=cache)  # prefill the prompt once
            else:
                logits, _ = self(idx[:, -block_size:])  # no cache, or a sliding window whose positions all move
            logits = logits[:, -1, :].float()  # (B, vocab)
            if vocab_limit is not None:
                logits[:, vocab_limit:] = float("-inf")
            if temperature == 0:
                next_id = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                probs = F.softmax(logits, dim=-1)
                next_id = torch.multinomial(probs, num_samples=1, generator=generator)  # (B, 1)
            idx = torch.cat((idx, next_id), dim=1)
        return idx

    @classmethod
    def from_pretrained(cls, name_or_path: str) -> "GPT":
        """OpenAI GPT-2 weights: a hub name ('gpt2', 'gpt2-medium', 'gpt2-large', 'gpt2-xl', downloaded by
        transformers) or a local directory written by GPT2LMHeadModel.save_pretrained."""
        from transformers import GPT2LMHeadModel  # heavy; only when asked for

        if name_or_path not in HF_HUB_MODELS and not Path(name_or_path).is_dir():
            raise ValueError(f"{name_or_path!r} is neither a GPT-2 hub name {list(HF_HUB_MODELS)} nor a directory")
        hf = GPT2LMHeadModel.from_pretrained(name_or_path)
        c = hf.config
        if c.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
            raise ValueError(f"{name_or_path}: activation {c.activation_function!r} is not GPT-2's tanh GELU")
        config = GPTConfig(
            block_size=c.n_positions, vocab_size=c.vocab_size, n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd
        )
        model = cls(config)
        model.load_state_dict(convert_hf_state_dict(hf.state_dict(), model.state_dict()))
        return model


def convert_hf_state_dict(hf_sd: dict, our_sd: dict) -> dict:
    """Map a Hugging Face GPT2LMHeadModel state dict onto ours: same keys, Conv1D weights transposed.

    Key sets are compared by name (mask buffers ignored) and every shape is checked, so a model of another
    size or layout fails loudly instead of loading half-way."""
    hf_sd = {k: v for k, v in hf_sd.items() if not k.endswith((".attn.bias", ".attn.masked_bias"))}
    missing, unexpected = sorted(set(our_sd) - set(hf_sd)), sorted(set(hf_sd) - set(our_sd))
    if missing or unexpected:
        raise ValueError(f"state dict keys differ: missing {missing[:10]}, unexpected {unexpected[:10]}")
    out = {}
    for key, ours in our_sd.items():
        theirs = hf_sd[key].t() if key.endswith(HF_TRANSPOSED) else hf_sd[key]
        if theirs.shape != ours.shape:
            raise ValueError(f"{key}: shape {tuple(theirs.shape)} does not fit ours {tuple(ours.shape)}")
        out[key] = theirs.detach().to(dtype=ours.dtype).contiguous()
    return out


# ----------------------------------------------------------------------------------------------------------
# Checkpoints


def load_checkpoint(path: str | os.PathLike) -> dict:
    """A checkpoint written by this script: plain tensors and dicts, loaded without running any code."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated file, not a torch file, or pickled objects weights_only refuses
        raise ValueError(f"{path} is not a readable checkpoint of this script ({type(e).__name__}: {e})") from None
    if not isinstance(ckpt, dict) or "model" not in ckpt or "model_config" not in ckpt:
        raise ValueError(f"{path} is not a checkpoint of this script (no 'model' / 'model_config' entries)")
    return ckpt


def load_model(source: str, device: str = "cpu") -> GPT:
    """A model from one of our checkpoints (a file), a local Hugging Face directory, or a GPT-2 hub name."""
    if Path(source).is_file() or str(source).endswith(".pt"):
        ckpt = load_checkpoint(source)
        model = GPT(GPTConfig(**ckpt["model_config"]))
        model.load_state_dict(ckpt["model"])
    else:
        model = GPT.from_pretrained(str(source))
    return model.to(device)
