"""
Text from a GPT-2: OpenAI's weights (a hub name), a Hugging Face
directory, or one of our checkpoints (which knows its tokenizer).

    python sample.py --init_from gpt2 --prompt "Hello, I'm a language model,"
    python sample.py --init_from log/model_19073.pt --max_new_tokens 200

Each sample is the prompt and --max_new_tokens new tokens (default
100: a few sentences of a GPT-2, a line or two of a character model).
--max_length counts the prompt's tokens too: the course's demo is
--max_length 30 (5 sequences, top-k 50, seed 42, the defaults).
train_gpt2.sample_texts does the work, the function that prints the
samples during training (KV cache, seeded). Ctrl-C ends it as
Python does: nothing is written. A closed stdout (`| head -1`)
ends the printing quietly, with exit status 0.
"""

import argparse
import math
import os
import sys
from pathlib import Path

# isort: split
# first: it loads torch, and Ctrl-C meanwhile ends the program in one line
import harness

# isort: split
import fineweb
import train_gpt2

# new tokens a sample when neither --max_new_tokens nor --max_length is given
NEW_TOKENS = 100
# Bounds that a typo cannot pass. Past the model's context each new token re-runs the whole
# window: a sample of more than MAX_TOKENS would take hours. The samples are one batch: for more
# than MAX_SAMPLES, run again with another --seed. MAX_TOP_K is more than any vocabulary.
MAX_TOKENS = 100_000
MAX_SAMPLES = 1_000
MAX_TOP_K = 1_000_000


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="sample.py",
        usage=argparse.SUPPRESS,
        description="Print samples from a GPT-2 model.",
    )
    p.add_argument("--init_from", default="gpt2", help="gpt2|gpt2-medium|...|HF_DIR|CKPT.pt")
    p.add_argument("--prompt", default="Hello, I'm a language model,")
    p.add_argument("--num_samples", type=int, default=5)
    length = p.add_mutually_exclusive_group()
    length.add_argument("--max_new_tokens", type=int, help=f"tokens added ({NEW_TOKENS})")
    length.add_argument("--max_length", type=int, help="tokens a sample, prompt included")
    p.add_argument("--top_k", type=int, default=50, help="0: the whole distribution")
    p.add_argument("--temperature", type=float, default=1.0, help="0: greedy")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--device", default="auto", help="auto|cpu|cuda|cuda:N|mps")
    args = p.parse_args(argv)
    if not 1 <= args.num_samples <= MAX_SAMPLES:
        p.error(
            f"--num_samples must be 1 to {MAX_SAMPLES:,}: they are one batch (for more, run"
            " again with another --seed)"
        )
    # None: the flag not given
    for flag in ("max_new_tokens", "max_length"):
        value = getattr(args, flag)
        if value is not None and not 1 <= value <= MAX_TOKENS:
            p.error(
                f"--{flag} must be 1 to {MAX_TOKENS:,}: past the model's context each token"
                " re-runs the whole window, so a longer sample would take hours"
            )
    if not 0 <= args.top_k <= MAX_TOP_K:
        p.error(
            f"--top_k must be 0 (the whole distribution) to {MAX_TOP_K:,} (no vocabulary is larger)"
        )
    # float32 takes a tiny temperature for 0 (NaN probabilities); below 1e-6 it is greedy anyway
    if not (args.temperature == 0 or 1e-6 <= args.temperature < math.inf):
        p.error("--temperature must be 0 (greedy) or a finite number >= 1e-6")
    if not 0 <= args.seed < 2**63:
        p.error("--seed must be in 0 .. 2**63 - 1")
    if not args.init_from:
        p.error("--init_from is empty")
    return args


def load(source, device):
    # (model, enc); train_gpt2.load_model says in one line why a model cannot load
    path = Path(source)
    # a path is a file or a directory here: a hub name has no ./ ../ /
    if source.startswith(("/", "./", "../")) and not path.exists():
        raise ValueError(f"--init_from {source}: no such file or directory")
    if path.is_file() and path.suffix != ".pt":
        raise ValueError(
            f"--init_from {source}: not a checkpoint (.pt), nor a Hugging Face directory"
        )
    return train_gpt2.load_model(source, device)


def new_tokens(args, n_prompt):
    # --max_new_tokens, or what --max_length leaves after the prompt
    if args.max_new_tokens is not None:
        return args.max_new_tokens
    if args.max_length is None:
        return NEW_TOKENS
    if n_prompt >= args.max_length:
        raise ValueError(
            f"the prompt is {n_prompt} tokens: --max_length {args.max_length} leaves"
            " none to sample (raise it, or use --max_new_tokens)"
        )
    return args.max_length - n_prompt


def run(args):
    # the samples' texts, as the command line asks
    device = harness.pick_device(args.device)
    model, enc = load(args.init_from, device)
    n_prompt = len(train_gpt2.prompt_ids(enc, args.prompt, model.config.block_size, "--prompt"))
    n_new = new_tokens(args, n_prompt)
    try:
        return train_gpt2.sample_texts(
            model,
            enc,
            args.prompt,
            args.num_samples,
            n_new,
            top_k=args.top_k,
            temperature=args.temperature,
            seed=args.seed,
        )
    except RuntimeError as e:
        if not harness.out_of_memory(e):
            raise
        raise ValueError(
            f"--num_samples {args.num_samples} of {n_prompt + n_new} tokens do not fit in"
            f" {device}'s memory: lower --num_samples (or the tokens a sample)"
        ) from None


def main(argv=None):
    args = parse_args(argv)
    # transformers' warnings and progress bars (a Hugging Face model) would bury the one line
    os.environ.update(TRANSFORMERS_VERBOSITY="error", HF_HUB_DISABLE_PROGRESS_BARS="1")
    try:
        texts = run(args)
    except (ValueError, OSError) as e:
        # one line, even for a library's multi-line message
        message = " ".join(str(e).split())
        sys.exit(f"sample.py: error: {message}")
    except KeyboardInterrupt:
        sys.exit("sample.py: interrupted")
    # a closed stdout (`sample.py | head -1`) ends the printing quietly, as in train_gpt2.py
    for i, text in enumerate(texts):
        fineweb.say(f"sample {i}: {text}")


if __name__ == "__main__":
    main()
