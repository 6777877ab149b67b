"""
HellaSwag evaluation for our GPT (and any GPT-2 that train_gpt2.load_model can read).

Each example is a context and four candidate endings, one of them right. We score it completion style, the
way a base model without instruction tuning can answer: feed `context + " " + ending` for each of the four
endings and compute the model's cross-entropy over the ending tokens only. The prediction is the ending with
the lowest total loss (`acc`) or the lowest mean loss per token (`acc_norm`, which does not favour short
endings). Multiple-choice style (showing all four endings and asking for a letter) needs a stronger model.

The scores are those of running each of the 4 rows whole (`score_examples(..., packed=False)` does exactly
that, as the reference), computed with less work: an example's context and its 4 endings go in one packed row,
so the context, which the endings share, runs once; position ids and an attention mask give every ending the
view it has in its own row; the vocabulary-wide lm_head runs only at the scored positions.

Reference numbers with this scoring on the 10,042 validation examples:
    OpenAI GPT-2 124M (`--model gpt2`): acc_norm 0.2955
    GPT-3 Small 124M (GPT-3 paper, Brown et al. 2020, zero-shot): acc_norm 0.337
Random guessing gives 0.25.

Run it:
    python hellaswag.py --model gpt2 --device cuda --dtype bfloat16     # OpenAI's 124M (downloads it)
    python hellaswag.py --model log/model_19073.pt --limit 1000          # one of our checkpoints
    python hellaswag.py --model out/gpt2-ours --data my/hellaswag_val.jsonl

The split files come from https://github.com/rowanz/hellaswag (downloaded once into hellaswag_data/ next
to this file; HF_DATASETS_OFFLINE=1 forbids the download). train_gpt2.py calls `evaluate` during training,
passing its tokenizer; this module imports train_gpt2 only in its command line (run), so a training run
never loads train_gpt2.py twice. Importing this module does nothing but define things.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Optional, Sequence

if __name__ == "__main__":  # Ctrl-C at any moment, torch's import included: one line, no traceback
    if signal.getsignal(signal.SIGINT) != signal.SIG_IGN:  # a background job (`cmd &`) was started ignoring it
        signal.signal(signal.SIGINT, lambda signum, frame: sys.exit("hellaswag.py: interrupted"))

import torch
import torch.nn.functional as F

from run_files import Parser, any_rank, check_device, check_path

HERE = Path(__file__).resolve().parent
DEFAULT_CACHE_DIR = HERE / "hellaswag_data"
DATA_URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_{split}.jsonl"
SPLITS = ("train", "val", "test")
N_ENDINGS = 4

# ----------------------------------------------------------------------------------------------------------
# Data: download, read, validate


def is_offline() -> bool:
    """HF_DATASETS_OFFLINE=1, the switch our tests and offline machines already set, also forbids this download."""
    return os.environ.get("HF_DATASETS_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def download_split(split: str, cache_dir: str | os.PathLike = DEFAULT_CACHE_DIR, progress: bool = True) -> Path:
    """Path of hellaswag_{split}.jsonl in cache_dir, downloading it first (tqdm bar) if it is not there yet."""
    if split not in SPLITS:
        raise ValueError(f"unknown HellaSwag split {split!r}; choose one of {SPLITS}")
    dest = Path(cache_dir) / f"hellaswag_{split}.jsonl"
    if dest.is_file():
        return dest
    url = DATA_URL.format(split=split)
    hint = f"pass --data PATH (data=PATH) to a local copy of hellaswag_{split}.jsonl, or place it at {dest}"
    if is_offline():
        raise FileNotFoundError(
            f"HellaSwag {split} split is not cached at {dest} and HF_DATASETS_OFFLINE=1 forbids downloading it; {hint}"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    # A per-process temporary name, renamed only when complete: an interrupted download never looks cached, and
    # several ranks downloading at once each finish their own file before the atomic rename.
    tmp = dest.with_name(f"{dest.name}.tmp{os.getpid()}")
    try:
        _fetch(url, tmp, progress)
        os.replace(tmp, dest)
    except (urllib.error.URLError, http.client.HTTPException, OSError) as e:  # URLError/timeouts are OSErrors
        tmp.unlink(missing_ok=True)
        raise FileNotFoundError(
            f"HellaSwag {split} split is not cached at {dest} and downloading {url} failed ({e}); {hint}"
        ) from None
    return dest


def _fetch(url: str, path: Path, progress: bool):
    """Stream url into path with a progress bar; a short body is an error, not a truncated dataset."""
    from tqdm import tqdm

    with urllib.request.urlopen(url, timeout=30) as response, open(path, "wb") as f:
        total = int(response.headers.get("Content-Length") or 0) or None
        with tqdm(total=total, unit="B", unit_scale=True, desc=path.name.split(".tmp")[0], disable=not progress) as bar:
            size = 0
            while chunk := response.read(1 << 20):
                f.write(chunk)
                size += len(chunk)
                bar.update(len(chunk))
    if total is not None and size != total:
        raise OSError(f"download incomplete: {size} of {total} bytes")


def check_example(example) -> None:
    """Raise ValueError naming the problem unless example has a non-empty ctx, 4 string endings, a label in 0..3."""
    if not isinstance(example, dict):
        raise ValueError(f"an example must be a JSON object, got {type(example).__name__}")
    ctx = example.get("ctx")
    if not isinstance(ctx, str) or not ctx:
        raise ValueError(f"'ctx' must be a non-empty string, got {ctx!r}")
    endings = example.get("endings")
    if not isinstance(endings, list) or len(endings) != N_ENDINGS:
        got = f"{len(endings)} endings" if isinstance(endings, list) else repr(endings)
        raise ValueError(f"'endings' must be a list of exactly {N_ENDINGS} endings, got {got}")
    if not all(isinstance(e, str) for e in endings):
        raise ValueError("'endings' must all be strings")
    if "label" not in example:
        raise ValueError("'label' is missing (HellaSwag's test split is unlabelled; evaluate on val)")
    label = example["label"]
    if not isinstance(label, int) or isinstance(label, bool) or not 0 <= label < N_ENDINGS:
        raise ValueError(f"'label' must be an integer in 0..{N_ENDINGS - 1}, got {label!r}")


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Validated examples of a HellaSwag jsonl file; ValueError with file:line for anything malformed."""
    path = check_path(path, "HellaSwag data file", is_dir=False)
    examples = []
    try:
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    example = json.loads(line)
                    check_example(example)
                except ValueError as e:  # json.JSONDecodeError is a ValueError
                    raise ValueError(f"{path}:{lineno}: {e}") from None
                examples.append(example)
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e})") from None
    if not examples:
        raise ValueError(f"{path}: no examples")
    return examples


