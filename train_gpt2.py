"""
GPT-2 pretraining in one file, read top to bottom: config, model, optimizers, data loader,
learning-rate schedule, distributed set-up, evaluation, checkpoints, and the training loop.

    python train_gpt2.py --preset shakespeare_char   # a character model: minutes on a CPU
    torchrun --standalone --nproc_per_node=8 train_gpt2.py --preset gpt2-124M   # 10B tokens

The data is fineweb.py's uint16 token shards and their manifest.json (fineweb.py also holds the
tokenizers); hellaswag_eval.py scores HellaSwag. What keeps a run safe and recorded is harness.py:
its log_dir (one run at a time), runs.jsonl (the config, data and code of every start, the result
of every end), atomic checkpoints, stop signals and the command line, where every TrainConfig
field is a flag. `python plot.py log/a log/b` compares runs. Importing this module does nothing
but define things.
"""

import bisect
import dataclasses
import math
import mmap
import os
import re
import time
from pathlib import Path

# isort: split
# first: it loads torch, and Ctrl-C meanwhile ends the program in one line
import harness

# isort: split
import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import fineweb
import hellaswag_eval

# -----------------------------------------------------------------------------
# Configuration


@dataclasses.dataclass(kw_only=True)
class ModelConfig:
    # The model's hyper-parameters that a run chooses. TrainConfig inherits them, so each is a flag
    # of train_gpt2.py too: a field added here reaches the model, its checkpoints and the command
    # line. (From scratch; --init_from brings its own, all but dropout.)
    n_layer: int = 12  # number of transformer blocks
    n_head: int = 12  # attention heads per block
    n_embd: int = 768  # width of the residual stream
    dropout: float = 0.0  # on embeddings, attention weights and both residual branches
    # GPT-2's weights need its biases and its tanh GELU; from scratch, nanoGPT's choices (no
    # biases, the exact GELU) train as well and faster on a CPU (docs/benchmarks.md)
    bias: bool = True  # biases in the Linears and LayerNorms (the head has none)
    gelu_approximate: str = "tanh"  # the GELU: tanh (GPT-2's approximation) or none (exact)


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
        # Every number finite and >= 0, no empty path (harness.check_flags), then what the recipe
        # needs, then the bounds only a typo passes (harness.check_typos).
        harness.check_flags(self)
        sizes = ["n_layer", "n_head", "n_embd", "batch_size", "seq_len", "total_batch_size"]
        for name in sizes + ["max_steps", "max_lr", "sample_length"]:
            if getattr(self, name) == 0:
                raise ValueError(f"--{name} must be > 0")
        if self.n_embd % self.n_head:
            raise ValueError("--n_embd must be a multiple of --n_head")
        if self.total_batch_size % (self.batch_size * self.seq_len):
            raise ValueError("--total_batch_size must be a multiple of --batch_size x --seq_len")
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
        if self.gelu_approximate not in ("tanh", "none"):
            raise ValueError("--gelu_approximate must be tanh or none")
        if self.compile not in ("auto", "true", "false"):
            raise ValueError("--compile must be auto, true or false")
        harness.check_typos(self)


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
        bias=False,
        gelu_approximate="none",
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

