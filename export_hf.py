"""
One of our checkpoints as a complete Hugging Face GPT-2 directory: the model (config.json, model.safetensors,
generation_config.json) and its tokenizer, so that `AutoTokenizer`, `AutoModelForCausalLM`, `pipeline` and
lm-evaluation-harness load it offline, and it computes exactly what our model computes.

    python export_hf.py log/model_19073.pt out/gpt2-ours

The tokenizer is the one the checkpoint was trained with. GPT-2's BPE is written as vocab.json + merges.txt +
tokenizer.json, built from the vendored assets/gpt2.tiktoken (no download) and giving the same ids as
fineweb.get_tokenizer(), <|endoftext|> (id 50256) included. A character-level model (`fineweb.py --tokenizer
char`) gets a tokenizer.json with one token per character, id i = its recorded vocabulary's i-th character.

The token table's padding rows (50,257 real ids padded to 50,304 for speed) are dropped: no tokenizer produces
those ids. The run's dropout goes into config.json (for fine-tuning; evaluation turns it off). The directory is
written complete under a temporary name and then renamed; an existing non-empty OUT_DIR is never touched.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Optional

from fineweb import CharTokenizer, tokenizer_from_manifest
from run_files import Parser, load_checkpoint, write_error
from train_gpt2 import HF_TRANSPOSED, GPTConfig

EOT = "<|endoftext|>"


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


# ----------------------------------------------------------------------------------------------------------
# Tokenizer files


def byte_symbols() -> list[str]:
    """GPT-2's printable stand-in for each byte (index = byte value), the alphabet of vocab.json and merges.txt:
    printable Latin-1 bytes stand for themselves, the other 68 (controls, space, soft hyphen...) take U+0100
    onwards in byte order, so no token is written with whitespace or control characters."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    symbols, extra = [], 0
    for b in range(256):
        if b in printable:
            symbols.append(chr(b))
        else:
            symbols.append(chr(256 + extra))
            extra += 1
    return symbols


def _bpe(token: bytes, ranks: dict[bytes, int], below: int) -> list[bytes]:
    """The pieces tiktoken's byte-pair encoding makes of `token` using only the tokens ranked below `below`: merge
    the adjacent pair whose concatenation ranks lowest (the leftmost on a tie) until none is left, or two remain."""
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best, at = below, -1
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1], below)
            if rank < best:
                best, at = rank, i
        if at < 0:
            break
        parts[at : at + 2] = [parts[at] + parts[at + 1]]
    return parts


def bpe_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The merge list equivalent to tiktoken's mergeable ranks: the token of rank r (r >= 256) is made by the
    (r - 256)-th merge, of the two pieces that BPE with the lower-ranked tokens leaves of it. Ranks 0..255 must be
    the 256 single bytes."""
    by_rank = sorted(ranks.items(), key=lambda item: item[1])
    single_bytes = all(len(token) == 1 for token, _ in by_rank[:256])
    if not single_bytes or [rank for _, rank in by_rank] != list(range(len(by_rank))):
        raise ValueError("not a byte-level BPE vocabulary: ranks 0..255 must be the single bytes, then 256, 257, ...")
    merges = []
    for token, rank in by_rank[256:]:
        pieces = _bpe(token, ranks, rank)
        if len(pieces) != 2:
            raise ValueError(f"token {token!r} (rank {rank}) is not a merge of two lower-ranked tokens")
        merges.append((pieces[0], pieces[1]))
    return merges


def _json(data) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


@functools.lru_cache(maxsize=4)  # a second export in the same process skips the 50,000 merges (~1 s)
def _vocab_and_merges(enc) -> tuple[dict[str, int], tuple[tuple[str, str], ...]]:
    """enc's tokens spelled in GPT-2's byte symbols -> id (<|endoftext|> included), and its merges so spelled."""
    ranks = {token: enc.encode_single_token(token) for token in enc.token_byte_values()}
    symbols = byte_symbols()
    spell = lambda token: "".join(symbols[b] for b in token)  # noqa: E731
    vocab = {spell(token): rank for token, rank in sorted(ranks.items(), key=lambda item: item[1])}
    vocab[EOT] = enc.eot_token
    return vocab, tuple((spell(a), spell(b)) for a, b in bpe_merges(ranks))


def gpt2_tokenizer_files(enc, block_size: int) -> dict[str, str]:
    """{file name: text} of GPT-2's tokenizer for transformers (GPT2Tokenizer / GPT2TokenizerFast): vocab.json,
    merges.txt, tokenizer.json and the configs, from enc = fineweb.get_tokenizer(). Ids are enc's ranks; the
    special token <|endoftext|> is bos, eos and unk; model_max_length is the model's context."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    vocab, merges = _vocab_and_merges(enc)

    # GPT-2's pipeline: split the text with its regex (ByteLevel's default is the same one), spell the bytes
    # with the symbols, BPE; decoding maps the symbols back to bytes.
    tok = Tokenizer(models.BPE(vocab=vocab, merges=list(merges), continuing_subword_prefix="", end_of_word_suffix="",
                               fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken(EOT, special=True, normalized=False)])

    special = {"bos_token": EOT, "eos_token": EOT, "unk_token": EOT}
    config = {"tokenizer_class": "GPT2Tokenizer", "model_max_length": block_size, **special,
              "add_prefix_space": False, "add_bos_token": False, "clean_up_tokenization_spaces": False,
              "errors": "replace"}
    return {"vocab.json": _json(vocab),
            "merges.txt": "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges),
            "tokenizer.json": tok.to_str(pretty=True),
            "tokenizer_config.json": _json(config),
            "special_tokens_map.json": _json(special)}


