"""
Text from a GPT-2: OpenAI's weights (hub name), a Hugging Face directory, or one of our checkpoints.

    python sample.py --init_from gpt2 --prompt "Hello, I'm a language model," --num_samples 5 --max_length 30
    python sample.py --init_from log/model_19073.pt --max_new_tokens 200 --temperature 0.8

--max_length counts the prompt too (5 sequences of 30 tokens, top-k 50, seed 42: the course's demo);
--max_new_tokens counts only what is added. Sampling is seeded and uses the KV cache; train_gpt2.sample_texts
does the work, the same function that prints samples during training.
"""

import signal
import sys

if __name__ == "__main__":  # Ctrl-C at any moment, torch's import included: one line, no traceback
    if signal.getsignal(signal.SIGINT) != signal.SIG_IGN:  # a background job (`cmd &`) was started ignoring it
        signal.signal(signal.SIGINT, lambda signum, frame: sys.exit("sample.py: interrupted"))

import run_files
import train_gpt2


def main(argv=None):
    parser = run_files.Parser(prog="sample.py", description="Print samples from a model.")
    parser.add_argument("--init_from", default="gpt2", help="gpt2 | gpt2-medium | ... | HF_DIR | CHECKPOINT.pt")
    parser.add_argument("--prompt", default="Hello, I'm a language model,")
    parser.add_argument("--num_samples", type=int, default=5)
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--max_length", type=int, default=None, help="tokens per sample, prompt included (default 30)")
    length.add_argument("--max_new_tokens", type=int, default=None, help="tokens added after the prompt")
    parser.add_argument("--top_k", type=int, default=50, help="0: sample from the whole distribution")
    parser.add_argument("--temperature", type=run_files.finite_float, default=1.0, help="0: greedy")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N | mps")
    args = parser.parse_args(argv)
    for name in ("num_samples", "max_length", "max_new_tokens"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:
            parser.error(f"--{name} must be positive, got {getattr(args, name)}")
    if args.top_k < 0 or args.temperature < 0:
        parser.error(f"--top_k and --temperature must be >= 0, got {args.top_k} and {args.temperature}")
    if not 0 <= args.seed < 2**63:  # torch's generators take 64-bit seeds
        parser.error(f"--seed must be in 0 .. 2**63 - 1, got {args.seed}")
    if not args.init_from:
        parser.error("--init_from is an empty path")
    try:
        device = run_files.check_device(args.device)
        model, enc = train_gpt2.load_model(args.init_from, device)  # a checkpoint knows its tokenizer
        new_tokens = args.max_new_tokens
        if new_tokens is None:  # --max_length (default 30) counts the prompt's tokens too
            prompt_len = len(train_gpt2.prompt_ids(enc, args.prompt))
            new_tokens = (args.max_length or 30) - prompt_len
            if new_tokens <= 0:
                raise ValueError(f"the prompt is {prompt_len} tokens: --max_length {args.max_length or 30} leaves "
                                 "none to sample (raise it, or use --max_new_tokens)")
        texts = train_gpt2.sample_texts(model, enc, args.prompt, args.num_samples, new_tokens, args.top_k or None,
                                        args.temperature, args.seed, device)
    except (ValueError, OSError) as e:
        sys.exit(f"sample.py: error: {' '.join(str(e).split())}")
    for i, text in enumerate(texts):
        print(f"sample {i}: {text}")


if __name__ == "__main__":
    main()
