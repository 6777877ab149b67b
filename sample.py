"""
Text from a GPT-2: OpenAI's weights (a hub name), a Hugging Face
directory, or one of our checkpoints (which knows its tokenizer).

    python sample.py --init_from gpt2 --prompt "Hello, I'm a language model,"
    python sample.py --init_from log/model_19073.pt --max_new_tokens 200

--max_length counts the prompt's tokens too (default 30: the course's
demo, 5 sequences of 30 tokens, top-k 50, seed 42); --max_new_tokens
counts only what is added. train_gpt2.sample_texts does the work, the
function that prints the samples during training (KV cache, seeded).
"""

import argparse
import math
import os
import re
import signal
import sys
from pathlib import Path


# a stop signal: one line on stderr, no traceback; a hard exit, as
# nothing needs cleaning up and no library's except can swallow it
def stop(signum, frame):
    os.write(2, f"sample.py: stopped by {signal.Signals(signum).name}\n".encode())
    os._exit(128 + signum)


if __name__ == "__main__":
    # before torch loads: its import takes seconds
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
        # one the program was started ignoring (nohup) stays so
        if signal.getsignal(sig) != signal.SIG_IGN:
            signal.signal(sig, stop)


import train_gpt2
from hellaswag import pick_device


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
    length.add_argument("--max_length", type=int, help="tokens a sample, prompt included (30)")
    length.add_argument("--max_new_tokens", type=int, help="tokens added to the prompt")
    p.add_argument("--top_k", type=int, default=50, help="0: the whole distribution")
    p.add_argument("--temperature", type=float, default=1.0, help="0: greedy")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--device", default="auto", help="auto|cpu|cuda|cuda:N|mps")
    args = p.parse_args(argv)
    # every count positive; None: the flag not given
    counts = [args.num_samples, args.max_length, args.max_new_tokens]
    if min(n for n in counts if n is not None) < 1:
        p.error("--num_samples, --max_length, --max_new_tokens must be >= 1")
    if args.top_k < 0 or not 0 <= args.temperature < math.inf:
        p.error("--top_k and --temperature must be >= 0 (and finite)")
    if not 0 <= args.seed < 2**63:
        p.error("--seed must be in 0 .. 2**63 - 1")
    if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", args.device):
        p.error("--device must be auto, cpu, cuda, cuda:N or mps")
    if not args.init_from:
        p.error("--init_from is empty")
    return args


def load(source, device):
    # (model, enc); whatever a missing or foreign file raises: one line
    path = Path(source)
    # a path is a file or a directory here: a hub name has no ./ ../ /
    if source.startswith(("/", "./", "../")) and not path.exists():
        raise ValueError(f"--init_from {source}: no such file or directory")
    if path.is_file() and path.suffix != ".pt":
        raise ValueError(
            f"--init_from {source}: not a checkpoint (.pt), nor a Hugging Face directory"
        )
    try:
        return train_gpt2.load_model(source, device)
    except (ValueError, OSError):
        raise
    except Exception as e:
        raise ValueError(f"cannot load {source}: {e}") from None


def new_tokens(args, enc):
    # --max_new_tokens, or what --max_length leaves after the prompt
    if args.max_new_tokens is not None:
        return args.max_new_tokens
    max_length = args.max_length or 30
    # an empty prompt is <|endoftext|> alone: one token
    ids = enc.encode(args.prompt, allowed_special="all")
    n = max(len(ids), 1)
    if n >= max_length:
        raise ValueError(
            f"the prompt is {n} tokens: --max_length {max_length} leaves"
            " none to sample (raise it, or use --max_new_tokens)"
        )
    return max_length - n


def run(args):
    # the samples' texts, as the command line asks
    device = pick_device(args.device)
    model, enc = load(args.init_from, device)
    return train_gpt2.sample_texts(
        model,
        enc,
        args.prompt,
        args.num_samples,
        new_tokens(args, enc),
        top_k=args.top_k,
        temperature=args.temperature,
        seed=args.seed,
    )


def main(argv=None):
    args = parse_args(argv)
    try:
        texts = run(args)
    except (ValueError, OSError) as e:
        # one line, even for a library's multi-line message
        message = " ".join(str(e).split())
        sys.exit(f"sample.py: error: {message}")
    for i, text in enumerate(texts):
        print(f"sample {i}: {text}")


if __name__ == "__main__":
    main()
