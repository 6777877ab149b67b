"""
GPT-2 pretraining, read top to bottom: config, model, data, learning-rate schedule, distributed set-up, evaluation,
the training loop, the command line.

    python fineweb.py --local input.txt --tokenizer char --out_dir data/shakespeare_char  # characters of the plays
    python train_gpt2.py --preset shakespeare_char                                        # minutes on a laptop CPU
    torchrun --standalone --nproc_per_node=8 train_gpt2.py --preset gpt2-124M             # the 10B-token recipe

Data: fineweb.py's uint16 token shards and manifest.json (fineweb.py also holds the tokenizers). The plumbing an
experiment never edits (checkpoint files and lineages, the log_dir lock, atomic writes, signals) is in run_files.py;
hellaswag.py scores HellaSwag, plot.py draws curves.png. Importing this module does nothing but define things.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import inspect
import math
import os
import re
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

if __name__ == "__main__":  # a stop request while torch loads (before train() takes over): a clean exit, no traceback
    for _signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):  # run_files.StopSignal's
        if signal.getsignal(_signum) != signal.SIG_IGN:  # one ignored from the start (nohup's SIGHUP) stays so
            signal.signal(_signum, lambda s, f: sys.exit(print(f"{signal.Signals(s).name}: stopped before training started")))

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import hellaswag  # HellaSwag scoring; it does not import this module back (nor do plot.py and run_files.py)
import plot  # curves.png
import run_files  # the plumbing: checkpoint files, lineages, the log_dir lock, atomic writes, signals
from fineweb import get_tokenizer, token_byte_lengths, tokenizer_from_manifest, tokenizer_info  # the data's tokenizers

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

@dataclass
class TrainConfig:
    """One training run. Every field is a flag of the same name (--max_lr 3e-4, --shuffle true), typed by its
    default; the comment on its line is its --help. --preset NAME replaces the defaults before the flags are read."""
    # data and output
    data_root: str = "edu_fineweb10B"  # directory of fineweb.py's shards ({prefix}_{val|train}_{i:06d}.npy)
    tokenizer: str = "auto"  # the data's tokenizer, checked against its manifest: auto (any) | gpt2 | char
    log_dir: str = "log"  # where log.txt, header.txt, checkpoints and curves.png go
    shuffle: bool = False  # each epoch in a seeded order of shards and windows, on a grid moved by a seeded offset
    # model (from scratch; --init_from loads a shape instead)
    n_layer: int = 12  # transformer blocks
    n_head: int = 12  # attention heads
    n_embd: int = 768  # residual width
    block_size: int = 1024  # maximum context length
    vocab_size: int = 0  # token table rows; 0: the data's tokenizer's (GPT-2's 50257 padded to 50304 for speed)
    dropout: float = 0.0  # dropout in training (0: none, as GPT-2 pretraining); also with --init_from
    bias: bool = True  # biases in Linears and LayerNorms (false: nanoGPT's variant; GPT-2 weights have them)
    init_from: str = "scratch"  # scratch | gpt2 | gpt2-medium | ... | HF_DIR | CHECKPOINT.pt (weights only)
    chunked_loss: bool = False  # the loss a chunk of rows at a time, no full logits: less memory; faster on a CPU
    # batch
    batch_size: int = 64  # micro-batch B: sequences per forward pass per process
    seq_len: int = 1024  # sequence length T of a training row
    total_batch_size: int = 524288  # tokens per optimizer step, over all processes and micro-steps
    # optimization
    max_steps: int = 19073  # optimizer steps to run (19,073 x 524,288 tokens = 10B)
    lr_decay_steps: int = 0  # step where the cosine reaches min_lr (0: max_steps)
    warmup_steps: int = 715  # linear warmup steps
    max_lr: float = 6e-4  # peak learning rate (AdamW's)
    min_lr_ratio: float = 0.1  # final learning rate as a fraction of max_lr
    beta2: float = 0.95  # AdamW's beta2 (GPT-2's 0.95; nearer 1 for small batches, as nanoGPT's char model)
    weight_decay: float = 0.1  # AdamW decay on matrices and embeddings (not biases or norms)
    optimizer: str = "adamw"  # adamw | muon (Muon for the blocks' matrices, AdamW for the rest)
    muon_lr: float = 0.02  # Muon's peak learning rate (--optimizer muon; the schedule is --max_lr's, scaled)
    grad_clip: float = 1.0  # clip the global gradient norm to this (0: no clipping)
    skip_nonfinite: bool = False  # skip an update with a non-finite loss or grad norm instead of stopping
    skip_spikes: float = 0.0  # skip an update whose loss or grad norm is Z running std devs above the mean (0: off)
    # evaluation and output intervals (0 disables)
    eval_interval: int = 250  # steps between validation losses
    val_tokens: int = 10485760  # tokens of val loss (a multiple of seq_len), the same for any world size
    hellaswag_interval: int = 250  # steps between HellaSwag evaluations
    hellaswag_data: str = ""  # HellaSwag jsonl (default: the official val split, downloaded once)
    hellaswag_limit: int = 0  # score only the first N examples (0: all 10,042)
    sample_interval: int = 250  # steps between printed samples
    sample_prompt: str = "Hello, I'm a language model,"  # prompt of the printed samples
    sample_length: int = 32  # tokens each printed sample adds to the prompt
    ckpt_interval: int = 5000  # steps between checkpoints (one is always written at the end)
    keep_last: int = 0  # keep only this run's newest K checkpoints (0: keep all)
    resume: str = ""  # '' (fresh run) | auto (newest valid checkpoint in log_dir, else fresh) | PATH
    # runtime
    device: str = "auto"  # auto (cuda > mps > cpu) | cpu | cuda | cuda:N | mps
    dtype: str = "auto"  # autocast dtype: auto | bfloat16 | float32 (auto: bfloat16 on CUDA, else float32)
    compile: str = "auto"  # torch.compile the training model: auto | true | false (auto: on CUDA)
    seed: int = 1337  # seed of the initial weights, shuffling and samples
    overfit_batch: bool = False  # train on one fixed batch (a sanity check: the loss must go to ~0)
    peak_flops: float = 0.0  # peak FLOP/s of one device for MFU (0: look up the GPU; none on CPU)
    wandb_project: str = ""  # log to this Weights & Biases project (needs `pip install wandb`)
    wandb_run_name: str = ""  # the run's name in wandb (default: wandb's); a resumed run continues its wandb run

    def __post_init__(self):
        positive = ("n_layer", "n_head", "n_embd", "block_size", "batch_size", "seq_len", "total_batch_size",
                    "max_steps", "sample_length")
        choices = {"optimizer": ("adamw", "muon"), "dtype": ("auto", "bfloat16", "float32"),
                   "compile": ("auto", "true", "false"), "tokenizer": ("auto", "gpt2", "char")}
        for name, value in dataclasses.asdict(self).items():
            if isinstance(value, float) and not math.isfinite(value):  # NaN would pass every test below
                raise ValueError(f"--{name} must be a finite number, got {value}")
            if type(value) in (int, float) and (value < 0 or (value == 0 and name in positive)):
                raise ValueError(f"--{name} must be {'positive' if name in positive else '>= 0'}, got {value}")
            if value not in choices.get(name, (value,)):
                raise ValueError(f"--{name} must be one of {'|'.join(choices[name])}, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"--n_embd ({self.n_embd}) must be divisible by --n_head ({self.n_head})")
        if self.seq_len > self.block_size:
            raise ValueError(f"--seq_len ({self.seq_len}) exceeds --block_size ({self.block_size})")
        if self.total_batch_size % (self.batch_size * self.seq_len):
            raise ValueError(f"--total_batch_size ({self.total_batch_size}) must be divisible by batch_size x "
                             f"seq_len ({self.batch_size} x {self.seq_len} = {self.batch_size * self.seq_len})")
        if not 0 < self.max_lr < 1 or not self.min_lr_ratio <= 1 or not self.beta2 < 1:
            raise ValueError(f"need 0 < max_lr < 1, 0 <= min_lr_ratio <= 1 and 0 <= beta2 < 1, got {self.max_lr}, "
                             f"{self.min_lr_ratio}, {self.beta2}")
        if self.val_tokens % self.seq_len or (self.eval_interval and not self.val_tokens):
            raise ValueError(f"--val_tokens ({self.val_tokens}) must be a positive multiple of --seq_len ({self.seq_len})")
        if empty := next((k for k in ("data_root", "log_dir", "init_from") if not getattr(self, k)), None):
            raise ValueError(f"--{empty} is an empty path")
        if self.seed >= 2**63:  # torch's generators take 64-bit seeds
            raise ValueError(f"--seed must be below 2**63, got {self.seed}")
        if self.hellaswag_data:
            run_files.check_path(self.hellaswag_data, "--hellaswag_data", is_dir=False)

PRESETS = {
    "gpt2-124M": {},  # the reference recipe, GPT-2 124M on 10B FineWeb-Edu tokens, is TrainConfig's defaults
    # GPT-2's tokens of input.txt (`python fineweb.py --local input.txt --out_dir data/shakespeare`): a smoke run of
    # the BPE path, a few CPU minutes. The unpadded vocabulary (no GPU to align it for) and the chunked loss (on a
    # CPU the 50k-wide head is most of a step).
    "shakespeare": dict(data_root="data/shakespeare", log_dir="log/shakespeare", tokenizer="gpt2", n_layer=4, n_head=4,
                        n_embd=128, block_size=128, vocab_size=50257, chunked_loss=True, batch_size=16, seq_len=128,
                        total_batch_size=2048, max_steps=100, warmup_steps=10, max_lr=3e-3, eval_interval=25,
                        val_tokens=8192, hellaswag_interval=0, sample_interval=50, sample_prompt="KING.\n",
                        ckpt_interval=100),
    # Characters of input.txt (`python fineweb.py --local input.txt --tokenizer char --out_dir data/shakespeare_char`),
    # nanoGPT's laptop model: val loss below 1.9 in about three CPU minutes, and samples that read like the plays.
    "shakespeare_char": dict(data_root="data/shakespeare_char", log_dir="log/shakespeare_char", tokenizer="char",
                             n_layer=4, n_head=4, n_embd=128, block_size=64, vocab_size=0, batch_size=12, seq_len=64,
                             total_batch_size=768,
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
        self.chunked_loss = False  # forward's loss by run_files.ChunkedCrossEntropy (--chunked_loss), else F.cross_entropy
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
        """idx (B, T) token ids -> (logits (B, T, vocab), loss): the mean cross-entropy of the targets (B, T) that are
        not -100, or None without targets. With self.chunked_loss: (None, the same loss), without full logits."""
        h = self.features(idx, kv_cache)  # (B, T, C)
        if targets is not None and self.chunked_loss:
            return None, run_files.ChunkedCrossEntropy.apply(h.flatten(0, 1), self.lm_head.weight, targets.flatten(),
                                                             torch.is_grad_enabled())
        logits = self.lm_head(h)  # (B, T, vocab)
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss

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
        block_size, cache, weight = self.config.block_size, None, next(self.parameters())
        dev = weight.device
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
            if temperature < torch.finfo(logits.dtype).tiny:  # 0, or so near that dividing by it would overflow: greedy
                next_id = logits.argmax(dim=-1, keepdim=True)
            else:  # shifted first: the largest logit is 0, so a temperature near 0 makes -inf, never inf - inf
                logits = (logits - logits.max(dim=-1, keepdim=True).values) / temperature
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
# Data: fineweb.py's uint16 token shards, read in windows of B*T+1 tokens

def windows(lengths: list[int], T: int) -> np.ndarray:
    """(shard, start) of each window of T+1 tokens within shards of these lengths, in order. Consecutive windows
    share a token (the last target of one is the first input of the next); a shard's last < T tokens are unread."""
    counts = np.maximum(np.asarray(lengths, dtype=np.int64) - 1, 0) // T  # windows per shard
    first = np.repeat(np.cumsum(counts) - counts, counts)  # the index of each window's shard's first window
    return np.stack([np.repeat(np.arange(len(counts)), counts), (np.arange(counts.sum()) - first) * T], axis=1)

