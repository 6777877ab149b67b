"""
GPT-2 pretraining in one file: config, model, data, learning-rate schedule, DDP, evaluation, training loop.

    python fineweb.py --local input.txt --tokenizer char --out_dir data/shakespeare_char  # characters of the plays
    python train_gpt2.py --preset shakespeare_char                                        # minutes on a laptop CPU
    torchrun --standalone --nproc_per_node=8 train_gpt2.py --preset gpt2-124M             # the 10B-token recipe

Data: fineweb.py's uint16 token shards and manifest.json. Beside this file: sample.py, hellaswag.py (the loop
calls it), plot.py (curves.png), export_hf.py, bench.py. Importing this module does nothing but define things.
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import dataclasses
import fcntl
import functools
import hashlib
import json
import math
import os
import platform
import re
import secrets
import signal
import stat
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
    dropout: float = 0.0  # nanoGPT's: after the embeddings, on attention weights and on both branches' outputs
    bias: bool = True  # biases in every Linear and LayerNorm, as in GPT-2 (False: nanoGPT's leaner variant)

    def __post_init__(self):
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
            if type(getattr(self, name)) is not int or getattr(self, name) <= 0:
                raise ValueError(f"GPTConfig.{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.n_embd % self.n_head or not 0 <= self.dropout < 1:
            raise ValueError(f"need n_embd ({self.n_embd}) divisible by n_head ({self.n_head}) and dropout in [0, 1), "
                             f"got {self.dropout}")

def opt(default, help: str, choices: tuple = ()):
    """A TrainConfig field: its default, the --help text of its command-line flag, the values allowed (if listed)."""
    return field(default=default, metadata={"help": help, **({"choices": choices} if choices else {})})

@dataclass
class TrainConfig:
    # data and output
    data_root: str = opt("edu_fineweb10B", "directory of fineweb.py shards ({prefix}_{val|train}_{i:06d}.npy)")
    log_dir: str = opt("log", "where log.txt, header.txt, checkpoints and curves.png go")
    shuffle: bool = opt(False, "read each epoch in a seeded random order of shards and of windows within them")
    # model (from scratch; --init_from loads a shape instead)
    n_layer: int = opt(12, "transformer blocks")
    n_head: int = opt(12, "attention heads")
    n_embd: int = opt(768, "residual width")
    block_size: int = opt(1024, "maximum context length")
    vocab_size: int = opt(0, "token table rows; 0: the data's tokenizer's (GPT-2's 50257 padded to 50304 for speed)")
    dropout: float = opt(0.0, "dropout in training (0: none, as GPT-2 pretraining); also with --init_from")
    bias: bool = opt(True, "biases in Linears and LayerNorms (false: nanoGPT's variant; GPT-2 weights have them)")
    init_from: str = opt("scratch", "scratch | gpt2 | gpt2-medium | ... | HF_DIR | CHECKPOINT.pt (weights only)")
    # batch
    batch_size: int = opt(64, "micro-batch B: sequences per forward pass per process")
    seq_len: int = opt(1024, "sequence length T of a training row")
    total_batch_size: int = opt(524288, "tokens per optimizer step, over all processes and micro-steps")
    # optimization
    max_steps: int = opt(19073, "optimizer steps to run (19,073 x 524,288 tokens = 10B)")
    lr_decay_steps: Optional[int] = opt(None, "step where the cosine reaches min_lr (default: max_steps)")
    warmup_steps: int = opt(715, "linear warmup steps")
    max_lr: float = opt(6e-4, "peak learning rate (AdamW's)")
    min_lr_ratio: float = opt(0.1, "final learning rate as a fraction of max_lr")
    beta2: float = opt(0.95, "AdamW's beta2 (GPT-2's 0.95; nearer 1 for small batches, as nanoGPT's char model)")
    weight_decay: float = opt(0.1, "AdamW decay on matrices and embeddings (not biases or norms)")
    optimizer: str = opt("adamw", "muon: Muon for the blocks' matrices, AdamW for the rest", ("adamw", "muon"))
    muon_lr: float = opt(0.02, "Muon's peak learning rate (--optimizer muon; the schedule is --max_lr's, scaled)")
    grad_clip: float = opt(1.0, "clip the global gradient norm to this (0: no clipping)")
    skip_nonfinite: bool = opt(False, "skip an update with a non-finite loss or grad norm instead of stopping")
    skip_spikes: float = opt(0.0, "skip an update whose loss or grad norm is Z running std devs above the mean (0: off)")
    # evaluation and output intervals (0 disables)
    eval_interval: int = opt(250, "steps between validation losses")
    val_tokens: int = opt(10485760, "tokens of val loss (a multiple of seq_len), the same for any world size")
    hellaswag_interval: int = opt(250, "steps between HellaSwag evaluations")
    hellaswag_data: str = opt("", "HellaSwag jsonl (default: the official val split, downloaded once)")
    hellaswag_limit: int = opt(0, "score only the first N examples (0: all 10,042)")
    sample_interval: int = opt(250, "steps between printed samples")
    sample_prompt: str = opt("Hello, I'm a language model,", "prompt of the printed samples")
    sample_length: int = opt(32, "tokens each printed sample adds to the prompt")
    ckpt_interval: int = opt(5000, "steps between checkpoints (one is always written at the end)")
    keep_last: int = opt(0, "keep only the newest K checkpoints (0: keep all)")
    resume: str = opt("", "'' (fresh run) | auto (newest valid checkpoint in log_dir, else fresh) | PATH")
    # runtime
    device: str = opt("auto", "auto (cuda > mps > cpu) | cpu | cuda | cuda:N | mps")
    dtype: str = opt("auto", "autocast dtype; auto: bfloat16 on CUDA, else float32", ("auto", "bfloat16", "float32"))
    compile: str = opt("auto", "torch.compile the training model; auto: on CUDA", ("auto", "true", "false"))
    seed: int = opt(1337, "seed of the initial weights, shuffling and samples")
    overfit_batch: bool = opt(False, "train on one fixed batch (a sanity check: the loss must go to ~0)")
    peak_flops: float = opt(0.0, "peak FLOP/s of one device for MFU (0: look up the GPU; none on CPU)")
    wandb_project: str = opt("", "log to this Weights & Biases project (needs `pip install wandb`)")

    def __post_init__(self):
        positive = ("n_layer", "n_head", "n_embd", "block_size", "batch_size", "seq_len", "total_batch_size", "max_steps",
                    "sample_length", "lr_decay_steps")
        for name, value in dataclasses.asdict(self).items():
            if isinstance(value, float) and not math.isfinite(value):  # NaN would pass every test below
                raise ValueError(f"--{name} must be a finite number, got {value}")
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value <= 0 and (value < 0 or name in positive):
                raise ValueError(f"--{name} must be {'positive' if name in positive else '>= 0'}, got {value}")
            if value not in self.__dataclass_fields__[name].metadata.get("choices", (value,)):
                raise ValueError(f"--{name} must be one of {'|'.join(self.__dataclass_fields__[name].metadata['choices'])}, "
                                 f"got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"--n_embd ({self.n_embd}) must be divisible by --n_head ({self.n_head})")
        if self.seq_len > self.block_size:
            raise ValueError(f"--seq_len ({self.seq_len}) exceeds --block_size ({self.block_size})")
        if self.total_batch_size % (self.batch_size * self.seq_len):
            raise ValueError(f"--total_batch_size ({self.total_batch_size}) must be divisible by batch_size x "
                             f"seq_len ({self.batch_size} x {self.seq_len} = {self.batch_size * self.seq_len})")
        if not 0 < self.max_lr < 1 or not 0 <= self.min_lr_ratio <= 1 or not 0 <= self.beta2 < 1:
            raise ValueError(f"need 0 < max_lr < 1, 0 <= min_lr_ratio <= 1 and 0 <= beta2 < 1, got {self.max_lr}, "
                             f"{self.min_lr_ratio}, {self.beta2}")
        if self.val_tokens % self.seq_len or (self.eval_interval and not self.val_tokens):
            raise ValueError(f"--val_tokens ({self.val_tokens}) must be a positive multiple of --seq_len ({self.seq_len})")
        if self.hellaswag_data:
            check_path(self.hellaswag_data, "--hellaswag_data", is_dir=False)

def str2bool(text: str) -> bool:
    if text.lower() not in ("true", "1", "yes", "false", "0", "no"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text.lower() in ("true", "1", "yes")

def finite_float(text: str) -> float:
    if not math.isfinite(value := float(text)):  # "nan" and "inf" parse as floats; no setting here means them
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value

def flag_type(name: str, annotation: str):
    """The argparse type of a TrainConfig field from its annotation: X, Optional[X] or X | None, X a plain type."""
    kind = re.sub(r"^Optional\[(\w+)\]$|^(\w+) \| None$", lambda m: m[1] or m[2], annotation)
    types = {"bool": str2bool, "int": int, "float": finite_float, "str": str}
    if kind not in types:  # a silent string flag would accept anything and fail far from the command line
        raise TypeError(f"TrainConfig.{name}: annotation {annotation!r} has no flag type; use bool, int, float or str")
    return types[kind]

FLAG_TYPES = {f.name: flag_type(f.name, f.type) for f in dataclasses.fields(TrainConfig)}  # checked as defined

PRESETS = {
    # The reference recipe: GPT-2 124M on 10B FineWeb-Edu tokens (the TrainConfig defaults, spelled out).
    "gpt2-124M": dict(data_root="edu_fineweb10B", n_layer=12, n_head=12, n_embd=768, block_size=1024,
                      vocab_size=0, batch_size=64, seq_len=1024, total_batch_size=524288, max_steps=19073,
                      warmup_steps=715, max_lr=6e-4, min_lr_ratio=0.1, weight_decay=0.1, grad_clip=1.0,
                      eval_interval=250, val_tokens=10485760, hellaswag_interval=250, sample_interval=250,
                      ckpt_interval=5000),
    # GPT-2's tokens of input.txt (`python fineweb.py --local input.txt --out_dir data/shakespeare`): a smoke run of
    # the BPE path, a few CPU minutes. The unpadded vocabulary: no GPU to align it for.
    "shakespeare": dict(data_root="data/shakespeare", log_dir="log/shakespeare", n_layer=4, n_head=4, n_embd=128,
                        block_size=128, vocab_size=50257, batch_size=16, seq_len=128, total_batch_size=2048,
                        max_steps=100, warmup_steps=10, max_lr=3e-3, eval_interval=25, val_tokens=8192,
                        hellaswag_interval=0, sample_interval=50, sample_prompt="KING.\n", ckpt_interval=100),
    # Characters of input.txt (`python fineweb.py --local input.txt --tokenizer char --out_dir data/shakespeare_char`),
    # nanoGPT's laptop model: val loss below 1.9 in about three CPU minutes, and samples that read like the plays.
    "shakespeare_char": dict(data_root="data/shakespeare_char", log_dir="log/shakespeare_char", n_layer=4, n_head=4,
                             n_embd=128, block_size=64, vocab_size=0, batch_size=12, seq_len=64, total_batch_size=768,
                             max_steps=2000, warmup_steps=100, max_lr=2e-3, beta2=0.99, shuffle=True, eval_interval=250,
                             val_tokens=16384, hellaswag_interval=0, sample_interval=2000, sample_prompt="\n",
                             sample_length=300, ckpt_interval=2000),
}

# ----------------------------------------------------------------------------------------------------------
# Model

class KVCache:
    """Keys and values of the positions seen so far, preallocated for `length` positions (default block_size)."""

    def __init__(self, config: GPTConfig, batch_size: int, device, dtype, length: Optional[int] = None):
        self.length = config.block_size if length is None else length  # short sequences need less memory
        shape = (2, config.n_layer, batch_size, config.n_head, self.length, config.n_embd // config.n_head)
        self.kv, self.pos = torch.empty(shape, device=device, dtype=dtype), 0  # pos: positions cached (read no further)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Store k, v (B, nh, T, hs) after the cached positions; return all keys and values so far."""
        end = self.pos + k.size(2)
        self.kv[0, layer, :, :, self.pos : end], self.kv[1, layer, :, :, self.pos : end] = k, v
        return self.kv[0, layer, :, :, :end], self.kv[1, layer, :, :, :end]

