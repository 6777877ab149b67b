"""
HellaSwag (https://github.com/rowanz/hellaswag) as the training loop scores it, completion
style, for any model that maps tokens to logits: its examples, their rendering into rows of
tokens, and the scoring.

Each example is a context and 4 endings, one of them right. Each ending makes a plain row,
context + " " + ending, and the model's cross-entropy is taken over the ending's tokens only. The
pick is the ending with the lowest summed loss (acc) or the lowest mean loss per token (acc_norm,
which does not favour short endings). A base model can answer this way; the multiple-choice style
(all 4 endings shown, answer a letter) needs a stronger model.

The examples: the official val split, downloaded once from the Hugging Face hub (Rowan/hellaswag,
as parquet) into the hub's cache, or a local rowanz .jsonl or HF-format .parquet. A run calls
load_examples() and prepare() once, and evaluate() every so often.

hellaswag.py is the command line (OpenAI's GPT-2 and our checkpoints): it builds our models with
train_gpt2.py's code, which imports this module, so this one imports neither. Importing it does
nothing.
"""

import json
import math
import os

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

COLUMNS = ("ctx", "endings", "label")
# rows per forward pass: the logits take rows x longest x vocab
BATCH_ROWS = 64
# a batch's width is rounded up to a multiple of this: on a GPU each distinct width builds its
# own attention kernels (cuDNN a graph per shape), so a run builds a handful, not one a length
WIDTH_STEP = 32

# -----------------------------------------------------------------------------
# data


def check_example(example, where):
    """The example as {"ctx", "endings" (4), "label" int}, or a
    one-line ValueError naming where it is and what is wrong."""
    if not isinstance(example, dict) or not all(k in example for k in COLUMNS):
        raise ValueError(f"{where}: need an object with keys ctx, endings, label")
    endings = example["endings"]
    texts = [example["ctx"], *endings] if isinstance(endings, list) else []
    if len(texts) != 5 or not all(isinstance(s, str) for s in texts):
        raise ValueError(f"{where}: need a string ctx and 4 string endings")
    # HF's parquet keeps the label as a string, "0" to "3"
    label = example["label"]
    text = label if isinstance(label, str) else repr(label)
    if text not in ("0", "1", "2", "3"):
        raise ValueError(f"{where}: label {label!r} is not 0..3 (the test split has none)")
    return {"ctx": example["ctx"], "endings": endings, "label": int(text)}


def read_jsonl(path):
    """Examples of a rowanz-format .jsonl file, one a line."""
    examples = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                example = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not JSON ({e.msg})") from None
            examples.append(check_example(example, f"{path}:{lineno}"))
    return examples


def read_parquet(path):
    """Examples of an HF-format .parquet file (label a string)."""
    import pyarrow.parquet as pq

    # not parquet: pyarrow's ValueError names the file
    table = pq.read_table(path)
    missing = [c for c in COLUMNS if c not in table.column_names]
    if missing:
        raise ValueError(f"{path}: no column {missing[0]!r} (need ctx, endings, label)")
    rows = enumerate(table.select(list(COLUMNS)).to_pylist())
    return [check_example(row, f"{path}: row {i}") for i, row in rows]


