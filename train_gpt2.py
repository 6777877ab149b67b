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
import bisect
import dataclasses
import functools
import hashlib
import json
import math
import os
import platform
import random
import re
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
# Configuration


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


def opt(default, help: str):
    """A TrainConfig field: its default and the --help text of its command-line flag."""
    return field(default=default, metadata={"help": help})


@dataclass
class TrainConfig:
    # data and output
    data_root: str = opt("edu_fineweb10B", "directory of fineweb.py shards ({prefix}_{val|train}_{i:06d}.npy)")
    log_dir: str = opt("log", "where log.txt, header.txt, checkpoints and curves.png go")
    shuffle_shards: bool = opt(False, "permute the train shard order every epoch (seeded, same on all ranks)")
    # model (from scratch; --init_from loads a shape instead)
    n_layer: int = opt(12, "transformer blocks")
    n_head: int = opt(12, "attention heads")
    n_embd: int = opt(768, "residual width")
    block_size: int = opt(1024, "maximum context length")
    vocab_size: int = opt(50304, "token table rows: 50257 real ids padded to a multiple of 128 for speed")
    init_from: str = opt("scratch", "scratch | gpt2 | gpt2-medium | ... | HF_DIR | CHECKPOINT.pt (weights only)")
    # batch
    batch_size: int = opt(64, "micro-batch B: sequences per forward pass per process")
    seq_len: int = opt(1024, "sequence length T of a training row")
    total_batch_size: int = opt(524288, "tokens per optimizer step, over all processes and micro-steps")
    # optimization
    max_steps: int = opt(19073, "optimizer steps to run (19,073 x 524,288 tokens = 10B)")
    lr_decay_steps: Optional[int] = opt(None, "step where the cosine reaches min_lr (default: max_steps)")
    warmup_steps: int = opt(715, "linear warmup steps")
    max_lr: float = opt(6e-4, "peak learning rate")
    min_lr_ratio: float = opt(0.1, "final learning rate as a fraction of max_lr")
    weight_decay: float = opt(0.1, "AdamW decay on matrices and embeddings (not biases or norms)")
    grad_clip: float = opt(1.0, "clip the global gradient norm to this (0: no clipping)")
    skip_nonfinite: bool = opt(False, "skip an update with a non-finite loss or grad norm instead of stopping")
    # evaluation and output intervals (0 disables)
    eval_interval: int = opt(250, "steps between validation losses")
    val_tokens: int = opt(10485760, "tokens of val loss (a multiple of seq_len), the same for any world size")
    hellaswag_interval: int = opt(250, "steps between HellaSwag evaluations")
    hellaswag_data: str = opt("", "HellaSwag jsonl (default: the official val split, downloaded once)")
    hellaswag_limit: int = opt(0, "score only the first N examples (0: all 10,042)")
    sample_interval: int = opt(250, "steps between printed samples")
    sample_prompt: str = opt("Hello, I'm a language model,", "prompt of the printed samples")
    ckpt_interval: int = opt(5000, "steps between checkpoints (one is always written at the end)")
    keep_last: int = opt(0, "keep only the newest K checkpoints (0: keep all)")
    resume: str = opt("", "'' (fresh run) | auto (newest valid checkpoint in log_dir, else fresh) | PATH")
    # runtime
    device: str = opt("auto", "auto (cuda > mps > cpu) | cpu | cuda | cuda:N | mps")
    dtype: str = opt("auto", "auto (bfloat16 on CUDA, else float32) | bfloat16 | float32: autocast dtype")
    compile: str = opt("auto", "torch.compile the training model: auto (on for CUDA) | true | false")
    seed: int = opt(1337, "seed of the initial weights, shuffling and samples")
    overfit_batch: bool = opt(False, "train on one fixed batch (a sanity check: the loss must go to ~0)")
    peak_flops: float = opt(0.0, "peak FLOP/s of one device for MFU (0: look up the GPU; none on CPU)")
    wandb_project: str = opt("", "log to this Weights & Biases project (needs `pip install wandb`)")

    def __post_init__(self):
        positive = ["n_layer", "n_head", "n_embd", "block_size", "vocab_size", "batch_size", "seq_len",
                    "total_batch_size", "max_steps"]
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name} must be positive, got {getattr(self, name)}")
        non_negative = ["warmup_steps", "eval_interval", "hellaswag_interval", "hellaswag_limit", "sample_interval",
                        "ckpt_interval", "keep_last", "weight_decay", "grad_clip", "peak_flops", "val_tokens"]
        for name in non_negative:
            if getattr(self, name) < 0:
                raise ValueError(f"--{name} must be >= 0, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"--n_embd ({self.n_embd}) must be divisible by --n_head ({self.n_head})")
        if self.seq_len > self.block_size:
            raise ValueError(f"--seq_len ({self.seq_len}) exceeds --block_size ({self.block_size})")
        if self.total_batch_size % (self.batch_size * self.seq_len):
            raise ValueError(f"--total_batch_size ({self.total_batch_size}) must be divisible by batch_size x "
                             f"seq_len ({self.batch_size} x {self.seq_len} = {self.batch_size * self.seq_len})")
        if self.lr_decay_steps is not None and self.lr_decay_steps <= 0:
            raise ValueError(f"--lr_decay_steps must be positive, got {self.lr_decay_steps}")
        if not 0 < self.max_lr < 1 or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"need 0 < max_lr < 1 and 0 <= min_lr_ratio <= 1, got {self.max_lr}, {self.min_lr_ratio}")
        if self.eval_interval and self.val_tokens <= 0:
            raise ValueError("--val_tokens must be positive when --eval_interval is set")
        if self.hellaswag_data and not Path(self.hellaswag_data).is_file():
            raise ValueError(f"--hellaswag_data {self.hellaswag_data} does not exist")
        if self.val_tokens % self.seq_len:
            raise ValueError(f"--val_tokens ({self.val_tokens}) must be a multiple of --seq_len ({self.seq_len})")
        for name, allowed in (("dtype", ("auto", "bfloat16", "float32")), ("compile", ("auto", "true", "false"))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"--{name} must be one of {'|'.join(allowed)}, got {getattr(self, name)!r}")


PRESETS = {
    # The reference recipe: GPT-2 124M on 10B FineWeb-Edu tokens (the TrainConfig defaults, spelled out).
    "gpt2-124M": dict(data_root="edu_fineweb10B", n_layer=12, n_head=12, n_embd=768, block_size=1024,
                      vocab_size=50304, batch_size=64, seq_len=1024, total_batch_size=524288, max_steps=19073,
                      warmup_steps=715, max_lr=6e-4, min_lr_ratio=0.1, weight_decay=0.1, grad_clip=1.0,
                      eval_interval=250, val_tokens=10485760, hellaswag_interval=250, sample_interval=250,
                      ckpt_interval=5000),
    # A small model on input.txt (`python fineweb.py --local input.txt --out_dir data/shakespeare`): about three
    # minutes on a 2-core CPU, val loss from 10.8 to about 6.4. The unpadded vocabulary: no GPU to align it for.
    "shakespeare": dict(data_root="data/shakespeare", log_dir="log/shakespeare", n_layer=4, n_head=4, n_embd=128,
                        block_size=128, vocab_size=50257, batch_size=16, seq_len=128, total_batch_size=2048,
                        max_steps=100, warmup_steps=10, max_lr=3e-3, eval_interval=25, val_tokens=8192,
                        hellaswag_interval=0, sample_interval=50, sample_prompt="KING.\n", ckpt_interval=100),
}


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