def load_examples(
    split: str = "val", data: str | os.PathLike | None = None, cache_dir: str | os.PathLike | None = None
) -> list[dict]:
    """HellaSwag examples from `data` if given, else from the cached (downloaded on first use) split file."""
    if data is None:
        data = download_split(split, DEFAULT_CACHE_DIR if cache_dir is None else cache_dir)
    return read_jsonl(data)


def load_for_training(data: str, limit: int, tokenizer: str, rank: int, world_size: int, device) -> tuple[list, str]:
    """(examples, '') for a training run's in-loop evaluation, or ([], why not) on every rank alike, so that all ranks
    take part in evaluate() or none does: a model in another tokenizer, or the official split unavailable (offline).
    A `data` file that cannot be read stops the run before it starts, on every rank. Rank 0 reads (downloads) first:
    the file is fetched once."""
    if tokenizer != "gpt2":
        return [], f"the model's tokenizer is {tokenizer}, not GPT-2's"
    examples, error = [], ""
    if world_size > 1 and rank:
        torch.distributed.barrier()  # the others wait until rank 0 has read
    try:
        examples = load_examples("val", data=data or None)[: limit or None]
    except (OSError, ValueError) as e:
        error = str(e)
    if world_size > 1 and not rank:
        torch.distributed.barrier()
    if any_rank(bool(error), world_size, device):
        if data:
            raise ValueError(error or f"{data}: unreadable on another rank")
        return [], error or "unavailable on another rank"
    return examples, ""


# ----------------------------------------------------------------------------------------------------------
# Rendering and scoring


