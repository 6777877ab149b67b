"""
GPT-2 pretraining in one file, read top to bottom: config, model, data loader, learning-rate
schedule, devices and distributed set-up, evaluation, checkpoints and stop signals, the training
loop and the command line.

    python train_gpt2.py --preset shakespeare_char   # a character model: minutes on a CPU
    torchrun --standalone --nproc_per_node=8 train_gpt2.py --preset gpt2-124M   # 10B tokens

The data is fineweb.py's uint16 token shards and their manifest.json (fineweb.py also holds the
tokenizers); hellaswag.py scores HellaSwag and plot.py draws the curves. A run writes into
--log_dir: log.txt (`step kind value` lines), runs.jsonl (a line per start: the config, the data,
the versions, the device, and the code that ran, kept in code/; a line per end: the result),
checkpoints model_{step:05d}.pt and curves.png. `python plot.py log/a log/b` compares two runs.
Importing this module does nothing but define things.
"""

import argparse
import ast
import dataclasses
import datetime
import fcntl
import hashlib
import io
import json
import math
import os
import platform
import re
import resource
import shlex
import signal
import socket
import stat
import subprocess
import sys
import time
import tokenize
import zipfile
from pathlib import Path

# Ctrl-C while torch loads (seconds) ends the program in one line, as it does before the loop
try:
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F

    import fineweb
    import hellaswag
    import plot
except KeyboardInterrupt:
    sys.exit("train_gpt2.py: interrupted while loading torch; nothing was written")

# -----------------------------------------------------------------------------
# Configuration


# At most this many micro-batches a step (on one process), tokens a printed sample, and layers
# (GPT-3 175B has 96): a typo past them would hang a run in one step, one sample, or in counting
# the model's parameters, a module at a time, before it is built.
MAX_MICRO_STEPS = 2**16
MAX_SAMPLE_LENGTH = 2048
MAX_LAYERS = 1024


@dataclasses.dataclass(kw_only=True)
class ModelConfig:
    # The model's hyper-parameters that a run chooses. TrainConfig inherits them, so each is a flag
    # of train_gpt2.py too: a field added here reaches the model, its checkpoints and the command
    # line. (From scratch; --init_from brings its own, all but dropout.)
    n_layer: int = 12  # number of transformer blocks
    n_head: int = 12  # attention heads per block
    n_embd: int = 768  # width of the residual stream
    dropout: float = 0.0  # on embeddings, attention weights and both residual branches


@dataclasses.dataclass(kw_only=True)
class GPTConfig(ModelConfig):
    # and what the data and the context fix
    block_size: int = 1024  # maximum sequence length
    vocab_size: int = 50257  # 50,000 BPE merges + 256 byte tokens + <|endoftext|>


@dataclasses.dataclass(kw_only=True)
class TrainConfig(ModelConfig):
    # One training run: ModelConfig's fields and these. Every field is a flag of the same name
    # (--max_lr 3e-4), typed by its annotation; the comment on its line, if any, is its --help.

    # data and output
    data_root: str = "edu_fineweb10B"  # fineweb.py's output directory (shards, manifest.json)
    log_dir: str = "log"  # log.txt, runs.jsonl, code/, checkpoints and curves.png go here
    shuffle: bool = False  # each epoch in a seeded order, on a window grid moved each epoch
    curves: bool = True  # draw curves.png at checkpoints (at most once a minute) and at the end
    # the model: from scratch (ModelConfig's fields) or from weights
    init_from: str = "scratch"  # scratch | gpt2 | gpt2-medium | ... | HF_DIR | CHECKPOINT.pt
    # batch
    batch_size: int = 64  # micro-batch B: rows per forward pass per process
    seq_len: int = 1024  # sequence length T of a row
    total_batch_size: int = 524288  # tokens per optimizer step, over processes and micro-steps
    # optimization
    max_steps: int = 19073  # optimizer steps (19,073 x 524,288 tokens = 10B)
    max_minutes: float = 0.0  # end after M minutes of training steps, the cosine over them (0: off)
    warmup_steps: int = 715  # linear warmup steps
    max_lr: float = 6e-4  # peak learning rate
    beta2: float = 0.95  # AdamW's beta2
    weight_decay: float = 0.1  # decay of matrices and embeddings (not biases or norms)
    optimizer: str = "adamw"  # adamw | muon (Muon for the blocks' matrices, AdamW the rest)
    muon_lr: float = 0.02  # Muon's peak learning rate (same warmup and cosine)
    grad_clip: float = 1.0  # clip the global gradient norm to this (0: no clipping)
    skip_nonfinite: bool = False  # skip an update with a non-finite loss or norm (else stop)
    skip_spikes: float = 0.0  # skip an update Z std devs above the recent mean (0: off)
    # evaluation and checkpoints (intervals in steps; 0 turns it off)
    # build-nanogpt evaluates every 250 steps; val every 1000 and HellaSwag and samples every
    # 2000 keep evaluation under 2% of the 124M recipe's run (docs/benchmarks.md)
    eval_interval: int = 1000  # steps between validation losses
    val_tokens: int = 10485760  # val tokens scored (a multiple of B x T), any world size
    hellaswag_interval: int = 2000  # steps between HellaSwag evaluations
    hellaswag_data: str = ""  # a HellaSwag .jsonl or .parquet ('': the official val split)
    sample_interval: int = 2000  # steps between printed samples
    sample_prompt: str = "Hello, I'm a language model,"  # prompt of the printed samples
    sample_length: int = 32  # tokens each sample adds to the prompt
    ckpt_interval: int = 5000  # steps between checkpoints (one is always written at the end)
    keep_last: int = 0  # keep only the newest K checkpoints of log_dir (0: keep all)
    resume: str = ""  # '' (a new run) | auto (the newest whole checkpoint in log_dir) | PATH
    # runtime
    device: str = "auto"  # auto (cuda > mps > cpu) | cpu | cuda | cuda:N | mps
    compile: str = "auto"  # torch.compile the model: auto (on CUDA) | true | false
    seed: int = 1337  # seed of the initial weights, the shuffle and the samples
    overfit_batch: bool = False  # train on one fixed batch (a sanity check: loss -> ~0)
    wandb_project: str = ""  # log to this Weights & Biases project too

    def __post_init__(self):
        # Checked before anything runs: a bad flag is one line now, not a failure hours later.
        # Every number is finite, and >= 0 unless its default is not (a -1 meaning "off"); an
        # integer fits the int64 that torch and numpy count in.
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if type(value) not in (int, float):
                continue
            if not math.isfinite(value) or value < 0 <= field.default:
                raise ValueError(f"--{field.name} must be a finite number >= 0, got {value}")
            if type(value) is int and abs(value) >= 2**63:
                raise ValueError(f"--{field.name} must be below 2**63 (an int64), got {value}")
        sizes = ["n_layer", "n_head", "n_embd", "batch_size", "seq_len", "total_batch_size"]
        for name in sizes + ["max_steps", "max_lr", "sample_length"]:
            if getattr(self, name) == 0:
                raise ValueError(f"--{name} must be > 0")
        if self.n_embd % self.n_head:
            raise ValueError("--n_embd must be a multiple of --n_head")
        if self.total_batch_size % (self.batch_size * self.seq_len):
            raise ValueError("--total_batch_size must be a multiple of --batch_size x --seq_len")
        # the bounds a typo cannot pass (a step of hours, a sample a stop request waits for)
        micro_batches = self.total_batch_size // (self.batch_size * self.seq_len)
        if micro_batches > MAX_MICRO_STEPS:
            raise ValueError(
                f"--total_batch_size {self.total_batch_size:,} is {micro_batches:,} micro-batches"
                f" of --batch_size x --seq_len a step: at most {MAX_MICRO_STEPS:,} (more is a"
                " typo: one step would take hours)"
            )
        if self.sample_length > MAX_SAMPLE_LENGTH:
            raise ValueError(
                f"--sample_length must be at most {MAX_SAMPLE_LENGTH:,} tokens: the samples are"
                " a glance at the model, and a stop request waits for them"
            )
        if self.n_layer > MAX_LAYERS:
            raise ValueError(
                f"--n_layer must be at most {MAX_LAYERS:,} (GPT-3 175B has 96): more is a typo,"
                " and counting its parameters would take minutes"
            )
        if self.val_tokens % (self.batch_size * self.seq_len):
            raise ValueError("--val_tokens must be a multiple of --batch_size x --seq_len")
        if self.eval_interval and not self.val_tokens:
            raise ValueError("--eval_interval needs --val_tokens > 0 (or --eval_interval 0)")
        if self.max_lr >= 1 or self.beta2 >= 1:
            raise ValueError("--max_lr and --beta2 must be below 1")
        # AdamW multiplies the weights by 1 - lr x weight_decay each step: past 1 it flips them
        if self.max_lr * self.weight_decay >= 1:
            raise ValueError(
                f"--weight_decay {self.weight_decay:g} x --max_lr {self.max_lr:g} must be below 1"
                " (AdamW scales the weights by 1 - lr x weight_decay a step)"
            )
        if self.optimizer not in ("adamw", "muon"):
            raise ValueError("--optimizer must be adamw or muon")
        if self.optimizer == "muon" and not self.muon_lr:
            raise ValueError("--optimizer muon needs --muon_lr > 0")
        if self.compile not in ("auto", "true", "false"):
            raise ValueError("--compile must be auto, true or false")
        if not (self.data_root and self.log_dir and self.init_from):
            raise ValueError("--data_root, --log_dir and --init_from must not be empty")


# fineweb.py's flags that make a preset's corpus of input.txt (the README's commands): its first
# run makes it (make_preset_data)
PRESET_DATA = {
    "data/shakespeare": [],
    "data/shakespeare_char": ["--tokenizer", "char"],
}

PRESETS = {
    # the reference recipe, GPT-2 124M on 10B tokens of FineWeb-Edu: TrainConfig's defaults
    "gpt2-124M": {},
    # GPT-2's tokens of input.txt (fineweb.py --local input.txt --out_dir data/shakespeare):
    # a smoke run of the BPE path, a few CPU minutes
    "shakespeare": dict(
        data_root="data/shakespeare",
        log_dir="log/shakespeare",
        n_layer=4,
        n_head=4,
        n_embd=128,
        batch_size=16,
        seq_len=128,
        total_batch_size=2048,
        max_steps=100,
        warmup_steps=10,
        max_lr=3e-3,
        eval_interval=25,
        val_tokens=8192,
        hellaswag_interval=0,
        sample_interval=50,
        sample_prompt="KING.\n",
        ckpt_interval=100,
    ),
    # characters of input.txt (fineweb.py --local input.txt --tokenizer char
    # --out_dir data/shakespeare_char): nanoGPT's laptop model, val loss ~1.9 in minutes
    "shakespeare_char": dict(
        data_root="data/shakespeare_char",
        log_dir="log/shakespeare_char",
        shuffle=True,
        n_layer=4,
        n_head=4,
        n_embd=128,
        batch_size=12,
        seq_len=64,
        total_batch_size=768,
        max_steps=2000,
        warmup_steps=100,
        max_lr=2e-3,
        beta2=0.99,
        eval_interval=250,
        val_tokens=16128,
        hellaswag_interval=0,
        sample_interval=2000,
        sample_prompt="\n",
        sample_length=300,
        ckpt_interval=2000,
    ),
}