# --- char tokenizer (fineweb-robust) ---
class CharTokenizer:
    """One token per character: id i is chars[i] (`fineweb.py --tokenizer char`). The interface is the part of
    GPT-2's encoding that fineweb.py and sampling use; there is no <|endoftext|>: documents end in a blank line."""

    name = "char"
    eot_token = None

    def __init__(self, chars: str):
        if not chars or list(chars) != sorted(set(chars)):
            raise ValueError("a CharTokenizer's vocabulary must be a non-empty string of sorted, unique characters")
        self.chars = chars
        self.n_vocab = len(chars)
        self._ids = {c: i for i, c in enumerate(chars)}

    def encode_ordinary(self, text: str) -> list[int]:
        try:
            return [self._ids[c] for c in text]
        except KeyError as e:
            raise ValueError(f"character {e.args[0]!r} is not in the vocabulary of {self.n_vocab} characters") from None

    def encode(self, text: str, **kwargs) -> list[int]:
        """Same as encode_ordinary: GPT-2's special tokens (allowed_special=...) do not exist here."""
        return self.encode_ordinary(text)

    def decode(self, ids) -> str:
        ids = [int(i) for i in ids]  # numpy and torch integers too
        bad = next((i for i in ids if not 0 <= i < self.n_vocab), None)
        if bad is not None:
            raise ValueError(f"token id {bad} is not in 0..{self.n_vocab - 1}")
        return "".join(self.chars[i] for i in ids)


def tokenizer_from_manifest(info: dict):
    """The tokenizer a fineweb.py manifest.json names: GPT-2's (also when it names none) or a CharTokenizer."""
    kind = info.get("tokenizer", "gpt2")
    if kind == "gpt2":
        return get_tokenizer()
    if kind == "char" and isinstance(info.get("vocab"), str):
        return CharTokenizer(info["vocab"])
    raise ValueError(f"manifest tokenizer {kind!r}: expected 'gpt2', or 'char' with its 'vocab' string")
# --- end char tokenizer ---


# ----------------------------------------------------------------------------------------------------------
# Model


class KVCache:
    """Keys and values of the positions seen so far, preallocated for `length` positions (default block_size)."""

    def __init__(self, config: GPTConfig, batch_size: int, device, dtype, length: Optional[int] = None):
        self.length = config.block_size if length is None else length  # short sequences need less memory
        shape = (config.n_layer, batch_size, config.n_head, self.length, config.n_embd // config.n_head)
        self.k = torch.empty(shape, device=device, dtype=dtype)  # positions past pos are never read
        self.v = torch.empty(shape, device=device, dtype=dtype)
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

    def forward(self, x: torch.Tensor, kv_cache: Optional[KVCache] = None, attn_mask=None) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        pos = 0 if kv_cache is None else kv_cache.pos  # positions cached before these T
        if kv_cache is not None:
            k, v = kv_cache.update(self.layer, k, v)  # (B, nh, pos+T, hs)
        if attn_mask is not None:  # packed sequences: the caller says which keys each query sees
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)  # (B, nh, T, hs)
        elif pos == 0:  # nothing cached: ordinary causal attention
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        else:
            # The queries are positions pos..pos+T-1, the keys 0..pos+T-1: query i sees keys up to pos + i, a
            # causal mask shifted right by pos (is_causal=True would align it top-left and hide the cache).
            mask = torch.ones(T, pos + T, dtype=torch.bool, device=x.device).tril(diagonal=pos)  # (T, pos+T)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, nh, T, hs)
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

    def forward(self, x: torch.Tensor, kv_cache: Optional[KVCache] = None, attn_mask=None) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), kv_cache, attn_mask)  # pre-norm: the residual stream itself is never normalised
        x = x + self.mlp(self.ln_2(x))
        return x


# The four weights that Hugging Face stores as Conv1D, i.e. (in, out): transposed relative to nn.Linear.
HF_TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
HF_HUB_MODELS = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")  # OpenAI's 124M, 350M, 774M, 1558M


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

    def features(self, idx: torch.Tensor, kv_cache: Optional[KVCache] = None, pos=None, attn_mask=None) -> torch.Tensor:
        """idx (B, T) token ids -> final hidden states (B, T, C) after ln_f, which lm_head turns into logits.
        With a kv_cache, idx continues the cached positions: a prefill, a decode step or a chunk of T tokens.
        Packed sequences (several in one row, e.g. continuations of one prefix) give their own position ids
        pos (B, T) and attn_mask (B, 1, T, T), True where a query may see a key, in place of the causal mask."""
        if idx.dim() != 2 or idx.size(1) == 0:
            raise ValueError(f"idx must be a non-empty (B, T) tensor of token ids, got shape {tuple(idx.shape)}")
        B, T = idx.size()
        start = 0 if kv_cache is None else kv_cache.pos
        if (pos is None) != (attn_mask is None) or (pos is not None and kv_cache is not None):
            raise ValueError("packed sequences need both pos and attn_mask, and no kv_cache")
        if pos is None:
            pos = torch.arange(start, start + T, dtype=torch.long, device=idx.device)  # (T,)
            if start + T > self.config.block_size:
                raise ValueError(f"sequence length {start + T} exceeds block_size {self.config.block_size}")
        elif int(pos.max()) >= self.config.block_size:
            raise ValueError(f"position id {int(pos.max())} >= block_size {self.config.block_size}")
        if kv_cache is not None and start + T > kv_cache.length:
            raise ValueError(f"sequence length {start + T} exceeds the KV cache's length {kv_cache.length}")
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)  # (B, T, C)
        for block in self.transformer.h:
            x = block(x, kv_cache, attn_mask)
        if kv_cache is not None:
            kv_cache.pos += T
        return self.transformer.ln_f(x)

    def forward(self, idx: torch.Tensor, targets: Optional[torch.Tensor] = None, kv_cache: Optional[KVCache] = None):
        """idx (B, T) token ids -> (logits (B, T, vocab), mean cross-entropy over targets != -100, or None)."""
        logits = self.lm_head(self.features(idx, kv_cache))  # (B, T, vocab)
        loss = None
        if targets is not None:
            # fp32 softmax; positions whose target is -100 (padding) are left out of the mean
            logits_hi = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 up, fp64 kept
            loss = F.cross_entropy(logits_hi.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-100)
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

    def new_kv_cache(self, batch_size: int, length: int) -> KVCache:
        """An empty cache on the model's device, in the dtype attention makes k, v in (autocast's, when on)."""
        weight = self.transformer.wte.weight
        on = torch.is_autocast_enabled(weight.device.type)
        dtype = torch.get_autocast_dtype(weight.device.type) if on else weight.dtype
        return KVCache(self.config, batch_size, weight.device, dtype, length)

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
                h = self.features(idx[:, -1:], cache)  # decode: only the newest token is new
            elif use_cache and idx.size(1) < block_size:
                cache = self.new_kv_cache(idx.size(0), min(block_size, idx.size(1) + max_new_tokens))  # what we fill
                h = self.features(idx, cache)  # prefill the prompt once
            else:
                h = self.features(idx[:, -block_size:])  # no cache, or a sliding window whose positions all move
            logits = self.lm_head(h[:, -1, :]).float()  # (B, vocab): only the last position is sampled from
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
        if name_or_path not in HF_HUB_MODELS and not Path(name_or_path).is_dir():
            raise ValueError(f"{name_or_path!r} is neither a GPT-2 hub name {list(HF_HUB_MODELS)} nor a directory")
        from transformers import GPT2LMHeadModel  # heavy; only when asked for

        try:
            hf = GPT2LMHeadModel.from_pretrained(name_or_path)
        except (OSError, ValueError) as e:  # no weights there, or the hub unreachable
            raise ValueError(f"cannot load a GPT-2 model from {name_or_path!r} ({str(e).strip().splitlines()[0]})") from None
        c = hf.config
        if c.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
            raise ValueError(f"{name_or_path}: activation {c.activation_function!r} is not GPT-2's tanh GELU")
        # Settings our architecture hard-codes: anything else would load without error and compute another model.
        fixed = {"tie_word_embeddings": True, "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
                 "layer_norm_epsilon": 1e-5}
        differ = {k: getattr(c, k, v) for k, v in fixed.items() if getattr(c, k, v) != v}
        if differ:
            raise ValueError(f"{name_or_path}: config {differ} is not supported; GPT-2 has {fixed}")
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
# Data: fineweb.py's uint16 shards, memory-mapped and read as one continuous token stream per split