def attention_mask(T: int, past: int, device, packed: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """Which keys each of T queries sees (True: visible), in the one place where attention's uses differ:
    training and val loss (None: plain causal, the fused kernels' fast path), decoding after `past` cached
    positions, and packed rows (HellaSwag) that bring their own (B, 1, T, T) mask."""
    if packed is not None or past == 0:
        return packed
    # Queries are positions past..past+T-1, keys 0..past+T-1: query i sees keys up to past + i, a causal mask
    # shifted right by `past` (is_causal would align it top-left and hide the cache).
    return torch.ones(T, past + T, dtype=torch.bool, device=device).tril(diagonal=past)  # (T, past+T)

class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        self.n_head, self.layer = config.n_head, layer  # layer: the index into a KVCache
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v of all heads at once
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout, self.resid_dropout = nn.Dropout(config.dropout), nn.Dropout(config.dropout)  # HF's names

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None, kv_cache: Optional[KVCache] = None):
        B, T, C = x.size()
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
        if kv_cache is not None:  # q, k, v: (B, nh, T, hs)
            k, v = kv_cache.update(self.layer, k, v)  # (B, nh, past+T, hs)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                           dropout_p=self.attn_dropout.p if self.training else 0.0)  # (B, nh, T, hs)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))  # heads merged back

class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.gelu, self.dropout = nn.GELU(approximate="tanh"), nn.Dropout(config.dropout)  # GPT-2's tanh GELU

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))

class Block(nn.Module):
    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(config.n_embd, bias=config.bias), CausalSelfAttention(config, layer)
        self.ln_2, self.mlp = nn.LayerNorm(config.n_embd, bias=config.bias), MLP(config)

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None, kv_cache: Optional[KVCache] = None):
        x = x + self.attn(self.ln_1(x), mask, kv_cache)  # pre-norm: the residual stream itself is never normalised
        return x + self.mlp(self.ln_2(x))

class ChunkedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of the logits h @ weight.T over targets != -100, `chunk` rows of fp32 logits at a time, so
    no (N, V) tensor exists; with `grad`, forward also makes the gradients and backward only scales them. Exact."""

    @staticmethod
    def forward(ctx, h, weight, targets, grad: bool, chunk: int = 1024):  # h (N, C), weight (V, C), targets (N,)
        loss, n = 0.0, (targets != -100).sum()
        grad_h, grad_w = (torch.empty_like(h), torch.zeros_like(weight)) if grad else (None, None)
        for i in range(0, h.size(0), chunk):
            hc, tc = h[i : i + chunk], targets[i : i + chunk, None]  # (c, C), (c, 1)
            valid, tc = tc != -100, tc.clamp(min=0)  # ignored rows point at id 0, with weight 0
            z = F.linear(hc, weight)  # (c, V) logits, bf16 under autocast: softmax in fp32 (1,024 x 50,304: 206 MB)
            z = z.to(torch.promote_types(z.dtype, torch.float32))
            z -= z.amax(dim=1, keepdim=True)  # each row's largest logit is now 0: exp cannot overflow
            target_z, p = z.gather(1, tc), z.exp_()  # one exp over the chunk, in place
            total = p.sum(dim=1, keepdim=True)
            loss = loss + torch.where(valid, total.log() - target_z, 0).sum()  # -log softmax of each target
            if grad:  # now, from this softmax: recomputing it in backward would cost a third more lm_head FLOPs
                p = p.div_(total).scatter_add_(1, tc, -valid.to(p.dtype))  # d loss / d logits: softmax - one_hot
                grad_h[i : i + chunk] = (p @ weight) * valid
                grad_w += p.t() @ (hc * valid)
        ctx.save_for_backward(grad_h, grad_w, n)
        return loss / n

    @staticmethod
    def backward(ctx, grad_loss):
        grad_h, grad_w, n = ctx.saved_tensors
        return grad_h * (grad_loss / n), grad_w * (grad_loss / n), None, None, None

# The four weights that Hugging Face stores as Conv1D, i.e. (in, out): transposed relative to nn.Linear.
HF_TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
HF_HUB_MODELS = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")  # OpenAI's 124M, 350M, 774M, 1558M

class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd), wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout), h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias)))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # weight tying: one Parameter, two uses
        for module in self.modules():  # GPT-2's init: N(0, 0.02) weights, zero biases (LayerNorm keeps 1 and 0)
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):  # two per block add to the residual stream: keep its variance O(1)
                nn.init.normal_(p, mean=0.0, std=0.02 * (2 * config.n_layer) ** -0.5)

    def features(self, idx: torch.Tensor, kv_cache: Optional[KVCache] = None, pos=None, attn_mask=None) -> torch.Tensor:
        """idx (B, T) token ids -> hidden states (B, T, C) after ln_f (lm_head's input). With a kv_cache, idx continues
        the cached positions (prefill, decode step or chunk). Packed rows (several sequences in one, e.g. endings of
        one prefix) bring position ids pos (B, T) and attn_mask (B, 1, T, T), True where a query may see a key."""
        past, T = self._check_inputs(idx, kv_cache, pos, attn_mask), idx.size(1)
        pos = torch.arange(past, past + T, dtype=torch.long, device=idx.device) if pos is None else pos  # (T,)
        mask = attention_mask(T, past, idx.device, attn_mask)  # one mask for every layer
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))  # (B, T, C)
        for block in self.transformer.h:
            x = block(x, mask, kv_cache)
        if kv_cache is not None:
            kv_cache.pos += T
        return self.transformer.ln_f(x)

    def _check_inputs(self, idx, kv_cache, pos, attn_mask) -> int:
        """features()' arguments, checked; returns the number of positions already in the cache."""
        if idx.dim() != 2 or idx.size(1) == 0:
            raise ValueError(f"idx must be a non-empty (B, T) tensor of token ids, got shape {tuple(idx.shape)}")
        if (pos is None) != (attn_mask is None) or (pos is not None and kv_cache is not None):
            raise ValueError("packed sequences need both pos and attn_mask, and no kv_cache")
        past = 0 if kv_cache is None else kv_cache.pos
        if pos is not None and int(pos.max()) >= self.config.block_size:
            raise ValueError(f"position id {int(pos.max())} >= block_size {self.config.block_size}")
        if pos is None and past + idx.size(1) > self.config.block_size:  # packed rows reuse positions instead
            raise ValueError(f"sequence length {past + idx.size(1)} exceeds block_size {self.config.block_size}")
        if kv_cache is not None and past + idx.size(1) > kv_cache.length:
            raise ValueError(f"sequence length {past + idx.size(1)} exceeds the KV cache's length {kv_cache.length}")
        return past

    def forward(self, idx: torch.Tensor, targets: Optional[torch.Tensor] = None, kv_cache: Optional[KVCache] = None):
        """idx (B, T) token ids -> (logits (B, T, vocab), None), or with targets (None, mean loss of targets != -100)."""
        h = self.features(idx, kv_cache)  # (B, T, C)
        if targets is None:
            return self.lm_head(h), None
        return None, ChunkedCrossEntropy.apply(h.flatten(0, 1), self.lm_head.weight, targets.flatten(),
                                               torch.is_grad_enabled())

    def num_params(self, exclude_embeddings: bool = False) -> int:
        """Unique parameters (the tied token table counted once). exclude_embeddings drops the position table
        only: the token table is also the output projection, so it does real work per token."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.transformer.wpe.weight.numel() if exclude_embeddings else n

    def crop_block_size(self, block_size: int):
        """Shorten the context of a (loaded) model: keep the first `block_size` rows of the position table."""
        if not 0 < block_size <= self.config.block_size:
            raise ValueError(f"crop_block_size: need 0 < {block_size} <= {self.config.block_size}")
        self.config = dataclasses.replace(self.config, block_size=block_size)
        self.transformer.wpe.weight = nn.Parameter(self.transformer.wpe.weight[:block_size].detach().clone())

    def configure_optimizers(self, weight_decay: float, learning_rate: float, device_type: str, muon_lr: float = 0.0,
                             beta2: float = 0.95) -> list:
        """[AdamW] with decay on matrices and embeddings (dim >= 2), none on biases and LayerNorm gains; with muon_lr,
        [AdamW, Muon], Muon taking the blocks' matrices (at muon_lr / learning_rate times the shared schedule)."""
        params = [(n, p) for n, p in self.named_parameters() if p.requires_grad]  # unique: the tied table once
        muon = [p for n, p in params if muon_lr and p.dim() == 2 and n.startswith("transformer.h.")]
        rest = [p for _, p in params if all(p is not q for q in muon)]
        groups = [{"params": [p for p in rest if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0}]
        opts = [torch.optim.AdamW(groups, lr=learning_rate, betas=(0.9, beta2), eps=1e-8, fused=device_type == "cuda")]
        if muon:  # decoupled decay scaled so that a step shrinks weights as much as AdamW's does
            opts.append(torch.optim.Muon([{"params": muon, "lr_scale": muon_lr / learning_rate}], lr=muon_lr,
                                         weight_decay=weight_decay * learning_rate / muon_lr))
        return opts

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: Optional[int] = None,
                 generator: Optional[torch.Generator] = None, use_cache: bool = True,
                 vocab_limit: Optional[int] = None) -> torch.Tensor:
        """Extend idx (B, T) by max_new_tokens sampled tokens (greedy when temperature == 0), from the last block_size
        tokens; vocab_limit masks padded ids (e.g. >= 50257) out. The KV cache is exact: while the sequence fits, each
        step feeds one token; past block_size every position shifts, so the window is re-run whole (as uncached)."""
        if not temperature >= 0 or (top_k is not None and top_k <= 0):
            raise ValueError(f"need temperature >= 0 and top_k positive, got {temperature} and {top_k}")
        weight, block_size, cache, dev = self.lm_head.weight, self.config.block_size, None, self.lm_head.weight.device
        for _ in range(max_new_tokens):
            if use_cache and cache is not None and idx.size(1) <= block_size:
                h = self.features(idx[:, -1:], cache)  # decode: only the newest token is new
            elif use_cache and idx.size(1) < block_size:
                # k and v are made in autocast's dtype when it is on; the cache is sized to what the call fills
                dtype = torch.get_autocast_dtype(dev.type) if torch.is_autocast_enabled(dev.type) else weight.dtype
                cache = KVCache(self.config, idx.size(0), dev, dtype, min(block_size, idx.size(1) + max_new_tokens))
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
                next_id = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1, generator=generator)  # (B, 1)
            idx = torch.cat((idx, next_id), dim=1)
        return idx

    @classmethod
    def from_pretrained(cls, name_or_path: str, dropout: float = 0.0) -> "GPT":
        """OpenAI GPT-2 weights from a hub name (gpt2, gpt2-medium, -large, -xl; via transformers) or a directory of
        GPT2LMHeadModel.save_pretrained. Dropout is ours to choose; the rest (biases included) is GPT-2's."""
        if name_or_path not in HF_HUB_MODELS and not Path(name_or_path).is_dir():
            raise ValueError(f"{name_or_path!r} is neither a GPT-2 hub name {list(HF_HUB_MODELS)} nor a directory")
        from transformers import GPT2LMHeadModel  # heavy; only when asked for

        try:
            hf = GPT2LMHeadModel.from_pretrained(name_or_path)
        except (OSError, ValueError) as e:  # no weights there, or the hub unreachable
            raise ValueError(f"cannot load a GPT-2 model from {name_or_path!r} ({str(e).strip().splitlines()[0]})") from None
        # Settings our architecture hard-codes: anything else would load without error and compute another model.
        fixed = {"activation_function": ("gelu_new", "gelu_pytorch_tanh"), "tie_word_embeddings": (True,),
                 "scale_attn_weights": (True,), "scale_attn_by_inverse_layer_idx": (False,), "layer_norm_epsilon": (1e-5,)}
        if differ := {k: getattr(hf.config, k) for k, ok in fixed.items() if getattr(hf.config, k, ok[0]) not in ok}:
            raise ValueError(f"{name_or_path}: config {differ} is not supported; GPT-2 has {fixed}")
        c = hf.config
        model = cls(GPTConfig(c.n_positions, c.vocab_size, c.n_layer, c.n_head, c.n_embd, dropout))
        model.load_state_dict(convert_hf_state_dict(hf.state_dict(), model.state_dict()))
        return model

def convert_hf_state_dict(hf_sd: dict, our_sd: dict) -> dict:
    """Map a Hugging Face GPT2LMHeadModel state dict onto ours: same keys, Conv1D weights transposed. Key sets
    are compared (mask buffers ignored) and every shape checked: another layout fails instead of half-loading."""
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
# Tokenizer and data: the GPT-2 BPE from a vendored vocabulary file, and fineweb.py's uint16 token shards

GPT2_VOCAB_FILE = HERE / "assets" / "gpt2.tiktoken"  # == tiktoken's r50k_base ranks, from openai-whisper
GPT2_VOCAB_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
GPT2_SPLIT_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
EOT_TOKEN = 50256  # <|endoftext|>: delimits documents
GPT2_VOCAB_SIZE = 50257  # real token ids; a padded model (50304) never samples the ids above this

