"""
One of our checkpoints as a Hugging Face GPT-2 directory.

    python export_hf.py log/model_19073.pt out/gpt2-ours

OUT_DIR gets what transformers saves of a GPT2LMHeadModel
(config.json, generation_config.json, model.safetensors) and the
checkpoint's tokenizer (tokenizer.json, tokenizer_config.json):
GPT-2's BPE, converted from tiktoken by transformers' own
TikTokenConverter, or one token per character for a model of a
`fineweb.py --tokenizer char` corpus. Either gives our ids; the
text <|endoftext|> is its one id 50256, as in tiktoken's
encode(text, allowed_special="all"). The token table's padding
rows (50,304 -> 50,257) are dropped: no text has those ids. The
run's dropout goes into config.json (for fine-tuning).

Use it as any Hugging Face model, offline:

    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained("out/gpt2-ours")
    tokenizer = AutoTokenizer.from_pretrained("out/gpt2-ours")

    from transformers import pipeline
    generate = pipeline("text-generation", model="out/gpt2-ours")
    print(generate("Hello, I'm a language model,"))

    lm_eval --model hf --model_args pretrained=out/gpt2-ours \\
        --tasks hellaswag

The directory is written as .OUT_DIR.tmp beside OUT_DIR, loaded
back and checked: its logits must be ours, GPT-2's with random
weights that work every layer must be our model's with the same
ones (a checkpoint's own logits may be too small for an edit to
show), and its tokenizer must give our ids. A model without
biases (--bias false) is GPT-2 with biases of zero, the exact GELU
(--gelu_approximate none) transformers' "gelu". A model that GPT-2's
format cannot hold (another activation, an untied head, capped
logits, other modules) is refused in one line. Only then is it
renamed to OUT_DIR; an existing non-empty OUT_DIR is never touched.
An error or Ctrl-C removes the temporary directory; a run killed
outright (SIGTERM, kill -9) leaves it, and the next export to that
OUT_DIR removes it before it starts (known by a mark inside it: a
directory of that name without it is refused, never deleted).
"""

import argparse
import os
import shutil
import sys
from pathlib import Path

# isort: split
# first: it loads torch, and Ctrl-C meanwhile ends the program in one line
import harness

# isort: split
import torch

import fineweb
import train_gpt2


def load(checkpoint_path):
    # (our model in eval mode, with the run's dropout for config.json; its tokenizer), or a
    # one-line ValueError
    model, enc = train_gpt2.load_model(checkpoint_path)
    if model.config.vocab_size < enc.n_vocab:
        raise ValueError(f"{checkpoint_path}: fewer token rows than its tokenizer's ids")
    return model.eval(), enc


def hf_model(model, n_vocab, eot):
    # A GPT2LMHeadModel with our shape, dropout and weights, its token
    # table cut to the tokenizer's n_vocab rows (50304 -> 50257). Weights it
    # has no place for are refused here (RoPE has no wpe, a wider MLP); the
    # same weights computed otherwise show in its logits (check_export).
    from transformers import GPT2Config, GPT2LMHeadModel

    c = model.config
    config = GPT2Config(
        **{theirs: getattr(c, ours) for ours, theirs in train_gpt2.HF_CONFIG.items()},
        # GPT-2's GELU (tanh) or the exact one
        activation_function="gelu_new" if c.gelu_approximate == "tanh" else "gelu",
        resid_pdrop=c.dropout,
        embd_pdrop=c.dropout,
        attn_pdrop=c.dropout,
        bos_token_id=eot,
        eos_token_id=eot,
        tie_word_embeddings=True,
    )
    hf = GPT2LMHeadModel(config)
    # GPT-2's names; its Conv1D keeps (in, out), a Linear's transpose
    sd = {}
    for key, value in model.state_dict().items():
        sd[key] = value.t() if key.endswith(train_gpt2.HF_TRANSPOSED) else value
    # a model without biases is GPT-2's with biases of zero
    if not c.bias:
        for key, value in hf.named_parameters():
            if key.endswith(".bias"):
                sd[key] = torch.zeros_like(value)
    differ = harness.weight_differing(hf, sd)
    if differ:
        raise ValueError(f"GPT-2's format cannot hold this model: {differ} differs")
    hf.load_state_dict(sd)
    hf.resize_token_embeddings(n_vocab)  # the first n_vocab rows
    return hf


def gpt2_tokenizer(enc, block_size):
    # GPT-2's BPE as transformers converts a tiktoken vocabulary
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    converter = TikTokenConverter(enc, enc._pat_str, extra_special_tokens=enc._special_tokens)
    # the ranks of enc itself (transformers' convert_tiktoken_to_fast reads
    # the same ones back from a file that it writes first)
    converter.load_tiktoken_bpe = lambda enc: enc._mergeable_ranks
    return PreTrainedTokenizerFast(
        tokenizer_object=converter.converted(),
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        model_max_length=block_size,
        clean_up_tokenization_spaces=False,
    )


def char_tokenizer(enc, block_size):
    # one token per character, id i = enc.chars[i]; another character is
    # an error, as with fineweb.CharTokenizer
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(enc.chars)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    # [\s\S]: any one character, newlines too
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), "isolated")
    tok.decoder = decoders.Fuse()  # joined back with nothing between
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, model_max_length=block_size, clean_up_tokenization_spaces=False
    )