# The shard names fineweb.py writes and this file reads; one definition for both. Shard 000000 is val.
SHARD_NAME = re.compile(r"(?P<prefix>[^.].*)_(?P<split>val|train)_(?P<index>\d{6})\.npy")  # [^.]: not a temp file


def shard_name(prefix: str, index: int) -> str:
    """{prefix}_{val|train}_{index:06d}.npy: shard 0 is the validation split, the rest are train."""
    return f"{prefix}_{'val' if index == 0 else 'train'}_{index:06d}.npy"


def list_shards(data_root: str | os.PathLike, split: str) -> list[Path]:
    """The `split` shards of data_root ({prefix}_{split}_{index:06d}.npy), in index order."""
    root = Path(data_root)
    if not root.is_dir():
        raise FileNotFoundError(
            f"data directory {root} does not exist; create it with `python fineweb.py` "
            f"(or `python fineweb.py --local input.txt --out_dir {root}` for the built-in corpus)"
        )
    found = [(int(m["index"]), p) for p in root.iterdir() if (m := SHARD_NAME.fullmatch(p.name)) and m["split"] == split]
    shards = [p for _, p in sorted(found)]
    if not shards:
        raise FileNotFoundError(f"no '{split}' shards (*_{split}_*.npy) in {root}; run fineweb.py to make them")
    return shards


def open_shard(path: Path) -> np.ndarray:
    """Memory-map one shard: pages are read on demand, the shard is never copied into memory whole."""
    try:
        tokens = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as e:
        raise ValueError(f"{path} is not a readable .npy shard ({type(e).__name__}: {e})") from None
    if tokens.dtype != np.uint16 or tokens.ndim != 1:
        raise ValueError(f"{path}: expected a 1-D uint16 token array as fineweb.py writes, got {tokens.dtype} {tokens.shape}")
    return tokens


class TokenStream:
    """A list of shards read as one sequence of tokens; `read` copies only the tokens asked for."""

    def __init__(self, shards: list[np.ndarray], names: list[str]):
        self.shards, self.names = shards, names
        self.offsets = np.cumsum([0] + [len(s) for s in shards]).tolist()  # stream position of each shard

    @classmethod
    def from_split(cls, data_root: str | os.PathLike, split: str) -> "TokenStream":
        paths = list_shards(data_root, split)
        return cls([open_shard(p) for p in paths], [p.name for p in paths])

    def __len__(self) -> int:
        return self.offsets[-1]

    def read(self, start: int, n: int) -> np.ndarray:
        """Tokens [start, start+n) of the stream, across shard boundaries when needed."""
        if start < 0 or start + n > len(self):
            raise IndexError(f"read [{start}, {start + n}) outside a stream of {len(self)} tokens")
        out = np.empty(n, dtype=np.uint16)
        i, filled = bisect.bisect_right(self.offsets, start) - 1, 0
        while filled < n:
            lo = start + filled - self.offsets[i]
            take = min(n - filled, len(self.shards[i]) - lo)
            out[filled : filled + take] = self.shards[i][lo : lo + take]
            filled, i = filled + take, i + 1
        return out

    def shards_at(self, start: int, n: int) -> list[str]:
        """Names of the shards that tokens [start, start+n) come from (for error messages)."""
        first = bisect.bisect_right(self.offsets, start) - 1
        last = bisect.bisect_right(self.offsets, start + n - 1) - 1
        return self.names[first : last + 1]


def check_token_ids(tokens: np.ndarray, vocab_size: Optional[int], where: str):
    """Ids >= vocab_size would index past the embedding table (a device-side assert on CUDA)."""
    if vocab_size is not None and len(tokens) and int(tokens.max()) >= vocab_size:
        raise ValueError(f"token id {int(tokens.max())} >= vocab_size {vocab_size} in {where}; "
                         "the shards were made with another tokenizer, or vocab_size is too small")