@functools.lru_cache(maxsize=None)
def get_tokenizer(vocab_file: str | os.PathLike = GPT2_VOCAB_FILE):
    """The GPT-2 encoding (identical to tiktoken.get_encoding('gpt2')), built offline: no download."""
    import tiktoken

    data = Path(vocab_file).read_bytes()
    if hashlib.sha256(data).hexdigest() != GPT2_VOCAB_SHA256:
        raise ValueError(f"{vocab_file} is not the GPT-2 vocabulary (sha256 mismatch); restore it from git")
    ranks = {base64.b64decode(tok): int(rank) for tok, rank in (line.split() for line in data.splitlines() if line)}
    return tiktoken.Encoding(name="gpt2", pat_str=GPT2_SPLIT_PATTERN, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": EOT_TOKEN}, explicit_n_vocab=GPT2_VOCAB_SIZE)

class CharTokenizer:
    """One token per character, id i = chars[i] (`fineweb.py --tokenizer char`), with the part of tiktoken's
    interface that fineweb.py and sampling use. No <|endoftext|>: fineweb.py ends each document with a blank line."""
    name, eot_token = "char", None

    def __init__(self, chars: str):
        if not chars or list(chars) != sorted(set(chars)):
            raise ValueError("a CharTokenizer's vocabulary must be a non-empty string of sorted, unique characters")
        self.chars, self.n_vocab, self._ids = chars, len(chars), {c: i for i, c in enumerate(chars)}

    def encode(self, text: str, **special) -> list[int]:  # there are no special tokens to allow
        if unknown := set(text) - self._ids.keys():
            raise ValueError(f"character {min(unknown)!r} is not in the vocabulary of {self.n_vocab} characters")
        return [self._ids[c] for c in text]

    encode_ordinary = encode

    def decode(self, ids) -> str:
        if bad := [int(i) for i in ids if not 0 <= int(i) < self.n_vocab]:
            raise ValueError(f"token id {bad[0]} is not in 0..{self.n_vocab - 1}")
        return "".join(self.chars[int(i)] for i in ids)

def tokenizer_from_manifest(info: dict):
    """The tokenizer a fineweb.py manifest.json (or a checkpoint) names: GPT-2's, also when it names none, or a
    CharTokenizer."""
    if (kind := info.get("tokenizer", "gpt2")) == "gpt2":
        return get_tokenizer()
    if kind != "char" or not isinstance(info.get("vocab"), str):
        raise ValueError(f"manifest tokenizer {kind!r}: expected 'gpt2', or 'char' with its 'vocab' string")
    return CharTokenizer(info["vocab"])

# The shard names fineweb.py writes and this file reads; one definition for both. Shard 000000 is val.
SHARD_NAME = re.compile(r"(?P<prefix>[^.].*)_(?P<split>val|train)_(?P<index>\d{6})\.npy")  # [^.]: not a temp file

# Made by fineweb.py before its first shard, removed after manifest.json: a run killed outright leaves it behind.
FINEWEB_INCOMPLETE = ".fineweb_incomplete"

def shard_name(prefix: str, index: int) -> str:
    return f"{prefix}_{'val' if index == 0 else 'train'}_{index:06d}.npy"

def find_shards(data_root: str | os.PathLike) -> tuple[dict[str, list[Path]], Optional[dict], Optional[str]]:
    """({"train": [...], "val": [...]}, manifest or None, a note for the log). fineweb.py writes manifest.json last:
    with one, exactly the shards it lists (sizes checked when opened); without one, shards of a single prefix that
    another tool wrote (build-nanogpt's edufineweb_*.npy), never a corpus fineweb.py did not finish."""
    try:
        root = check_path(data_root, "data directory", is_dir=True)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{e}; create it with `python fineweb.py` (or `python fineweb.py --local input.txt "
                                f"--out_dir {data_root}` for the built-in corpus)") from None
    if (root / "manifest.json").exists():
        try:
            manifest = json.loads((root / "manifest.json").read_text())
            manifest["sizes"] = {root / x["file"]: x["tokens"] for x in manifest["shards"]}
            return {s: [root / x["file"] for x in manifest["shards"] if x["split"] == s] for s in ("train", "val")}, \
                manifest, None
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{root}/manifest.json is not fineweb.py's manifest ({e}); re-run fineweb.py") from None
    if partial := sorted(p.name for p in root.iterdir() if p.name == FINEWEB_INCOMPLETE or p.name[0] == "."
                         and ".tmp" in p.name):  # fineweb.py's marker, or its temp files: it was killed mid-run
        raise ValueError(f"{root} has no manifest.json and holds an unfinished fineweb.py output ({partial[0]}); "
                         f"finish it with `python fineweb.py ... --out_dir {root} --overwrite`")
    found = sorted((int(m["index"]), m["split"], m["prefix"], p) for p in root.iterdir() if (m := SHARD_NAME.fullmatch(p.name)))
    if len(prefixes := sorted({prefix for _, _, prefix, _ in found})) > 1:
        raise ValueError(f"{root} holds shards of {len(prefixes)} corpora (prefixes {', '.join(prefixes)}); "
                         "keep one corpus per directory")
    splits = {s: [p for _, split, _, p in found if split == s] for s in ("train", "val")}
    if missing := next((s for s in splits if not splits[s]), None):
        raise FileNotFoundError(f"no '{missing}' shards (*_{missing}_*.npy) in {root}; run fineweb.py to make them")
    return splits, None, (f"no manifest.json in {root}: using the {len(found)} shards found there ({prefixes[0]}_*: "
                          f"{len(splits['val'])} val, {len(splits['train'])} train), as another tool wrote them")

def open_shard(path: Path, tokens: Optional[int] = None) -> np.ndarray:
    """Memory-map one shard (pages are read on demand, never the whole shard); `tokens`: its size per the manifest."""
    try:
        shard = np.load(path, mmap_mode="r", allow_pickle=False)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} is missing (manifest.json lists it); re-run fineweb.py") from None
    except Exception as e:
        raise ValueError(f"{path} is not a readable .npy shard ({type(e).__name__}: {e})") from None
    if shard.dtype != np.uint16 or shard.ndim != 1:
        raise ValueError(f"{path}: expected a 1-D uint16 token array as fineweb.py writes, got {shard.dtype} {shard.shape}")
    if tokens is not None and len(shard) != tokens:
        raise ValueError(f"{path} holds {len(shard)} tokens, manifest.json says {tokens}; re-run fineweb.py")
    return shard

def windows(lengths: list[int], T: int) -> np.ndarray:
    """(shard, start) of each window of T+1 tokens within shards of these lengths, in order. Consecutive windows
    share a token (the last target of one is the first input of the next); a shard's last < T tokens are unread."""
    counts = np.maximum(np.asarray(lengths, dtype=np.int64) - 1, 0) // T  # windows per shard
    first = np.repeat(np.cumsum(counts) - counts, counts)  # the index of each window's shard's first window
    return np.stack([np.repeat(np.arange(len(counts)), counts), (np.arange(counts.sum()) - first) * T], axis=1)

def read_window(shards: list[np.ndarray], names: list[str], k: int, start: int, n: int, vocab_size: Optional[int]):
    """Tokens [start, start+n) of shard k as int64; ids >= vocab_size would index past the embedding table."""
    tokens = shards[k][start : start + n].astype(np.int64)
    if vocab_size is not None and int(tokens.max()) >= vocab_size:
        raise ValueError(f"token id {int(tokens.max())} >= vocab_size {vocab_size} in {names[k]}; "
                         "the shards were made with another tokenizer, or vocab_size is too small")
    return torch.from_numpy(tokens)

class DataLoaderLite:
    """(B, T) training batches, each a window of B*T+1 tokens inside one shard (its last token only a target).

    An epoch is every window of every shard once: in order, or with shuffle=True in a seeded order per epoch,
    shards permuted and then the windows within each. Rank r of a world of W reads windows r, r+W, r+2W, ... of
    epoch 0, then epoch 1, and so on, so over all ranks every window of an epoch is read exactly once; the state
    is how many windows the world has read. Shards are memory-mapped: memory is O(B*T) plus a window index."""

    def __init__(self, paths: list[Path], B: int, T: int, rank: int = 0, world: int = 1,
                 vocab_size: Optional[int] = None, shuffle: bool = False, seed: int = 0, sizes: Optional[dict] = None):
        if B <= 0 or T <= 0 or not 0 <= rank < world:
            raise ValueError(f"need B, T > 0 and 0 <= rank < world, got B={B}, T={T}, rank {rank}, world {world}")
        self.B, self.T, self.rank, self.world, self.vocab_size, self.shuffle, self.seed = B, T, rank, world, vocab_size, shuffle, seed
        self.shards, self.names = [open_shard(p, (sizes or {}).get(p)) for p in paths], [p.name for p in paths]
        self.all = windows([len(s) for s in self.shards], B * T)  # (shard, start) of each window, in order
        if len(self.all) < world:
            raise ValueError(f"the train shards hold {len(self.all)} window(s) of B x T + 1 = {B * T + 1} tokens, fewer "
                             f"than one step needs (one for each of {world} rank(s)); lower batch_size/seq_len or add data")
        self.taken, self.epoch, self.order = 0, None, None  # taken: windows the whole world has read so far

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        epoch, i = divmod(self.taken + self.rank, len(self.all))
        if epoch != self.epoch:  # every rank draws the same order: the same seed, the same epoch
            rng = np.random.default_rng([self.seed, epoch]) if self.shuffle else None
            self.epoch, self.order = epoch, self.all if rng is None else np.concatenate(
                [rng.permutation(self.all[self.all[:, 0] == k]) for k in rng.permutation(len(self.shards))])
        self.taken += self.world
        buf = read_window(self.shards, self.names, *self.order[i], self.B * self.T + 1, self.vocab_size)
        return buf[:-1].view(self.B, self.T), buf[1:].view(self.B, self.T)

    def state_dict(self) -> dict:
        return {"taken": self.taken, "windows": len(self.all), "B": self.B, "T": self.T, "shuffle": self.shuffle,
                "seed": self.seed}

    def load_state_dict(self, state: dict):
        if any(state.get(k) != v for k, v in self.state_dict().items() if k != "taken") or state["taken"] % self.world:
            raise ValueError(f"the train data or its batching changed since the checkpoint ({state} -> {self.state_dict()})")
        self.taken = state["taken"]

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
# Distributed set-up

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

def check_device(device: str) -> str:
    """--device as torch wants it: auto resolved (cuda > mps > cpu), a clear error for a device this machine lacks."""
    mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "mps" if mps else "cpu"
    if not re.fullmatch(r"cpu|mps|cuda(:\d+)?", device):
        raise ValueError(f"--device {device!r}: use auto, cpu, cuda, cuda:N or mps")
    if (device.startswith("cuda") and not torch.cuda.is_available()) or (device == "mps" and not mps):
        raise ValueError(f"--device {device}: {'CUDA' if device != 'mps' else 'MPS'} is not available on this machine "
                         "(use --device cpu)")
    return device

def setup_runtime(device: str = "auto") -> Runtime:
    """Single process, or DDP when torchrun set RANK/LOCAL_RANK/WORLD_SIZE (NCCL on CUDA, gloo on CPU)."""
    device = check_device(device)
    if "RANK" not in os.environ:
        return Runtime(False, 0, 0, 1, device, device.split(":")[0])
    rank, local_rank, world = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    if (device_type := device.split(":")[0]) == "mps":
        raise ValueError("DDP on mps is not supported; use a single process or --device cpu")
    device = f"cuda:{local_rank}" if device_type == "cuda" else "cpu"
    if device_type == "cuda":
        torch.cuda.set_device(device)
    init_process_group("nccl" if device_type == "cuda" else "gloo", rank, world)
    return Runtime(True, rank, local_rank, world, device, device_type)

def autocast_context(device_type: str, dtype: str):
    """bf16 autocast for matmuls (weights and optimizer state stay fp32); a no-op for float32."""
    return torch.autocast(device_type=device_type, dtype=torch.bfloat16, enabled=dtype == "bfloat16")

def all_ranks_agree(flag: bool, rt: Runtime) -> bool:
    """True on every rank if any rank says True (so all ranks stop at the same step)."""
    if not rt.ddp:
        return flag
    t = torch.tensor([float(flag)], device=rt.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())