def read_window(shard: np.ndarray, start: int, n: int, vocab_size: Optional[int]) -> torch.Tensor:
    """Tokens [start, start+n) of a shard as int64; ids >= vocab_size would index past the embedding table."""
    tokens = shard[start : start + n].astype(np.int64)
    if vocab_size is not None and int(tokens.max()) >= vocab_size:
        raise ValueError(f"token id {int(tokens.max())} >= vocab_size {vocab_size} in "
                         f"{Path(getattr(shard, 'filename', None) or 'a shard').name}; the shards were made with "
                         "another tokenizer, or vocab_size is too small")
    return torch.from_numpy(tokens)

class DataLoaderLite:
    """(B, T) training batches, each a window of B*T+1 tokens inside one shard (its last token only a target).

    An epoch reads every window of every shard once: in order, or with shuffle=True in a seeded order per epoch, the
    shards permuted, the windows within each permuted, and their grid moved by a seeded offset in [0, B*T) so that
    every epoch sees new window boundaries. Rank r of a world of W reads windows r, r+W, r+2W, ... of each epoch in
    turn, so over all ranks every window of an epoch is read exactly once; the state is the epoch and how many of
    its windows the world has read. Shards are memory-mapped: memory is O(B*T) plus a window index."""

    def __init__(self, paths: list[Path], B: int, T: int, rank: int = 0, world: int = 1,
                 vocab_size: Optional[int] = None, shuffle: bool = False, seed: int = 0, sizes: Optional[dict] = None):
        if B <= 0 or T <= 0 or not 0 <= rank < world:
            raise ValueError(f"need B, T > 0 and 0 <= rank < world, got B={B}, T={T}, rank {rank}, world {world}")
        self.B, self.T, self.rank, self.world, self.vocab_size, self.shuffle, self.seed = B, T, rank, world, vocab_size, shuffle, seed
        self.shards = [run_files.open_shard(p, (sizes or {}).get(p)) for p in paths]
        self.windows = len(windows([len(s) for s in self.shards], B * T))  # per epoch, on the grid from 0
        if self.windows < world:
            raise ValueError(f"the train shards hold {self.windows} window(s) of B x T + 1 = {B * T + 1} tokens, fewer "
                             f"than one step needs (one for each of {world} rank(s)); lower batch_size/seq_len or add data")
        self.epoch, self.pos, self.orders = 0, 0, {}  # pos: windows of this epoch the whole world has read

    def order(self, epoch: int) -> np.ndarray:
        """(shard, start) of each window of `epoch`, in the order the world reads them (the same on every rank)."""
        if epoch not in self.orders:  # kept: this epoch's and the one before (a step may straddle them)
            lengths, order = [len(s) for s in self.shards], None
            if self.shuffle:
                rng = np.random.default_rng([self.seed, epoch])
                offset = int(rng.integers(self.B * self.T))  # the grid starts here in every shard, this epoch
                grid = windows([max(n - offset, 0) for n in lengths], self.B * self.T) + [0, offset]
                order = np.concatenate([rng.permutation(grid[grid[:, 0] == k]) for k in rng.permutation(len(lengths))])
            order = windows(lengths, self.B * self.T) if order is None else order
            self.orders = {e: o for e, o in self.orders.items() if e == epoch - 1} | {epoch: order}
        return self.orders[epoch]

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        epoch, i = self.epoch, self.pos + self.rank
        while i >= len(self.order(epoch)):  # past this epoch's end: the next epoch's first windows
            i, epoch = i - len(self.order(epoch)), epoch + 1
        k, start = self.order(epoch)[i]
        self.pos += self.world
        while self.pos >= len(self.order(self.epoch)):
            self.pos, self.epoch = self.pos - len(self.order(self.epoch)), self.epoch + 1
        buf = read_window(self.shards[k], start, self.B * self.T + 1, self.vocab_size)
        return buf[:-1].view(self.B, self.T), buf[1:].view(self.B, self.T)

    def epochs_read(self) -> float:
        return self.epoch + self.pos / len(self.order(self.epoch))

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos, "windows": self.windows, "B": self.B, "T": self.T,
                "shuffle": self.shuffle, "seed": self.seed}

    def load_state_dict(self, state: dict):
        if "taken" in state:  # a checkpoint from before epochs were kept
            state = {**state, "epoch": state["taken"] // state["windows"], "pos": state["taken"] % state["windows"]}
        if any(state.get(k) != v for k, v in self.state_dict().items() if k not in ("epoch", "pos")) or state["pos"] % self.world:
            raise ValueError(f"the train data or its batching changed since the checkpoint ({state} -> {self.state_dict()})")
        self.epoch, self.pos = state["epoch"], state["pos"]

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

def setup_distributed(device: str = "auto") -> tuple[bool, int, int, int, str]:
    """(ddp, rank, local_rank, world_size, device): one process, or one rank of a torchrun launch (it sets RANK,
    LOCAL_RANK and WORLD_SIZE) joined to the process group, NCCL on CUDA and gloo on CPU. A CUDA device always gets
    its index (run_files.cuda_device picks it) and is made current: synchronize(), the memory stats and a new
    context then mean this GPU, never GPU 0."""
    device, env = run_files.check_device(device), run_files.torchrun_env(os.environ)
    if env is not None and device == "mps":
        raise ValueError("DDP on mps is not supported; use a single process or --device cpu")
    if device.startswith("cuda"):
        device = run_files.cuda_device(device, env, torch.cuda.device_count(), os.environ.get("CUDA_VISIBLE_DEVICES"))
        torch.cuda.set_device(device)
    if env is None:
        return False, 0, 0, 1, device
    rank, local_rank, world_size, _ = env
    run_files.init_process_group("nccl" if device.startswith("cuda") else "gloo", rank, world_size)
    return True, rank, local_rank, world_size, device

def autocast_context(device_type: str, dtype: str):
    """bf16 autocast for matmuls (weights and optimizer state stay fp32); a no-op for float32."""
    return torch.autocast(device_type=device_type, dtype=torch.bfloat16, enabled=dtype == "bfloat16")

# ----------------------------------------------------------------------------------------------------------
# Evaluation and metrics

@torch.no_grad()
def evaluate_val_loss(model: GPT, shards: list[np.ndarray], val_tokens: int, B: int, T: int, dtype: str,
                      rank: int = 0, world_size: int = 1, device: str = "cpu", should_stop=None) -> Optional[float]:
    """Mean loss of the first val_tokens targets of the val split, its first val_tokens/T windows of T+1 tokens;
    window i is scored by rank i % world_size, so the tokens are the same for any world size or batch size.
    should_stop() (the same answer on every rank) is asked before each batch: True ends it early, returning None."""
    seqs = windows([len(s) for s in shards], T)
    if val_tokens <= 0 or val_tokens % T or val_tokens // T > len(seqs):
        raise ValueError(f"val_tokens ({val_tokens}) must be a positive multiple of seq_len ({T}) and fit the val split "
                         f"({len(seqs)} sequences of {T} tokens)")
    model.eval()
    device_type = device.split(":")[0]
    exact = torch.float32 if device_type == "mps" else torch.float64  # MPS has no float64
    sums = torch.zeros(2, dtype=exact, device=device)  # loss summed over tokens, tokens
    mine = seqs[rank : val_tokens // T : world_size]  # this rank's windows
    for i in range(0, -(-(val_tokens // T) // world_size), B):  # as many batches on every rank (the last maybe empty)
        if should_stop is not None and should_stop():
            model.train()
            return None
        if len(batch := mine[i : i + B]):
            rows = torch.stack([read_window(shards[k], start, T + 1, model.config.vocab_size) for k, start in batch])
            rows = rows.to(device)
            with autocast_context(device_type, dtype):
                _, loss = model(rows[:, :-1], rows[:, 1:])  # the training loss itself
            sums[0] += loss.to(exact) * rows[:, 1:].numel()  # summed on the device: no host sync per batch
            sums[1] += rows[:, 1:].numel()
    if world_size > 1:
        dist.all_reduce(sums)
    model.train()
    return (sums[0] / sums[1]).item()

def val_bytes(shards: list[np.ndarray], val_tokens: int, T: int, byte_lengths: np.ndarray) -> int:
    """UTF-8 bytes of the text of the targets evaluate_val_loss scores: bits per byte = loss * tokens / (ln 2 * bytes),
    a measure that does not depend on the tokenizer. Counted once per run."""
    seqs = windows([len(s) for s in shards], T)[: val_tokens // T]
    return int(sum(byte_lengths[shards[k][start + 1 : start + T + 1]].sum() for k, start in seqs))

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

def flops_per_token(model: GPT, seq_len: int) -> int:
    """Training FLOPs per token: 6N for the weight matmuls (forward + backward) plus 12·L·C·T for attention
    scores and values. N excludes the position table (a lookup) and includes the tied token table."""
    return 6 * model.num_params(exclude_embeddings=True) + 12 * model.config.n_layer * model.config.n_embd * seq_len

def evaluate(cfg: TrainConfig, step: int, raw_model: GPT, enc, val_shards: list[np.ndarray], val_bytes: int,
             hellaswag_examples: list, dtype: str, rank: int, world_size: int, device: str, metrics: run_files.Metrics,
             should_stop) -> bool:
    """The evaluations due at `step`, on the plain model (the compiled one would recompile for every new shape): val
    loss and bits per byte, HellaSwag (each rank scoring a share), samples (rank 0). False if should_stop() cut them."""
    if is_due(step, cfg.eval_interval, cfg.max_steps):
        loss = evaluate_val_loss(raw_model, val_shards, cfg.val_tokens, cfg.batch_size, cfg.seq_len, dtype, rank,
                                 world_size, device, should_stop)
        if loss is None:
            return False
        metrics.report(step, val=loss, **({"bpb": loss * cfg.val_tokens / (math.log(2) * val_bytes)} if val_bytes else {}))
    if hellaswag_examples and is_due(step, cfg.hellaswag_interval, cfg.max_steps):
        result = hellaswag.evaluate(raw_model, hellaswag_examples, device, enc=enc, rank=rank, world_size=world_size,
                                    autocast_dtype=torch.bfloat16 if dtype == "bfloat16" else None, should_stop=should_stop)
        if result is None:
            return False
        metrics.report(step, hella=result["acc_norm"])
    if rank == 0 and is_due(step, cfg.sample_interval, cfg.max_steps):
        metrics.report_samples(step, sample_texts(raw_model, enc, cfg.sample_prompt, 4, cfg.sample_length, 50, 1.0,
                                                  cfg.seed, device))
    return True

def is_due(step: int, interval: int, last_step: int) -> bool:
    """Every `interval` steps (0: never), and always at the last step."""
    return interval > 0 and (step % interval == 0 or step == last_step)

# ----------------------------------------------------------------------------------------------------------
# Training

def load_model(source: str, device: str = "cpu") -> tuple[GPT, object]:
    """A model and the tokenizer its ids mean: one of our checkpoints (a .pt file), a local Hugging Face directory
    or a GPT-2 hub name (these two with GPT-2's tokenizer)."""
    if str(source).endswith(".pt") or Path(source).is_file():
        ckpt = run_files.load_checkpoint(source)
        (model := GPT(GPTConfig(**ckpt["model_config"]))).load_state_dict(ckpt["model"])
        return model.to(device), tokenizer_from_manifest(ckpt.get("tokenizer", {}))
    return GPT.from_pretrained(str(source)).to(device), get_tokenizer()

def build_model(cfg: TrainConfig, enc, known_tokenizer: bool) -> GPT:
    """From scratch with cfg's shape, or --init_from's weights (cropped to block_size if shorter); cfg's dropout. The
    vocabulary: --vocab_size, or the data's tokenizer's (GPT-2's 50,257 padded to 50,304, a multiple of 128, for speed)."""
    if cfg.init_from == "scratch":
        if known_tokenizer and 0 < cfg.vocab_size < enc.n_vocab:
            raise ValueError(f"--vocab_size {cfg.vocab_size} is smaller than the data's {enc.name} tokenizer ({enc.n_vocab} ids)")
        model = GPT(GPTConfig(cfg.block_size, cfg.vocab_size or (50304 if enc.name == "gpt2" else enc.n_vocab),
                              cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.dropout, cfg.bias))
    else:
        model, model_enc = load_model(run_files.check_path(cfg.init_from, "--init_from", is_dir=False)
                                      if cfg.init_from.endswith(".pt") else cfg.init_from)
        if known_tokenizer and tokenizer_info(model_enc) != tokenizer_info(enc):
            raise ValueError(f"--init_from {cfg.init_from} was trained on the {model_enc.name} tokenizer with another "
                             f"vocabulary than the data in {cfg.data_root} ({enc.name}): its ids would mean other text")
        if model.config.bias and not cfg.bias:
            raise ValueError(f"--bias false: {cfg.init_from} has biases (GPT-2's weights always do)")
        model.config = dataclasses.replace(model.config, dropout=cfg.dropout)  # the run's choice, not the weights'
        model.apply(lambda m: setattr(m, "p", cfg.dropout) if isinstance(m, nn.Dropout) else None)
        if cfg.block_size < model.config.block_size:
            model.crop_block_size(cfg.block_size)
        if cfg.seq_len > model.config.block_size:
            raise ValueError(f"--seq_len ({cfg.seq_len}) exceeds the context of {cfg.init_from} ({model.config.block_size})")
    model.chunked_loss = cfg.chunked_loss
    return model

def resume(cfg: TrainConfig, raw_model: GPT, optimizers: list, train_loader: DataLoaderLite,
           guard: run_files.SpikeGuard, data: dict, rank: int, world_size: int, log) -> dict:
    """Load --resume's checkpoint (auto: the one rank 0 finds written last in log_dir) into the model, optimizers (their
    state; their hyper-parameters stay this run's), loader, spike guard and RNG; choose the lineage. Returns where the
    run starts: step, whether that step's evaluations are logged (a finished run's checkpoint), val loss, lineage."""
    path, ckpt = run_files.find_resume_checkpoint(cfg.resume, Path(cfg.log_dir), rank, world_size, log)
    start = {"step": 0, "evals_done": False, "val_loss": None, "path": path}
    if ckpt is not None:
        saved_config = dataclasses.asdict(GPTConfig(**ckpt["model_config"]))  # older checkpoints lack some fields
        run_files.check_resumable(path, {**ckpt, "model_config": saved_config}, dataclasses.asdict(raw_model.config),
                                  dataclasses.asdict(cfg), data)
        raw_model.load_state_dict(ckpt["model"])
        for opt, state in zip(optimizers, (ckpt["optimizer"], ckpt.get("muon"))):
            run_files.load_optimizer_state(opt, state)  # its moments and step counts, this run's hyper-parameters
        train_loader.load_state_dict(ckpt["train_loader"])
        guard.load_state_dict(ckpt.get("spikes", {"history": [], "skipped": 0}))  # older checkpoints have none
        run_files.restore_rng_state(ckpt["rng"])
        start.update(step=ckpt["step"], evals_done=ckpt["evals_done"], val_loss=ckpt["val_loss"])
        if changes := run_files.resume_changes(ckpt.get("train_config", {}), dataclasses.asdict(cfg)):
            log(f"resumed with other settings (applied): {', '.join(changes)}")
    start["lineage"] = run_files.choose_lineage(Path(cfg.log_dir), path, ckpt, rank, world_size, log)
    return start

def set_up(cfg: TrainConfig, ddp: bool, rank: int, world_size: int, device: str, lock: run_files.LogDirLock, log):
    """Everything a run needs before its first step, checked before anything is written: the data and its tokenizer
    (as its manifest names it), the model, optimizers, HellaSwag and a resumed run's state. Only then is log_dir made
    (locked against a second run), its log repaired and header.txt written: a run failing its checks writes nothing
    but the lock file of an existing log_dir."""
    B, T, device_type = cfg.batch_size, cfg.seq_len, device.split(":")[0]
    if cfg.total_batch_size % (B * T * world_size):
        raise ValueError(f"--total_batch_size {cfg.total_batch_size} is not divisible by batch_size x seq_len x "
                         f"world_size = {B} x {T} x {world_size} = {B * T * world_size}")
    splits, manifest, note = run_files.find_shards(cfg.data_root, cfg.tokenizer)
    enc, sizes = tokenizer_from_manifest(manifest or {}), (manifest or {}).get("sizes", {})
    if cfg.tokenizer not in ("auto", enc.name):
        raise ValueError(f"--tokenizer {cfg.tokenizer}: the data in {cfg.data_root} is in {enc.name} tokens ({enc.n_vocab:,}"
                         f" ids); make data of {cfg.tokenizer} tokens with fineweb.py --tokenizer {cfg.tokenizer}")
    data = {"tokenizer": tokenizer_info(enc), **{k: (manifest or {}).get(k) for k in ("dataset", "source")},
            "fingerprint": run_files.corpus_fingerprint(manifest, splits["train"] + splits["val"])}
    val_shards = [run_files.open_shard(p, sizes.get(p)) for p in splits["val"]]
    val_bytes_ = val_bytes(val_shards, cfg.val_tokens, T, token_byte_lengths(enc)) if cfg.eval_interval else 0
    hellaswag_examples, why = hellaswag.load_for_training(cfg.hellaswag_data, cfg.hellaswag_limit, enc.name, rank,
                                                          world_size, device) if cfg.hellaswag_interval else ([], "")
    run_files.tune_for(device_type)  # TF32 for fp32 matmuls on CUDA, freed memory kept on a CPU
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank
    raw_model = build_model(cfg, enc, manifest is not None).to(device)
    optimizers = raw_model.configure_optimizers(cfg.weight_decay, cfg.max_lr, device_type,
                                                cfg.muon_lr * (cfg.optimizer == "muon"), cfg.beta2)
    train_loader = DataLoaderLite(splits["train"], B, T, rank, world_size, raw_model.config.vocab_size, cfg.shuffle,
                                  cfg.seed, sizes)
    guard = run_files.SpikeGuard(cfg.skip_spikes)
    unlocked = lock.claim(create=False)  # if log_dir exists, no other run may change its checkpoints from here on
    start = resume(cfg, raw_model, optimizers, train_loader, guard, data, rank, world_size, log)
    unlocked = lock.claim(create=True) or unlocked  # a note when the filesystem has no locks
    dtype = cfg.dtype if cfg.dtype != "auto" else run_files.default_dtype(device_type)
    grad_accum_steps = cfg.total_batch_size // (B * T * world_size)
    use_compile = cfg.compile == "true" or (cfg.compile == "auto" and device_type == "cuda")
    derived = {"num_params": raw_model.num_params(), "grad_accum_steps": grad_accum_steps, "dtype": dtype,
               "compile": use_compile, "device": device, "world_size": world_size, "data": data,
               "epochs": (cfg.max_steps - start["step"]) * cfg.total_batch_size / (train_loader.windows * B * T),
               "train_tokens": train_loader.windows * B * T, "resumed_from": start["path"] and str(start["path"]),
               "lineage": start["lineage"]}
    notes = [note, why and f"HellaSwag skipped: {why}", unlocked and f"warning: {unlocked}",
             run_files.mfu_note(device_type, run_files.peak_flops(device_type, cfg.peak_flops))]
    metrics = run_files.start_logging(dataclasses.asdict(cfg), derived, notes, {"val": start["val_loss"]}, rank == 0, log)
    return (raw_model, optimizers, train_loader, guard, metrics, start, dtype, grad_accum_steps, use_compile, enc, data,
            val_shards, val_bytes_, hellaswag_examples)

def save_checkpoint(cfg: TrainConfig, raw_model: GPT, optimizers: list, train_loader: DataLoaderLite,
                    guard: run_files.SpikeGuard, enc, data: dict, lineage: dict, ddp: bool, master_process: bool,
                    step: int, evals_done: bool, val_loss: Optional[float]) -> Optional[Path]:
    """Everything a resume needs, as plain data (no pickled objects: torch.load(weights_only=True) reads it), written
    by rank 0 as model_{step:05d}[_{lineage}].pt in log_dir; every rank waits for the file."""
    state = {"model": raw_model.state_dict(), "optimizer": optimizers[0].state_dict(),
             "muon": optimizers[1].state_dict() if len(optimizers) > 1 else None,
             "model_config": dataclasses.asdict(raw_model.config), "train_config": dataclasses.asdict(cfg),
             "tokenizer": tokenizer_info(enc), "data": {"fingerprint": data["fingerprint"]}, "step": step,
             "epoch": train_loader.epochs_read(), "evals_done": evals_done, "val_loss": val_loss,
             "train_loader": train_loader.state_dict(), "rng": run_files.capture_rng_state(), "spikes": guard.state_dict()}
    path = None
    if master_process:
        path = run_files.save_checkpoint(Path(cfg.log_dir), step, lineage, state, cfg.keep_last)
        plot.refresh(cfg.log_dir)  # curves.png, for a look at the run so far
    if ddp:
        dist.barrier()  # nobody races ahead (or exits) before the file exists
    return path

def train(cfg: TrainConfig, log=print) -> dict:
    """Train as configured (one process, or one rank under torchrun); return the final metrics."""
    with run_files.StopSignal() as stop:  # SIGTERM, SIGINT, SIGHUP, SIGUSR1 from here on: a checkpoint, a clean exit
        ddp, rank, local_rank, world_size, device = setup_distributed(cfg.device)
        device_type, master_process = device.split(":")[0], rank == 0
        log = log if master_process else (lambda *args: None)  # rank 0 speaks for every rank
        lock = run_files.LogDirLock(cfg.log_dir, master_process)  # one run per log_dir
        try:
            (raw_model, optimizers, train_loader, guard, metrics, start, dtype, grad_accum_steps, use_compile, enc, data,
             val_shards, val_bytes_, hellaswag_examples) = set_up(cfg, ddp, rank, world_size, device, lock, log)
            model = raw_model  # what trains, below wrapped in DDP and compiled; raw_model evaluates and saves
            if ddp:
                model = DDP(model, device_ids=[torch.device(device).index] if device_type == "cuda" else None)
            model = torch.compile(model) if use_compile else model  # after DDP: gradient buckets split the graph
            save = functools.partial(save_checkpoint, cfg, raw_model, optimizers, train_loader, guard, enc, data,
                                     start["lineage"], ddp, master_process)
            stopping = lambda: run_files.any_rank(stop.requested is not None, world_size, device)  # noqa: E731
            fixed_batch = train_loader.next_batch() if cfg.overfit_batch else None
            flops, peak = flops_per_token(raw_model, cfg.seq_len), run_files.peak_flops(device_type, cfg.peak_flops)
            step, stopped = start["step"], False
            for step in range(start["step"], cfg.max_steps + 1):  # evaluate (a stop request cuts it short), then train
                stopped = stopping() or ((step > start["step"] or not start["evals_done"]) and not evaluate(
                    cfg, step, raw_model, enc, val_shards, val_bytes_, hellaswag_examples, dtype, rank, world_size,
                    device, metrics, stopping))  # an end-of-run checkpoint's step has been evaluated already
                if stopped or step == cfg.max_steps:
                    break
                t0 = time.time()
                model.zero_grad(set_to_none=True)
                loss_accum = torch.zeros((), device=device)
                with stop.held():  # a stop request waits for the step's end; compilers it starts never see it
                    for micro_step in range(grad_accum_steps):
                        x, y = fixed_batch if cfg.overfit_batch else train_loader.next_batch()
                        x, y = x.to(device), y.to(device)
                        if ddp:  # all-reduce gradients only on the last micro-step (set before the forward)
                            model.require_backward_grad_sync = micro_step == grad_accum_steps - 1
                        with autocast_context(device_type, dtype):
                            logits, loss = model(x, y)
                        # The loss is a mean over B*T tokens; dividing by grad_accum_steps makes the summed
                        # gradients those of the mean over the whole batch.
                        loss = loss / grad_accum_steps
                        loss_accum += loss.detach()
                        loss.backward()
                if ddp:
                    dist.all_reduce(loss_accum, op=dist.ReduceOp.AVG)  # the loss of the whole batch, on every rank
                norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), cfg.grad_clip or float("inf"))
                lr = get_lr(step, cfg.max_lr, cfg.max_lr * cfg.min_lr_ratio, cfg.warmup_steps,
                            cfg.lr_decay_steps or cfg.max_steps)
                for group in (group for opt in optimizers for group in opt.param_groups):
                    group["lr"] = lr * group.get("lr_scale", 1.0)  # Muon's group runs at its own peak
                loss_value, norm_value = loss_accum.item(), norm.item()  # the one host sync of a step
                if not math.isfinite(loss_value + norm_value):
                    run_files.check_nonfinite(cfg.skip_nonfinite, cfg.log_dir, start["lineage"]["suffix"], step,
                                              loss_value, norm_value, log)  # raises unless --skip_nonfinite
                elif (z := guard.spike(loss_value, norm_value)) is not None:
                    metrics.report(step, spike=z, skipped=guard.skipped)  # and this update is not made
                else:
                    for opt in optimizers:
                        opt.step()
                if device_type == "cuda":
                    torch.cuda.synchronize()  # the step's GPU work is done: now the clock means something
                dt = time.time() - t0
                mfu = {"mfu": flops * cfg.total_batch_size / dt / (peak * world_size)} if peak else {}
                metrics.report(step, train=loss_value, lr=lr, norm=norm_value, ms=1000 * dt,
                               tok_per_s=cfg.total_batch_size / dt, epoch=train_loader.epochs_read(), **mfu)
                if cfg.ckpt_interval and (step + 1) % cfg.ckpt_interval == 0 and step + 1 < cfg.max_steps:
                    save(step + 1, False, metrics.latest["val"])
            new = step > start["step"] or (not stopped and not start["evals_done"])  # anything this run did
            path = save(step, not stopped, metrics.latest["val"]) if new else start["path"]
            metrics.finish()
            result = {**metrics.latest, "step": step, "checkpoint": None if path is None else str(path), "stopped": stopped}
            log(run_files.summary(cfg.log_dir, result, stop.requested or "a stop request on another rank"))
            return result
        finally:
            lock.release()
            if ddp and dist.is_initialized():
                dist.destroy_process_group()

# ----------------------------------------------------------------------------------------------------------
# Command line

FLAG_TYPES = {bool: run_files.str2bool, int: int, float: run_files.finite_float, str: str}  # a flag's type is its default's

def parse_train_args(argv: list[str]) -> TrainConfig:
    """--preset NAME replaces TrainConfig's defaults; then every field is a flag (--max_lr 3e-4), typed by its default
    and documented by the comment on its line, so explicit flags override the preset."""
    first = run_files.Parser(add_help=False)
    first.add_argument("--preset", choices=sorted(PRESETS))
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    defaults.update(PRESETS.get(first.parse_known_args(argv)[0].preset, {}))
    help_of = dict(re.findall(r"^ {4}(\w+): \w+ = .*?  # (.*)$", inspect.getsource(TrainConfig), flags=re.M))
    parser = run_files.Parser(description="Train GPT-2 (README.md has the recipes; sample.py, hellaswag.py, plot.py and "
                    "export_hf.py use what it writes).", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS), help="a named recipe; other flags override it")
    for name, default in defaults.items():
        if type(default) not in FLAG_TYPES:  # a silent string flag would accept anything and fail far from here
            raise TypeError(f"TrainConfig.{name}: default {default!r} has no flag type; use a bool, int, float or str")
        parser.add_argument(f"--{name}", type=FLAG_TYPES[type(default)], default=default, help=help_of.get(name, ""),
                            metavar="true|false" if type(default) is bool else None)
    args = vars(parser.parse_args(argv))
    args.pop("preset")
    try:
        return TrainConfig(**args)
    except ValueError as e:
        parser.error(str(e))

def main(argv: Optional[list[str]] = None):
    try:
        train(parse_train_args(sys.argv[1:] if argv is None else argv))
    except (ValueError, OSError, run_files.NonFiniteError) as e:
        if os.environ.get("GPT2_DEBUG"):
            raise
        sys.exit(f"error: {e}")

if __name__ == "__main__":
    main()