# -----------------------------------------------------------------------------
# Model


class KVCache:
    # keys and values of every layer for the positions seen so far (sampling)

    def __init__(self, n_layer):
        self.kv = [None] * n_layer
        self.pos = 0  # positions cached (GPT.forward adds a call's T after its last block)

    def update(self, layer, k, v):
        # k, v (B, nh, T, hs) of the new positions -> those of all positions so far
        if self.kv[layer] is not None:
            k = torch.cat([self.kv[layer][0], k], dim=2)
            v = torch.cat([self.kv[layer][1], v], dim=2)
        self.kv[layer] = (k, v)
        return k, v


class CausalSelfAttention(nn.Module):
    def __init__(self, config, layer):
        super().__init__()
        # key, query, value projections for all heads, in one matmul
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.layer = layer  # its index in a KVCache

    def forward(self, x, kv_cache=None):
        B, T, C = x.size()
        # q, k, v of every head: c_attn's output is [q | k | v], each head's hs columns in a row
        qkv = self.c_attn(x).view(B, T, 3, self.n_head, C // self.n_head)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, nh, T, hs)
        past = 0
        if kv_cache is not None:
            past = kv_cache.pos
            k, v = kv_cache.update(self.layer, k, v)  # (B, nh, past + T, hs)
        # Causal: the query at position past + i sees the keys at 0 .. past + i. With nothing
        # cached that is SDPA's is_causal; one new token sees every key; several new tokens
        # after a cache need the causal mask shifted by the cached length.
        mask = None
        if past and T > 1:
            mask = torch.ones(T, past + T, dtype=torch.bool, device=x.device).tril(past)
        dropout_p = self.resid_dropout.p if self.training else 0.0
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=past == 0, dropout_p=dropout_p
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # heads side by side again
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.gelu = nn.GELU(approximate="tanh")  # GPT-2's GELU
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config, layer):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config, layer)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x, kv_cache=None):
        # pre-norm: the residual stream itself is never normalised
        x = x + self.attn(self.ln_1(x), kv_cache)
        return x + self.mlp(self.ln_2(x))


# OpenAI's checkpoints keep these weights in Conv1D modules: (in, out), a Linear's transpose.
HF_TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# GPTConfig's fields under their names in transformers' GPT2Config
HF_CONFIG = {
    "block_size": "n_positions",
    "vocab_size": "vocab_size",
    "n_layer": "n_layer",
    "n_head": "n_head",
    "n_embd": "n_embd",
}


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config, i) for i in range(config.n_layer)]),
                ln_f=nn.LayerNorm(config.n_embd),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        # weight tying: the token table is also the output projection
        self.transformer.wte.weight = self.lm_head.weight
        # the two projections per block that add to the residual stream
        blocks = self.transformer.h
        residual = {b.attn.c_proj for b in blocks} | {b.mlp.c_proj for b in blocks}
        self.apply(lambda module: self._init_weights(module, module in residual))

    def _init_weights(self, module, adds_to_residual):
        # GPT-2's init: N(0, 0.02) weights, zero biases; LayerNorms keep their ones and zeros.
        # The projections that add to the residual stream (c_proj) are scaled down, so that the
        # stream's variance stays O(1) however deep the model.
        std = 0.02 * (2 * self.config.n_layer) ** -0.5 if adds_to_residual else 0.02
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx, targets=None, kv_cache=None, return_logits=False):
        # idx (B, T) token ids -> (logits (B, T, vocab), None); with targets (B, T), (None, the
        # mean cross-entropy of the targets that are not -100): the logits are the step's
        # largest tensor, and a caller holding them would keep them through the backward pass
        # into the next step. An evaluation that needs both (a val accuracy) passes
        # return_logits: (logits, loss). With a kv_cache, idx continues the cached positions.
        # Every use of the model (training, val, sampling, HellaSwag) comes here.
        B, T = idx.size()
        past = 0 if kv_cache is None else kv_cache.pos
        pos = torch.arange(past, past + T, dtype=torch.long, device=idx.device)  # (T,)
        tok_emb = self.transformer.wte(idx)  # (B, T, C)
        pos_emb = self.transformer.wpe(pos)  # (T, C)
        x = self.transformer.drop(tok_emb + pos_emb)
        for block in self.transformer.h:
            x = block(x, kv_cache)
        if kv_cache is not None:
            kv_cache.pos += T
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)  # (B, T, vocab)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return (logits if return_logits else None), loss

    def flops_per_token(self, T):
        # FLOPs of a training step per token at context T (forward and backward): 6 per weight
        # that multiplies, plus attention's 12 x layers x width x T. A table that is only looked
        # up (the position table; the token table under an untied head) does no matmul.
        head = self.lm_head.weight
        n = sum(p.numel() for p in self.parameters())
        for module in self.modules():
            if isinstance(module, nn.Embedding) and module.weight is not head:
                n -= module.weight.numel()
        return 6 * n + 12 * self.config.n_layer * self.config.n_embd * T

    @classmethod
    def from_pretrained(cls, name_or_dir, dropout=0.0):
        # OpenAI's GPT-2 (gpt2, gpt2-medium, gpt2-large, gpt2-xl) or a GPT2LMHeadModel directory
        from transformers import GPT2Config, GPT2LMHeadModel

        # a path that is not there, and not a hub name (`gpt2`, `openai-community/gpt2`) either
        hub_name = re.fullmatch(r"[\w.-]+(/[\w.-]+)?", name_or_dir)
        if not hub_name and not Path(name_or_dir).exists():
            raise ValueError(f"{name_or_dir}: no such directory")
        try:
            hf = GPT2LMHeadModel.from_pretrained(name_or_dir)
        except Exception as e:
            # a directory without config.json or with truncated weights, a hub name out of
            # reach: transformers' many errors, told in one line
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            if not Path(name_or_dir).exists():
                raise ValueError(
                    f"{name_or_dir}: no such directory, nor a model the Hugging Face hub gives"
                    f" here ({reason})"
                ) from None
            raise ValueError(f"{name_or_dir}: transformers cannot load it ({reason})") from None
        # GPT-2 is what our model hard-codes (the tanh GELU, a tied head, the norms' eps) and the
        # weights transformers gives GPT-2 of this shape (no other MLP width, no extra module);
        # the causal-mask buffers of older transformers versions are not weights
        c = hf.config
        sd_hf = {k: v for k, v in hf.state_dict().items() if not k.endswith(".attn.bias")}
        with torch.device("meta"):
            gpt2 = GPT2LMHeadModel(GPT2Config(**{k: getattr(c, k) for k in HF_CONFIG.values()}))
        shapes = {k: v.shape for k, v in gpt2.state_dict().items() if not k.endswith(".attn.bias")}
        same_shapes = shapes == {k: v.shape for k, v in sd_hf.items()}
        gelu = c.activation_function in ("gelu_new", "gelu_pytorch_tanh")
        if not gelu or not c.tie_word_embeddings or c.layer_norm_epsilon != 1e-5 or not same_shapes:
            raise ValueError(
                f"{name_or_dir}: not GPT-2 (its activation, head, norms, modules or their shapes)"
            )
        # GPT-2's weights into this model, which an edit may have left without a place for one
        # (no position table, a wider MLP)
        shape = {ours: getattr(c, theirs) for ours, theirs in HF_CONFIG.items()}
        model = cls(GPTConfig(dropout=dropout, **shape))
        sd = model.state_dict()
        weights = {k: w.t() if k.endswith(HF_TRANSPOSED) else w for k, w in sd_hf.items()}
        differ = weight_differing(model, weights)
        if differ:
            raise ValueError(
                f"{name_or_dir}: this edited model cannot take GPT-2's weights ({differ} differs):"
                " start it from scratch or from a checkpoint of its own"
            )
        with torch.no_grad():
            for k, w in weights.items():
                sd[k].copy_(w)
        check_finite(model, name_or_dir)
        return model

    def configure_optimizers(
        self, weight_decay, learning_rate, device_type, muon_lr=0.0, beta2=0.95
    ):
        # [AdamW] decaying the 2-D weights (matrices, embeddings), not biases and norms. With
        # muon_lr: [AdamW, Muon], Muon taking the blocks' matrices; its group's lr_scale is
        # muon_lr / learning_rate, so it follows the same schedule at its own peak. Each
        # parameter goes in with its name, which torch keeps in the optimizers' state: a resume
        # checks them against this model's (check_resumable).
        params = [(n, p) for n, p in self.named_parameters() if p.requires_grad]
        muon = [
            (n, p) for n, p in params if muon_lr and p.dim() == 2 and n.startswith("transformer.h.")
        ]
        rest = [(n, p) for n, p in params if all(p is not q for _, q in muon)]
        groups = [
            {"params": [(n, p) for n, p in rest if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [(n, p) for n, p in rest if p.dim() < 2], "weight_decay": 0.0},
        ]
        # the fused kernel on a GPU: one launch for every parameter
        adamw = torch.optim.AdamW(
            groups, lr=learning_rate, betas=(0.9, beta2), fused=device_type == "cuda"
        )
        if not muon:
            return [adamw]
        # decoupled decay scaled so that a step shrinks the weights as AdamW's step does
        muon_group = {"params": muon, "lr_scale": muon_lr / learning_rate}
        muon_decay = weight_decay * learning_rate / muon_lr
        return [adamw, Muon([muon_group], lr=muon_lr, weight_decay=muon_decay)]

    @torch.no_grad()
    def generate(
        self, idx, max_new_tokens, temperature=1.0, top_k=None, generator=None, vocab_limit=None
    ):
        # Extend idx (B, T) by max_new_tokens sampled tokens (temperature 0: greedy); ids from
        # vocab_limit on (a padded table's extra rows) are never drawn. A KV cache makes each
        # step feed one token; past block_size every position shifts: the window is run whole.
        cache = KVCache(self.config.n_layer)
        for _ in range(max_new_tokens):
            if idx.size(1) <= self.config.block_size:
                # the cache holds every position but the newest (the first time: none)
                logits, _ = self(idx[:, cache.pos :], kv_cache=cache)
            else:
                logits, _ = self(idx[:, -self.config.block_size :])
            logits = logits[:, -1, :].float()  # (B, vocab)
            logits[:, vocab_limit or logits.size(-1) :] = -math.inf
            if temperature == 0:
                next_id = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
            else:
                # the largest logit shifted to 0: no temperature can overflow the softmax
                logits = logits - logits.max(dim=-1, keepdim=True).values
                probs = F.softmax(logits / temperature, dim=-1)
                # top-k sampling: draw among the k likeliest tokens
                topk_probs, topk_ids = torch.topk(
                    probs, min(top_k or probs.size(-1), probs.size(-1))
                )
                choice = torch.multinomial(topk_probs, 1, generator=generator)  # (B, 1)
                next_id = torch.gather(topk_ids, -1, choice)  # (B, 1)
            idx = torch.cat((idx, next_id), dim=1)
        return idx


# Muon (kellerjordan.github.io/posts/muon): SGD with Nesterov momentum whose update, a matrix,
# is orthogonalised (about U V^T of its SVD) by a few Newton-Schulz iterations in bfloat16. The
# same update as torch.optim.Muon with its defaults (momentum 0.95, 5 steps, lr scaled by
# sqrt(max(1, rows / cols)), decoupled weight decay) and the same state, a "momentum_buffer" per
# matrix. Ours because torch's has no batched path: it runs the iteration matrix by matrix, ~25
# kernels each (1,200 a step at GPT-2 124M). Here the element-wise work is a torch._foreach_*
# call over all the matrices, and the iteration runs once per shape on a stack of its matrices.
class Muon(torch.optim.Optimizer):
    def __init__(self, params, lr, weight_decay=0.0, momentum=0.95, ns_steps=5):
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, ns_steps=ns_steps)
        super().__init__(params, defaults)

    @staticmethod
    def orthogonalise(G, steps, eps=1e-7):
        # G (n, rows, cols), n matrices of one shape -> about U V^T of each, in bfloat16
        X = G.bfloat16()
        # the iteration multiplies by X X^T: the smaller side's square, tall matrices transposed
        tall = G.size(1) > G.size(2)
        if tall:
            X = X.mT
        # each matrix divided by its Frobenius norm: singular values at most 1
        X = X / X.norm(dim=(1, 2), keepdim=True).clamp(min=eps)
        # a quintic X -> a X + b (X X^T) X + c (X X^T)^2 X, whose coefficients pull singular
        # values from near 0 towards 1 in few steps (to roughly 0.5..1.5: trains as well as 1)
        a, b, c = (3.4445, -4.7750, 2.0315)
        for _ in range(steps):
            A = X @ X.mT  # (n, short side, short side)
            B = torch.baddbmm(A, A, A, beta=b, alpha=c)  # b A + c A A
            X = torch.baddbmm(X, B, X, beta=a)  # a X + B X
        return X.mT if tall else X

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue  # (foreach ops take no empty lists)
            grads = [p.grad for p in params]
            for p in params:
                if "momentum_buffer" not in self.state[p]:
                    self.state[p]["momentum_buffer"] = torch.zeros_like(p)
            bufs = [self.state[p]["momentum_buffer"] for p in params]
            # Nesterov: the buffer averages the gradients, the update leans from it to the gradient
            momentum = group["momentum"]
            torch._foreach_lerp_(bufs, grads, 1 - momentum)
            updates = torch._foreach_lerp(grads, bufs, momentum)
            # decoupled weight decay, at the group's lr
            torch._foreach_mul_(params, 1 - group["lr"] * group["weight_decay"])
            # the matrices of each shape orthogonalised together
            shapes = {}
            for p, update in zip(params, updates):
                shapes.setdefault(p.shape, []).append((p, update))
            for (rows, cols), pairs in shapes.items():
                G = torch.stack([update for _, update in pairs])  # (n, rows, cols)
                ortho = self.orthogonalise(G, group["ns_steps"])  # (n, rows, cols)
                # contiguous in the weights' dtype: foreach's single-kernel path on a GPU
                ortho = ortho.to(G.dtype, memory_format=torch.contiguous_format)
                # a tall matrix's update scaled up, so every update's RMS is about 1 / sqrt(cols)
                lr = group["lr"] * math.sqrt(max(1, rows / cols))
                torch._foreach_add_([p for p, _ in pairs], list(ortho.unbind()), alpha=-lr)