class DataLoaderLite:
    """(B, T) training batches from the `split` shards of data_root, read as one continuous stream.

    Each call, the world's ranks take consecutive windows of B*T+1 tokens (a window's last token is only a
    target), rank r the r-th, so together they cover the stream in order with nothing skipped at shard ends.
    When the rest of the stream is too short for a whole step, it wraps: epoch += 1, and with shuffle=True the
    shard order is permuted by (seed, epoch), identically on every rank. At most world*B*T tokens per epoch
    go unread. Memory is O(B*T): shards are memory-mapped."""

    def __init__(self, data_root, split: str, B: int, T: int, process_rank: int = 0, num_processes: int = 1,
                 vocab_size: Optional[int] = None, shuffle: bool = False, seed: int = 0):
        if B <= 0 or T <= 0:
            raise ValueError(f"batch size and sequence length must be positive, got B={B}, T={T}")
        if not 0 <= process_rank < num_processes:
            raise ValueError(f"process_rank {process_rank} not in [0, {num_processes})")
        self.B, self.T, self.rank, self.world = B, T, process_rank, num_processes
        self.split, self.vocab_size, self.shuffle, self.seed = split, vocab_size, shuffle, seed
        self.base = TokenStream.from_split(data_root, split)
        need = B * T * num_processes + 1
        if len(self.base) < need:
            raise ValueError(
                f"the '{split}' split in {data_root} holds {len(self.base)} tokens, fewer than one step of "
                f"{num_processes} rank(s) x B={B} x T={T} (+1) = {need}; lower batch_size/seq_len or add data"
            )
        self.reset()

    def _stream_for(self, epoch: int) -> TokenStream:
        order = list(range(len(self.base.shards)))
        if self.shuffle:
            order = np.random.default_rng([self.seed, epoch]).permutation(len(order)).tolist()
        return TokenStream([self.base.shards[i] for i in order], [self.base.names[i] for i in order])

    def reset(self):
        self.epoch, self.position = 0, 0  # position: stream offset where the next step's rank-0 window starts
        self.stream = self._stream_for(0)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        BT = self.B * self.T
        if self.position + BT * self.world + 1 > len(self.stream):  # the same decision on every rank
            self.epoch, self.position = self.epoch + 1, 0
            self.stream = self._stream_for(self.epoch)
        start = self.position + self.rank * BT
        buf = self.stream.read(start, BT + 1)
        check_token_ids(buf, self.vocab_size, f"{', '.join(self.stream.shards_at(start, BT + 1))} (epoch {self.epoch})")
        self.position += BT * self.world
        buf = torch.from_numpy(buf.astype(np.int64))  # only this window is widened to int64
        return buf[:-1].view(self.B, self.T), buf[1:].view(self.B, self.T)

    def state_dict(self) -> dict:
        return {"split": self.split, "epoch": self.epoch, "position": self.position,
                "num_tokens": len(self.base), "shuffle": self.shuffle, "seed": self.seed}

    def load_state_dict(self, state: dict):
        if state["num_tokens"] != len(self.base) or state["shuffle"] != self.shuffle or state["seed"] != self.seed:
            raise ValueError(
                f"the '{self.split}' data changed since the checkpoint (tokens {state['num_tokens']} -> "
                f"{len(self.base)}, shuffle {state['shuffle']} -> {self.shuffle}, seed {state['seed']} -> {self.seed})"
            )
        self.epoch, self.position = state["epoch"], state["position"]
        self.stream = self._stream_for(self.epoch)


# ----------------------------------------------------------------------------------------------------------
# Learning-rate schedule


def get_lr(step: int, max_lr: float, min_lr: float, warmup_steps: int, decay_steps: int) -> float:
    """Linear warmup to max_lr over warmup_steps, cosine decay to min_lr at decay_steps, then constant."""
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps  # step 0 already takes a small step
    if step >= decay_steps:
        return min_lr
    progress = (step - warmup_steps) / (decay_steps - warmup_steps)  # 0 -> 1
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (max_lr - min_lr)


# ----------------------------------------------------------------------------------------------------------
# Distributed / runtime set-up


@dataclass
class Runtime:
    ddp: bool  # launched by torchrun with a process group
    rank: int  # global rank
    local_rank: int  # rank on this node (picks the GPU)
    world_size: int
    device: str  # e.g. "cuda:3", "mps", "cpu"
    device_type: str  # "cuda" | "mps" | "cpu": what torch.autocast wants

    @property
    def master(self) -> bool:
        return self.rank == 0


def detect_device() -> str:
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def check_device(device: str) -> str:
    """--device as torch wants it: auto resolved, and a clear error for a device this machine lacks."""
    if device == "auto":
        return detect_device()
    if not re.fullmatch(r"cpu|mps|cuda(:\d+)?", device):
        raise ValueError(f"--device {device!r}: use auto, cpu, cuda, cuda:N or mps")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: CUDA is not available on this machine (use --device cpu)")
    if device == "mps" and detect_device() != "mps":
        raise ValueError("--device mps: MPS is not available on this machine (use --device cpu)")
    return device


def setup_runtime(device: str = "auto") -> Runtime:
    """Single process, or DDP when torchrun set RANK/LOCAL_RANK/WORLD_SIZE (NCCL on CUDA, gloo on CPU)."""
    device = check_device(device)
    if "RANK" not in os.environ:
        return Runtime(False, 0, 0, 1, device, device.split(":")[0])
    rank, local_rank, world = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    device_type = device.split(":")[0]
    if device_type == "mps":
        raise ValueError("DDP on mps is not supported; use a single process or --device cpu")
    if device_type == "cuda":
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(device)
    else:
        device = "cpu"
    backend = "nccl" if device_type == "cuda" else "gloo"
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt not in (None, "0") and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # After a torchrun restart the agent's shared store still holds the dead attempt's addresses (gloo then
        # connects to them, pytorch/pytorch#135712): rendezvous under a key prefix of this attempt instead.
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False)
        dist.init_process_group(backend, store=dist.PrefixStore(f"attempt_{attempt}/", store), rank=rank, world_size=world)
    else:
        dist.init_process_group(backend)
    return Runtime(True, rank, local_rank, world, device, device_type)


def teardown_runtime(rt: Runtime):
    if rt.ddp and dist.is_initialized():
        dist.destroy_process_group()


def autocast_context(device_type: str, dtype: str):
    """bf16 autocast for matmuls (weights and optimizer state stay fp32); a no-op for float32."""
    return torch.autocast(device_type=device_type, dtype=torch.bfloat16, enabled=dtype == "bfloat16")


# Dense bf16 tensor-core peak per GPU, from the vendors' datasheets (SXM parts).
PEAK_BF16_FLOPS = {"A100": 312e12, "H100": 989e12, "H200": 989e12, "H800": 989e12, "A10G": 125e12,
                   "L4": 121e12, "L40S": 362e12, "RTX 4090": 165e12, "RTX 3090": 71e12, "B200": 2250e12}


def peak_flops(device_type: str, override: float = 0.0) -> Optional[float]:
    """Peak bf16 FLOP/s of this device: the override, else a lookup by GPU name, else None (MFU not shown)."""
    if override > 0:
        return override
    if device_type != "cuda":
        return None
    name = torch.cuda.get_device_name()
    matches = [key for key in PEAK_BF16_FLOPS if key in name]
    return PEAK_BF16_FLOPS[max(matches, key=len)] if matches else None  # longest: "L40S" before "L4"


def flops_per_token(num_params: int, n_layer: int, n_head: int, head_dim: int, seq_len: int) -> int:
    """Training FLOPs per token: 6N for the weight matmuls (forward + backward) plus 12·L·H·Q·T for attention
    scores and values. N excludes the position table (a lookup) and includes the tied token table."""
    return 6 * num_params + 12 * n_layer * n_head * head_dim * seq_len