# fineweb.py's flags that make a preset's corpus of input.txt (the README's commands): a preset's
# first run makes it
PRESET_DATA = {
    "data/shakespeare": [],
    "data/shakespeare_char": ["--tokenizer", "char"],
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
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.layer = layer  # its index in a KVCache

    def forward(self, x, kv_cache=None):
        B, T, C = x.size()
        # q, k, v of every head: c_attn's output is [q | k | v], each head's hs columns in a row
        qkv = self.c_attn(x).view(B, T, 3, self.n_head, C // self.n_head)
        # (B, T, nh, hs) -> (B, nh, T, hs); unbind's backward stacks the three gradients into
        # c_attn's layout, where a permute's would copy them once more
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))
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
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate=config.gelu_approximate)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config, layer):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config, layer)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
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
# GPT2Config's activation_function -> our gelu_approximate (GPT-2's own is gelu_new)
HF_GELU = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "none"}


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
                ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
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
        # GPT-2 is what our model builds (a GELU, a tied head, the norms' eps, biases) and the
        # weights transformers gives GPT-2 of this shape (no other MLP width, no extra module);
        # the causal-mask buffers of older transformers versions are not weights
        c = hf.config
        sd_hf = {k: v for k, v in hf.state_dict().items() if not k.endswith(".attn.bias")}
        with torch.device("meta"):
            gpt2 = GPT2LMHeadModel(GPT2Config(**{k: getattr(c, k) for k in HF_CONFIG.values()}))
        shapes = {k: v.shape for k, v in gpt2.state_dict().items() if not k.endswith(".attn.bias")}
        same_shapes = shapes == {k: v.shape for k, v in sd_hf.items()}
        gelu = HF_GELU.get(c.activation_function)
        if not gelu or not c.tie_word_embeddings or c.layer_norm_epsilon != 1e-5 or not same_shapes:
            raise ValueError(
                f"{name_or_dir}: not GPT-2 (its activation, head, norms, modules or their shapes)"
            )
        # GPT-2's weights into this model, which an edit may have left without a place for one
        # (no position table, a wider MLP)
        shape = {ours: getattr(c, theirs) for ours, theirs in HF_CONFIG.items()}
        model = cls(GPTConfig(dropout=dropout, gelu_approximate=gelu, **shape))
        sd = model.state_dict()
        weights = {k: w.t() if k.endswith(HF_TRANSPOSED) else w for k, w in sd_hf.items()}
        differ = harness.weight_differing(model, weights)
        if differ:
            raise ValueError(
                f"{name_or_dir}: this edited model cannot take GPT-2's weights ({differ} differs):"
                " start it from scratch or from a checkpoint of its own"
            )
        with torch.no_grad():
            for k, w in weights.items():
                sd[k].copy_(w)
        harness.check_finite(model, name_or_dir)
        return model

    def configure_optimizers(
        self, weight_decay, learning_rate, device_type, muon_lr=0.0, beta2=0.95
    ):
        # [AdamW] decaying the 2-D weights (matrices, embeddings), not biases and norms. With
        # muon_lr: [AdamW, Muon], Muon taking the blocks' matrices; its group's lr_scale is
        # muon_lr / learning_rate, so it follows the same schedule at its own peak. Each
        # parameter goes in with its name, which torch keeps in the optimizers' state: a resume
        # checks them against this model's (harness.check_resumable).
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


# -----------------------------------------------------------------------------
# Optimizers: AdamW is torch's (GPT.configure_optimizers), Muon is here


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