def download_val():
    """Path of the official val split (10,042 examples) in the
    Hugging Face hub's cache, downloaded there on first use."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return hf_hub_download(
            "Rowan/hellaswag",
            "default/validation/0000.parquet",
            repo_type="dataset",
            revision="refs/convert/parquet",
        )
    except (LocalEntryNotFoundError, HfHubHTTPError) as e:
        # offline (HF_HUB_OFFLINE=1) or no network, and not cached; or the hub said no
        raise ValueError(
            "HellaSwag's val split is not in the Hugging Face cache, and the hub"
            f" is out of reach ({type(e).__name__}): pass a local copy (.jsonl or"
            " .parquet) with hellaswag.py --data FILE or train_gpt2.py --hellaswag_data FILE"
        ) from None


def load_examples(data=None, limit=0):
    """HellaSwag examples [{"ctx", "endings" (4), "label" int}]
    from data (a rowanz .jsonl, or an HF .parquet) or, data None,
    the official val split; limit > 0 keeps the first limit."""
    path = download_val() if data is None else str(data)
    # a FIFO or a device could block for ever
    if not os.path.isfile(path):
        raise ValueError(f"{path}: no such file, or not a regular file")
    reader = read_parquet if path.endswith(".parquet") else read_jsonl
    try:
        examples = reader(path)
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None
    except OSError as e:
        raise ValueError(f"{path}: cannot read it ({e.strerror or type(e).__name__})") from None
    if not examples:
        raise ValueError(f"{path}: no examples")
    return examples[: limit or None]


# -----------------------------------------------------------------------------
# rendering and scoring


def render_example(example, enc):
    """(tokens (4, L) long, mask (4, L) long, label): row i is the
    context then ending i, right-padded with 0 to the longest row;
    the mask is 1 on the ending's tokens."""
    # encode_ordinary: text spelling <|endoftext|> stays text
    ctx = enc.encode_ordinary(example["ctx"])
    # the space goes with the ending, as GPT-2's BPE splits words
    endings = [enc.encode_ordinary(" " + e) for e in example["endings"]]
    rows = [torch.tensor(ctx + e) for e in endings]
    masks = [torch.tensor([0] * len(ctx) + [1] * len(e)) for e in endings]
    tokens = pad_sequence(rows, batch_first=True)
    mask = pad_sequence(masks, batch_first=True)
    return tokens, mask, example["label"]


def prepare(examples, enc, block_size):
    """Render and check every example, once per run, for evaluate().

    A dict of CPU tensors over R = 4 * n plain rows, row 4 * i + j
    being example i's context + ending j:
      tokens (R, W): render_example's rows, right-padded with 0
      start (R,): where the ending begins (the context's length)
      count (R,): the ending's tokens
      order (R,): the rows, shortest first, for batches of little
        padding; labels (n,); and n_vocab, the tokenizer's size.
    """
    if not examples:
        raise ValueError("no HellaSwag examples to prepare")
    token_rows = []
    mask_rows = []
    for i, example in enumerate(examples):
        tokens, mask, _ = render_example(example, enc)
        # nothing would predict the ending's first token
        if mask[:, 0].any():
            raise ValueError(f"example {i}: the context is empty")
        if tokens.size(1) > block_size:
            raise ValueError(
                f"example {i}: context + ending is {tokens.size(1)} tokens,"
                f" more than block_size {block_size}"
            )
        token_rows.extend(tokens)
        mask_rows.extend(mask)
    mask = pad_sequence(mask_rows, batch_first=True)
    # the mask's first 1 is where the ending begins
    start = mask.argmax(dim=1)
    count = mask.sum(dim=1)
    return dict(
        tokens=pad_sequence(token_rows, batch_first=True),
        start=start,
        count=count,
        order=torch.argsort(start + count, stable=True),
        labels=torch.tensor([ex["label"] for ex in examples]),
        n_vocab=enc.n_vocab,
    )


def ending_logits(model, x, start, n_ends, n_vocab, autocast_dtype=None):
    """(logits (B, E, n_vocab) float32, targets (B, E)): the model's
    outputs on x (B, T) that predict each row's ending, E = n_ends
    (the batch's longest ending), and the tokens they predict.

    Output t predicts token t + 1: a row's ending, its tokens from
    start on, is predicted by outputs start - 1 onwards. Only those
    are taken and upcast, not the whole (B, T, V), which is freed on
    return, before the softmax's copy."""
    B, T = x.size()
    with torch.autocast(x.device.type, autocast_dtype, autocast_dtype is not None):
        logits, _ = model(x)  # (B, T, V)
    offsets = torch.arange(n_ends, device=x.device)  # (E,)
    # a shorter ending's padding may run past the row: clamped here, never scored
    pos = (start[:, None] - 1 + offsets).clamp(max=T - 2)  # (B, E)
    rows = torch.arange(B, device=x.device)[:, None]  # (B, 1)
    # a padded embedding table's extra ids (n_vocab on) are never text
    scored = logits[rows, pos, :n_vocab].float()  # (B, E, n_vocab)
    return scored, x[rows, pos + 1]