# -----------------------------------------------------------------------------
# Data: fineweb.py's shards, read in windows


def verify_shards(data_root, manifest, vocab_size, rank, world):
    # Every shard checked before training reads it: its sha256 against manifest.json's and every
    # id below the vocabulary. That reads the whole corpus once, so the processes of a node
    # share it: process `rank` of `world` checks every world-th shard (docs/data.md: its cost).
    for i, entry in enumerate(manifest["shards"]):
        if i % world != rank:
            continue
        problem = fineweb.verify_shard(Path(data_root) / entry["file"], entry, vocab_size)
        if problem:
            raise ValueError(f"{problem}; rerun fineweb.py")


class Shard:
    # The tokens of one shard file, read a slice at a time: the file is opened for each read and
    # closed after it, so a corpus of thousands of shards holds no file open between reads
    # (`ulimit -n` is often 1024) and the page cache does the caching.

    def __init__(self, path, tokens):
        self.path = path
        self.tokens = tokens
        with open(path, "rb") as f:
            _, self.offset = fineweb.npy_layout(f)  # where the tokens start

    def __len__(self):
        return self.tokens

    def __getitem__(self, window):
        # shard[start:stop] (uint16)
        start, stop, _ = window.indices(self.tokens)
        with open(self.path, "rb") as f:
            f.seek(self.offset + 2 * start)
            return np.fromfile(f, dtype="<u2", count=max(stop - start, 0))


def load_shards(data_root, split, manifest):
    # the split's shards (verify_shards has checked them against the manifest)
    entries = [e for e in manifest["shards"] if e["split"] == split]
    shards = [Shard(Path(data_root) / e["file"], e["tokens"]) for e in entries]
    if not shards:
        raise ValueError(f"no {split} shards in {data_root}; run fineweb.py")
    return shards


def windows(shards, n, offset=0):
    # (shard, start) of every window of n + 1 tokens at stride n from `offset` in each shard:
    # consecutive windows share a token (the last target of one, the first input of the next);
    # a shard's last tokens that fill no window are not read
    starts = [np.arange(offset, len(shard) - n, n, dtype=np.int64) for shard in shards]
    return np.concatenate([np.stack([np.full_like(s, k), s], axis=1) for k, s in enumerate(starts)])


class DataLoaderLite:
    # Batches x, y (B, T) on `device`: each a window of B*T + 1 tokens of one shard.
    #
    # An epoch reads every window once: in order, or (shuffle) in a seeded order of the shards
    # and of the windows within each, their grid moved by a seeded offset in [0, B*T) so that
    # each epoch sees new window boundaries. The world reads an epoch's windows in turn, rank r
    # taking windows r, r + W, r + 2W, ...: every window of an epoch is read once by the world
    # as a whole. The state is the epoch and how many of its windows the world has read.

    def __init__(self, shards, B, T, rank=0, world=1, shuffle=False, seed=0, device="cpu"):
        self.shards = shards
        self.B = B
        self.T = T
        self.rank = rank
        self.world = world
        self.shuffle = shuffle
        self.seed = seed
        self.device = device
        # the fewest windows an epoch can hold: on a grid moved by B*T - 1 (shuffle); with fewer
        # than ranks, a step reads on into the next epoch
        if not len(windows(shards, B * T, B * T - 1 if shuffle else 0)):
            raise ValueError("the shards hold no window of B x T + 1 tokens: lower B or T")
        self.orders = {}  # the window orders of the last two epochs asked for
        self.epoch = 0
        self.pos = 0  # windows of this epoch the world has read

    def order(self, epoch):
        # (shard, start) of each window of `epoch` in the order the world reads them; the
        # previous epoch's is kept too, as a step may straddle two
        if epoch in self.orders:
            return self.orders[epoch]
        if not self.shuffle:
            order = windows(self.shards, self.B * self.T)
        else:
            rng = np.random.default_rng([self.seed, epoch])
            offset = int(rng.integers(self.B * self.T))
            grid = windows(self.shards, self.B * self.T, offset)
            shard_order = rng.permutation(len(self.shards))
            order = np.concatenate([rng.permutation(grid[grid[:, 0] == k]) for k in shard_order])
        self.orders = {e: o for e, o in self.orders.items() if e == epoch - 1}
        self.orders[epoch] = order
        return order

    def locate(self, epoch, i):
        # (epoch, index) of window i of `epoch`, counted on into the next epochs past its end:
        # a step may straddle two epochs
        while i >= len(self.order(epoch)):
            i -= len(self.order(epoch))
            epoch += 1
        return epoch, i

    def next_batch(self):
        epoch, i = self.locate(self.epoch, self.pos + self.rank)
        shard, start = self.order(epoch)[i]
        self.epoch, self.pos = self.locate(self.epoch, self.pos + self.world)
        window = self.shards[shard][start : start + self.B * self.T + 1]
        buf = torch.from_numpy(window.astype(np.int64))
        # From pinned memory the copy is asynchronous: the CPU goes on to prepare the next batch
        # while the GPU still works on this one.
        buf = buf.pin_memory() if self.device.startswith("cuda") else buf
        buf = buf.to(self.device, non_blocking=True)
        x = buf[:-1].view(self.B, self.T)  # inputs
        y = buf[1:].view(self.B, self.T)  # targets
        return x, y

    def epochs_read(self):
        return self.epoch + self.pos / len(self.order(self.epoch))

    def state_dict(self):
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state):
        # (check_resumable has checked that the data and its batching are the checkpoint's)
        self.epoch = state["epoch"]
        self.pos = state["pos"]


# -----------------------------------------------------------------------------
# Learning-rate schedule


def get_lr(step, max_lr, min_lr, warmup_steps, decay_steps, time_used=None):
    # Linear warmup to max_lr, cosine decay to min_lr at decay_steps, then constant. A
    # time-bounded run (--max_minutes) decays over time instead: time_used is the fraction of its
    # budget spent, and at 1 (its last step) the LR is min_lr, mid-warmup too.
    if time_used is not None and time_used >= 1:
        return min_lr
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if time_used is None and step >= decay_steps:
        return min_lr
    decay_ratio = time_used
    if time_used is None:
        decay_ratio = (step - warmup_steps) / (decay_steps - warmup_steps)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))  # 1 -> 0
    return min_lr + coeff * (max_lr - min_lr)