# ----------------------------------------------------------------------------------------------------------
# Evaluation and metrics

@torch.no_grad()
def evaluate_val_loss(model: GPT, shards: list[np.ndarray], names: list[str], val_tokens: int, B: int, T: int,
                      rt: Runtime, dtype: str, vocab_size: Optional[int] = None) -> float:
    """Mean loss of the first val_tokens targets of the val split, its first val_tokens/T windows of T+1 tokens;
    window i is scored by rank i % world, so the tokens are the same for any world size or batch size."""
    seqs = windows([len(s) for s in shards], T)
    if val_tokens <= 0 or val_tokens % T or val_tokens // T > len(seqs):
        raise ValueError(f"val_tokens ({val_tokens}) must be a positive multiple of seq_len ({T}) and fit the val split "
                         f"({len(seqs)} sequences of {T} tokens)")
    model.eval()
    exact = torch.float32 if rt.device_type == "mps" else torch.float64  # MPS has no float64
    sums = torch.zeros(2, dtype=exact, device=rt.device)  # loss summed over tokens, tokens
    mine = seqs[rt.rank : val_tokens // T : rt.world_size]  # this rank's windows
    for i in range(0, len(mine), B):
        rows = torch.stack([read_window(shards, names, *w, T + 1, vocab_size) for w in mine[i : i + B]]).to(rt.device)
        with autocast_context(rt.device_type, dtype):
            _, loss = model(rows[:, :-1], rows[:, 1:])  # the training loss itself
        sums[0] += loss.to(exact) * rows[:, 1:].numel()  # summed on the device: no host sync per batch
        sums[1] += rows[:, 1:].numel()
    if rt.ddp:
        dist.all_reduce(sums)
    model.train()
    return (sums[0] / sums[1]).item()

def prompt_ids(enc, prompt: str) -> list[int]:
    """A prompt's token ids: <|endoftext|> is GPT-2's special token; an empty prompt is <|endoftext|> alone (a
    tokenizer without one, like characters, has no ids for it)."""
    return enc.encode(prompt, allowed_special="all") or ([enc.eot_token] if enc.eot_token is not None else [])

def sample_texts(model: GPT, enc, prompt: str, num_samples: int, max_new_tokens: int, top_k: Optional[int],
                 temperature: float, seed: int, device: str) -> list[str]:
    """Seeded top-k samples continuing `prompt`, encoded (<|endoftext|> is GPT-2's special token) and decoded with
    enc; ids past the tokenizer's (a padded table's extra rows) are never drawn."""
    if model.config.vocab_size < enc.n_vocab:
        raise ValueError(f"the model's vocabulary ({model.config.vocab_size} ids) is smaller than the {enc.name} "
                         f"tokenizer's ({enc.n_vocab}): it was not trained on these ids")
    ids = prompt_ids(enc, prompt)
    if not 0 < len(ids) < model.config.block_size:
        raise ValueError(f"the prompt is {len(ids)} tokens; the model needs 1 to {model.config.block_size - 1}")
    was_training = model.training
    out = model.eval().generate(torch.tensor(ids, device=device).repeat(num_samples, 1), max_new_tokens, temperature,
                                top_k, torch.Generator(device=device).manual_seed(seed), vocab_limit=enc.n_vocab)
    model.train(was_training)
    return [enc.decode(row.tolist()) for row in out]

# How each metric reads on stdout; log.txt and wandb get every value as measured. A kind missing here needs no
# entry: it prints as `kind value`.
SHOW = {"train": "loss {:.6f}", "val": "val loss {:.4f}", "hella": "HellaSwag acc_norm {:.4f}", "lr": "lr {:.4e}",
        "norm": "norm {:.4f}", "ms": "{:7.1f} ms", "tok_per_s": "{:9.0f} tok/s", "mfu": "MFU {:6.2%}"}

class Metrics:
    """The one sink of measured values. report(step, kind=value, ...) is called once, where they are measured:
    it prints them as one line, appends a `step kind value` line each to log_dir/log.txt (what plot.py and
    play.ipynb read) and sends them to wandb when it is on. Only rank 0 writes; every rank keeps `latest`."""

    def __init__(self, log_dir: Path, enabled: bool, echo, wandb_run=None):
        self.path, self.enabled, self.echo, self.wandb_run = log_dir / "log.txt", enabled, echo, wandb_run
        self.latest: dict[str, float] = {}  # the newest value of each kind: train() returns them

    def report(self, step: int, **values: float):
        self.latest.update(values)
        if self.enabled:
            self.echo(f"step {step:5d} | " + " | ".join(SHOW.get(k, k + " {:.6g}").format(v) for k, v in values.items()))
            with open(self.path, "a") as f:  # appended: a resumed run continues the same file
                f.writelines(f"{step} {kind} {value:.8g}\n" for kind, value in values.items())
            if self.wandb_run is not None:
                self.wandb_run.log(values, step=step)

# ----------------------------------------------------------------------------------------------------------
# Training

class SpikeGuard:
    """Flags an update whose loss or grad norm lies more than z standard deviations above the mean of the last
    `window` accepted ones (after `warmup` of them): a bad batch is skipped instead of derailing the run (llm.c's
    rule; z = 0: off). Its history goes into checkpoints, so a resumed run decides alike."""

    def __init__(self, z: float, window: int = 128, warmup: int = 16):
        self.z, self.window, self.warmup, self.history = z, window, warmup, []  # history: (loss, norm) pairs

    def spike(self, loss: float, norm: float) -> Optional[float]:
        """The larger z-score of (loss, norm) if it is over the threshold, else None (then `accept` it)."""
        if self.z <= 0 or len(self.history) < self.warmup:
            return None
        past = np.array(self.history)  # (n, 2)
        score = float(((np.array([loss, norm]) - past.mean(0)) / (past.std(0) + 1e-8)).max())
        return score if score > self.z else None

    def accept(self, loss: float, norm: float):
        self.history = (self.history + [(loss, norm)])[-self.window :]

@dataclass
class Run:
    """What a training run holds across steps: made by start_run, saved by save_checkpoint."""
    cfg: TrainConfig
    rt: Runtime
    enc: object  # the data's tokenizer (GPT-2's, or a CharTokenizer): samples are decoded with it
    model: GPT  # the plain module: evaluation, sampling and checkpoints use it
    train_model: nn.Module  # the module that trains: `model` compiled and/or wrapped in DDP (the same weights)
    optimizers: list  # AdamW, and Muon for the blocks' matrices with --optimizer muon
    train_loader: DataLoaderLite
    val: tuple  # (the val split's shards, their names)
    dtype: str  # autocast dtype: "bfloat16" | "float32"
    grad_accum: int  # micro-steps per optimizer step
    guard: SpikeGuard
    step: int = 0  # optimizer steps taken so far
    evals_done: bool = False  # the evaluations of `step` are already logged (a resumed end-of-run checkpoint)
    val_loss: Optional[float] = None  # a resumed run's newest val loss, until this run measures its own
    skipped: int = 0  # updates skipped as spikes
    hellaswag: Optional[list] = None  # loaded at the first HellaSwag evaluation
    lineage: dict = field(default_factory=dict)  # its id, its parent, the suffix of its checkpoint names
    resumed_from: Optional[str] = None

def build_model(cfg: TrainConfig, enc, known_tokenizer: bool) -> GPT:
    """From scratch with cfg's shape, or --init_from's weights (cropped to block_size if shorter); cfg's dropout. The
    vocabulary: --vocab_size, or the data's tokenizer's (GPT-2's 50,257 padded to 50,304, a multiple of 128, for speed)."""
    if cfg.init_from == "scratch":
        if known_tokenizer and 0 < cfg.vocab_size < enc.n_vocab:
            raise ValueError(f"--vocab_size {cfg.vocab_size} is smaller than the data's {enc.name} tokenizer ({enc.n_vocab} ids)")
        return GPT(GPTConfig(cfg.block_size, cfg.vocab_size or (50304 if enc.name == "gpt2" else enc.n_vocab),
                             cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.dropout, cfg.bias))
    model, model_enc = load_model(cfg.init_from)
    if known_tokenizer and (model_enc.name, model_enc.n_vocab) != (enc.name, enc.n_vocab):
        raise ValueError(f"--init_from {cfg.init_from} was trained on the {model_enc.name} tokenizer; the data in "
                         f"{cfg.data_root} is {enc.name} ({enc.n_vocab} ids)")
    if model.config.bias and not cfg.bias:
        raise ValueError(f"--bias false: {cfg.init_from} has biases (GPT-2's weights always do)")
    model.config = dataclasses.replace(model.config, dropout=cfg.dropout)  # the run's choice, not the weights'
    model.apply(lambda m: setattr(m, "p", cfg.dropout) if isinstance(m, nn.Dropout) else None)
    if cfg.block_size < model.config.block_size:
        model.crop_block_size(cfg.block_size)
    if cfg.seq_len > model.config.block_size:
        raise ValueError(f"--seq_len ({cfg.seq_len}) exceeds the context of {cfg.init_from} ({model.config.block_size})")
    return model

def start_run(cfg: TrainConfig, rt: Runtime, lock: LogDirLock, log) -> Run:
    """Everything a run needs before its first step, checked before anything is written: data, model, optimizers
    and a resumed run's state. Only then is log_dir made (locked against a second run) and header.txt written,
    so a run that fails its checks leaves no files behind."""
    B, T = cfg.batch_size, cfg.seq_len
    if cfg.total_batch_size % (B * T * rt.world_size):
        raise ValueError(f"--total_batch_size {cfg.total_batch_size} is not divisible by batch_size x seq_len x "
                         f"world_size = {B} x {T} x {rt.world_size} = {B * T * rt.world_size}")
    splits, manifest, note = find_shards(cfg.data_root)
    if note:
        log(f"note: {note}")
    enc, sizes = tokenizer_from_manifest(manifest or {}), (manifest or {}).get("sizes", {})
    if rt.device_type == "cuda":  # TF32 for any fp32 matmul left outside autocast
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    if rt.device_type == "cpu":
        keep_freed_memory()
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank
    model = build_model(cfg, enc, manifest is not None).to(rt.device)
    run = Run(cfg, rt, enc, model, model, model.configure_optimizers(cfg.weight_decay, cfg.max_lr, rt.device_type,
                                                                     cfg.muon_lr * (cfg.optimizer == "muon"), cfg.beta2),
              DataLoaderLite(splits["train"], B, T, rt.rank, rt.world_size, model.config.vocab_size, cfg.shuffle,
                             cfg.seed, sizes), ([open_shard(p, sizes.get(p)) for p in splits["val"]],
                                                [p.name for p in splits["val"]]),
              cfg.dtype if cfg.dtype != "auto" else default_dtype(rt.device_type),
              cfg.total_batch_size // (B * T * rt.world_size), SpikeGuard(cfg.skip_spikes))
    lock.claim(create=False)  # if log_dir exists, no other run may change its checkpoints from here on
    resume(run, Path(cfg.log_dir), log)
    lock.claim(create=True)
    use_compile = cfg.compile == "true" or (cfg.compile == "auto" and rt.device_type == "cuda")
    run.train_model = torch.compile(model) if use_compile else model
    if rt.ddp:
        from torch.nn.parallel import DistributedDataParallel as DDP

        run.train_model = DDP(run.train_model, device_ids=[rt.local_rank] if rt.device_type == "cuda" else None)
    if rt.master:
        write_header(Path(cfg.log_dir), cfg, rt, {"num_params": model.num_params(), "grad_accum_steps": run.grad_accum,
                     "dtype": run.dtype, "compile": use_compile, "resumed_from": run.resumed_from, "lineage": run.lineage,
                     "data": {k: (manifest or {}).get(k) for k in ("dataset", "tokenizer", "source")}})
    log(f"{model.num_params():,} parameters | {rt.world_size} process(es) on {rt.device} | {run.dtype} | "
        f"compile {use_compile}")
    log(f"total batch {cfg.total_batch_size:,} tokens = {B} x {T} x {rt.world_size} ranks x {run.grad_accum} micro-steps")
    return run

def is_due(step: int, interval: int, last_step: int) -> bool:
    """Every `interval` steps (0: never), and always at the last step."""
    return interval > 0 and (step % interval == 0 or step == last_step)

def evaluate(run: Run, step: int, metrics: Metrics, log):
    """The evaluations due at `step`, on the plain model: val loss and HellaSwag (every rank scores a share of them),
    and samples (rank 0)."""
    cfg, rt, model = run.cfg, run.rt, run.model
    if is_due(step, cfg.eval_interval, cfg.max_steps):
        metrics.report(step, val=evaluate_val_loss(model, *run.val, cfg.val_tokens, cfg.batch_size, cfg.seq_len, rt,
                                                   run.dtype, model.config.vocab_size))
    if is_due(step, cfg.hellaswag_interval, cfg.max_steps):
        import hellaswag  # beside this file; it does not import this module back

        if run.hellaswag is None:  # loaded once; [] when it cannot be had (offline) or does not apply
            run.hellaswag, why = [], f"the model's tokenizer is {run.enc.name}, not GPT-2's"
            if run.enc.name == "gpt2":
                run.hellaswag, why = hellaswag.load_for_training(cfg.hellaswag_data or None, cfg.hellaswag_limit,
                                                                 rt.rank, rt.world_size, rt.device)
            if why:
                log(f"HellaSwag skipped: {why}")
        if run.hellaswag:
            result = hellaswag.evaluate(model, run.hellaswag, rt.device, enc=run.enc, rank=rt.rank, world_size=rt.world_size,
                                        autocast_dtype=torch.bfloat16 if run.dtype == "bfloat16" else None)
            metrics.report(step, hella=result["acc_norm"])
    if is_due(step, cfg.sample_interval, cfg.max_steps) and rt.master:
        for text in sample_texts(model, run.enc, cfg.sample_prompt, 4, cfg.sample_length, 50, 1.0, cfg.seed, rt.device):
            log(f"sample: {text!r}")

def train(cfg: TrainConfig, log=print) -> dict:
    """Train as configured (one process, or one rank under torchrun); return the final metrics."""
    rt = setup_runtime(cfg.device)
    lock = LogDirLock(cfg.log_dir, rt)  # one run per log_dir
    try:
        log = log if rt.master else (lambda *args: None)
        run = start_run(cfg, rt, lock, log)
        model, train_model, loader = run.model, run.train_model, run.train_loader
        metrics = Metrics(Path(cfg.log_dir), rt.master, log, start_wandb(cfg, rt))
        metrics.latest.update(val=run.val_loss, skipped=run.skipped)  # a resumed run's, until this run's own
        if run.step == cfg.max_steps and run.evals_done:  # a finished run, resumed: nothing to do or rewrite
            return {**metrics.latest, "step": run.step, "checkpoint": run.resumed_from}
        fixed_batch = loader.next_batch() if cfg.overfit_batch else None
        flops, peak = flops_per_token(model, cfg.seq_len), peak_flops(rt.device_type, cfg.peak_flops)
        with StopSignal() as stop:
            for step in range(run.step, cfg.max_steps + 1):
                if not run.evals_done:  # a checkpoint written at the end of a run has evaluated already
                    evaluate(run, step, metrics, log)
                if step == cfg.max_steps:
                    break
                t0 = time.time()
                model.zero_grad(set_to_none=True)
                loss_accum = torch.zeros((), device=rt.device)
                for micro in range(run.grad_accum):
                    x, y = fixed_batch if cfg.overfit_batch else loader.next_batch()
                    x, y = to_device(x, rt), to_device(y, rt)
                    if rt.ddp:  # all-reduce gradients only on the last micro-step (set before the forward)
                        train_model.require_backward_grad_sync = micro == run.grad_accum - 1
                    with autocast_context(rt.device_type, run.dtype):
                        _, loss = train_model(x, y)
                    # The loss is a mean over B*T tokens; dividing by grad_accum makes the summed gradients
                    # those of the mean over the whole batch.
                    loss = loss / run.grad_accum
                    loss_accum += loss.detach()
                    loss.backward()
                if rt.ddp:
                    dist.all_reduce(loss_accum, op=dist.ReduceOp.AVG)  # the loss of the whole batch, on every rank
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip or float("inf"))
                lr = get_lr(step, cfg.max_lr, cfg.max_lr * cfg.min_lr_ratio, cfg.warmup_steps,
                            cfg.lr_decay_steps or cfg.max_steps)
                for group in (group for opt in run.optimizers for group in opt.param_groups):
                    group["lr"] = lr * group.get("lr_scale", 1.0)  # Muon's group runs at its own peak
                loss_value, norm_value = loss_accum.item(), norm.item()  # the one host sync of a step
                if not (math.isfinite(loss_value) and math.isfinite(norm_value)):
                    check_nonfinite(run, step, loss_value, norm_value, log)  # raises unless --skip_nonfinite
                elif (z := run.guard.spike(loss_value, norm_value)) is not None:
                    run.skipped += 1
                    metrics.report(step, spike=z, skipped=run.skipped)  # and this update is not made
                else:
                    run.guard.accept(loss_value, norm_value)
                    for opt in run.optimizers:
                        opt.step()
                if rt.device_type == "cuda":
                    torch.cuda.synchronize()  # the step's GPU work is done: now the clock means something
                dt = time.time() - t0
                mfu = {"mfu": flops * cfg.total_batch_size / dt / (peak * rt.world_size)} if peak else {}
                metrics.report(step, train=loss_value, lr=lr, norm=norm_value, ms=1000 * dt,
                               tok_per_s=cfg.total_batch_size / dt, **mfu)
                run.step, run.evals_done = step + 1, False
                if all_ranks_agree(stop.requested, rt):
                    path = save_checkpoint(run, metrics.latest["val"])
                    log(f"stop requested: saved {path} after step {step}; resume with --resume auto")
                    return {**metrics.latest, "step": run.step, "checkpoint": str(path), "stopped": True}
                if cfg.ckpt_interval and run.step % cfg.ckpt_interval == 0 and run.step < cfg.max_steps:
                    save_checkpoint(run, metrics.latest["val"])
        run.evals_done = True
        path = save_checkpoint(run, metrics.latest["val"])
        if metrics.wandb_run is not None:
            metrics.wandb_run.finish()
        return {**metrics.latest, "step": run.step, "checkpoint": str(path)}
    finally:
        lock.release()
        if rt.ddp and dist.is_initialized():
            dist.destroy_process_group()

def to_device(t: torch.Tensor, rt: Runtime) -> torch.Tensor:
    """A host batch on the run's device; pinned memory lets the copy to a GPU overlap with compute."""
    return t.pin_memory().to(rt.device, non_blocking=True) if rt.device_type == "cuda" else t.to(rt.device)

def start_wandb(cfg: TrainConfig, rt: Runtime):
    if not (cfg.wandb_project and rt.master):
        return None
    import wandb  # optional dependency, imported only when asked for

    return wandb.init(project=cfg.wandb_project, config=dataclasses.asdict(cfg), resume="allow")

# ----------------------------------------------------------------------------------------------------------
# Command line

class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (the usage of ~50 flags would bury it) and no abbreviations (a prefix of
    one flag would silently set another)."""

    def __init__(self, **kwargs):
        super().__init__(allow_abbrev=False, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see -h)\n")

def parse_train_args(argv: list[str]) -> TrainConfig:
    """--field value for every TrainConfig field, plus --preset; explicit flags override the preset."""
    parser = Parser(description="Train GPT-2 (README.md has the recipes; sample.py, hellaswag.py, plot.py and "
                    "export_hf.py use what it writes).", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), help="a named recipe; other flags override it")
    for f in dataclasses.fields(TrainConfig):
        parser.add_argument(f"--{f.name}", type=FLAG_TYPES[f.name], default=f.default, help=f.metadata["help"],
                            metavar="true|false" if FLAG_TYPES[f.name] is str2bool else None)
    if preset := parser.parse_known_args(argv)[0].preset:
        parser.set_defaults(**PRESETS[preset])
    args = vars(parser.parse_args(argv))
    args.pop("preset")
    try:
        return TrainConfig(**args)
    except ValueError as e:
        parser.error(str(e))

def main(argv: Optional[list[str]] = None):
    try:
        if train(parse_train_args(sys.argv[1:] if argv is None else argv)).get("stopped"):
            print("stopped cleanly")
    except (ValueError, OSError, NonFiniteError) as e:
        if os.environ.get("GPT2_DEBUG"):
            raise
        sys.exit(f"error: {e}")

# ----------------------------------------------------------------------------------------------------------
# Plumbing: what a run needs and a reader changing the model or the loop does not. Checkpoint files and model
# loading, lineages, resume lookup and pruning, the log directory's lock, RNG capture, atomic writes, path checks,
# the plot refresh, signals, the run header, process-group start-up, CPU tuning and the FLOP arithmetic of MFU.

class NonFiniteError(RuntimeError):
    """The loss or gradient norm became inf/NaN."""

def check_nonfinite(run: Run, step: int, loss: float, norm: float, log):
    """A non-finite loss or grad norm stops the run, naming the last good checkpoint (--skip_nonfinite: skip it)."""
    if not run.cfg.skip_nonfinite:
        good = checkpoint_paths(run.cfg.log_dir, run.lineage["suffix"])
        raise NonFiniteError(f"non-finite loss {loss} / grad norm {norm} at step {step}; last good checkpoint: "
                             f"{good[-1] if good else 'none'} (lower --max_lr, or pass --skip_nonfinite true)")
    log(f"step {step:5d} | non-finite loss {loss} / grad norm {norm}: update skipped")

def check_path(path: str | os.PathLike, what: str, is_dir: bool) -> Path:
    """path, if it is there and of the right kind; else one line naming it: missing, a symlink loop, no permission,
    a file where a directory belongs or the other way round."""
    try:
        if stat.S_ISDIR((p := Path(path)).stat().st_mode) != is_dir:
            raise ValueError(f"{what} {path} is a {'file' if is_dir else 'directory'}, not a {'directory' if is_dir else 'file'}")
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {path} does not exist") from None
    except OSError as e:
        raise ValueError(f"{what} {path}: {e.strerror}") from None
    if not os.access(p, os.R_OK | (os.X_OK if is_dir else 0)):
        raise ValueError(f"{what} {path}: permission denied")
    return p

def load_checkpoint(path: str | os.PathLike) -> dict:
    """A checkpoint of this script: plain tensors and dicts, loaded without running any code, memory-mapped."""
    path = check_path(path, "checkpoint", is_dir=False)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # truncated file, not a torch file, or pickled objects weights_only refuses
        raise ValueError(f"{path} is not a readable checkpoint of this script ({type(e).__name__}: {e})") from None
    if not isinstance(ckpt, dict) or "model" not in ckpt or "model_config" not in ckpt:
        raise ValueError(f"{path} is not a checkpoint of this script (no 'model' / 'model_config' entries)")
    return ckpt

def load_model(source: str, device: str = "cpu") -> tuple[GPT, object]:
    """A model and the tokenizer its ids mean: one of our checkpoints (a .pt file), a local Hugging Face directory
    or a GPT-2 hub name (these two with GPT-2's tokenizer)."""
    if str(source).endswith(".pt") or Path(source).is_file():
        ckpt = load_checkpoint(source)
        (model := GPT(GPTConfig(**ckpt["model_config"]))).load_state_dict(ckpt["model"])
        return model.to(device), tokenizer_from_manifest(ckpt.get("tokenizer", {}))
    return GPT.from_pretrained(str(source)).to(device), get_tokenizer()

def save_checkpoint(run: Run, val_loss: Optional[float]) -> Path:
    """model_{step:05d}[_{lineage}].pt in log_dir, written atomically by rank 0: everything a resume needs, as plain
    data; then this lineage's oldest are pruned and curves.png redrawn. Every rank waits for the file."""
    path = Path(run.cfg.log_dir) / f"model_{run.step:05d}{run.lineage['suffix']}.pt"
    if run.rt.master:
        if not all(torch.isfinite(p).all() for p in run.model.parameters()):
            raise NonFiniteError(f"refusing to checkpoint non-finite weights at step {run.step}")
        ckpt = {"model": run.model.state_dict(), "optimizer": run.optimizers[0].state_dict(),
                "muon": run.optimizers[1].state_dict() if len(run.optimizers) > 1 else None,
                "model_config": dataclasses.asdict(run.model.config), "train_config": dataclasses.asdict(run.cfg),
                "tokenizer": {"tokenizer": run.enc.name, "vocab": getattr(run.enc, "chars", None)},
                "step": run.step, "evals_done": run.evals_done, "val_loss": val_loss,
                "train_loader": run.train_loader.state_dict(), "rng": capture_rng_state(),
                "spikes": {"history": run.guard.history, "skipped": run.skipped},
                "lineage": {k: v for k, v in run.lineage.items() if k != "suffix"}}
        try:
            atomic_write(path, lambda f: torch.save(ckpt, f))
        except (OSError, RuntimeError) as e:  # a full disk, most often (torch wraps the OSError in a RuntimeError)
            raise OSError(f"could not write {path} ({write_error(e)}); earlier checkpoints are intact: free some space, then "
                          "rerun with --resume auto") from None
        if run.cfg.keep_last:  # the oldest checkpoints of this lineage only
            for old in checkpoint_paths(run.cfg.log_dir, run.lineage["suffix"])[: -run.cfg.keep_last]:
                old.unlink(missing_ok=True)
        refresh_plot(run.cfg.log_dir)
    if run.rt.ddp:
        dist.barrier()  # nobody races ahead (or exits) before the file exists
    return path

def resume(run: Run, log_dir: Path, log):
    """Load --resume's checkpoint into run (auto: the usable one written last in log_dir, if any): weights,
    optimizers, loader, RNG, step; then choose the run's lineage."""
    cfg, path, ckpt = run.cfg, None, None
    if cfg.resume == "auto":
        path, ckpt = newest_usable_checkpoint(log_dir, log)
        if ckpt is None:
            log(f"no checkpoint in {log_dir}: starting fresh")
    elif cfg.resume:
        path = Path(cfg.resume)
        ckpt = check_training_checkpoint(path, load_checkpoint(path))
    if ckpt is not None:
        if GPTConfig(**ckpt["model_config"]) != run.model.config:
            raise ValueError(f"{path} holds a model of shape {ckpt['model_config']}, this run builds {run.model.config}")
        if ckpt["step"] > cfg.max_steps:
            raise ValueError(f"--max_steps {cfg.max_steps} is below the step of {path} ({ckpt['step']}): raise "
                             "--max_steps, or resume an earlier checkpoint with --resume PATH")
        if (ckpt.get("muon") is None) != (len(run.optimizers) == 1):
            raise ValueError(f"{path} was trained with another --optimizer; resume it with the same one")
        run.model.load_state_dict(ckpt["model"])
        for opt, state in zip(run.optimizers, (ckpt["optimizer"], ckpt.get("muon"))):
            opt.load_state_dict(state)
        run.train_loader.load_state_dict(ckpt["train_loader"])
        restore_rng_state(ckpt["rng"])
        run.step, run.evals_done, run.val_loss, run.resumed_from = ckpt["step"], ckpt["evals_done"], ckpt["val_loss"], str(path)
        spikes = ckpt.get("spikes", {"history": [], "skipped": 0})  # checkpoints from before the spike guard have none
        run.guard.history, run.skipped = spikes["history"], spikes["skipped"]
    run.lineage = choose_lineage(log_dir, path, ckpt, run.rt)
    branch = f"; a new lineage {run.lineage['id']} branches from it" if ckpt and run.lineage["parent"] else ""
    log(f"resumed from {path} at step {run.step}{branch}" if ckpt else f"lineage {run.lineage['id']} starts")
    if run.lineage["suffix"]:
        log(f"note: {log_dir} holds other runs' checkpoints: this run writes model_NNNNN{run.lineage['suffix']}.pt")

def check_training_checkpoint(path: Path, ckpt: dict) -> dict:
    if not {"optimizer", "train_loader", "rng", "step"} <= set(ckpt):
        raise ValueError(f"{path} holds weights but no optimizer or loader state to resume; start from its weights "
                         f"with --init_from {path}")
    return ckpt

def choose_lineage(log_dir: Path, path: Optional[Path], ckpt: Optional[dict], rt: Runtime) -> dict:
    """This run's lineage {id, parent, suffix}. Resuming the newest readable checkpoint of a lineage continues it
    (its id and file names); a fresh run, or a resume from an older checkpoint (a branch), starts a new one. A
    log_dir's first lineage writes model_{step:05d}.pt, any other model_{step:05d}_{id}.pt, so that no run writes
    over or prunes a checkpoint of another lineage."""
    ids = [secrets.token_hex(4)]
    if rt.ddp:
        dist.broadcast_object_list(ids, src=0)  # rank 0's, on every rank
    lineage = {"id": ids[0], "parent": None}
    if ckpt is not None:
        suffix = (m[2] or "") if (m := CHECKPOINT.fullmatch(path.name)) else None  # None: not named as we name them
        if suffix is None or any(checkpoint_step(p) > ckpt["step"] and readable(p) for p in checkpoint_paths(path.parent, suffix)):
            lineage["parent"] = {"file": str(path), "step": ckpt["step"]}  # a branch: a new lineage
        else:  # continue its lineage, with its file names if it lives here
            lineage = ckpt.get("lineage") or {"id": suffix[1:] or ids[0], "parent": None}
            if path.parent.resolve() == log_dir.resolve():
                return {**lineage, "suffix": suffix}
    taken = log_dir.is_dir() and checkpoint_paths(log_dir, "")  # another lineage holds the plain names
    return {**lineage, "suffix": f"_{lineage['id']}" if taken else ""}

CHECKPOINT = re.compile(r"model_(\d+)(_[0-9a-f]{8})?\.pt")  # model_{step:05d}[_{lineage}].pt

def checkpoint_step(path: Path) -> int:
    return int(CHECKPOINT.fullmatch(path.name)[1])

def checkpoint_paths(log_dir: str | os.PathLike, suffix: Optional[str] = None) -> list[Path]:
    """Checkpoint files of log_dir (only one lineage's: suffix '' for plain names, '_{id}' for the others), by step."""
    found = [p for p in Path(log_dir).glob("model_*.pt") if (m := CHECKPOINT.fullmatch(p.name)) and suffix in (None, m[2] or "")]
    return sorted(found, key=checkpoint_step)

def readable(path: Path) -> bool:
    try:
        return bool(load_checkpoint(path))
    except (OSError, ValueError):
        return False

def newest_usable_checkpoint(log_dir: Path, log) -> tuple[Optional[Path], Optional[dict]]:
    """The checkpoint written last in log_dir that can be resumed; the ones passed over are named in warnings."""
    for path in sorted(checkpoint_paths(log_dir) if log_dir.is_dir() else [], reverse=True,
                       key=lambda p: (p.stat().st_mtime_ns, checkpoint_step(p))):
        try:
            return path, check_training_checkpoint(path, load_checkpoint(path))
        except (OSError, ValueError) as e:
            log(f"warning: skipping unusable checkpoint: {e}")
    return None, None

class LogDirLock:
    """Rank 0's exclusive lock on --log_dir: flock on the directory itself, so no file is made and the lock dies
    with its process (a killed run never blocks --resume auto). Released when the run ends."""

    def __init__(self, log_dir: str, rt: Runtime):
        self.path, self.rt, self.fd = Path(log_dir), rt, None

    def claim(self, create: bool):
        """Lock log_dir if it exists (create: make it first). If rank 0 cannot, torchrun stops the other ranks."""
        if self.path.exists() and not self.path.is_dir():
            raise ValueError(f"--log_dir {self.path} exists and is not a directory")
        if self.rt.master and self.fd is None and (create or self.path.is_dir()):
            self.path.mkdir(parents=True, exist_ok=True)
            self.fd = os.open(self.path, os.O_RDONLY)
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self.release()
                raise ValueError(f"--log_dir {self.path} is in use by another run ({lock_holder(self.path)}); wait for "
                                 "it, or choose another --log_dir") from None
            for stale in self.path.glob(".model_*.pt.tmp*"):  # left by a run killed while saving
                stale.unlink(missing_ok=True)

    def release(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

def lock_holder(path: Path) -> str:
    """'pid N: its command line' of the process holding a flock on path, read from Linux's /proc/locks."""
    st = path.stat()
    key = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        pid = next(line.split()[4] for line in Path("/proc/locks").read_text().splitlines() if key in line.split())
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(bytes(1), b" ").decode().strip()
        return f"pid {pid}: {command if len(command) < 100 else command[:97] + '...'}"
    except (OSError, StopIteration):
        return "another process"

def capture_rng_state() -> dict:
    """The RNGs a run draws from (torch's, CPU and CUDA: dropout), as tensors (weights_only-loadable)."""
    return {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}

def restore_rng_state(state: dict):
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])

def write_error(e: BaseException) -> str:
    """Why a write failed, in a few words: the OSError's own text (also inside the error that torch.save or
    safetensors raise around it), else the last line of the message."""
    cause = e if isinstance(e, OSError) else e.__context__
    if isinstance(cause, OSError) and cause.strerror:
        return cause.strerror
    return (str(e).strip().splitlines() or [type(e).__name__])[-1]

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

def refresh_plot(log_dir: str | os.PathLike):
    """Redraw log_dir/curves.png with plot.py. A plot never stops a run: problems are reported, not raised."""
    try:
        import plot  # beside this file; it needs matplotlib and does not import this module back

        png = plot.curves_png(log_dir)
        atomic_write(Path(log_dir) / "curves.png", lambda f: f.write(png))
    except Exception as e:  # plot.py or matplotlib missing, a full disk: say so, and train on
        print(f"warning: curves.png not updated ({type(e).__name__}: {e})", file=sys.stderr)

class StopSignal:
    """Set by SIGTERM/SIGINT; the loop checks it after each step, saves a checkpoint and exits cleanly."""

    def __enter__(self):
        self.requested, self.previous = False, {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}
        return self

    def _handle(self, signum, frame):
        self.requested = True

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

def write_header(log_dir: Path, cfg: TrainConfig, rt: Runtime, extra: dict):
    """Append this run's config and versions to log_dir/header.txt (one JSON block per start or resume)."""
    info = {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": sys.argv, "config": dataclasses.asdict(cfg),
            "world_size": rt.world_size, "device": rt.device, "python": platform.python_version(),
            "torch": torch.__version__, "gpu": torch.cuda.get_device_name() if rt.device_type == "cuda" else None, **extra}
    with open(log_dir / "header.txt", "a") as f:
        f.write(json.dumps(info, indent=1) + "\n")

def init_process_group(backend: str, rank: int, world: int):
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt not in (None, "0") and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # After a torchrun restart the agent's shared store still holds the dead attempt's addresses (gloo then
        # connects to them, pytorch/pytorch#135712): rendezvous under a key prefix of this attempt instead.
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=False)
        dist.init_process_group(backend, store=dist.PrefixStore(f"attempt_{attempt}/", store), rank=rank, world_size=world)
    else:
        dist.init_process_group(backend)