# ----------------------------------------------------------------------------------------------------------
# Evaluation: validation loss, HellaSwag, samples


@torch.no_grad()
def evaluate_val_loss(model: nn.Module, stream: TokenStream, val_tokens: int, B: int, T: int, rt: Runtime,
                      dtype: str, vocab_size: Optional[int] = None) -> float:
    """Mean loss over the first val_tokens targets of the val stream: val_tokens/T sequences of T, sequence i
    scored by rank i % world, so the tokens are the same for any world size or batch size."""
    if val_tokens <= 0 or val_tokens % T or val_tokens + 1 > len(stream):
        raise ValueError(f"val_tokens ({val_tokens}) must be a positive multiple of seq_len ({T}) and fit the val split "
                         f"({len(stream)} tokens)")
    model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=rt.device)
    count = torch.zeros((), dtype=torch.float64, device=rt.device)
    mine = list(range(rt.rank, val_tokens // T, rt.world_size))
    for i in range(0, len(mine), B):
        rows = np.stack([stream.read(j * T, T + 1) for j in mine[i : i + B]])
        check_token_ids(rows, vocab_size, "the val split " + ", ".join(stream.names))
        rows = torch.from_numpy(rows.astype(np.int64)).to(rt.device)
        x, y = rows[:, :-1], rows[:, 1:]
        with autocast_context(rt.device_type, dtype):
            logits, _ = model(x)
        loss_sum += F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1), reduction="sum")
        count += y.numel()
    if rt.ddp:
        dist.all_reduce(loss_sum)
        dist.all_reduce(count)
    model.train()
    return (loss_sum / count).item()


def sample_texts(model: GPT, prompt: str, num_samples: int, max_new_tokens: int, top_k: Optional[int],
                 temperature: float, seed: int, device: str) -> list[str]:
    """Seeded top-k samples continuing `prompt`, decoded; padded vocabulary ids are never drawn."""
    enc = get_tokenizer()
    prompt_ids = enc.encode(prompt) or [EOT_TOKEN]
    if len(prompt_ids) >= model.config.block_size:
        raise ValueError(f"prompt is {len(prompt_ids)} tokens, the model's context is {model.config.block_size}")
    idx = torch.tensor(prompt_ids, dtype=torch.long, device=device).repeat(num_samples, 1)
    generator = torch.Generator(device=device).manual_seed(seed)
    was_training = model.training
    model.eval()
    out = model.generate(idx, max_new_tokens, temperature=temperature, top_k=top_k, generator=generator,
                         vocab_limit=min(enc.n_vocab, model.config.vocab_size))
    model.train(was_training)
    return [enc.decode(row.tolist()) for row in out]


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


def atomic_write(path: Path, write):
    """write(f) into a temp file beside `path`, fsync, then rename: a crash never leaves a truncated file."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def capture_rng_state() -> dict:
    """Every RNG a run touches, as tensors and plain lists (weights_only-loadable)."""
    np_state = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
        "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
    }


def restore_rng_state(state: dict):
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


def checkpoint_paths(log_dir: str | os.PathLike) -> list[Path]:
    """model_{step:05d}.pt files of log_dir, oldest first."""
    return sorted(Path(log_dir).glob("model_*.pt"), key=lambda p: int(p.stem.split("_")[1]) if p.stem.split("_")[1].isdigit() else -1)


def newest_valid_checkpoint(log_dir: str | os.PathLike) -> tuple[Optional[Path], Optional[dict], list[str]]:
    """The newest checkpoint that loads, skipping unreadable ones (returned as warnings)."""
    warnings = []
    for path in reversed(checkpoint_paths(log_dir)):
        try:
            return path, load_checkpoint(path), warnings
        except ValueError as e:
            warnings.append(f"skipping unreadable checkpoint: {e}")
    return None, None, warnings


def prune_checkpoints(log_dir: str | os.PathLike, keep_last: int):
    if keep_last > 0:
        for path in checkpoint_paths(log_dir)[:-keep_last]:
            path.unlink(missing_ok=True)


class RunLog:
    """log_dir/log.txt, appended (a resumed run continues it), one `{step} {kind} {value}` line per metric."""

    def __init__(self, log_dir: str | os.PathLike, enabled: bool):
        self.path, self.enabled = Path(log_dir) / "log.txt", enabled

    def write(self, step: int, kind: str, value: float):
        if self.enabled:
            with open(self.path, "a") as f:
                f.write(f"{step} {kind} {value:.6f}\n")


def read_log(path: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
    """Parse log.txt into {kind: [(step, value), ...]}; the last value logged for a step wins."""
    series: dict[str, dict[int, float]] = {}
    for lineno, line in enumerate(Path(path).read_text().splitlines(), start=1):
        try:
            step, kind, value = line.split()
            series.setdefault(kind, {})[int(step)] = float(value)
        except ValueError:
            raise ValueError(f"{path}:{lineno}: expected '<step> <kind> <value>', got {line!r}") from None
    return {kind: sorted(values.items()) for kind, values in series.items()}


def write_header(log_dir: Path, cfg: TrainConfig, rt: Runtime, extra: dict):
    """Append this run's config and versions to log_dir/header.txt (one JSON block per start or resume)."""
    info = {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": sys.argv, "config": dataclasses.asdict(cfg),
            "world_size": rt.world_size, "device": rt.device, "python": platform.python_version(),
            "torch": torch.__version__, "numpy": np.__version__,
            "gpu": torch.cuda.get_device_name() if rt.device_type == "cuda" else None, **extra}
    with open(log_dir / "header.txt", "a") as f:
        f.write(json.dumps(info, indent=1) + "\n")


# ----------------------------------------------------------------------------------------------------------
# Training


class NonFiniteError(RuntimeError):
    """The loss or gradient norm became inf/NaN."""