# -----------------------------------------------------------------------------
# Devices and distributed set-up


def pick_device(name):
    # the torch device --device names (auto: cuda, else mps, else cpu), or one ValueError line
    # saying this machine lacks it
    if name == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    if not re.fullmatch(r"cpu|mps|cuda(:\d+)?", name):
        raise ValueError(f"--device {name}: not cpu, cuda, cuda:N or mps")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: this torch sees no CUDA GPU")
    if name.startswith("cuda:") and int(name[5:]) >= torch.cuda.device_count():
        raise ValueError(f"--device {name}: this machine has {torch.cuda.device_count()} GPU(s)")
    if name == "mps" and not torch.backends.mps.is_available():
        raise ValueError("--device mps: this torch sees no Apple GPU")
    return name


def setup_distributed(device):
    # (ddp, rank, local_rank, world_size, device): one process, or one rank of a torchrun
    # launch (which sets RANK, LOCAL_RANK and WORLD_SIZE), joined to the process group
    ddp = "RANK" in os.environ
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    device = pick_device(device)
    if device == "cuda":
        # one GPU per rank; a scheduler that gives each task its own GPU shows it as cuda:0
        device = f"cuda:{local_rank % torch.cuda.device_count()}"
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    if ddp:
        cuda = device.startswith("cuda")
        dist.init_process_group(
            "nccl" if cuda else "gloo", device_id=torch.device(device) if cuda else None
        )
    return ddp, rank, local_rank, world_size, device