def keep_freed_memory():
    """On glibc, stop handing big freed blocks back to the OS: otherwise every CPU step maps its large buffers (the
    loss's chunks of logits, the gradients) afresh and page-faults them in again, a large part of a small model's step."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-4, 0)  # M_MMAP_MAX = 0: big blocks come from the heap, and stay there for the next step
        libc.mallopt(-1, 2**31 - 1)  # M_TRIM_THRESHOLD: never shrink the heap
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to tune
        pass

def default_dtype(device_type: str) -> str:
    """--dtype auto: bf16 autocast on CUDA and on CPUs that compute in bf16 natively (AVX512-BF16, AMX; Linux's
    /proc/cpuinfo says), float32 elsewhere: emulated bf16 is many times slower than fp32."""
    if device_type == "cuda":
        return "bfloat16"
    try:
        flags = Path("/proc/cpuinfo").read_text().split() if device_type == "cpu" else []
    except OSError:
        flags = []
    return "bfloat16" if {"avx512_bf16", "amx_bf16"} & set(flags) else "float32"

# Dense bf16 tensor-core peak per GPU, from the vendors' datasheets (SXM parts).
PEAK_BF16_FLOPS = {"A100": 312e12, "H100": 989e12, "H200": 989e12, "H800": 989e12, "A10G": 125e12,
                   "L4": 121e12, "L40S": 362e12, "RTX 4090": 165e12, "RTX 3090": 71e12, "B200": 2250e12}

def peak_flops(device_type: str, override: float = 0.0) -> Optional[float]:
    """Peak bf16 FLOP/s of this device: the override, else a lookup by GPU name, else None (MFU not shown)."""
    if override > 0 or device_type != "cuda":
        return override or None
    matches = [key for key in PEAK_BF16_FLOPS if key in torch.cuda.get_device_name()]
    return PEAK_BF16_FLOPS[max(matches, key=len)] if matches else None  # the longest: "L40S" before "L4"

def flops_per_token(model: GPT, seq_len: int) -> int:
    """Training FLOPs per token: 6N for the weight matmuls (forward + backward) plus 12·L·C·T for attention
    scores and values. N excludes the position table (a lookup) and includes the tied token table."""
    return 6 * model.num_params(exclude_embeddings=True) + 12 * model.config.n_layer * model.config.n_embd * seq_len

if __name__ == "__main__":
    main()