@torch.no_grad()
def probe_model(config):
    # Our model of this config with random weights that take every layer out of its near-linear
    # range: matrices N(0, 1 / fan_in), biases and norms N(0, 1), so attention scores, MLP
    # inputs and logits are O(1). A checkpoint's own weights may not: two steps from the init
    # the logits are ~0.5, where a soft cap (30 x tanh(x / 30)) is the identity to 1e-4.
    model = train_gpt2.GPT(config).eval()
    generator = torch.Generator().manual_seed(0)
    for p in model.parameters():
        std = p.size(-1) ** -0.5 if p.dim() >= 2 else 1.0
        p.copy_(std * torch.randn(p.shape, generator=generator))
    return model


@torch.no_grad()
def check_export(model, enc, out):
    # The directory, loaded back by transformers, computes our logits on
    # fixed random ids (2, T) of the model's whole context (an edit may show
    # only at distant positions: a sliding window), <|endoftext|> among them
    # (a model may treat it apart: document masking), within float32
    # rounding (1e-4 of the largest logit), and tokenizes their text as we
    # do; or a ValueError. GPT-2's architecture with the probe's weights
    # (probe_model) must compute our architecture's logits too.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    probe = probe_model(model.config)
    probe_hf = hf_model(probe, enc.n_vocab, enc.eot_token).eval()
    T = model.config.block_size
    generator = torch.Generator().manual_seed(0)
    idx = torch.randint(0, enc.n_vocab, (2, T), generator=generator)
    if enc.eot_token is not None:
        idx[:, 3::7] = enc.eot_token
    for ours, theirs in [(model, hf), (probe, probe_hf)]:
        logits = ours(idx)[0][..., : enc.n_vocab]  # (2, T, n_vocab)
        diff = (theirs(idx).logits - logits).abs().max().item()
        if not diff <= 1e-4 * max(1.0, logits.abs().max().item()):
            raise ValueError(
                f"GPT-2's format cannot hold this model: its logits differ from ours by"
                f" {diff:.3g} (another activation, attention or positions, an untied head,"
                " capped logits?)"
            )
    text = enc.decode(idx[0].tolist())
    theirs = AutoTokenizer.from_pretrained(out)(text)["input_ids"]
    if theirs != enc.encode(text, allowed_special="all"):
        raise ValueError("the exported tokenizer gives other ids than ours")


# in an export's temporary directory from its start until just before the rename: what a killed
# export leaves is known as ours by it
MARK = ".export_hf"


def remove_killed(tmp):
    # What a killed export to the same OUT_DIR left at tmp, removed; anything else there is not
    # this program's to delete: a ValueError. Nothing there is nothing to do.
    if not os.path.lexists(tmp):
        return
    if tmp.is_symlink() or not (tmp / MARK).is_file():
        raise ValueError(
            f"{tmp} is in the way and is not export_hf.py's: move it, or pick another OUT_DIR"
        )
    shutil.rmtree(tmp)


# Write checkpoint_path (a model_*.pt of train_gpt2.py) as a Hugging Face
# GPT-2 directory out_dir, checked; returns its Path. A ValueError or an
# OSError (one line) leaves nothing behind.
def export_hf(checkpoint_path, out_dir):
    from safetensors import SafetensorError  # transformers writes the weights with it

    # resolved once: the export goes there, whatever a link on the path comes to mean
    out = Path(out_dir).resolve()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} exists and is not an empty directory; pick a new OUT_DIR")
    above = fineweb.claimed_by(out)
    if above:
        raise ValueError(f"{out} is inside {above}: pick an OUT_DIR outside it")
    model, enc = load(checkpoint_path)
    chars = isinstance(enc, fineweb.CharTokenizer)
    tokenizer = (char_tokenizer if chars else gpt2_tokenizer)(enc, model.config.block_size)
    # one name for every export to out: what a killed run left there is removed first
    tmp = out.with_name(f".{out.name}.tmp")
    remove_killed(tmp)
    made = False
    try:
        tmp.mkdir()
        made = True
        (tmp / MARK).touch()
        hf_model(model, enc.n_vocab, enc.eot_token).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        check_export(model, enc, tmp)
        (tmp / MARK).unlink()
        # on disk before the rename makes it visible
        for path in tmp.iterdir():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, out)
    except (OSError, SafetensorError) as e:
        # a full disk (safetensors says so in its own error), a parent that is a file, a
        # directory that cannot be written: the line names OUT_DIR
        # (the error's own text may name the temporary directory: the user knows OUT_DIR)
        raise OSError(f"cannot write {out}: {getattr(e, 'strerror', None) or e}") from None
    finally:
        # (gone once renamed)
        if made and tmp.is_dir():
            shutil.rmtree(tmp)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="export_hf.py",
        usage=argparse.SUPPRESS,
        description="Write a checkpoint as a Hugging Face GPT-2 directory (model, tokenizer).",
    )
    parser.add_argument("checkpoint", help="a model_*.pt that train_gpt2.py wrote")
    parser.add_argument("out_dir", help="the directory to write (new, or empty)")
    args = parser.parse_args(argv)
    # transformers' warnings and progress bars would bury the one line
    os.environ.update(TRANSFORMERS_VERBOSITY="error", HF_HUB_DISABLE_PROGRESS_BARS="1")
    try:
        out = export_hf(args.checkpoint, args.out_dir)
    except (ValueError, OSError) as e:
        sys.exit(f"export_hf.py: error: {' '.join(str(e).split())}")
    except KeyboardInterrupt:
        sys.exit(f"export_hf.py: interrupted; {args.out_dir} was not written")
    # a closed stdout (`| head`) ends the printing quietly, as in train_gpt2.py: the export is done
    fineweb.say(f"wrote {out}: load it with AutoModelForCausalLM.from_pretrained({str(out)!r})")


if __name__ == "__main__":
    main()