class StopFlag:
    """Set by SIGTERM/SIGINT; the loop checks it after each step, saves a checkpoint and exits cleanly."""

    def __init__(self):
        self.requested = False
        self.previous = {}

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        self.requested = True

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def all_ranks_agree(flag: bool, rt: Runtime) -> bool:
    """True on every rank if any rank says True (so all ranks stop at the same step)."""
    if not rt.ddp:
        return flag
    t = torch.tensor([float(flag)], device=rt.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def build_model(cfg: TrainConfig) -> GPT:
    """From scratch with cfg's shape, or the weights named by --init_from (cropped to block_size if shorter)."""
    if cfg.init_from == "scratch":
        return GPT(GPTConfig(block_size=cfg.block_size, vocab_size=cfg.vocab_size, n_layer=cfg.n_layer,
                             n_head=cfg.n_head, n_embd=cfg.n_embd))
    model = load_model(cfg.init_from)
    if cfg.block_size < model.config.block_size:
        model.crop_block_size(cfg.block_size)
    if cfg.seq_len > model.config.block_size:
        raise ValueError(f"--seq_len ({cfg.seq_len}) exceeds the context of {cfg.init_from} ({model.config.block_size})")
    return model


def find_resume_checkpoint(resume: str, log_dir: Path, log) -> tuple[Optional[dict], Optional[str]]:
    """--resume auto: the newest readable checkpoint in log_dir (None: start fresh); else the named file."""
    if resume != "auto":
        return load_checkpoint(resume), resume
    path, ckpt, warnings = newest_valid_checkpoint(log_dir)
    for w in warnings:
        log(f"warning: {w}")
    if ckpt is None:
        log(f"no checkpoint in {log_dir}: starting fresh")
    return ckpt, str(path) if path else None


def accumulate_gradients(model: nn.Module, next_batch, grad_accum: int, rt: Runtime, dtype: str) -> torch.Tensor:
    """Forward/backward over grad_accum micro-batches; returns the mean loss (averaged over ranks under DDP)."""
    loss_accum = torch.zeros((), device=rt.device)
    for micro in range(grad_accum):
        x, y = next_batch()
        if rt.device_type == "cuda":  # pinned memory lets the copy overlap with compute
            x, y = x.pin_memory().to(rt.device, non_blocking=True), y.pin_memory().to(rt.device, non_blocking=True)
        else:
            x, y = x.to(rt.device), y.to(rt.device)
        if rt.ddp:  # all-reduce gradients only on the last micro-step (must be set before the forward)
            model.require_backward_grad_sync = micro == grad_accum - 1
        with autocast_context(rt.device_type, dtype):
            _, loss = model(x, y)
        # The loss is a mean over B*T tokens; dividing by grad_accum makes the summed gradients those of the
        # mean over the whole total batch.
        loss = loss / grad_accum
        loss_accum += loss.detach()
        loss.backward()
    if rt.ddp:
        dist.all_reduce(loss_accum, op=dist.ReduceOp.AVG)
    return loss_accum


def train(cfg: TrainConfig, log=print) -> dict:
    """Run training as configured (one process, or one rank under torchrun); return the final metrics."""
    rt = setup_runtime(cfg.device)
    try:
        return _train(cfg, rt, log if rt.master else (lambda *a, **k: None))
    finally:
        teardown_runtime(rt)


def _train(cfg: TrainConfig, rt: Runtime, log) -> dict:
    dtype = cfg.dtype if cfg.dtype != "auto" else ("bfloat16" if rt.device_type == "cuda" else "float32")
    use_compile = cfg.compile == "true" or (cfg.compile == "auto" and rt.device_type == "cuda")
    B, T = cfg.batch_size, cfg.seq_len
    if cfg.total_batch_size % (B * T * rt.world_size):
        raise ValueError(f"--total_batch_size {cfg.total_batch_size} is not divisible by batch_size x seq_len x "
                         f"world_size = {B} x {T} x {rt.world_size} = {B * T * rt.world_size}")
    grad_accum = cfg.total_batch_size // (B * T * rt.world_size)
    decay_steps = cfg.lr_decay_steps or cfg.max_steps
    min_lr = cfg.max_lr * cfg.min_lr_ratio
    log_dir = Path(cfg.log_dir)
    if log_dir.exists() and not log_dir.is_dir():
        raise ValueError(f"--log_dir {log_dir} exists and is not a directory")
    if rt.master:
        log_dir.mkdir(parents=True, exist_ok=True)
        for stale in log_dir.glob(".model_*.pt.tmp*"):  # left by a kill during a checkpoint write
            stale.unlink(missing_ok=True)
    if rt.device_type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # TF32 for any fp32 matmul left outside autocast
        torch.backends.cudnn.allow_tf32 = True

    torch.manual_seed(cfg.seed)  # the same initial weights on every rank
    model = build_model(cfg).to(rt.device)
    vocab = model.config.vocab_size
    train_loader = DataLoaderLite(cfg.data_root, "train", B, T, rt.rank, rt.world_size, vocab_size=vocab,
                                  shuffle=cfg.shuffle_shards, seed=cfg.seed)
    val_stream = TokenStream.from_split(cfg.data_root, "val") if cfg.eval_interval else None
    optimizer = model.configure_optimizers(cfg.weight_decay, cfg.max_lr, rt.device_type)

    start_step, evals_done, resumed_from, val_loss = 0, False, None, None
    if cfg.resume:
        ckpt, resumed_from = find_resume_checkpoint(cfg.resume, log_dir, log)
        if ckpt is not None:
            if GPTConfig(**ckpt["model_config"]) != model.config:
                raise ValueError(f"{resumed_from} holds a model of shape {ckpt['model_config']}, this run builds {model.config}")
            model.load_state_dict(ckpt["model"])
            optimizer.load_state_dict(ckpt["optimizer"])
            train_loader.load_state_dict(ckpt["train_loader"])
            restore_rng_state(ckpt["rng"])
            start_step, evals_done, val_loss = ckpt["step"], ckpt["evals_done"], ckpt["val_loss"]
            log(f"resumed from {resumed_from} at step {start_step}")

    raw_model = model  # uncompiled, unwrapped: evaluation, sampling and checkpoints use it
    train_model = torch.compile(model) if use_compile else model
    if rt.ddp:
        from torch.nn.parallel import DistributedDataParallel as DDP

        train_model = DDP(train_model, device_ids=[rt.local_rank] if rt.device_type == "cuda" else None)

    n_params = raw_model.num_params()
    flops_tok = flops_per_token(raw_model.num_params(exclude_embeddings=True), model.config.n_layer,
                                model.config.n_head, model.config.n_embd // model.config.n_head, T)
    peak = peak_flops(rt.device_type, cfg.peak_flops)
    run_log = RunLog(log_dir, rt.master)
    if rt.master:
        write_header(log_dir, cfg, rt, {"num_params": n_params, "grad_accum_steps": grad_accum, "dtype": dtype,
                                        "compile": use_compile, "resumed_from": resumed_from})
    log(f"{n_params:,} parameters | {rt.world_size} process(es) on {rt.device} | {dtype} | compile {use_compile}")
    log(f"total batch {cfg.total_batch_size:,} tokens = {B} x {T} x {rt.world_size} ranks x {grad_accum} micro-steps")
    wandb_run = None
    if cfg.wandb_project and rt.master:
        import wandb  # optional dependency, imported only when asked for

        wandb_run = wandb.init(project=cfg.wandb_project, config=dataclasses.asdict(cfg), resume="allow")

    hella_examples = None
    fixed_batch = train_loader.next_batch() if cfg.overfit_batch else None
    next_batch = (lambda: fixed_batch) if cfg.overfit_batch else train_loader.next_batch
    metrics = {"step": start_step, "val_loss": val_loss, "hellaswag": None, "train_loss": None}

    def save(step: int, done: bool) -> Path:
        """Checkpoint after `step` updates (rank 0); `done`: this step's evaluations are already logged."""
        path = log_dir / f"model_{step:05d}.pt"
        if rt.master:
            if not all(torch.isfinite(p).all() for p in raw_model.parameters()):
                raise NonFiniteError(f"refusing to checkpoint non-finite weights at step {step}")
            ckpt = {"model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
                    "model_config": dataclasses.asdict(raw_model.config), "train_config": dataclasses.asdict(cfg),
                    "step": step, "evals_done": done, "val_loss": metrics["val_loss"],
                    "train_loader": train_loader.state_dict(), "rng": capture_rng_state()}
            atomic_write(path, lambda f: torch.save(ckpt, f))
            prune_checkpoints(log_dir, cfg.keep_last)
            refresh_plot(log_dir)
        if rt.ddp:
            dist.barrier()  # nobody races ahead (or exits) before the file exists
        return path

    with StopFlag() as stop:
        for step in range(start_step, cfg.max_steps + 1):
            last = step == cfg.max_steps
            due = lambda interval: interval > 0 and (step % interval == 0 or last)  # noqa: E731
            if not (step == start_step and evals_done):
                if due(cfg.eval_interval):
                    metrics["val_loss"] = evaluate_val_loss(train_model if not rt.ddp else train_model.module, val_stream,
                                                            cfg.val_tokens, B, T, rt, dtype, vocab)
                    log(f"step {step:5d} | val loss {metrics['val_loss']:.4f}")
                    run_log.write(step, "val", metrics["val_loss"])
                if due(cfg.hellaswag_interval):
                    hella_examples = hella_examples if hella_examples is not None else load_hellaswag(cfg, rt, log)
                    if hella_examples:  # every rank scores its share; counts are all-reduced inside
                        import hellaswag

                        res = hellaswag.evaluate(raw_model, hella_examples, rt.device, rank=rt.rank,
                                                 world_size=rt.world_size,
                                                 autocast_dtype=torch.bfloat16 if dtype == "bfloat16" else None)
                        metrics["hellaswag"] = res["acc_norm"]
                        log(f"step {step:5d} | HellaSwag acc_norm {res['correct_norm']}/{res['n']} = {res['acc_norm']:.4f}")
                        run_log.write(step, "hella", res["acc_norm"])
                if due(cfg.sample_interval) and rt.master:
                    for text in sample_texts(raw_model, cfg.sample_prompt, 4, 32, 50, 1.0, cfg.seed, rt.device):
                        log(f"sample: {text!r}")
            if last:
                break

            t0 = time.time()
            optimizer.zero_grad(set_to_none=True)
            loss_accum = accumulate_gradients(train_model, next_batch, grad_accum, rt, dtype)
            norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), cfg.grad_clip or float("inf"))
            lr = get_lr(step, cfg.max_lr, min_lr, cfg.warmup_steps, decay_steps)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss_value, norm_value = loss_accum.item(), norm.item()  # the one host sync per step
            if not (math.isfinite(loss_value) and math.isfinite(norm_value)):
                if not cfg.skip_nonfinite:
                    good = checkpoint_paths(log_dir)
                    raise NonFiniteError(f"non-finite loss {loss_value} / grad norm {norm_value} at step {step}; "
                                         f"last good checkpoint: {good[-1] if good else 'none'} "
                                         "(lower --max_lr, or pass --skip_nonfinite true)")
                log(f"step {step:5d} | non-finite loss {loss_value} / grad norm {norm_value}: update skipped")
            else:
                optimizer.step()
            if rt.device_type == "cuda":
                torch.cuda.synchronize()
            dt = time.time() - t0
            tok_per_s = cfg.total_batch_size / dt
            mfu = f" | MFU {flops_tok * tok_per_s / (peak * rt.world_size):6.2%}" if peak else ""
            log(f"step {step:5d} | loss {loss_value:.6f} | lr {lr:.4e} | norm {norm_value:.4f} | "
                f"{dt * 1000:7.1f} ms | {tok_per_s:9.0f} tok/s{mfu}")
            run_log.write(step, "train", loss_value)
            if wandb_run is not None:
                wandb_run.log({"train/loss": loss_value, "lr": lr, "grad_norm": norm_value,
                               "val/loss": metrics["val_loss"]}, step=step)
            metrics["train_loss"], metrics["step"] = loss_value, step + 1
            if all_ranks_agree(stop.requested, rt):
                path = save(step + 1, done=False)
                log(f"stop requested: saved {path} after step {step}; resume with --resume auto")
                metrics["stopped"] = True
                return metrics
            if cfg.ckpt_interval and (step + 1) % cfg.ckpt_interval == 0 and step + 1 < cfg.max_steps:
                save(step + 1, done=False)
    metrics["checkpoint"] = str(save(cfg.max_steps, done=True))
    if wandb_run is not None:
        wandb_run.finish()
    return metrics