class Shard:
    # One shard file, read nothing until its pool is reached (map): a corpus of thousands of
    # shards holds open only the files of the shards being read (`ulimit -n` is often 1024).

    def __init__(self, path, tokens):
        self.path = path
        self.tokens = tokens
        with open(path, "rb") as f:
            _, self.offset = fineweb.npy_layout(f)  # where the tokens start

    def __len__(self):
        return self.tokens

    def map(self):
        # The tokens (uint16), memory-mapped: read when touched, through the page cache that the
        # processes of a node share; the map holds the file open while the array lives. The
        # kernel is asked to read the whole file ahead, in the large sequential reads a shared
        # filesystem serves well, rather than a page at a time as rows are read.
        with open(self.path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        mapped.madvise(mmap.MADV_WILLNEED)
        return np.frombuffer(mapped, dtype="<u2", count=self.tokens, offset=self.offset)


def load_shards(data_root, split, manifest):
    # the split's shards (the harness has checked them against the manifest)
    entries = [e for e in manifest["shards"] if e["split"] == split]
    shards = [Shard(Path(data_root) / e["file"], e["tokens"]) for e in entries]
    if not shards:
        raise ValueError(f"no {split} shards in {data_root}; run fineweb.py")
    return shards


def window_counts(shards, n, offset):
    # how many windows of n + 1 tokens at stride n from `offset` each shard holds: consecutive
    # windows share a token (the last target of one, the first input of the next); a shard's
    # last tokens that fill no window are not read
    return [max(len(shard) - 1 - offset, 0) // n for shard in shards]


# An epoch reads its shards in pools: consecutive shards of its order whose windows hold at most
# POOL_ROWS rows of T tokens (a shuffled row is a window; in order, a window is B rows) and
# POOL_SHARDS shards (a pool has at least one shard). A shuffled pool's windows are shuffled
# together; a pool's shards are mapped while it is read. So the loader's memory and open files
# are a pool's, whatever the size of the corpus, and its random reads stay within a pool's files
# (2**20 rows of 1,025 GPT-2 tokens: 2 GB, which the page cache holds).
POOL_ROWS = 2**20
POOL_SHARDS = 32


def group_pools(order, counts, most):
    # the shards of `order` that hold a window (counts[k] of shard k), in pools of consecutive
    # ones of at most `most` windows and POOL_SHARDS shards; a shard of more windows than
    # `most` is a pool of its own
    pools = []
    windows = 0  # in the last pool
    for k in order:
        if not counts[k]:
            continue
        full = pools and (windows + counts[k] > most or len(pools[-1]) == POOL_SHARDS)
        if not pools or full:
            pools.append([])
            windows = 0
        pools[-1].append(k)
        windows += counts[k]
    return pools


@dataclasses.dataclass
class EpochPlan:
    # what an epoch reads, in order: its pools' windows, one pool after another
    offset: int  # where each shard's first window starts (the grid's offset)
    counts: list  # windows in each shard of the loader's list
    pools: list  # each pool's shards (their indices), in the order they are read
    ends: list  # windows in the pools up to the end of each (the last: the epoch's)


def open_tokens(shard):
    # what a pool reads a shard's windows from: a Shard's mapped file, or an array of tokens as it
    # is (tests and bench.py pass those)
    if isinstance(shard, Shard):
        return shard.map()
    return shard


class DataLoaderLite:
    # Batches x, y (B, T) on `device`. In order (build-nanogpt's): a batch is one window of
    # B*T + 1 tokens of one shard, x its first B*T tokens and y its last. Shuffled: each of its B
    # rows is a window of T + 1 tokens of its own, from anywhere in its pool.
    #
    # An epoch reads every window once: windows at stride n (B*T in order, T shuffled). In
    # order, the shards and their windows in turn. Shuffled, the epoch's seed ([seed, epoch])
    # permutes the shards and moves the grid of windows by an offset in [0, T), so that each
    # epoch sees new windows; then it reads the shards in pools (POOL_ROWS), each pool's windows
    # in a seeded order of their own ([seed, epoch, pool]), drawn when the pool is reached. In
    # order, the pools are read in order too.
    #
    # The world reads an epoch's windows in units of a batch's (one in order, B shuffled): rank r
    # takes units r, r + W, r + 2W, ..., so every window of an epoch is read once by the world as
    # a whole and the ranks together read exactly what one process reads; a step may straddle
    # two epochs. The state is the epoch and how many of its windows the world has read.

    def __init__(self, shards, B, T, rank=0, world=1, shuffle=False, seed=0, device="cpu"):
        self.shards = shards
        self.B = B
        self.T = T
        self.rank = rank
        self.world = world
        self.shuffle = shuffle
        self.seed = seed
        self.device = device
        self.n = T if shuffle else B * T  # a window is n + 1 tokens
        self.rows = B if shuffle else 1  # windows in a batch
        # the fewest windows an epoch can hold: on a grid moved by n - 1 (shuffle); with fewer
        # than a step reads, a step reads on into the next epochs
        if not sum(window_counts(shards, self.n, self.n - 1 if shuffle else 0)):
            if shuffle:
                raise ValueError(
                    "the shards hold no window of T + 1 tokens on every grid (a shard of 2 x T"
                    " tokens): lower T"
                )
            raise ValueError("the shards hold no window of B x T + 1 tokens: lower B or T")
        self.plans = {}  # the plans of the last two epochs asked for
        # the pool being read: (epoch, index), its shards' tokens, the windows in its shards up
        # to the end of each, and the order of its windows (None: in order)
        self.pool = None
        self.pool_tokens = []
        self.pool_ends = []
        self.pool_order = None
        self.epoch = 0
        self.pos = 0  # windows of this epoch the world has read

    def plan(self, epoch):
        # what `epoch` reads; the previous epoch's plan is kept too, as a step may straddle two
        if epoch in self.plans:
            return self.plans[epoch]
        offset = 0
        order = range(len(self.shards))
        if self.shuffle:
            rng = np.random.default_rng([self.seed, epoch])
            offset = int(rng.integers(self.n))
            order = rng.permutation(len(self.shards))
        counts = window_counts(self.shards, self.n, offset)
        pools = group_pools(order, counts, max(POOL_ROWS * self.T // self.n, 1))
        ends = np.cumsum([sum(counts[k] for k in pool) for pool in pools]).tolist()
        self.plans = {e: p for e, p in self.plans.items() if e == epoch - 1}
        self.plans[epoch] = EpochPlan(offset, counts, pools, ends)
        return self.plans[epoch]

    def locate(self, epoch, i):
        # (epoch, index) of window i of `epoch`, counted on into the next epochs past its end:
        # a step may straddle two epochs
        while i >= self.plan(epoch).ends[-1]:
            i -= self.plan(epoch).ends[-1]
            epoch += 1
        return epoch, i

    def open_pool(self, epoch, p):
        # Pool p of `epoch` becomes the one read: the last one's maps are dropped first (their
        # files close), then its shards are mapped and its windows' order is drawn.
        plan = self.plan(epoch)
        shards = plan.pools[p]
        self.pool_tokens = []
        self.pool_tokens = [open_tokens(self.shards[k]) for k in shards]
        self.pool_ends = np.cumsum([plan.counts[k] for k in shards]).tolist()
        self.pool_order = None
        if self.shuffle:
            rng = np.random.default_rng([self.seed, epoch, p])
            self.pool_order = rng.permutation(self.pool_ends[-1])
        self.pool = (epoch, p)

    def window(self, epoch, i):
        # the n + 1 tokens of window i of `epoch`, from its pool
        plan = self.plan(epoch)
        p = bisect.bisect_right(plan.ends, i)
        if self.pool != (epoch, p):
            self.open_pool(epoch, p)
        j = i - (plan.ends[p - 1] if p else 0)  # its place in the pool's order
        if self.pool_order is not None:
            j = int(self.pool_order[j])  # its index among the pool's windows, shard by shard
        q = bisect.bisect_right(self.pool_ends, j)  # the pool's shard that holds it
        start = plan.offset + (j - (self.pool_ends[q - 1] if q else 0)) * self.n
        return self.pool_tokens[q][start : start + self.n + 1]

    def next_batch(self):
        # this rank's unit of the world's: `rows` consecutive windows, the rank-th unit from pos
        first = self.pos + self.rank * self.rows
        buf = np.empty((self.rows, self.n + 1), dtype=np.int64)
        for row in range(self.rows):
            epoch, i = self.locate(self.epoch, first + row)
            buf[row] = self.window(epoch, i)
        self.epoch, self.pos = self.locate(self.epoch, self.pos + self.world * self.rows)
        buf = torch.from_numpy(buf)
        # From pinned memory the copy is asynchronous: the CPU goes on to prepare the next batch
        # while the GPU still works on this one.
        buf = buf.pin_memory() if self.device.startswith("cuda") else buf
        buf = buf.to(self.device, non_blocking=True)
        # (B, T) each, contiguous as a batch of one window is (shuffled rows need a copy)
        x = buf[:, :-1].reshape(self.B, self.T).contiguous()  # inputs
        y = buf[:, 1:].reshape(self.B, self.T).contiguous()  # targets
        return x, y

    def epochs_read(self):
        return self.epoch + self.pos / self.plan(self.epoch).ends[-1]

    def state_dict(self):
        # (order: what pos counts, windows of B x T + 1 tokens or rows of T + 1)
        return {
            "epoch": self.epoch,
            "pos": self.pos,
            "order": "rows" if self.shuffle else "windows",
        }

    def load_state_dict(self, state):
        # (harness.check_resumable has checked that the data and its batching are the checkpoint's)
        self.epoch = state["epoch"]
        self.pos = state["pos"]


# -----------------------------------------------------------------------------
# Learning-rate schedule


def get_lr(step, max_lr, min_lr, warmup_steps, decay_steps, time_used=None):
    # Linear warmup to max_lr, cosine decay to min_lr at decay_steps, then constant. A
    # time-bounded run (--max_minutes) decays over whichever ends first, its steps or its time:
    # time_used is the fraction of its budget spent, and at 1 (its last step) the LR is min_lr,
    # mid-warmup too.
    if time_used is not None and time_used >= 1:
        return min_lr
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= decay_steps:
        return min_lr
    decay_ratio = (step - warmup_steps) / (decay_steps - warmup_steps)
    if time_used is not None:
        decay_ratio = max(decay_ratio, time_used)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))  # 1 -> 0
    return min_lr + coeff * (max_lr - min_lr)


# -----------------------------------------------------------------------------
# Distributed set-up


def setup_distributed(device):
    # (ddp, rank, local_rank, world_size, device): one process, or one rank of a torchrun
    # launch (which sets RANK, LOCAL_RANK and WORLD_SIZE), joined to the process group
    ddp = "RANK" in os.environ
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    device = harness.pick_device(device)
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


# -----------------------------------------------------------------------------
# Evaluation


@torch.no_grad()
def evaluate_val_loss(model, val_loader, val_steps, amp=None, stop_requested=None):
    # The mean loss over the val split's first val_steps windows of B*T + 1 tokens, as
    # build-nanogpt scores it. Window i is rank i % world's, so the tokens are the same for any
    # world size; the sums stay on the device (one host sync, at the end). amp: an autocast
    # dtype (torch.bfloat16) or None. None when a stop was asked for during the pass (on any
    # rank; stop_requested() says): it ends early rather than keep a scheduler's grace period
    # waiting.
    val_loader.load_state_dict({"epoch": 0, "pos": 0})
    sums = torch.zeros(3, device=val_loader.device)  # summed batch losses, batches, stops
    model.eval()
    for _ in range(val_loader.rank, val_steps, val_loader.world):
        if stop_requested is not None and stop_requested():
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


def val_data(data_root, cfg, manifest, enc, rank, world_size, device):
    # (loader, UTF-8 bytes of its scored tokens): the first val_tokens + 1 tokens of the val
    # split (fineweb.py makes it one shard), read in windows of B*T + 1; bits per byte = loss *
    # tokens / (ln 2 * the targets' bytes). (None, 0) without evaluation.
    B = cfg.batch_size
    T = cfg.seq_len
    val_shard = load_shards(data_root, "val", manifest)[0]
    if not cfg.eval_interval:
        return None, 0
    if cfg.val_tokens >= len(val_shard):
        fits = (len(val_shard) - 1) // (B * T) * (B * T)
        hint = f"pass --val_tokens {fits}" if fits else "lower --batch_size or --seq_len"
        raise ValueError(
            f"--val_tokens {cfg.val_tokens:,} is more than the val split holds"
            f" ({len(val_shard):,} tokens): {hint}, or --eval_interval 0"
        )
    targets = val_shard.map()[1 : cfg.val_tokens + 1]
    val_bytes = int(fineweb.token_byte_lengths(enc)[targets].sum())
    return DataLoaderLite([val_shard], B, T, rank, world_size, device=device), val_bytes


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


def hellaswag_data(cfg, enc, block_size, log):
    # HellaSwag in GPT-2's tokens, rendered once (hellaswag_eval.prepare): the official val
    # split (downloaded once) or --hellaswag_data's file; None when it is off or the data is in
    # another tokenizer's ids
    if not cfg.hellaswag_interval:
        return None
    if enc.name != "gpt2":
        log(f"HellaSwag skipped: it is in GPT-2's tokens, the data in {enc.name}'s")
        return None
    examples = hellaswag_eval.load_examples(cfg.hellaswag_data or None)
    return hellaswag_eval.prepare(examples, enc, block_size)


# -----------------------------------------------------------------------------
# Checkpoints: what one holds, and whether it can continue under this code


@dataclasses.dataclass
class TrainState:
    # What a run has done besides its weights, optimizer moments and place in the data: every
    # field is saved in each checkpoint and restored on resume (a field added here is too).
    step: int = 0  # optimizer steps taken
    tokens: int = 0  # trained on so far
    train_seconds: float = 0.0  # spent in training steps so far
    val_loss: float | None = None  # the last one measured
    spike_history: list = dataclasses.field(default_factory=list)  # (loss, norm) of recent steps


def make_checkpoint(cfg, raw_model, optimizers, train_loader, state, data):
    # everything a run needs to continue bit for bit, as plain data and tensors (the harness adds
    # the record of its code); data: the tokenizer and the corpus's fingerprint
    return {
        "model": raw_model.state_dict(),
        "model_config": dataclasses.asdict(raw_model.config),
        # each optimizer's state with its class: a resume into another optimizer is refused
        "optimizers": [dict(opt.state_dict(), kind=type(opt).__name__) for opt in optimizers],
        "loader": train_loader.state_dict(),
        "train_config": dataclasses.asdict(cfg),
        "data": data,
        **dataclasses.asdict(state),
    }


def resume(ckpt, cfg, raw_model, optimizers, train_loader, data):
    # a checkpoint's state restored into this run, checked first (harness.check_resumable); its
    # TrainState. The moments and step counts are the checkpoint's, the optimizers'
    # hyper-parameters this run's.
    harness.check_resumable(ckpt, raw_model, optimizers, cfg, data)
    raw_model.load_state_dict(ckpt["model"])
    for opt, saved in zip(optimizers, ckpt["optimizers"]):
        opt.load_state_dict(
            {"state": saved["state"], "param_groups": opt.state_dict()["param_groups"]}
        )
    train_loader.load_state_dict(ckpt["loader"])
    fields = [f.name for f in dataclasses.fields(TrainState)]
    return TrainState(**{name: ckpt[name] for name in fields if name in ckpt})


def load_model(source, device="cpu", dropout=None):
    # (model, tokenizer) from one of our checkpoints (.pt), a Hugging Face GPT-2 directory or a
    # hub name (these two with GPT-2's tokenizer); what cannot load is one ValueError line. The
    # model's dropout is `dropout`, or None: the checkpoint's (a Hugging Face model's: none).
    if not str(source).endswith(".pt"):
        harness.check_model_files(source)
        model = GPT.from_pretrained(str(source), dropout or 0.0)
        # GPT-2's tokenizer goes with it: a smaller table would be handed ids it does not hold
        if model.config.vocab_size < fineweb.GPT2_VOCAB_SIZE:
            raise ValueError(
                f"{source}: a vocabulary of {model.config.vocab_size:,} tokens, not GPT-2's"
                f" {fineweb.GPT2_VOCAB_SIZE:,}: load the .pt checkpoint it was exported from"
            )
        return model.to(device), fineweb.get_tokenizer()
    ckpt = harness.read_checkpoint(source)
    try:
        # (a field the checkpoint's code had and this one has not is left out: its weights say
        # whether this model can take them)
        saved = ckpt["model_config"]
        fields = {k: v for k, v in saved.items() if k in GPTConfig.__dataclass_fields__}
        if dropout is not None:
            fields["dropout"] = dropout
        model = GPT(GPTConfig(**fields))
        differ = harness.weight_differing(model, ckpt["model"])
        if differ:
            raise ValueError(
                f"{source} holds another model than this code builds ({differ} differs; was the"
                " model edited since?): use it with the code that made it (its run's code/ keeps"
                " it), or train this model from scratch"
            )
        model.load_state_dict(ckpt["model"])
        harness.check_finite(model, source)
        enc = fineweb.tokenizer_from_manifest(ckpt["data"]["tokenizer"])
    except (KeyError, TypeError, AttributeError, RuntimeError) as e:
        raise ValueError(f"{source} is not a checkpoint of train_gpt2.py's GPT ({e})") from None
    return model.to(device), enc


# -----------------------------------------------------------------------------
# Training


def seed_torch(seed, device):
    # torch's random numbers (dropout's) from `seed`: those of the CPU's generator and of this
    # process's GPU's, the ones its kernels draw from. (torch.manual_seed seeds every backend's
    # generators, checking each kind of device: 0.2 ms a call, a micro-step's at small sizes.)
    torch.default_generator.manual_seed(seed)
    if device.startswith("cuda"):
        torch.cuda.manual_seed(seed)
    if device == "mps":
        torch.mps.manual_seed(seed)


def build_model(cfg, enc, device, log):
    # from scratch with cfg's ModelConfig fields, or --init_from's model (saying which of those
    # fields it brings other values of); either way cfg's dropout
    if cfg.init_from == "scratch":
        # the data's tokenizer's ids; GPT-2's 50,257 padded to 50,304 (a multiple of 128): faster
        vocab_size = 50304 if enc.name == "gpt2" else enc.n_vocab
        shape = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(ModelConfig)}
        config = GPTConfig(block_size=cfg.seq_len, vocab_size=vocab_size, **shape)
        # a model too big for the device is refused before it is built (counted without memory)
        with torch.device("meta"):
            harness.check_fits(sum(p.numel() for p in GPT(config).parameters()), device)
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


def train(cfg, log=print):
    # Train as configured: one process, or one rank of a torchrun launch. Returns the final
    # metrics. The run (harness.py) reads the code first, before anything slow; rank 0 holds
    # log_dir once the ranks have met.
    run = harness.Run(cfg, log)
    harness.make_preset_data(cfg.data_root, PRESET_DATA)
    ddp, rank, local_rank, world_size, device = setup_distributed(cfg.device)
    with run:
        # ---- the set-up: data, model, optimizers, evaluation's data, the resume, the record
        device_type = device.split(":")[0]
        master_process = rank == 0
        B = cfg.batch_size
        T = cfg.seq_len
        grad_accum_steps = micro_steps(cfg, world_size)

        # data: fineweb.py's corpus, held for the run and every shard checked against its
        # manifest before training reads it (harness.py)
        data_root, manifest = run.open_corpus(cfg.data_root)
        enc = fineweb.tokenizer_from_manifest(manifest)
        data = {"tokenizer": fineweb.tokenizer_info(enc), "fingerprint": manifest["fingerprint"]}
        train_shards = load_shards(data_root, "train", manifest)
        train_loader = DataLoaderLite(
            train_shards, B, T, rank, world_size, cfg.shuffle, cfg.seed, device
        )
        val_loader, val_bytes = val_data(data_root, cfg, manifest, enc, rank, world_size, device)

        # the model and its optimizers: the same initial weights on every rank
        if device_type == "cuda":
            torch.set_float32_matmul_precision("high")  # TF32 for what autocast leaves in fp32
        torch.manual_seed(cfg.seed)
        raw_model = build_model(cfg, enc, device, run.log).to(device)
        muon_lr = cfg.muon_lr if cfg.optimizer == "muon" else 0.0
        optimizers = raw_model.configure_optimizers(
            cfg.weight_decay, cfg.max_lr, device_type, muon_lr, cfg.beta2
        )
        # (the tied token table counted once)
        run.log(
            f"{sum(p.numel() for p in raw_model.parameters()):,} parameters, {raw_model.config}"
        )
        # bf16 autocast on a GPU (its tensor cores); float32 elsewhere, where bf16 is emulated
        amp = torch.bfloat16 if device_type == "cuda" else None
        # the samples' prompt, checked now: the first sample comes after the run's first writes
        if cfg.sample_interval:
            prompt_ids(enc, cfg.sample_prompt, raw_model.config.block_size, "--sample_prompt")
        hella = hellaswag_data(cfg, enc, raw_model.config.block_size, run.log)

        # the checkpoint --resume names, if any, restored; then the run's start is recorded
        state = TrainState()
        ckpt = run.resume()
        if ckpt is not None:
            state = resume(ckpt, cfg, raw_model, optimizers, train_loader, data)
            harness.check_finite(raw_model, run.resumed_from)
        ckpt = None  # (its memory is the model's and optimizers' now)
        start_step = state.step
        # the model as built (--init_from's shape, not the flags'), the data it reads
        run.begin(
            start_step,
            device,
            model=dataclasses.asdict(raw_model.config),
            data=dict(data, dataset=manifest.get("dataset")),
        )
        time_budget = cfg.max_minutes * 60  # seconds of training (0: no bound)
        epochs = (cfg.max_steps - start_step) * cfg.total_batch_size / sum(map(len, train_shards))
        run.log(
            f"{B} x {T} x {world_size} rank(s) x {grad_accum_steps} micro-steps ="
            f" {cfg.total_batch_size:,} tokens a step; {cfg.max_steps - start_step} steps to go,"
            f" {epochs:.2f} epochs of the train split"
        )
        if time_budget:
            run.log(
                f"time-bounded: training ends after {cfg.max_minutes:g} minutes of training"
                f" steps ({state.train_seconds / 60:.2f} done), if before step {cfg.max_steps}"
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
        # the parameters, listed once: raw_model.parameters() walks the modules for them (0.1 ms
        # at small sizes), and the step clears and clips their gradients
        params = list(raw_model.parameters())
        # MFU: the FLOPs of a step against the GPUs' peak (None off CUDA or on an unknown GPU)
        peak = harness.peak_flops(device)
        flops_per_step = raw_model.flops_per_token(T) * cfg.total_batch_size
        stopping = False
        time_up = time_budget > 0 and state.train_seconds >= time_budget

        # ---- the loop: evaluation, the checkpoint, one optimization step, the log line. A stop
        # signal only asks (run.stop_requested): the run ends at a step's end with a checkpoint.
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
                loss = evaluate_val_loss(raw_model, val_loader, val_steps, amp, run.stop_requested)
                stopping = loss is None
                if loss is not None:
                    state.val_loss = loss
                    bpb = loss * cfg.val_tokens / (math.log(2) * val_bytes)
                    run.report(step, val=loss, bpb=bpb)

            # HellaSwag every hellaswag_interval steps and at the end
            hella_due = hella is not None and (step % cfg.hellaswag_interval == 0 or last_step)
            if hella_due and not stopping:
                result = hellaswag_eval.evaluate(raw_model, hella, device, rank, world_size, amp)
                run.report(step, hella=result["acc_norm"])

            # samples from the model, rank 0 only
            sample_due = cfg.sample_interval and (step % cfg.sample_interval == 0 or last_step)
            if master_process and sample_due and not stopping:
                texts = sample_texts(
                    raw_model, enc, cfg.sample_prompt, 4, cfg.sample_length, seed=cfg.seed
                )
                for i, text in enumerate(texts):
                    run.log(f"sample {i}: {text}")

            # checkpoint every ckpt_interval steps, at the end, and when a stop was asked for
            ckpt_due = cfg.ckpt_interval and step % cfg.ckpt_interval == 0
            if step > start_step and (ckpt_due or last_step or stopping):
                state.step = step
                checkpoint = make_checkpoint(cfg, raw_model, optimizers, train_loader, state, data)
                run.save(step, checkpoint, last=last_step or stopping)
            if last_step or stopping:
                break

            # one optimization step: grad_accum_steps micro-steps of B x T tokens
            t0 = time.time()
            if cfg.overfit_batch:
                # the run's first batch at every step, on any number of ranks and after a resume
                train_loader.load_state_dict({"epoch": 0, "pos": 0})
            # (set to None: the backward pass writes them anew)
            for p in params:
                p.grad = None
            loss_accum = torch.zeros((), device=device)
            for micro_step in range(grad_accum_steps):
                x, y = train_loader.next_batch()
                # dropout's random numbers are the window's (the run's n-th read): the same on
                # any number of ranks and after a resume, with no random state to save
                window = (step * grad_accum_steps + micro_step) * world_size + rank
                seed_torch(cfg.seed + window, device)
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

            # The step's results, summed over the ranks in one all-reduce and brought to the host
            # with the gradient norm in one sync: the mean loss, whether a rank was asked to stop
            # (all ranks stop together) and rank 0's training clock (a time-bounded run's LR and
            # last step are the same on every rank). A scalar added here (a 0-d tensor on the
            # device, this rank's share of the mean: / world_size) is logged with the loss.
            seconds = state.train_seconds + time.time() - t0 if master_process else 0.0
            sums = {
                "train": loss_accum / world_size,
                "stop": torch.tensor(float(run.stop_requested()), device=device),
                "clock": torch.tensor(seconds, device=device),
            }
            summed = torch.stack(list(sums.values()))
            if ddp:
                dist.all_reduce(summed)
            norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip or math.inf)
            synced = torch.cat([summed, norm.view(1)]).tolist()
            values = dict(zip(sums, synced))
            norm = synced[-1]
            stopping = values.pop("stop") > 0
            seconds = values.pop("clock")

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
            loss_value = values["train"]
            skip = not math.isfinite(loss_value + norm)
            if skip and not cfg.skip_nonfinite:
                raise ValueError(
                    f"non-finite loss {loss_value} or grad norm {norm} at step {step}: the run"
                    " diverged (a flag or an edit since the last good run: --max_lr, the model);"
                    " --resume auto continues from the last checkpoint, --skip_nonfinite true"
                    " skips such updates"
                )
            history = state.spike_history
            if not skip and cfg.skip_spikes and len(history) >= 16:
                past = np.array(history)  # (n, 2)
                z = ((np.array([loss_value, norm]) - past.mean(0)) / (past.std(0) + 1e-8)).max()
                skip = z > cfg.skip_spikes
                run.report(step, spike=z)
            if not skip:
                for opt in optimizers:
                    opt.step()
                state.spike_history = (history + [[loss_value, norm]])[-128:]

            # The log line; the step's time includes its wait for the GPU (the sync above). The
            # tokens and training time so far are what comparisons of runs are drawn against.
            dt = time.time() - t0
            step_tokens = grad_accum_steps * B * T * world_size
            state.tokens += step_tokens
            state.train_seconds += dt
            values.update(
                lr=lr,
                norm=norm,
                ms=dt * 1000,
                tok_per_s=step_tokens / dt,
                epoch=train_loader.epochs_read(),
            )
            if peak:
                values["mfu"] = flops_per_step / dt / (peak * world_size)
            run.report(step, **values, tokens=state.tokens, time=state.train_seconds)

        run.end(last_step, step)
        return {
            "step": step,
            "val_loss": state.val_loss,
            "stopped": not last_step,
            "log_dir": cfg.log_dir,
        }


def main(argv=None):
    # the command line (harness.main): every TrainConfig field a flag, a bad one a single line
    harness.main(train, TrainConfig, PRESETS, argv)


if __name__ == "__main__":
    main()