# Dense bf16 peak FLOP/s of one GPU, from the vendors' datasheets: the denominator of MFU. The
# first name found in torch.cuda.get_device_name() wins.
PEAK_BF16_FLOPS = [
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H200 NVL", 835e12),
    ("GH200", 989e12),
    ("H100", 989e12),
    ("H200", 989e12),
    ("B200", 2250e12),
    ("B100", 1750e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L40", 181e12),
    ("L4", 121e12),
    ("RTX 6000 Ada", 364e12),
    ("RTX A6000", 155e12),
    ("RTX 4090", 165e12),
    ("RTX 3090", 71e12),
    ("MI300X", 1307e12),
]


def peak_flops(device):
    # one GPU's dense bf16 peak FLOP/s, or None: a CPU, a GPU not in the table or a MIG slice
    # (a share of its GPU) logs no MFU rather than a wrong one
    if not device.startswith("cuda"):
        return None
    name = torch.cuda.get_device_name(device)
    if "MIG" in name:
        return None
    for model, flops in PEAK_BF16_FLOPS:
        if model in name:
            return flops
    return None


# -----------------------------------------------------------------------------
# Evaluation


@torch.no_grad()
def evaluate_val_loss(model, val_loader, val_steps, amp=None, stop=None):
    # The mean loss over the val split's first val_steps windows of B*T + 1 tokens, as
    # build-nanogpt scores it. Window i is rank i % world's, so the tokens are the same for any
    # world size; the sums stay on the device (one host sync, at the end). amp: an autocast
    # dtype (torch.bfloat16) or None. None when a stop was asked for during the pass (on any
    # rank): it ends early rather than keep a scheduler's grace period waiting.
    val_loader.load_state_dict({"epoch": 0, "pos": 0})
    sums = torch.zeros(3, device=val_loader.device)  # summed batch losses, batches, stops
    model.eval()
    for _ in range(val_loader.rank, val_steps, val_loader.world):
        if stop is not None and stop.requested():
            sums[2] = 1
            break
        x, y = val_loader.next_batch()
        with torch.autocast(x.device.type, amp, enabled=amp is not None):
            _, loss = model(x, y)
        sums[:2] += torch.stack([loss.float(), torch.ones_like(sums[0])])
    model.train()
    if dist.is_initialized():
        dist.all_reduce(sums)
    loss_sum, batches, stops = sums.tolist()
    if stops:
        return None
    return loss_sum / batches


def prompt_ids(enc, prompt, block_size, flag="the prompt"):
    # a sampling prompt's ids (an empty one: <|endoftext|> alone), or one ValueError line naming
    # `flag`: a character the tokenizer lacks, nothing to start from, no room left in the
    # model's context for a sampled token
    try:
        ids = enc.encode(prompt, allowed_special="all")
    except ValueError as e:
        raise ValueError(f"{flag}: {e}") from None
    if not ids and enc.eot_token is None:
        raise ValueError(f"{flag} is empty, and this model has no <|endoftext|> to start from")
    ids = ids or [enc.eot_token]
    if len(ids) >= block_size:
        raise ValueError(
            f"{flag} is {len(ids)} tokens: the model's context is {block_size} tokens,"
            f" so the prompt must be {block_size - 1} at most"
        )
    return ids


def sample_texts(
    model, enc, prompt, num_samples, max_new_tokens, top_k=50, temperature=1.0, seed=42
):
    # seeded samples continuing `prompt`
    ids = prompt_ids(enc, prompt, model.config.block_size)
    device = next(model.parameters()).device
    idx = torch.tensor(ids, device=device).repeat(num_samples, 1)  # (num_samples, T)
    generator = torch.Generator(device=device).manual_seed(seed)
    model.eval()
    out = model.generate(idx, max_new_tokens, temperature, top_k, generator, enc.n_vocab)
    model.train()
    return [enc.decode(row.tolist()) for row in out]


# -----------------------------------------------------------------------------
# Checkpoints, the log_dir and stop signals


def find_checkpoints(log_dir):
    # (step, path) of every model_{step}.pt in log_dir, by step
    paths = Path(log_dir).glob("model_*.pt")
    return sorted((int(p.stem[6:]), p) for p in paths if p.stem[6:].isdigit())


def is_whole(path):
    # torch.save writes a zip file: it is whole if every record matches its stored CRC-32, so a
    # torn, truncated or bit-flipped file fails (torch.load itself checks none of that). A file
    # that cannot be read at all (permissions, an I/O error) is not known to be damaged: its
    # OSError goes to the caller, which stops rather than write over what it could not read.
    # Nor is a path that is not a regular file, which is never opened: a FIFO would block for
    # good, a device read for ever.
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise OSError("not a regular file")
    try:
        with zipfile.ZipFile(path) as z:
            return z.testzip() is None
    except (zipfile.BadZipFile, EOFError):
        return False


def load_checkpoint(path):
    # a checkpoint of this program, checked whole before torch reads it (plain data only)
    try:
        whole = is_whole(path)
        ckpt = torch.load(path, map_location="cpu", weights_only=True) if whole else None
    except OSError as e:
        raise ValueError(f"cannot read checkpoint {path} ({e.strerror or e})") from None
    except Exception as e:
        raise ValueError(f"{path} is not a train_gpt2.py checkpoint ({e})") from None
    if not whole:
        raise ValueError(f"{path} is damaged, or not a checkpoint (fails its CRC-32 check)")
    keys = {"model", "model_config", "step"}
    if not isinstance(ckpt, dict) or not keys <= ckpt.keys() or not isinstance(ckpt["model"], dict):
        raise ValueError(f"{path} is not a train_gpt2.py checkpoint")
    return ckpt


def check_finite(model, source):
    # A model whose run diverged (a NaN or an inf among its weights) computes NaN: HellaSwag's
    # argmin would pick ending 0, a sample would be one token over and over, an export would
    # blame its architecture. Every loader (resume, load_model, from_pretrained) refuses it so.
    # Its parameters only: a buffer may hold -inf on purpose (a fork's attention mask).
    for name, w in model.named_parameters():
        if not torch.isfinite(w).all():
            raise ValueError(
                f"{source} holds non-finite weights (first: {name}): its run diverged before it"
                " was saved; use an earlier checkpoint"
            )


def weight_differing(model, state):
    # The name of the first weight the model and a state dict do not share in name and shape, or
    # None: a model edited since the checkpoint (RoPE, another MLP, ...) named in one line, not
    # in load_state_dict's list of every key.
    theirs = {name: tuple(w.shape) for name, w in state.items()}
    mine = {name: tuple(w.shape) for name, w in model.state_dict().items()}
    differ = sorted(theirs.keys() ^ mine.keys()) or [n for n in mine if mine[n] != theirs[n]]
    return differ[0] if differ else None


def load_model(source, device="cpu", dropout=None):
    # (model, tokenizer) from one of our checkpoints (.pt), a Hugging Face GPT-2 directory or a
    # hub name (these two with GPT-2's tokenizer); what cannot load is one ValueError line. The
    # model's dropout is `dropout`, or None: the checkpoint's (a Hugging Face model's: none).
    if not str(source).endswith(".pt"):
        # transformers opens what a directory holds: a FIFO or a device there would hang it
        path = Path(source)
        entries = [path, *path.iterdir()] if path.is_dir() else [path]
        for entry in entries:
            if entry.exists() and not entry.is_file() and not entry.is_dir():
                raise ValueError(
                    f"{entry} is not a regular file (a FIFO or a device?): a model is a .pt"
                    " checkpoint, or a Hugging Face directory of plain files"
                )
        model = GPT.from_pretrained(str(source), dropout or 0.0)
        # GPT-2's tokenizer goes with it: a smaller table would be handed ids it does not hold
        if model.config.vocab_size < fineweb.GPT2_VOCAB_SIZE:
            raise ValueError(
                f"{source}: a vocabulary of {model.config.vocab_size:,} tokens, not GPT-2's"
                f" {fineweb.GPT2_VOCAB_SIZE:,}: load the .pt checkpoint it was exported from"
            )
        return model.to(device), fineweb.get_tokenizer()
    ckpt = load_checkpoint(source)
    try:
        # (a checkpoint of the previous version records a bias flag too: its weights are the same)
        saved = ckpt["model_config"]
        fields = {k: v for k, v in saved.items() if k in GPTConfig.__dataclass_fields__}
        if dropout is not None:
            fields["dropout"] = dropout
        model = GPT(GPTConfig(**fields))
        differ = weight_differing(model, ckpt["model"])
        if differ:
            raise ValueError(
                f"{source} holds another model than this code builds ({differ} differs; was the"
                " model edited since?): use it with the code that made it (its run's code/ keeps"
                " it), or train this model from scratch"
            )
        model.load_state_dict(ckpt["model"])
        check_finite(model, source)
        enc = fineweb.tokenizer_from_manifest(ckpt["tokenizer"])
    except (KeyError, TypeError, AttributeError, RuntimeError) as e:
        raise ValueError(f"{source} is not a checkpoint of train_gpt2.py's GPT ({e})") from None
    return model.to(device), enc


def save_checkpoint(path, checkpoint):
    # atomically, as fineweb.py writes its shards: under a temporary name, flushed to disk, then
    # renamed, so that a crash at any moment leaves the whole file or none. torch's zip writer
    # reports a failed write (most often a full disk) as a RuntimeError.
    try:
        fineweb.write_atomic(Path(path), lambda f: torch.save(checkpoint, f))
    except RuntimeError as e:
        raise OSError(f"cannot write {path} (is the disk full?): {e}") from None


def choose_checkpoint(resume, log_dir, log):
    # The checkpoint --resume names: auto, the highest step in log_dir whose file is whole (a
    # damaged one is skipped with a warning, and later written over); a path; or none ('').
    # A checkpoint that cannot be read stops the run: it may be whole, and a run that skipped
    # it would write over it.
    if resume != "auto":
        return Path(resume) if resume else None
    for _, path in reversed(find_checkpoints(log_dir)):
        try:
            whole = is_whole(path)
        except OSError as e:
            raise ValueError(
                f"cannot read checkpoint {path} ({e.strerror or e}): move it out of the log_dir"
                " (or make it readable), then run again (nothing was written)"
            ) from None
        if whole:
            return path
        log(f"warning: skipping {path}: damaged (fails its CRC-32 check)")
    return None


def parameter_differing(optimizers, saved):
    # What differs between the optimizers' parameters and the checkpoint's, or None. An edit can
    # keep the weights' names and shapes and still add, drop or move a parameter (an untied head:
    # lm_head.weight was the token table's other name); each parameter from there on would take
    # another's state. The groups' parameter names (torch keeps them) are compared; for a
    # checkpoint or an optimizer without them, each group's number of parameters.
    groups = [group for opt in optimizers for group in opt.param_groups]
    saved_groups = [group for opt in saved for group in opt["param_groups"]]
    if len(groups) != len(saved_groups):
        return f"{len(saved_groups)} optimizer groups, this run's {len(groups)}"
    for group, their_group in zip(groups, saved_groups):
        mine = group.get("param_names")
        theirs = their_group.get("param_names")
        if mine is None or theirs is None:
            mine = group["params"]
            theirs = their_group["params"]
            if len(mine) != len(theirs):
                return f"a group of {len(theirs)} parameters, this run's {len(mine)}"
            continue
        differ = sorted(set(mine) ^ set(theirs)) or [a for a, b in zip(mine, theirs) if a != b]
        if differ:
            return f"{differ[0]} differs"
    return None


def check_resumable(ckpt, model, optimizers, cfg, data):
    # Refuse, in one line, a resume whose model, batches or data would not be the checkpoint's;
    # every other flag of this run applies from the resumed step on.
    fix = "(a new run from its weights: --init_from)"
    missing = {"train_config", "optimizers", "loader", "data", "spike_history"} - ckpt.keys()
    if missing:
        raise ValueError(f"resume: an older train_gpt2.py wrote it (no {min(missing)}) {fix}")
    saved = ckpt["train_config"]
    for name in ("batch_size", "seq_len", "total_batch_size", "shuffle", "seed", "optimizer"):
        if saved.get(name) != getattr(cfg, name):
            raise ValueError(f"resume: --{name} was {saved.get(name)} {fix}")
    # every field of the model's config, one the checkpoint predates at its default
    ours = dataclasses.asdict(model.config)
    theirs = {f.name: f.default for f in dataclasses.fields(GPTConfig)}
    theirs.update(ckpt["model_config"])
    for name, value in theirs.items():
        if name != "dropout" and ours.get(name) != value:
            raise ValueError(
                f"resume: its model's {name} is {value}, this one's {ours.get(name)} {fix}"
            )
    # the same config, other weights
    differ = weight_differing(model, ckpt["model"])
    if differ:
        raise ValueError(
            f"resume: its weights are not this model's ({differ} differs; was the model edited"
            " since?): a new run goes in a new --log_dir"
        )
    # the same weights, other parameters in the optimizers
    differ = parameter_differing(optimizers, ckpt["optimizers"])
    if differ:
        raise ValueError(
            f"resume: its optimizer state does not fit this model's parameters ({differ}; was the"
            " model edited since?): a new run from its weights: --init_from CHECKPOINT,"
            " in a new --log_dir"
        )
    if ckpt["data"] != data:
        raise ValueError(f"resume: its data (tokenizer, corpus) differs {fix}")
    if cfg.max_steps < ckpt["step"]:
        raise ValueError(f"resume: it is at step {ckpt['step']}, past --max_steps {fix}")


def free_log_dir(log_dir):
    # the first of LOG_DIR-2, LOG_DIR-3, ... that does not exist: a directory to offer a new run
    n = 2
    while Path(f"{log_dir}-{n}").exists():
        n += 1
    return f"{log_dir}-{n}"


def lock_log_dir(log_dir, log):
    # One run per log_dir: an exclusive flock on log_dir/.lock, which the kernel drops when the
    # process ends (a killed run leaves no stale lock). The file names its holder, for the
    # refusal. Returns the open lock file and the directories made for it (log_dir and its
    # missing parents, outermost first), which a start that fails removes again.
    made = []
    try:
        for directory in reversed([log_dir, *log_dir.parents]):
            if not directory.is_dir():
                directory.mkdir()
                made.append(directory)
        if (log_dir / ".lock").exists() and not (log_dir / ".lock").is_file():
            raise ValueError(f"{log_dir / '.lock'} is not a regular file: move it away")
        lock = open(log_dir / ".lock", "a+")
    except OSError as e:
        remove_made(made)
        raise ValueError(
            f"cannot use --log_dir {log_dir} ({e.strerror}: {e.filename}): pass a directory"
            " that can be made and written"
        ) from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "another process"
        lock.close()
        raise ValueError(
            f"{log_dir} is in use by another run ({holder}): pass another --log_dir"
            f" ({free_log_dir(log_dir)} is free)"
        ) from None
    except OSError as e:
        log(f"warning: no file locks in {log_dir} ({e.strerror}): keep other runs out of it")
    lock.truncate(0)
    lock.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    lock.flush()
    return lock, made


def remove_made(made):
    # the directories a failed start made (outermost first), removed innermost first while empty
    for directory in reversed(made):
        try:
            directory.rmdir()
        except OSError:
            return


def check_log_dir(log_dir, start_step, continues, resume):
    # A run writes only into an empty log_dir or into the run it continues (it resumed from one
    # of its checkpoints): never over what another run made. Refused in one line that names a
    # free directory. --resume auto with no whole checkpoint starts its log_dir's run again.
    checkpoints = find_checkpoints(log_dir)
    later = [path for step, path in checkpoints if step > start_step]
    free = free_log_dir(log_dir)
    if continues and later and resume != "auto":
        raise ValueError(
            f"{log_dir} holds checkpoints up to {later[-1].name}, past step {start_step} where"
            f" this run resumes: continue from the newest with --resume auto, or pass a new"
            f" --log_dir ({free} is free)"
        )
    made = [name for name in ("log.txt", "runs.jsonl") if (log_dir / name).exists()]
    for name in made:
        # the run appends to them: a FIFO or a device there would block it or take its records
        if not (log_dir / name).is_file():
            raise ValueError(f"{log_dir / name} is not a regular file: move it out of the log_dir")
    if not continues and resume != "auto" and (checkpoints or made):
        held = f"checkpoints up to {checkpoints[-1][1].name}" if checkpoints else made[0]
        raise ValueError(
            f"{log_dir} holds another run ({held}), which this one does not continue: pass a"
            f" new --log_dir ({free} is free), or continue that run with --resume auto"
        )


def open_lines(path):
    # path opened to append whole lines (write_lines): a last line torn by a kill is ended first,
    # so that the next record is not joined to it (check_log_dir has refused a special file)
    f = open(path, "ab", buffering=0)
    if f.tell() > 0:
        with open(path, "rb") as old:
            old.seek(-1, os.SEEK_END)
            if old.read(1) != b"\n":
                write_lines(f, "\n")
    return f


def write_lines(f, text):
    # text (whole lines) at the end of f, an open_lines file: all of it, or on a failed write (a
    # full disk) none of it, what was written cut off again; the error names the file
    end = os.lseek(f.fileno(), 0, os.SEEK_END)
    data = memoryview(text.encode())
    try:
        while data:
            data = data[f.write(data) :]
    except OSError as e:
        os.ftruncate(f.fileno(), end)
        raise OSError(f"cannot write {f.name}: {e.strerror or e}") from None


def read_code(known=()):
    # {path: source} of every module imported from this checkout (the packages of an environment
    # inside it, a .venv, aside) and not in `known`, read now: the code this run runs
    root = Path(__file__).resolve().parent
    environments = [Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()]

    def ours(path):
        return path.is_relative_to(root) and not any(path.is_relative_to(e) for e in environments)

    # torch alone brings over a thousand modules from a few hundred directories: each directory
    # is resolved once, and only the files of one inside the checkout
    directories = {}
    code = {}
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None) or ""
        # (a module made in memory may name a relative file of its own)
        if not (file.endswith(".py") and os.path.isabs(file)):
            continue
        directory = os.path.dirname(file)
        if directory not in directories:
            directories[directory] = ours(Path(directory).resolve())
        if not directories[directory]:
            continue
        path = Path(file).resolve()
        if not ours(path):
            continue
        name = path.relative_to(root).as_posix()
        if name not in known:
            code[name] = path.read_bytes()
    return dict(sorted(code.items()))


def git_state(modules):
    # {commit, diff, untracked} of the git checkout this file is in: `git diff HEAD` as plain
    # text (no colour, external diff driver or textconv, whatever the user's git config says)
    # and the modules git does not track; None outside a checkout or without git
    root = Path(__file__).resolve().parent
    git = ["git", "-c", "core.quotepath=off"]
    diff = ["diff", "--no-color", "--no-ext-diff", "--no-textconv", "HEAD"]
    try:
        commit = subprocess.run([*git, "rev-parse", "HEAD"], cwd=root, capture_output=True)
        changes = subprocess.run([*git, *diff], cwd=root, capture_output=True, timeout=60)
        tracked = subprocess.run([*git, "ls-files", "-z", *modules], cwd=root, capture_output=True)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if commit.returncode or changes.returncode or tracked.returncode:
        return None
    tracked = set(tracked.stdout.decode().split("\0"))
    return {
        "commit": commit.stdout.decode().strip(),
        "diff": changes.stdout,
        "untracked": [name for name in modules if name not in tracked],
    }


def read_run_code():
    # The code of a run, read at its start before anything slow (an edit made meanwhile for the
    # next experiment is not this run's): its modules' sources and the git state
    sources = read_code()
    return {"sources": sources, "git": git_state(list(sources))}