def render_example(example: dict, enc) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(tokens (4, L) long, mask (4, L) long, label): context then " " + ending per row, mask 1 on ending
    tokens, rows right-padded with 0 to the longest one. enc: the GPT-2 tokenizer (fineweb.get_tokenizer())."""
    check_example(example)
    # encode_ordinary: text that happens to spell "<|endoftext|>" is plain text here, not a special token
    ctx_tokens = enc.encode_ordinary(example["ctx"])
    if not ctx_tokens:
        raise ValueError(f"'ctx' {example['ctx']!r} has no tokens: the first ending token would have no prediction")
    # the leading space: GPT-2's BPE attaches it to the next word, as the ending would appear in running text
    rows = [ctx_tokens + enc.encode_ordinary(" " + ending) for ending in example["endings"]]
    length = max(len(row) for row in rows)
    tokens = torch.zeros((N_ENDINGS, length), dtype=torch.long)
    mask = torch.zeros((N_ENDINGS, length), dtype=torch.long)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = torch.tensor(row)
        mask[i, len(ctx_tokens) : len(row)] = 1
    return tokens, mask, example["label"]


def ending_losses(
    outputs: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor, head=None, vocab_limit: Optional[int] = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row (sum, mean) cross-entropy (N,) float32 over the tokens where mask is 1.

    outputs (N, L, V) are the model's logits for tokens (N, L): outputs[:, t] predict tokens[:, t + 1], so the
    loss of token t + 1 is taken from position t. Or, given `head` (the model's lm_head), outputs (N, L, C) are
    its final hidden states, and head makes logits at the K scored positions only: the vocabulary-wide matmul
    at every position is a large part of a forward pass. Only the K scored positions go through the softmax,
    never the whole (N, L, V) tensor. Padding (mask 0) changes nothing. Ids >= vocab_limit (the tokenizer's
    n_vocab; a padded table's extra rows) are left out of the softmax: no text ever holds them."""
    if not outputs.shape[:2] == tokens.shape == mask.shape:
        shapes = f"outputs {tuple(outputs.shape)}, tokens {tuple(tokens.shape)}, mask {tuple(mask.shape)}"
        raise ValueError(f"need outputs (N, L, V or C), tokens (N, L), mask (N, L); got {shapes}")
    mask = mask.bool()
    if mask[:, 0].any():
        raise ValueError("mask is 1 at position 0, a token nothing predicts: the context must come first")
    target_mask = mask[:, 1:]  # (N, L-1): does position t predict a scored token (t + 1)?
    count = target_mask.sum(dim=1)  # (N,)
    if (count == 0).any():
        raise ValueError("a row has no scored tokens (mask all 0)")
    rows, cols = target_mask.nonzero(as_tuple=True)  # (K,), (K,)
    logits = outputs[rows, cols] if head is None else head(outputs[rows, cols])  # (K, V)
    logits = logits.float()  # a new tensor: indexing and the head each make one, so writing into it is safe
    if vocab_limit is not None:
        logits[:, vocab_limit:] = float("-inf")  # padded ids are never targets; keep them out of the softmax too
    token_loss = F.cross_entropy(logits, tokens[rows, cols + 1], reduction="none")  # (K,)
    # Scatter into a dense (N, L-1) grid and sum rows: deterministic on GPU, unlike an atomic index_add.
    dense = torch.zeros(target_mask.shape, dtype=torch.float32, device=outputs.device)
    dense[rows, cols] = token_loss
    sum_loss = dense.sum(dim=1)
    return sum_loss, sum_loss / count