def load_hellaswag(cfg: TrainConfig, rt: Runtime, log) -> list:
    """HellaSwag val examples, or [] with a message when they cannot be had (e.g. offline). Rank 0 goes first,
    so the file is downloaded once; the same answer on every rank, since all of them call evaluate()."""
    import hellaswag

    examples, error = [], None
    for turn in (0, 1):
        if (rt.rank == 0) == (turn == 0):
            try:
                examples = hellaswag.load_examples("val", data=cfg.hellaswag_data or None)
            except (FileNotFoundError, OSError, ValueError) as e:
                error = e
        if rt.ddp:
            dist.barrier()
    if all_ranks_agree(error is not None, rt):
        log(f"HellaSwag skipped: {error or 'unavailable on another rank'}")
        return []
    return examples[: cfg.hellaswag_limit] if cfg.hellaswag_limit else examples


def refresh_plot(log_dir: Path) -> Optional[Path]:
    """Redraw log_dir/curves.png at a checkpoint; None instead of an error: a plot never stops a run."""
    try:
        return plot_curves(log_dir)
    except ImportError:  # matplotlib is optional for training
        return None
    except Exception as e:  # e.g. a full disk: warn and train on
        print(f"warning: curves.png not updated ({type(e).__name__}: {e})", file=sys.stderr)
        return None


# ----------------------------------------------------------------------------------------------------------
# Training curves and Hugging Face export

GPT2_124M_VAL_LOSS = 3.2924  # OpenAI's GPT-2 124M on our FineWeb-Edu val split: the loss to beat
HELLASWAG_BASELINES = {"GPT-2 124M": 0.2955, "GPT-3 124M": 0.337}  # acc_norm on the 10,042 val examples