def kept_name(name, data):
    # where a module's source (or the git diff) is kept in log_dir: code/{name}-{its hash}, so
    # equal names mean equal bytes (mylib/attn.py: code/mylib.attn-0123456789ab.py)
    stem, dot, suffix = name.rpartition(".")
    stem = stem.replace("/", ".") if dot else name
    suffix = f".{suffix}" if dot else ""
    return f"code/{stem}-{hashlib.sha256(data).hexdigest()[:12]}{suffix}"


def keep(log_dir, name, data):
    # data kept once under log_dir (kept_name); the relative path
    kept = kept_name(name, data)
    if not (log_dir / kept).exists():
        fineweb.write_atomic(log_dir / kept, lambda f: f.write(data))
    return kept


def record_run(log_dir, record, code):
    # One line a start in runs.jsonl: the record, and what produced the run: the source of every
    # module of this checkout it imported (each kept once in code/), the git commit, diff and
    # untracked modules, the versions and the time. plot.py compares runs from these.
    record["code"] = {name: keep(log_dir, name, data) for name, data in code["sources"].items()}
    git = code["git"]
    if git is not None:
        diff = keep(log_dir, "git.diff", git["diff"]) if git["diff"] else None
        git = {"commit": git["commit"], "diff": diff, "untracked": git["untracked"]}
    record["git"] = git
    record["versions"] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    record["time"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    append_record(log_dir, record)


def append_record(log_dir, record):
    # one line of runs.jsonl, appended whole or not at all
    with open_lines(log_dir / "runs.jsonl") as f:
        write_lines(f, json.dumps(record) + "\n")


def peak_memory_gb(device):
    # this process's peak memory: the GPU's allocations on CUDA, else its largest resident size
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated(device) / 2**30
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB (bytes on macOS)
    return rss * (1 if sys.platform == "darwin" else 1024) / 2**30


def record_result(log_dir, status, steps, device):
    # The run's end, appended to runs.jsonl as {"result": {...}}: finished or stopped, its steps,
    # the last value of every kind of log.txt (as logged there: tokens, time, val, bpb, hella,
    # a fork's metric) but the bookkeeping, and its peak memory. Returned as a summary line.
    series = plot.read_log(log_dir / "log.txt")
    result = {
        "status": status,
        "steps": steps,
        "tokens": None,
        "time": None,
        "peak_memory_gb": round(peak_memory_gb(device), 3),
        "val": None,
        "bpb": None,
        "hella": None,
    }
    for kind, points in series.items():
        if kind not in plot.BOOKKEEPING - {"tokens", "time"}:
            result[kind] = int(points[-1][1]) if kind == "tokens" else points[-1][1]
    append_record(log_dir, {"result": result})
    shown = [
        f"{k} {v}" for k, v in result.items() if v is not None and k not in ("status", "steps")
    ]
    return f"{status} at step {steps}: " + " | ".join(shown)


# SIGINT (Ctrl-C), SIGTERM and SIGUSR1 (schedulers), SIGHUP (a closed terminal) ask a run to stop.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)


class StopSignal:
    # During the loop the stop signals only ask: the run ends at its step's end with a
    # checkpoint, also when asked twice. They are blocked in this thread too, so that processes
    # started meanwhile (torch.compile's compilers) inherit them blocked: Ctrl-C to the whole
    # process group stops the run, never a compiler halfway. SIGINT and SIGHUP stay ignored if
    # the program was started ignoring them (nohup, a shell's background job); SIGTERM and
    # SIGUSR1 are a scheduler's, and always ask.

    def __init__(self, log):
        self.log = log
        self.name = None  # the signal that asked
        self.told = False  # whether the console has been told

    def __enter__(self):
        self.previous = {}
        for sig in STOP_SIGNALS:
            kept_ignored = sig in (signal.SIGINT, signal.SIGHUP)
            if kept_ignored and signal.getsignal(sig) == signal.SIG_IGN:
                continue
            self.previous[sig] = signal.signal(sig, self.handle)
        signal.pthread_sigmask(signal.SIG_BLOCK, self.previous)
        return self

    def handle(self, signum, frame):
        self.name = self.name or signal.Signals(signum).name

    def requested(self):
        # a signal sent while blocked waits as pending: take it now
        for sig in signal.sigpending() & set(self.previous):
            signal.sigwait([sig])
            self.handle(sig, None)
        if self.name and not self.told:
            self.told = True
            self.log(f"{self.name}: the run stops at the end of this step, with a checkpoint")
        return self.name is not None

    def __exit__(self, *exc):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, self.previous)
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


# -----------------------------------------------------------------------------
# Training


def out_of_memory(error):
    # whether a RuntimeError says a tensor did not fit: torch.OutOfMemoryError (a GPU's), the
    # CPU's and MPS's allocators ("can't allocate memory"), a size past int64 ("overflowed")
    text = str(error)
    return isinstance(error, torch.OutOfMemoryError) or "memory" in text or "overflow" in text


def micro_steps(cfg, world_size):
    # the batch arithmetic: B x T tokens per micro-step and rank, accumulated to the total
    tokens = cfg.batch_size * cfg.seq_len * world_size
    if cfg.total_batch_size % tokens == 0:
        return cfg.total_batch_size // tokens
    sizes = range(cfg.batch_size, 0, -1)
    fits = [b for b in sizes if cfg.total_batch_size % (b * cfg.seq_len * world_size) == 0]
    hint = f"pass --batch_size {fits[0]}" if fits else "change --total_batch_size"
    raise ValueError(
        f"--total_batch_size {cfg.total_batch_size:,} is not a multiple of B x T x ranks ="
        f" {cfg.batch_size} x {cfg.seq_len} x {world_size}: {hint}"
    )


def check_fits(config, device):
    # A new model too big for this device, refused before it is built: built for real it would
    # fill memory until the kernel's OOM killer ends the run without a word. Its parameters are
    # counted on the meta device (no memory); training takes 16 bytes a parameter at least
    # (float32 weights and gradients, and AdamW's two moments).
    with torch.device("meta"):
        n = sum(p.numel() for p in GPT(config).parameters())
    if device.startswith("cuda"):
        where, memory = "GPU", torch.cuda.get_device_properties(device).total_memory
    else:
        where, memory = "machine", os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if 16 * n > memory:
        raise ValueError(
            f"a model of {n:,} parameters does not fit in memory: it takes"
            f" {16 * n / 2**30:,.0f} GB to train (16 bytes a parameter), this {where} has"
            f" {memory / 2**30:,.0f} GB: lower --n_layer or --n_embd"
        )


def build_model(cfg, enc, device, log):
    # from scratch with cfg's ModelConfig fields, or --init_from's model (saying which of those
    # fields it brings other values of); either way cfg's dropout
    if cfg.init_from == "scratch":
        # the data's tokenizer's ids; GPT-2's 50,257 padded to 50,304 (a multiple of 128): faster
        vocab_size = 50304 if enc.name == "gpt2" else enc.n_vocab
        shape = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(ModelConfig)}
        config = GPTConfig(block_size=cfg.seq_len, vocab_size=vocab_size, **shape)
        check_fits(config, device)
        return GPT(config)
    model, model_enc = load_model(cfg.init_from, dropout=cfg.dropout)
    same_tokens = fineweb.tokenizer_info(model_enc) == fineweb.tokenizer_info(enc)
    if not same_tokens or cfg.seq_len > model.config.block_size:
        raise ValueError(f"--init_from {cfg.init_from}: another tokenizer, or a shorter context")
    names = [f.name for f in dataclasses.fields(ModelConfig) if f.name != "dropout"]
    own = [
        f"{n} {getattr(model.config, n)}"
        for n in names
        if getattr(cfg, n) != getattr(model.config, n)
    ]
    if own:
        log(f"note: --init_from {cfg.init_from} brings its own {', '.join(own)} (not the flags')")
    return model


class Metrics:
    # Every metric goes through report(): a line on the console, `step kind value` lines in
    # log.txt (kept open, one whole write per report) and wandb. A training step's console line
    # also says how much time is left at the pace so far.

    def __init__(self, log_dir, max_steps, time_budget, wandb_run, log):
        # (log_dir None: another rank's, whose metrics go nowhere)
        self.file = open_lines(Path(log_dir) / "log.txt") if log_dir else None
        self.max_steps = max_steps
        self.time_budget = time_budget  # seconds of training (0: none)
        self.wandb_run = wandb_run
        self.log = log
        self.first = None  # (time, step, training seconds) of the first training step reported

    def report(self, step, **values):
        # an int as it is (a count of tokens), any other number to 6 significant digits
        text = {k: str(v) if isinstance(v, int) else f"{v:.6g}" for k, v in values.items()}
        line = f"step {step:5d}/{self.max_steps} | "
        line += " | ".join(f"{k} {v}" for k, v in text.items())
        if "train" in values:
            line += f" | {self.time_left(step, values.get('time', 0.0))}"
        self.log(line)
        if self.file is not None:
            write_lines(self.file, "".join(f"{step} {k} {v}\n" for k, v in text.items()))
        if self.wandb_run is not None:
            self.wandb_run.log(values, step=step)

    def time_left(self, step, train_seconds):
        # The remaining steps at the mean pace since the first one (evaluations included); in a
        # time-bounded run, at most the training time left, at the same pace.
        now = time.time()
        if self.first is None:
            self.first = (now, step, train_seconds)
        if step == self.first[1]:
            return "eta -"
        wall = now - self.first[0]
        seconds = wall / (step - self.first[1]) * (self.max_steps - step - 1)
        if self.time_budget:
            trained = train_seconds - self.first[2]
            seconds = min(seconds, wall / trained * max(self.time_budget - train_seconds, 0))
        return f"eta {seconds // 3600:.0f}h{seconds % 3600 // 60:02.0f}m"


def make_preset_data(data_root):
    # A preset's corpus of input.txt (PRESET_DATA) is made on its first run, by fineweb.py's code
    # with the README's flags (the same bytes); a process making it meanwhile is waited for.
    if data_root not in PRESET_DATA or (Path(data_root) / fineweb.MANIFEST).exists():
        return
    input_txt = Path(__file__).resolve().parent / "input.txt"
    fineweb.main(
        ["--local", str(input_txt), *PRESET_DATA[data_root], "--out_dir", data_root], wait=True
    )


