"""
HellaSwag accuracy of a GPT-2 model, completion style (hellaswag_eval.py has the scoring, the
training loop's too): OpenAI's weights (a hub name), a Hugging Face directory, or one of our
checkpoints.

Reference numbers with this scoring, 10,042 val examples:
    OpenAI GPT-2 124M (--model gpt2): acc 0.2859, acc_norm 0.2955
    GPT-3 Small 124M (GPT-3 paper, zero-shot): acc_norm 0.337
    random guessing: 0.25

Run it:
    python hellaswag.py --model gpt2 --device cuda --dtype bfloat16
    python hellaswag.py --model log/model_19073.pt --limit 1000
    python hellaswag.py --model HF_DIR --data hellaswag_val.jsonl

Without --data it reads the official val split, downloaded once from the Hugging Face hub
(Rowan/hellaswag, as parquet) into the hub's cache; --data takes a local rowanz .jsonl or an
HF-format .parquet. Importing this module does nothing; Ctrl-C ends the command line as Python
does.
"""

import argparse
import os
import sys

# isort: split
# first: it loads torch, and Ctrl-C meanwhile ends the program in one line
import harness

# isort: split
import torch

import fineweb
import hellaswag_eval
import train_gpt2

# Bounds that a typo cannot pass: HellaSwag's splits hold about 60,000 examples in all, and a
# batch's logits take rows x width x 50,304 floats, past any GPU's memory beyond MAX_BATCH_ROWS.
MAX_LIMIT = 1_000_000
MAX_BATCH_ROWS = 16_384


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="hellaswag.py",
        usage=argparse.SUPPRESS,
        description="HellaSwag accuracy of a GPT-2 model, completion style.",
    )
    p.add_argument("--model", default="gpt2", help="gpt2|gpt2-medium|...|HF_DIR|CHECKPOINT.pt")
    p.add_argument("--data", help="a rowanz .jsonl or HF .parquet (default: the val split)")
    p.add_argument("--limit", type=int, default=0, help="the first N examples only (0: all)")
    p.add_argument("--device", default="auto", help="auto|cpu|cuda|cuda:N|mps")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="autocast")
    p.add_argument(
        "--batch_rows", type=int, default=hellaswag_eval.BATCH_ROWS, help="rows per batch"
    )
    args = p.parse_args(argv)
    if not 0 <= args.limit <= MAX_LIMIT:
        p.error(
            f"--limit must be 0 (all examples) to {MAX_LIMIT:,}: HellaSwag's splits hold about"
            " 60,000 examples in all"
        )
    if not 1 <= args.batch_rows <= MAX_BATCH_ROWS:
        p.error(
            f"--batch_rows must be 1 to {MAX_BATCH_ROWS:,}: a batch's logits take rows x width"
            " x 50,304 floats, and more rows would fit no GPU"
        )
    if not args.model:
        p.error("--model is empty")
    if args.data == "":
        p.error("--data is empty (leave it out for the official val split)")
    return args


def run(args):
    """Evaluate as the command line says: the result dict."""
    device = harness.pick_device(args.device)
    examples = hellaswag_eval.load_examples(args.data, args.limit)
    model, enc = train_gpt2.load_model(args.model, device)
    if enc.name != "gpt2":
        raise ValueError(f"{args.model} uses the {enc.name} tokenizer; HellaSwag needs GPT-2's")
    prepared = hellaswag_eval.prepare(examples, enc, model.config.block_size)
    # TF32 matmuls where the GPU has them, as in training
    torch.set_float32_matmul_precision("high")
    try:
        return hellaswag_eval.evaluate(
            model,
            prepared,
            device,
            autocast_dtype=torch.bfloat16 if args.dtype == "bfloat16" else None,
            batch_rows=args.batch_rows,
        )
    except RuntimeError as e:
        if not harness.out_of_memory(e):
            raise
        raise ValueError(
            f"out of {device} memory with --batch_rows {args.batch_rows}: lower it"
        ) from None


def main(argv=None):
    args = parse_args(argv)
    # transformers' warnings and progress bars (a Hugging Face model) would bury the one line
    os.environ.update(TRANSFORMERS_VERBOSITY="error", HF_HUB_DISABLE_PROGRESS_BARS="1")
    try:
        result = run(args)
    except (OSError, ValueError) as e:
        # one line, even for a library's multi-line message
        message = " ".join(str(e).split())
        sys.exit(f"hellaswag.py: error: {message}")
    except KeyboardInterrupt:
        sys.exit("hellaswag.py: interrupted")
    # a closed stdout (`| head`) ends the printing quietly, as in train_gpt2.py
    scores = f"acc {result['acc']:.4f} acc_norm {result['acc_norm']:.4f}"
    fineweb.say(f"{scores} over {result['n']} examples")


if __name__ == "__main__":
    main()