def plot_curves(log_dir: str | os.PathLike, out_path: str | os.PathLike | None = None) -> Path:
    """Draw log_dir/log.txt as a PNG (default log_dir/curves.png): losses, and HellaSwag if logged, with baselines."""
    log_path = Path(log_dir) / "log.txt"
    if not log_path.is_file():
        raise FileNotFoundError(f"{log_path} does not exist; it is written by a training run with --log_dir {log_dir}")
    series = read_log(log_path)
    if not series:
        raise ValueError(f"{log_path} holds no metrics yet")
    # A bare Figure on the Agg canvas: no pyplot, so no global backend switch (a notebook's plots are untouched).
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    hella = series.get("hella", [])
    fig = Figure(figsize=(13 if hella else 7, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2 if hella else 1, squeeze=False)[0]
    for kind in ("train", "val"):
        if series.get(kind):
            axes[0].plot(*zip(*series[kind]), label=f"{kind} loss")
    axes[0].axhline(GPT2_124M_VAL_LOSS, color="red", linestyle="--", label=f"GPT-2 124M val ({GPT2_124M_VAL_LOSS})")
    axes[0].set(xlabel="step", ylabel="loss", title="loss")
    if hella:
        axes[1].plot(*zip(*hella), label="ours")
        for (name, acc), color in zip(HELLASWAG_BASELINES.items(), ("red", "green")):
            axes[1].axhline(acc, color=color, linestyle="--", label=f"{name} ({acc})")
        axes[1].set(xlabel="step", ylabel="acc_norm", title="HellaSwag")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend()
    out = Path(out_path) if out_path is not None else Path(log_dir) / "curves.png"
    atomic_write(out, lambda f: fig.savefig(f, format="png", dpi=100))  # a viewer never sees half a PNG
    return out


def to_hf_state_dict(our_sd: dict, keep_vocab: Optional[int] = None) -> dict:
    """Inverse of convert_hf_state_dict: Conv1D weights transposed back; token-table rows >= keep_vocab
    dropped (the padding of a 50304-row table, ids the tokenizer never produces)."""
    out = {}
    for key, value in our_sd.items():
        value = value.detach()
        if key in ("transformer.wte.weight", "lm_head.weight") and keep_vocab is not None:
            value = value[:keep_vocab]
        out[key] = (value.t() if key.endswith(HF_TRANSPOSED) else value).contiguous()
    return out


def export_hf(checkpoint_path: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Write one of our checkpoints as a directory that transformers.GPT2LMHeadModel.from_pretrained loads."""
    from transformers import GPT2Config, GPT2LMHeadModel  # heavy; only when asked for

    ckpt = load_checkpoint(checkpoint_path)
    c = GPTConfig(**ckpt["model_config"])
    vocab = min(c.vocab_size, GPT2_VOCAB_SIZE)  # 50304 -> 50257; a smaller (test) vocabulary is kept as is
    eot = EOT_TOKEN if vocab > EOT_TOKEN else None
    config = GPT2Config(vocab_size=vocab, n_positions=c.block_size, n_ctx=c.block_size, n_embd=c.n_embd,
                        n_layer=c.n_layer, n_head=c.n_head, activation_function="gelu_new",
                        bos_token_id=eot, eos_token_id=eot, tie_word_embeddings=True)
    hf = GPT2LMHeadModel(config)
    result = hf.load_state_dict(to_hf_state_dict(ckpt["model"], vocab), strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ValueError(f"{checkpoint_path} does not map onto GPT-2: missing {result.missing_keys[:10]}, "
                         f"unexpected {result.unexpected_keys[:10]}")
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} already exists and is not an empty directory; choose a new OUT_DIR")
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")  # complete, then renamed: never a half export
    try:
        hf.save_pretrained(tmp)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            import shutil

            shutil.rmtree(tmp)
    return out


# ----------------------------------------------------------------------------------------------------------
# Command line


def str2bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (the full usage of ~40 flags would bury it); -h still shows it all."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see -h)\n")


def train_parser() -> argparse.ArgumentParser:
    """--field value for every TrainConfig field, plus --preset; explicit flags override the preset."""
    parser = Parser(
        description="Train GPT-2 (sub-commands: sample, plot, export; see `train_gpt2.py sample -h`).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), help="a named recipe; other flags override it")
    for f in dataclasses.fields(TrainConfig):  # f.type is the annotation's text (from __future__ import annotations)
        kind = {"bool": str2bool, "int": int, "Optional[int]": int, "float": float}.get(f.type, str)
        parser.add_argument(f"--{f.name}", type=kind, default=f.default, help=f.metadata["help"],
                            metavar="true|false" if kind is str2bool else None)
    return parser


def parse_train_args(argv: list[str]) -> TrainConfig:
    parser = train_parser()
    preset = parser.parse_known_args(argv)[0].preset
    if preset:
        parser.set_defaults(**PRESETS[preset])
    args = vars(parser.parse_args(argv))
    args.pop("preset")
    try:
        return TrainConfig(**args)
    except ValueError as e:
        parser.error(str(e))


def sample_main(argv: list[str]):
    parser = Parser(prog="train_gpt2.py sample", description="Print samples from a model.")
    parser.add_argument("--init_from", default="gpt2", help="gpt2 | gpt2-medium | ... | HF_DIR | CHECKPOINT.pt")
    parser.add_argument("--prompt", default="Hello, I'm a language model,")
    parser.add_argument("--num_samples", type=int, default=5)
    parser.add_argument("--max_new_tokens", type=int, default=30)
    parser.add_argument("--top_k", type=int, default=50, help="0: sample from the whole distribution")
    parser.add_argument("--temperature", type=float, default=1.0, help="0: greedy")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args(argv)
    if args.num_samples <= 0 or args.max_new_tokens <= 0:
        parser.error("--num_samples and --max_new_tokens must be positive")
    device = check_device(args.device)
    model = load_model(args.init_from, device)
    texts = sample_texts(model, args.prompt, args.num_samples, args.max_new_tokens, args.top_k or None,
                         args.temperature, args.seed, device)
    for i, text in enumerate(texts):
        print(f"sample {i}: {text}")


def plot_main(argv: list[str]):
    parser = Parser(prog="train_gpt2.py plot", description="Draw a run's log.txt as curves.png.")
    parser.add_argument("log_dir", help="the --log_dir of a run (holds log.txt)")
    parser.add_argument("--out", default=None, help="PNG path (default: LOG_DIR/curves.png)")
    args = parser.parse_args(argv)
    print(f"wrote {plot_curves(args.log_dir, args.out)}")


def export_main(argv: list[str]):
    parser = Parser(prog="train_gpt2.py export", description="Write a checkpoint as a Hugging Face GPT-2 directory.")
    parser.add_argument("checkpoint", help="a model_*.pt written by training")
    parser.add_argument("out_dir", help="directory for config.json and model.safetensors")
    args = parser.parse_args(argv)
    print(f"wrote {export_hf(args.checkpoint, args.out_dir)}: load it with GPT2LMHeadModel.from_pretrained")


def main(argv: Optional[list[str]] = None):
    argv = sys.argv[1:] if argv is None else argv
    commands = {"sample": sample_main, "plot": plot_main, "export": export_main}
    try:
        if argv and argv[0] in commands:
            return commands[argv[0]](argv[1:])
        cfg = parse_train_args(argv)
        metrics = train(cfg)
        if metrics.get("stopped"):
            print("stopped cleanly")
    except (ValueError, OSError, NonFiniteError) as e:
        if os.environ.get("GPT2_DEBUG"):
            raise
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