def train(cfg, log=print):
    # Train as configured (one process, or one rank of a torchrun launch); the final metrics.
    # Rank 0 reads the code first (before anything slow), holds log_dir's lock and alone writes
    # there; a start that fails before writing anything leaves no directory it made.
    code = read_run_code() if os.environ.get("RANK", "0") == "0" else None
    make_preset_data(cfg.data_root)
    ddp, rank, local_rank, world_size, device = setup_distributed(cfg.device)
    log = log if rank == 0 else lambda *args: None
    log_dir = Path(cfg.log_dir)
    lock = None
    made = []
    try:
        if rank == 0:
            lock, made = lock_log_dir(log_dir, log)
        return run(cfg, rank, local_rank, world_size, device, log, code)
    finally:
        if lock is not None:
            lock.close()
        if made and os.listdir(log_dir) == [".lock"]:
            os.remove(log_dir / ".lock")
            remove_made(made)
        if ddp:
            dist.destroy_process_group()


def run(cfg, rank, local_rank, world_size, device, log, code):
    device_type = device.split(":")[0]
    master_process = rank == 0
    ddp = dist.is_initialized()
    B = cfg.batch_size
    T = cfg.seq_len
    grad_accum_steps = micro_steps(cfg, world_size)

    # data: what fineweb.py wrote, each shard checked against its manifest before training
    # reads it (the processes of a node share the check; each node checks its own copy)
    manifest = fineweb.load_corpus(cfg.data_root)
    if "note" in manifest:
        log(f"note: {manifest['note']}")
    enc = fineweb.tokenizer_from_manifest(manifest)
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    t0 = time.time()
    verify_shards(cfg.data_root, manifest, enc.n_vocab, local_rank, local_world)
    log(
        f"{len(manifest['shards'])} shards checked against manifest.json ({time.time() - t0:.1f} s)"
    )
    data = {"tokenizer": fineweb.tokenizer_info(enc), "fingerprint": manifest["fingerprint"]}
    train_shards = load_shards(cfg.data_root, "train", manifest)
    # val: the first val_tokens + 1 tokens of the val split (fineweb.py makes it one shard), read
    # in windows of B*T + 1; bits per byte = loss * tokens / (ln 2 * the targets' UTF-8 bytes)
    val_shard = load_shards(cfg.data_root, "val", manifest)[0]
    if cfg.eval_interval and cfg.val_tokens >= len(val_shard):
        fits = (len(val_shard) - 1) // (B * T) * (B * T)
        hint = f"pass --val_tokens {fits}" if fits else "lower --batch_size or --seq_len"
        raise ValueError(
            f"--val_tokens {cfg.val_tokens:,} is more than the val split holds"
            f" ({len(val_shard):,} tokens): {hint}, or --eval_interval 0"
        )
    bytes_of_val = int(fineweb.token_byte_lengths(enc)[val_shard[1 : cfg.val_tokens + 1]].sum())
    val_loader = (
        DataLoaderLite([val_shard], B, T, rank, world_size, device=device)
        if cfg.eval_interval
        else None
    )
    train_loader = DataLoaderLite(
        train_shards, B, T, rank, world_size, cfg.shuffle, cfg.seed, device
    )

    # the model and its optimizers: the same initial weights on every rank
    if device_type == "cuda":
        torch.set_float32_matmul_precision("high")  # TF32 for what autocast leaves in fp32
    torch.manual_seed(cfg.seed)
    raw_model = build_model(cfg, enc, device, log).to(device)
    muon_lr = cfg.muon_lr if cfg.optimizer == "muon" else 0.0
    optimizers = raw_model.configure_optimizers(
        cfg.weight_decay, cfg.max_lr, device_type, muon_lr, cfg.beta2
    )
    # (the tied token table counted once)
    log(f"{sum(p.numel() for p in raw_model.parameters()):,} parameters, {raw_model.config}")
    # bf16 autocast on a GPU (its tensor cores); float32 elsewhere, where bf16 is emulated
    amp = torch.bfloat16 if device_type == "cuda" else None
    # the samples' prompt, checked now: the first sample comes after the run's first writes
    if cfg.sample_interval:
        prompt_ids(enc, cfg.sample_prompt, raw_model.config.block_size, "--sample_prompt")

    # HellaSwag, in GPT-2's tokens, rendered once: the official split (downloaded once) or a file
    hella = None
    if cfg.hellaswag_interval and enc.name == "gpt2":
        examples = hellaswag.load_examples(cfg.hellaswag_data or None)
        hella = hellaswag.prepare(examples, enc, raw_model.config.block_size)
    elif cfg.hellaswag_interval:
        log(f"HellaSwag skipped: it is in GPT-2's tokens, the data in {enc.name}'s")

    # resume from the checkpoint --resume names: rank 0 chooses, every rank reads it
    log_dir = Path(cfg.log_dir)
    chosen = [choose_checkpoint(cfg.resume, log_dir, log) if master_process else None]
    if ddp:
        dist.broadcast_object_list(chosen)
    path = chosen[0]
    # a checkpoint of this log_dir: the same run goes on (its wandb run too)
    continues = path is not None and path.resolve().parent == log_dir.resolve()
    start_step = 0
    history = []  # (loss, norm) of the recent updates, for --skip_spikes
    tokens = 0  # trained on so far
    train_seconds = 0.0  # spent in training steps so far
    wandb_id = None
    ckpt = None
    if path is not None:
        ckpt = load_checkpoint(path)
        check_resumable(ckpt, raw_model, optimizers, cfg, data)
        raw_model.load_state_dict(ckpt["model"])
        check_finite(raw_model, path)
        for opt, saved in zip(optimizers, ckpt["optimizers"]):
            # the moments and step counts are the checkpoint's, the hyper-parameters this run's
            opt.load_state_dict(
                {"state": saved["state"], "param_groups": opt.state_dict()["param_groups"]}
            )
        train_loader.load_state_dict(ckpt["loader"])
        start_step = ckpt["step"]
        history = ckpt["spike_history"]
        tokens = ckpt.get("tokens", start_step * cfg.total_batch_size)
        train_seconds = ckpt.get("train_seconds", 0.0)
        wandb_id = ckpt["wandb_id"] if continues else None
        log(f"resumed from {path} at step {start_step}")
        if cfg.init_from != "scratch":
            log(f"note: --init_from {cfg.init_from} not applied: the run goes on from {path}")

    # log_dir (rank 0's, locked): nothing another run made is written over; then the run's
    # record and its metrics' sinks
    wandb_run = None
    kept = None  # where each module's source is kept (rank 0's)
    if master_process:
        check_log_dir(log_dir, start_step, continues, cfg.resume)
        # the code as read at the start, and any module of this checkout imported since
        code["sources"].update(read_code(code["sources"]))
        kept = {name: kept_name(name, source) for name, source in code["sources"].items()}
        # A resume under other code than its checkpoint's (a logging fix mid-run) goes on, said
        # in one line and recorded with this start's step.
        saved = ckpt.get("code") if ckpt is not None else None
        changed = []
        if saved:  # (a checkpoint older than the code's record: not known)
            changed = sorted(n for n in kept.keys() | saved.keys() if kept.get(n) != saved.get(n))
        if changed:
            log(
                f"note: the code differs from {path}'s ({', '.join(changed)}): the run goes on"
                f" under this code, and runs.jsonl records that it changed at step {start_step}"
            )
        # A branch (a resume from another run's checkpoint) starts with a checkpoint of its own,
        # before anything else is written: stopped or killed at any moment, --resume auto
        # continues it.
        if ckpt is not None and not continues:
            ckpt.update(train_config=dataclasses.asdict(cfg), code=kept, wandb_id=None)
            save_checkpoint(log_dir / f"model_{start_step:05d}.pt", ckpt)
        if cfg.wandb_project:
            import wandb

            wandb_run = wandb.init(
                project=cfg.wandb_project,
                id=wandb_id,
                resume="allow",
                config=dataclasses.asdict(cfg),
            )
            wandb_id = wandb_run.id
        record = {
            "step": start_step,
            "resumed_from": path and str(path),
            "config": dataclasses.asdict(cfg),
            # the model as built: with --init_from, not the config's shape flags
            "model": dataclasses.asdict(raw_model.config),
            "data": dict(data, dataset=manifest.get("dataset")),
            "world_size": world_size,
            "device": torch.cuda.get_device_name(device) if device_type == "cuda" else device,
        }
        if changed:
            record["code_changed"] = changed
        record_run(log_dir, record, code)
    ckpt = None  # (its memory is the model's and optimizers' now)
    time_budget = cfg.max_minutes * 60  # seconds of training (0: no bound)
    metrics = Metrics(
        log_dir if master_process else None, cfg.max_steps, time_budget, wandb_run, log
    )
    epochs = (cfg.max_steps - start_step) * cfg.total_batch_size / sum(map(len, train_shards))
    log(
        f"{B} x {T} x {world_size} rank(s) x {grad_accum_steps} micro-steps ="
        f" {cfg.total_batch_size:,} tokens a step; {cfg.max_steps - start_step} steps to go,"
        f" {epochs:.2f} epochs of the train split"
    )
    if time_budget:
        log(
            f"time-bounded: training ends after {cfg.max_minutes:g} minutes of training steps"
            f" ({train_seconds / 60:.2f} done), if before step {cfg.max_steps}"
        )

    # model trains (wrapped in DDP, then compiled); raw_model evaluates and saves
    model = raw_model
    if ddp:
        model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device] if device_type == "cuda" else None
        )
    if cfg.compile == "true" or (cfg.compile == "auto" and device_type == "cuda"):
        # after DDP: dynamo splits the graph at DDP's buckets, so all-reduces overlap backward
        model = torch.compile(model)
    # MFU: the FLOPs of a step against the GPUs' peak (None off CUDA or on an unknown GPU)
    peak = peak_flops(device)
    flops_per_step = raw_model.flops_per_token(T) * cfg.total_batch_size
    val_loss = None
    stopping = False
    time_up = time_budget > 0 and train_seconds >= time_budget

    # The loop. From here on a stop signal only asks: the run ends at a step's end with a
    # checkpoint. (Before, its default action ends the program: nothing worth keeping is
    # written yet.)
    with StopSignal(log) as stop:
        for step in range(start_step, cfg.max_steps + 1):
            last_step = step == cfg.max_steps or time_up

            # validation loss (and bits per byte) every eval_interval steps and at the end; a
            # stop asked for meanwhile ends the pass early and skips the rest of evaluation. The
            # plain model: compiling its eval-mode graph costs more than it saves
            # (docs/benchmarks.md), and outside DDP no forward waits on the other ranks (they
            # may score different numbers of batches)
            val_due = cfg.eval_interval and (step % cfg.eval_interval == 0 or last_step)
            if val_due and not stopping:
                val_steps = cfg.val_tokens // (B * T)
                loss = evaluate_val_loss(raw_model, val_loader, val_steps, amp, stop)
                stopping = loss is None
                if loss is not None:
                    val_loss = loss
                    bpb = val_loss * cfg.val_tokens / (math.log(2) * bytes_of_val)
                    metrics.report(step, val=val_loss, bpb=bpb)

            # HellaSwag every hellaswag_interval steps and at the end
            hella_due = hella is not None and (step % cfg.hellaswag_interval == 0 or last_step)
            if hella_due and not stopping:
                result = hellaswag.evaluate(raw_model, hella, device, rank, world_size, amp)
                metrics.report(step, hella=result["acc_norm"])

            # samples from the model, rank 0 only
            sample_due = cfg.sample_interval and (step % cfg.sample_interval == 0 or last_step)
            if master_process and sample_due and not stopping:
                texts = sample_texts(
                    raw_model, enc, cfg.sample_prompt, 4, cfg.sample_length, seed=cfg.seed
                )
                for i, text in enumerate(texts):
                    log(f"sample {i}: {text}")

            # checkpoint every ckpt_interval steps, at the end, and when a stop was asked for
            ckpt_due = cfg.ckpt_interval and step % cfg.ckpt_interval == 0
            if step > start_step and (ckpt_due or last_step or stopping):
                checkpoint = {
                    "model": raw_model.state_dict(),
                    "optimizers": [opt.state_dict() for opt in optimizers],
                    "model_config": dataclasses.asdict(raw_model.config),
                    "train_config": dataclasses.asdict(cfg),
                    "step": step,
                    "val_loss": val_loss,
                    "loader": train_loader.state_dict(),
                    "spike_history": history,
                    "tokens": tokens,
                    "train_seconds": train_seconds,
                    "data": data,
                    "tokenizer": data["tokenizer"],
                    "code": kept,
                    "wandb_id": wandb_id,
                }
                if master_process:
                    save_checkpoint(log_dir / f"model_{step:05d}.pt", checkpoint)
                    log(f"saved {log_dir / f'model_{step:05d}.pt'}")
                    # --keep_last: only this log_dir's older checkpoints go
                    for s, old in find_checkpoints(log_dir)[: -cfg.keep_last or None]:
                        if cfg.keep_last and s < step:
                            old.unlink()
                if ddp:
                    dist.barrier()  # nobody races ahead (or exits) before the file exists
                if master_process and cfg.curves:
                    plot.refresh(log_dir, log, force=last_step or stopping)
            if last_step:
                break
            if stopping:
                log(f"{stop.name or 'a stop request on another rank'}: stopped at step {step}")
                break

            # one optimization step: grad_accum_steps micro-steps of B x T tokens
            t0 = time.time()
            if cfg.overfit_batch:
                # the run's first batch at every step, on any number of ranks and after a resume
                train_loader.load_state_dict({"epoch": 0, "pos": 0})
            model.zero_grad(set_to_none=True)
            loss_accum = torch.zeros((), device=device)
            for micro_step in range(grad_accum_steps):
                x, y = train_loader.next_batch()
                # dropout's random numbers are the window's (the run's n-th read): the same on
                # any number of ranks and after a resume, with no random state to save
                window = (step * grad_accum_steps + micro_step) * world_size + rank
                torch.manual_seed(cfg.seed + window)
                if ddp:
                    # all-reduce the gradients only after the last micro-step's backward
                    model.require_backward_grad_sync = micro_step == grad_accum_steps - 1
                with torch.autocast(device_type, amp, enabled=amp is not None):
                    _, loss = model(x, y)
                # The loss is a mean over B x T tokens; divided by the micro-steps, the summed
                # gradients are those of the mean over the whole batch.
                loss = loss / grad_accum_steps
                loss_accum += loss.detach()
                loss.backward()
            # One all-reduce and one host sync a step: the loss, whether a rank was asked to
            # stop (all ranks stop together), rank 0's training clock (so that a time-bounded
            # run's LR and last step are the same on every rank), then the gradient norm.
            asked = torch.full((), float(stop.requested()), device=device)
            seconds = train_seconds + time.time() - t0 if master_process else 0.0
            clock = torch.full((), seconds, device=device)
            shared = torch.stack([loss_accum / world_size, asked, clock])
            if ddp:
                dist.all_reduce(shared)
            norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), cfg.grad_clip or math.inf)
            loss_value, stops, seconds, norm = torch.cat([shared, norm.view(1)]).tolist()
            stopping = stops > 0
            # The schedule: min_lr is max_lr / 10 (GPT-2's recipe, 6e-4 -> 6e-5). A time-bounded
            # run (--max_minutes) decays over its budget and ends after the step that spends it.
            time_used = seconds / time_budget if time_budget else None
            time_up = time_used is not None and time_used >= 1
            lr = get_lr(
                step, cfg.max_lr, cfg.max_lr / 10, cfg.warmup_steps, cfg.max_steps, time_used
            )
            for opt in optimizers:
                for group in opt.param_groups:
                    group["lr"] = lr * group.get("lr_scale", 1.0)  # Muon runs at its own peak

            # A non-finite update stops the run (or is skipped). With --skip_spikes, each step's
            # z-score (loss or norm against the last 128 updates) is logged; above Z, skipped.
            skip = not math.isfinite(loss_value + norm)
            if skip and not cfg.skip_nonfinite:
                raise ValueError(
                    f"non-finite loss {loss_value} or grad norm {norm} at step {step}: the run"
                    " diverged (a flag or an edit since the last good run: --max_lr, the model);"
                    " --resume auto continues from the last checkpoint, --skip_nonfinite true"
                    " skips such updates"
                )
            if not skip and cfg.skip_spikes and len(history) >= 16:
                past = np.array(history)  # (n, 2)
                z = ((np.array([loss_value, norm]) - past.mean(0)) / (past.std(0) + 1e-8)).max()
                skip = z > cfg.skip_spikes
                metrics.report(step, spike=z)
            if not skip:
                for opt in optimizers:
                    opt.step()
                history = (history + [[loss_value, norm]])[-128:]

            # The log line; the step's time includes its wait for the GPU (the sync above). The
            # tokens and training time so far are what comparisons of runs are drawn against.
            dt = time.time() - t0
            step_tokens = grad_accum_steps * B * T * world_size
            tokens += step_tokens
            train_seconds += dt
            values = dict(
                train=loss_value,
                lr=lr,
                norm=norm,
                ms=dt * 1000,
                tok_per_s=step_tokens / dt,
                epoch=train_loader.epochs_read(),
            )
            if peak:
                values["mfu"] = flops_per_step / dt / (peak * world_size)
            metrics.report(step, **values, tokens=tokens, time=train_seconds)

        # the run's end, finished or stopped: a result record for scripts, and a summary line
        if master_process:
            log(record_result(log_dir, "finished" if last_step else "stopped", step, device))
        if wandb_run is not None:
            wandb_run.finish()
    return {"step": step, "val_loss": val_loss, "stopped": not last_step, "log_dir": str(log_dir)}