def collate(rendered: Sequence[tuple[torch.Tensor, torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack the 4 rows of several rendered examples into tokens, mask (4 * n, L), right-padded with 0.

    Right-padding is safe for a causal model: a position attends only to itself and earlier ones, so the pad
    tokens after an ending cannot change its logits; and the mask is 0 there, so they are never scored."""
    length = max(tokens.size(1) for tokens, _, _ in rendered)
    tokens = torch.cat([F.pad(t, (0, length - t.size(1))) for t, _, _ in rendered])
    mask = torch.cat([F.pad(m, (0, length - m.size(1))) for _, m, _ in rendered])
    return tokens, mask


def _render_all(examples: Sequence[dict], indices: Sequence[int], block_size: int, vocab_size: int, enc) -> list:
    """Rendered examples, checked to fit the model's context and vocabulary (indices name them in errors)."""
    rendered = []
    for i, example in zip(indices, examples):
        try:
            item = render_example(example, enc)
        except ValueError as e:
            raise ValueError(f"example {i}: {e}") from None
        if item[0].size(1) > block_size:
            raise ValueError(
                f"example {i} (ind {example.get('ind', '?')}): context + ending is {item[0].size(1)} tokens, "
                f"longer than the model's block_size {block_size}; not truncating, which would change the task"
            )
        if int(item[0].max()) >= vocab_size:  # a test-size model: the embedding lookup would fail unhelpfully
            raise ValueError(
                f"example {i}: token id {int(item[0].max())} >= the model's vocab_size {vocab_size}; "
                "HellaSwag needs a model with the GPT-2 vocabulary"
            )
        rendered.append(item)
    return rendered


def _packed_length(item: tuple[torch.Tensor, torch.Tensor, int]) -> int:
    """Tokens in an example's packed row: the context once, then each ending but its last token."""
    tokens, mask, _ = item
    return int(mask[0].argmax()) + int(mask.sum()) - N_ENDINGS  # argmax: the first 1, i.e. the context length


def _batches(lengths: list[int], batch_size: int) -> list[list[int]]:
    """Indices 0..n-1 in batches of at most batch_size, similar lengths together so that little compute goes
    to padding. Which examples share a batch does not change their scores: this is only a matter of speed."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def _losses_full(model, batch: list, device, vocab_limit: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum, mean) losses (4n,) the straightforward way: every row whole, logits at every position."""
    tokens, mask = (t.to(device) for t in collate(batch))  # (4n, L)
    logits, _ = model(tokens)  # (4n, L, V)
    return ending_losses(logits, tokens, mask, vocab_limit=vocab_limit)


def pack(batch: list) -> dict[str, torch.Tensor]:
    """The n examples of a batch packed one per row, for _losses_packed.

    Row e holds example e's context once, then each of its 4 endings without its last token (whose output
    predicts nothing we score), right-padded to P. Each ending has the positions it has in its own full row
    (starting at the context length again) and sees only the context and its own earlier tokens, so every
    hidden state is the one the straightforward way computes. The model's inputs: tokens, pos (n, P) and
    attn_mask (n, 1, P, P). For scoring, one window per ending (4n of them, W = 1 + the longest ending):
    window_tokens (the last context token, then the ending), window_mask (1 on the ending), and where its
    hidden states are: packed row `row` (4n,), positions `where` (4n, W)."""
    rows, positions, segments, windows = [], [], [], []
    for tokens, mask, _ in batch:
        c = int(mask[0].argmax())
        row, pos, seg = tokens[0, :c].tolist(), list(range(c)), [0] * c
        for i in range(N_ENDINGS):
            ending = tokens[i, mask[i].bool()].tolist()
            start = len(row)  # where this ending's tokens but the last go
            windows.append(([row[c - 1]] + ending, [c - 1] + list(range(start, start + len(ending) - 1))))
            row += ending[:-1]
            pos += range(c, c + len(ending) - 1)
            seg += [i + 1] * (len(ending) - 1)
        rows.append(row)
        positions.append(pos)
        segments.append(seg)
    P, W = max(map(len, rows)), max(len(w) for w, _ in windows)

    def padded(lists, width, value):
        return torch.tensor([x + [value] * (width - len(x)) for x in lists], dtype=torch.long)

    seg = padded(segments, P, -1)  # (n, P); padding is segment -1: it sees the context and padding, never scored
    causal = torch.ones(P, P, dtype=torch.bool).tril()  # (P, P): query q sees keys k <= q
    same = (seg[:, None, :] == 0) | (seg[:, None, :] == seg[:, :, None])  # (n, P, P): context, or the same segment
    return dict(tokens=padded(rows, P, 0), pos=padded(positions, P, 0), attn_mask=(causal & same)[:, None],
                row=torch.arange(len(batch)).repeat_interleave(N_ENDINGS),
                where=padded([w for _, w in windows], W, 0), window_tokens=padded([t for t, _ in windows], W, 0),
                window_mask=padded([[0] + [1] * (len(t) - 1) for t, _ in windows], W, 0))


def _losses_packed(model, batch: list, device, vocab_limit: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same losses as _losses_full with less compute: each context runs once, not once per ending, no
    ending's last token runs at all, and lm_head runs only where a token is scored. Exact: a token's hidden state
    depends only on the tokens it sees and their positions, which pack() keeps as in the full rows."""
    p = {k: v.to(device) for k, v in pack(batch).items()}
    hidden = model.features(p["tokens"], pos=p["pos"], attn_mask=p["attn_mask"])  # (n, P, C)
    windows = hidden[p["row"][:, None], p["where"]]  # (4n, W, C): the hidden states of each ending's window
    return ending_losses(windows, p["window_tokens"], p["window_mask"], head=model.lm_head, vocab_limit=vocab_limit)


@torch.no_grad()
def _score_rendered(
    model,
    rendered: list,
    device,
    batch_size: int,
    autocast_dtype: Optional[torch.dtype],
    vocab_limit: int,
    progress: bool = False,
    packed: bool = True,
    should_stop: Optional[Callable[[], bool]] = None,
    world_size: int = 1,
) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """(sum_loss, mean_loss), each (n, 4) float32 on the CPU, in the order of `rendered`; None if should_stop(),
    asked before each batch (as often on every rank of world_size: it may be a collective), said to stop."""
    from tqdm import tqdm

    length = _packed_length if packed else (lambda item: item[0].size(1))  # what a batch is padded to
    batches = _batches([length(item) for item in rendered], batch_size)
    if should_stop is not None and world_size > 1:  # ranks may have a batch more or less: ask as often as the most
        count = torch.tensor([len(batches)], device=device)
        torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MAX)
        batches += [[]] * (int(count.item()) - len(batches))
    sum_loss = torch.zeros((len(rendered), N_ENDINGS))
    mean_loss = torch.zeros((len(rendered), N_ENDINGS))
    device_type = torch.device(device).type
    was_training = model.training
    model.eval()
    try:
        for batch in tqdm(batches, desc="hellaswag", unit="batch", disable=not progress):
            if should_stop is not None and should_stop():
                return None
            if not batch:
                continue
            items = [rendered[i] for i in batch]
            with torch.autocast(device_type=device_type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                s, m = (_losses_packed if packed else _losses_full)(model, items, device, vocab_limit)
            sum_loss[batch] = s.view(-1, N_ENDINGS).cpu()
            mean_loss[batch] = m.view(-1, N_ENDINGS).cpu()
    finally:
        model.train(was_training)
    return sum_loss, mean_loss


def score_examples(
    model,
    examples: Sequence[dict],
    device,
    *,
    enc,
    batch_size: int = 8,
    autocast_dtype=None,
    progress=False,
    packed: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sum_loss (n, 4), mean_loss (n, 4), labels (n,)) for examples, in order. acc's prediction is
    sum_loss.argmin(1), acc_norm's mean_loss.argmin(1). enc: the GPT-2 tokenizer. packed=False scores the
    straightforward way (every row whole, logits everywhere): the reference the fast default must reproduce."""
    rendered = _render_all(examples, range(len(examples)), model.config.block_size, model.config.vocab_size, enc)
    sum_loss, mean_loss = _score_rendered(model, rendered, device, batch_size, autocast_dtype, enc.n_vocab, progress,
                                          packed)
    return sum_loss, mean_loss, torch.tensor([label for _, _, label in rendered], dtype=torch.long)


def evaluate(
    model,
    examples: Sequence[dict],
    device,
    *,
    enc,
    batch_size: int = 8,
    autocast_dtype: Optional[torch.dtype] = None,
    rank: int = 0,
    world_size: int = 1,
    progress: bool = False,
    should_stop: Optional[Callable[[], bool]] = None,
) -> Optional[dict]:
    """HellaSwag accuracy of our GPT: dict(n, correct, correct_norm, acc, acc_norm) over all examples, with
    enc the GPT-2 tokenizer (fineweb.get_tokenizer(); passed in, the model's own).

    batch_size counts examples per batch (one packed row each). Under DDP every rank calls this with the same
    examples and its own rank; rank r scores examples i % world_size == r and the counts are all-reduced, so
    every rank returns the single-process result. Pass the plain model (not the DDP wrapper, and uncompiled:
    every batch has a new length). It runs in eval mode without gradients and restores the model's mode.
    should_stop() is asked before each batch, the same number of times on every rank; True ends it: None."""
    if not examples:
        raise ValueError("no HellaSwag examples to evaluate")
    if not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank {rank}, world_size {world_size}")
    indices = range(rank, len(examples), world_size)
    error = None
    try:
        config = model.config
        rendered = _render_all([examples[i] for i in indices], indices, config.block_size, config.vocab_size, enc)
    except ValueError as e:
        error = e
    if any_rank(error is not None, world_size, device):
        raise error or ValueError("HellaSwag examples failed validation on another rank (see its error)")
    scores = _score_rendered(model, rendered, device, batch_size, autocast_dtype, enc.n_vocab, progress,
                             should_stop=should_stop, world_size=world_size)
    if scores is None:
        return None
    sum_loss, mean_loss = scores
    labels = torch.tensor([label for _, _, label in rendered], dtype=torch.long)
    correct = (sum_loss.argmin(dim=1) == labels).sum()
    correct_norm = (mean_loss.argmin(dim=1) == labels).sum()
    counts = torch.tensor([len(rendered), correct, correct_norm], dtype=torch.long, device=device)
    if world_size > 1:
        torch.distributed.all_reduce(counts)  # sum over ranks
    n, correct, correct_norm = counts.tolist()
    return dict(n=n, correct=correct, correct_norm=correct_norm, acc=correct / n, acc_norm=correct_norm / n)


# ----------------------------------------------------------------------------------------------------------
# CLI


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = Parser(prog="hellaswag.py", description="HellaSwag accuracy (completion style) of a GPT-2 model.")
    p.add_argument("--model", default="gpt2", help="gpt2|gpt2-medium|gpt2-large|gpt2-xl, an HF directory, or our .pt")
    p.add_argument("--device", default="auto", help="auto|cpu|cuda|cuda:N|mps (auto: cuda, else mps, else cpu)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="bfloat16: run under autocast")
    p.add_argument("--split", default="val", choices=SPLITS, help="official split to download (test has no labels)")
    p.add_argument("--data", default=None, help="a local HellaSwag jsonl file instead of the downloaded split")
    p.add_argument("--cache_dir", default=str(DEFAULT_CACHE_DIR), help="where downloaded split files are kept")
    p.add_argument("--limit", type=int, default=None, help="evaluate only the first N examples")
    p.add_argument("--batch_size", type=int, default=8, help="examples (4 rows each) per batch")
    args = p.parse_args(argv)
    if args.limit is not None and args.limit < 1:
        p.error(f"--limit must be >= 1, got {args.limit}")
    if args.batch_size < 1:
        p.error(f"--batch_size must be >= 1, got {args.batch_size}")
    return args


def run(args: argparse.Namespace) -> dict:
    """Load data and model as the arguments say, evaluate, print a summary; the metrics dict."""
    from train_gpt2 import load_model  # here, not at the top: see the docstring

    examples = load_examples(args.split, args.data, args.cache_dir)[: args.limit]
    device = check_device(args.device)
    autocast_dtype = torch.bfloat16 if args.dtype == "bfloat16" else None
    model, enc = load_model(args.model, device)
    if enc.name != "gpt2":
        raise ValueError(f"{args.model} was trained with the {enc.name} tokenizer; HellaSwag needs GPT-2's")
    print(f"{args.model}: {model.num_params() / 1e6:.1f}M params on {device} ({args.dtype}), {len(examples)} examples")
    result = evaluate(model, examples, device, enc=enc, batch_size=args.batch_size,
                      autocast_dtype=autocast_dtype, progress=True)
    print(f"{result['n']} acc: {result['acc']:.4f} acc_norm: {result['acc_norm']:.4f}")
    return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        run(args)
    except (FileNotFoundError, ValueError, OSError) as e:  # user errors: bad paths, bad data, no network
        message = " ".join(str(e).split())  # one line, even for multi-line messages from transformers
        print(f"hellaswag.py: error: {message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