def char_tokenizer_files(chars: str, block_size: int) -> dict[str, str]:
    """{file name: text} of a one-token-per-character tokenizer (PreTrainedTokenizerFast over tokenizer.json): id i
    is chars[i]; every character is its own token, spaces and newlines included; decoding joins them back as they
    were. A character outside chars is an error, as with fineweb.CharTokenizer. There is no special token."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    CharTokenizer(chars)  # the same checks: non-empty, sorted, unique
    tok = Tokenizer(models.WordLevel({c: i for i, c in enumerate(chars)}, unk_token="\0unknown"))
    # [\s\S]: any one code point, newline included (a bare . would skip newlines)
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()  # concatenate, no spaces in between
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": block_size,
              "clean_up_tokenization_spaces": False}
    return {"tokenizer.json": tok.to_str(pretty=True), "tokenizer_config.json": _json(config),
            "special_tokens_map.json": _json({})}


# ----------------------------------------------------------------------------------------------------------
# Export


def checkpoint_tokenizer(ckpt: dict, where: str):
    """The tokenizer a checkpoint was trained with (GPT-2's when it records none), as a ValueError naming where."""
    info = ckpt.get("tokenizer") or {}
    if not isinstance(info, dict):
        raise ValueError(f"{where}: its 'tokenizer' entry is a {type(info).__name__}, not a dict")
    try:
        return tokenizer_from_manifest(info)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def export_hf(checkpoint_path: str | os.PathLike, out_dir: str | os.PathLike, with_tokenizer: bool = True) -> Path:
    """Write one of our checkpoints, with its tokenizer, as a directory that transformers' Auto classes load.
    with_tokenizer=False writes the model alone, for a caller that tokenises itself (play.ipynb): then a model
    whose vocabulary no known tokenizer fits is exported too."""
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} already exists and is not an empty directory; choose a new OUT_DIR")
    ckpt = load_checkpoint(checkpoint_path)
    c = GPTConfig(**ckpt["model_config"])
    enc = checkpoint_tokenizer(ckpt, str(checkpoint_path))
    if with_tokenizer and c.vocab_size < enc.n_vocab:
        recorded = "it records" if (ckpt.get("tokenizer") or {}).get("tokenizer") else "assumed (it records none)"
        raise ValueError(f"{checkpoint_path}: the model has {c.vocab_size} token rows, fewer than the "
                         f"{enc.n_vocab} ids of the {enc.name} tokenizer {recorded}; an export needs a tokenizer "
                         f"that fits the model")
    from transformers import GPT2Config, GPT2LMHeadModel  # heavy; only when asked for

    vocab = min(c.vocab_size, enc.n_vocab)  # 50304 -> 50257: the padding rows are dropped
    eot = enc.eot_token if enc.eot_token is not None and enc.eot_token < vocab else None  # characters: none
    config = GPT2Config(vocab_size=vocab, n_positions=c.block_size, n_ctx=c.block_size, n_embd=c.n_embd,
                        n_layer=c.n_layer, n_head=c.n_head, activation_function="gelu_new",
                        resid_pdrop=c.dropout, embd_pdrop=c.dropout, attn_pdrop=c.dropout,
                        bos_token_id=eot, eos_token_id=eot, tie_word_embeddings=True)
    hf = GPT2LMHeadModel(config)
    result = hf.load_state_dict(to_hf_state_dict(ckpt["model"], vocab), strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ValueError(f"{checkpoint_path} does not map onto GPT-2: missing {result.missing_keys[:10]}, "
                         f"unexpected {result.unexpected_keys[:10]}")
    files = {}
    if with_tokenizer:
        files = (char_tokenizer_files(enc.chars, c.block_size) if isinstance(enc, CharTokenizer)
                 else gpt2_tokenizer_files(enc, c.block_size))
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")  # complete, then renamed: never a half export
    try:
        hf.save_pretrained(tmp)
        for name, text in files.items():
            (tmp / name).write_text(text, encoding="utf-8")
        os.replace(tmp, out)
    except Exception as e:  # an OSError, or safetensors' own error when the disk is full
        raise OSError(f"could not write {out} ({write_error(e)}); nothing was left behind") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv=None):
    parser = Parser(prog="export_hf.py", description="Write a checkpoint and its tokenizer as a Hugging Face GPT-2 "
                    "directory.")
    parser.add_argument("checkpoint", help="a model_*.pt written by training")
    parser.add_argument("out_dir", help="directory for the model and tokenizer files (must not exist, or be empty)")
    args = parser.parse_args(argv)
    if not args.out_dir:
        parser.error("OUT_DIR is an empty path")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a one-file "Writing model shards" bar: stderr keeps errors only
    try:
        out = export_hf(args.checkpoint, args.out_dir)
    except (ValueError, OSError) as e:
        sys.exit(f"export_hf.py: error: {' '.join(str(e).split())}")
    print(f"wrote {out}: load it with AutoTokenizer / AutoModelForCausalLM.from_pretrained, or pipeline")


if __name__ == "__main__":
    main()
