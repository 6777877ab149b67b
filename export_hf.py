"""
One of our checkpoints as a Hugging Face GPT-2 directory (config.json + model.safetensors), which
`transformers.GPT2LMHeadModel.from_pretrained` loads and which computes exactly what our model computes.

    python export_hf.py log/model_19073.pt out/gpt2-ours

The token table's padding rows (50,257 real ids padded to 50,304 for speed) are dropped: no tokenizer
produces those ids. The directory is written complete under a temporary name and then renamed; an existing
non-empty OUT_DIR is never touched.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import Optional

from fineweb import EOT_TOKEN, GPT2_VOCAB_SIZE
from run_files import load_checkpoint, write_error
from train_gpt2 import HF_TRANSPOSED, GPTConfig


def to_hf_state_dict(our_sd: dict, keep_vocab: Optional[int] = None) -> dict:
    """Inverse of train_gpt2.convert_hf_state_dict: Conv1D weights transposed back; token-table rows >= keep_vocab
    dropped (the padding of a 50304-row table, ids the tokenizer never produces)."""
    out = {}
    for key, value in our_sd.items():
        value = value.detach()
        if key in ("transformer.wte.weight", "lm_head.weight") and keep_vocab is not None:
            value = value[:keep_vocab]
        out[key] = (value.t() if key.endswith(HF_TRANSPOSED) else value).contiguous()
    return out


def export_hf(checkpoint_path: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Write one of our checkpoints as a directory that transformers.GPT2LMHeadModel.from_pretrained loads."""
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} already exists and is not an empty directory; choose a new OUT_DIR")
    from transformers import GPT2Config, GPT2LMHeadModel  # heavy; only when asked for

    ckpt = load_checkpoint(checkpoint_path)
    c = GPTConfig(**ckpt["model_config"])
    vocab = min(c.vocab_size, GPT2_VOCAB_SIZE)  # 50304 -> 50257; a smaller (test) vocabulary is kept as is
    eot = EOT_TOKEN if vocab > EOT_TOKEN else None
    config = GPT2Config(vocab_size=vocab, n_positions=c.block_size, n_ctx=c.block_size, n_embd=c.n_embd,
                        n_layer=c.n_layer, n_head=c.n_head, activation_function="gelu_new",
                        bos_token_id=eot, eos_token_id=eot, tie_word_embeddings=True)
    hf = GPT2LMHeadModel(config)
    result = hf.load_state_dict(to_hf_state_dict(ckpt["model"], vocab), strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ValueError(f"{checkpoint_path} does not map onto GPT-2: missing {result.missing_keys[:10]}, "
                         f"unexpected {result.unexpected_keys[:10]}")
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")  # complete, then renamed: never a half export
    try:
        hf.save_pretrained(tmp)
        os.replace(tmp, out)
    except Exception as e:  # an OSError, or safetensors' own error when the disk is full
        raise OSError(f"could not write {out} ({write_error(e)}); nothing was left behind") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(prog="export_hf.py", allow_abbrev=False,
                                     description="Write a checkpoint as a Hugging Face GPT-2 directory.")
    parser.add_argument("checkpoint", help="a model_*.pt written by training")
    parser.add_argument("out_dir", help="directory for config.json and model.safetensors (must not exist, or be empty)")
    args = parser.parse_args(argv)
    try:
        out = export_hf(args.checkpoint, args.out_dir)
    except (ValueError, OSError) as e:
        sys.exit(f"export_hf.py: error: {' '.join(str(e).split())}")
    print(f"wrote {out}: load it with GPT2LMHeadModel.from_pretrained")


if __name__ == "__main__":
    main()