def summed_loss(logits, targets, count):
    """Cross-entropy (B,) of each row, summed over its ending: the
    first count of its E positions (ending_logits'); the rest is
    padding."""
    losses = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
    offsets = torch.arange(targets.size(1), device=targets.device)  # (E,)
    ending = offsets < count[:, None]  # (B, E)
    return (losses.view_as(targets) * ending).sum(dim=1)


@torch.no_grad()
def ending_losses(
    model,
    prepared,
    device,
    rank=0,
    world_size=1,
    autocast_dtype=None,
    batch_rows=BATCH_ROWS,
):
    """(sum, mean) loss over each ending's tokens, each (m, 4)
    float32 on device, of the m examples rank::world_size.

    Batches of batch_rows plain rows, shortest first, cut to the
    longest rounded up to WIDTH_STEP: little padding, and padding is
    never scored. The losses stay on the device: nothing comes back
    to the host."""
    # rank r scores examples r, r + world_size, ...
    order = prepared["order"]
    mine = order[order // 4 % world_size == rank]
    # the batch plan, from the CPU tensors: each row's length and its ending's
    widths = (prepared["start"] + prepared["count"])[mine].tolist()
    ends = prepared["count"][mine].tolist()
    # non_blocking: the copies wait for no queued GPU work
    rows = mine.to(device, non_blocking=True)
    tokens = prepared["tokens"].to(device, non_blocking=True)  # (R, W)
    start = prepared["start"].to(device, non_blocking=True)  # (R,)
    count = prepared["count"].to(device, non_blocking=True)  # (R,)
    table = torch.zeros(len(order), device=device)  # (R,)
    n_vocab = prepared["n_vocab"]
    was_training = model.training
    model.eval()
    try:
        for first in range(0, len(widths), batch_rows):
            idx = rows[first : first + batch_rows]
            longest = max(widths[first : first + batch_rows])
            # never past the longest row of all (at most block_size)
            width = min(math.ceil(longest / WIDTH_STEP) * WIDTH_STEP, tokens.size(1))
            n_ends = max(ends[first : first + batch_rows])
            x = tokens[idx, :width]  # (B, T)
            logits, targets = ending_logits(model, x, start[idx], n_ends, n_vocab, autocast_dtype)
            table[idx] = summed_loss(logits, targets, count[idx])
    finally:
        model.train(was_training)
    sums = table.view(-1, 4)[rank::world_size]
    return sums, sums / count.view(-1, 4)[rank::world_size]


def evaluate(
    model,
    prepared,
    device,
    rank=0,
    world_size=1,
    autocast_dtype=None,
    batch_rows=BATCH_ROWS,
):
    """HellaSwag accuracy: dict(n, acc, acc_norm) over all the
    prepared examples, on every rank alike.

    Under DDP every rank calls this with the same prepared data;
    rank r scores examples r::world_size, and the counts are
    summed over ranks. Pass the plain model (not DDP's wrapper).
    It runs in eval mode without gradients and restores the
    model's mode. One host sync, at the end."""
    labels = prepared["labels"][rank::world_size].to(device, non_blocking=True)
    sums, means = ending_losses(
        model, prepared, device, rank, world_size, autocast_dtype, batch_rows
    )
    # (2, m): acc's picks, then acc_norm's
    correct = torch.stack([sums.argmin(dim=1), means.argmin(dim=1)]) == labels
    counts = correct.sum(dim=1)  # (2,): acc's and acc_norm's
    if world_size > 1:
        torch.distributed.all_reduce(counts)
    right, right_norm = counts.tolist()
    n = len(prepared["labels"])
    return dict(n=n, acc=right / n, acc_norm=right_norm / n)