# -----------------------------------------------------------------------------
# Command line


def true_or_false(text):
    # a bool flag takes true or false (anything else: argparse's one-line error)
    return ["false", "true"].index(text.lower()) == 1


def field_helps():
    # {field: its --help}, the comments within each config field's statement in this file's
    # source, however the formatter lays it out: `x: float = (` with the value and its comment on
    # the next line, a comment after the opening parenthesis, or after the closing one
    with tokenize.open(__file__) as f:
        source = f.read()
    comments = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string[1:].strip()
    configs = [cls.__name__ for cls in TrainConfig.__mro__]
    helps = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef) or node.name not in configs:
            continue
        for field in node.body:
            if isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name):
                lines = range(field.lineno, field.end_lineno + 1)
                helps[field.target.id] = " ".join(comments[n] for n in lines if n in comments)
    return helps


def parse_args(argv):
    # --preset NAME replaces TrainConfig's defaults; then every field is a flag, typed by its
    # annotation and documented by its comment (if any), so explicit flags override the preset
    first = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    first.add_argument("--preset", choices=sorted(PRESETS))
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    defaults.update(PRESETS.get(first.parse_known_args(argv)[0].preset, {}))
    helps = field_helps()
    gpus = torch.cuda.device_count()
    here = "no CUDA GPU: auto is cpu (or mps), float32, not compiled"
    here = f"{gpus} CUDA GPU(s): auto is cuda, bfloat16, compiled" if gpus else here
    parser = argparse.ArgumentParser(
        prog="train_gpt2.py",
        usage=argparse.SUPPRESS,
        description="Train GPT-2 (README.md has the recipes).",
        epilog=f"On this machine: {here}.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), help="a recipe; flags override it")
    for field in dataclasses.fields(TrainConfig):
        kind = field.type if isinstance(field.type, type) else type(field.default)
        kind = true_or_false if kind is bool else kind
        parser.add_argument(
            f"--{field.name}", type=kind, default=defaults[field.name], help=helps.get(field.name)
        )
    args = vars(parser.parse_args(argv))
    args.pop("preset")
    try:
        return TrainConfig(**args)
    except ValueError as e:
        parser.error(str(e))


def continue_command(argv):
    # the command that continues a stopped run, shell-quoted: its flags (less --resume), then
    # --resume auto; under torchrun, on one node (several: each with its own flags)
    launcher = (
        ["torchrun", "--standalone", f"--nproc_per_node={os.environ['LOCAL_WORLD_SIZE']}"]
        if "LOCAL_WORLD_SIZE" in os.environ
        else ["python"]
    )
    args = iter(argv)
    kept = []
    for arg in args:
        if arg == "--resume":
            next(args, None)  # and its value
        elif not arg.startswith("--resume="):
            kept.append(arg)
    return shlex.join(launcher + [os.path.relpath(__file__), *kept, "--resume", "auto"])


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        cfg = parse_args(argv)
        result = train(cfg, log=fineweb.say)
    except RuntimeError as e:
        # a GPU's out of memory, or the CPU allocator's, at any step
        if not out_of_memory(e):
            raise
        sys.exit(
            "train_gpt2.py: error: out of memory: lower --batch_size (gradient accumulation"
            " keeps --total_batch_size), or the model's size"
        )
    except (ValueError, OSError) as e:
        sys.exit(f"train_gpt2.py: error: {' '.join(str(e).split())}")
    except KeyboardInterrupt:
        sys.exit("train_gpt2.py: interrupted outside the training loop; checkpoints as they were")
    # The run's work is done, its last checkpoint and record written: a stop signal from here on
    # (a scheduler's, at the job's end) changes nothing, and the exit status stays 0.
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    if result["stopped"] and os.environ.get("RANK", "0") == "0":
        fineweb.say(f"to continue: {continue_command(argv)}")


if __name__ == "__main__":
    main()
