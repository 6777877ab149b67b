"""Every bad input is rejected clearly: the program exits non-zero, the last line of stderr is one error
message that says what is wrong, and no traceback is printed. One case per row of the README's "Bad inputs" table.

Each case is a real process of one of the project's programs (train_gpt2.py, sample.py, ...) on small files made
here, forked by tests/launcher.py from a process that has imported torch already (most cases fail before a model
is built: an interpreter and a torch import would be nearly all of their cost). The selected cases are started two
at a time when the first one runs, and each test waits for its own (under `pytest -n 2 --dist loadgroup` they all
run in one worker).
"""

import dataclasses
import fcntl
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from train_gpt2 import GPT, GPTConfig
import launcher
from helpers import child_env, many_characters

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TIMEOUT = 300
CUDA = torch.cuda.is_available()
AS_ROOT = os.geteuid() == 0  # root reads and writes whatever chmod says

# A tiny, fast run; each case adds the flag it gets wrong (argparse: the last occurrence wins).
TINY = ("--n_layer", "2", "--n_head", "2", "--n_embd", "32", "--block_size", "32", "--vocab_size", "64",
        "--seq_len", "16", "--batch_size", "2", "--total_batch_size", "64", "--max_steps", "2", "--val_tokens", "64",
        "--eval_interval", "1", "--hellaswag_interval", "0", "--sample_interval", "0", "--device", "cpu",
        "--dtype", "float32", "--compile", "false", "--data_root", "{d}/data", "--log_dir", "{out}")
EXAMPLE = {"ctx": "A man is sitting on a roof.", "endings": ["he starts pulling up roofing.", "he sits.", "he flies.",
                                                            "he sings."]}


@dataclasses.dataclass(frozen=True)
class Case:
    program: str  # the script
    bad_input: str  # what is wrong: the table's second column
    args: tuple  # its arguments; {d} is the directory of inputs below, {out} a fresh path for this case's output
    message: str  # a phrase the last line of stderr must contain
    cpu_only: bool = False  # the input is only bad on a machine without CUDA
    not_as_root: bool = False  # the input is made bad with chmod, which does not stop root
    file_size_limit: int = 0  # > 0: RLIMIT_FSIZE in bytes for the process, a disk that fills up
    env: tuple = ()  # (name, value) pairs added to the process's environment
    cuda_only: bool = False  # the input is only bad on a machine with CUDA

    @property
    def id(self) -> str:
        return f"{self.program.removesuffix('.py')}: {self.bad_input}"


def train(bad_input: str, *args: str, message: str, **kw) -> Case:
    return Case("train_gpt2.py", bad_input, TINY + args, message, **kw)


def fineweb(bad_input: str, local: str, *args: str, message: str, **kw) -> Case:
    return Case("fineweb.py", bad_input, ("--local", f"{{d}}/{local}", "--out_dir", "{out}", *args), message, **kw)


def hellaswag(bad_input: str, data: str, model: str, *args: str, message: str) -> Case:
    return Case("hellaswag.py", bad_input, ("--data", f"{{d}}/{data}", "--model", f"{{d}}/{model}", *args), message)


CASES = [
    # train_gpt2.py: data
    train("data directory that does not exist", "--data_root", "{d}/missing",
          message="does not exist; create it with `python fineweb.py`"),
    train("data directory without shards", "--data_root", "{d}/empty", message="no 'train' shards"),
    train("corrupt shard", "--data_root", "{d}/corrupt", message="is not a readable .npy shard"),
    train("shard of the wrong dtype (int32)", "--data_root", "{d}/int32", message="expected a 1-D uint16 token array"),
    train("train split shorter than one step", "--data_root", "{d}/short", message="fewer than one step"),
    train("token ids >= vocab_size", "--vocab_size", "50", message="token id 63 >= vocab_size 50"),
    # train_gpt2.py: checkpoints and weights
    train("--resume a checkpoint of another model shape", "--resume", "{d}/other_run.pt",
          message="holds a model of shape"),
    train("--resume a truncated checkpoint", "--resume", "{d}/torn.pt", message="is not a readable checkpoint"),
    train("--resume a checkpoint that does not exist", "--resume", "{d}/missing.pt", message="does not exist"),
    train("--init_from a directory that is not a model", "--init_from", "{d}/not_a_model", message="not_a_model"),
    # train_gpt2.py: settings
    train("non-positive size", "--batch_size", "0", message="--batch_size must be positive"),
    train("--seq_len longer than --block_size", "--seq_len", "64", message="exceeds --block_size"),
    train("total batch not divisible by B x T", "--total_batch_size", "100",
          message="must be divisible by batch_size x seq_len"),
    train("unknown preset", "--preset", "gpt3", message="invalid choice: 'gpt3'"),
    train("unknown device", "--device", "tpu", message="tpu"),
    train("--device cuda without a GPU", "--device", "cuda", message="CUDA is not available", cpu_only=True),
    train("--device cuda:N beyond this machine's GPUs", "--device", "cuda:99", message="--device cuda:99: this process "
          "sees", cuda_only=True),
    train("a partial torchrun environment", env=(("RANK", "0"),), message="RANK is set but LOCAL_RANK is not: "
          "torchrun sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT together"),
    train("a malformed torchrun variable", env=(("RANK", "abc"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"),
                                               ("MASTER_ADDR", "localhost"), ("MASTER_PORT", "29500")),
          message="RANK='abc' is not a whole number >= 0"),
    train("--log_dir that is a file", "--log_dir", "{d}/a_file", message="not a directory"),
    train("--hellaswag_data that does not exist", "--hellaswag_interval", "1", "--hellaswag_data",
          "{d}/missing.jsonl", message="does not exist"),
    # train_gpt2.py: numbers, flags and paths of the wrong kind
    train("a float flag that is not finite", "--grad_clip", "nan", message="argument --grad_clip: expected a finite number"),
    train("an abbreviated flag", "--eval", "5", message="unrecognized arguments: --eval 5"),
    train("--data_root that is a file", "--data_root", "{d}/a_file", message="a_file is a file, not a directory"),
    train("--hellaswag_data that is a directory", "--hellaswag_interval", "1", "--hellaswag_data", "{d}/empty",
          message="empty is a directory, not a file"),
    train("--resume a directory", "--resume", "{d}/empty", message="empty is a directory, not a file"),
    train("--resume a symbolic link loop", "--resume", "{d}/loop.pt", message="Too many levels of symbolic links"),
    train("--resume a file of weights only", "--resume", "{d}/weights_only.pt",
          message="holds weights but no optimizer or loader state to resume; start from its weights with --init_from"),
    # train_gpt2.py: data a run must not trust
    train("data that fineweb.py did not finish", "--data_root", "{d}/unfinished",
          message="has no manifest.json and holds an unfinished fineweb.py output"),
    train("data of two corpora in one directory", "--data_root", "{d}/two_corpora", message="holds shards of 2 corpora"),
    train("a shard whose size is not the manifest's", "--data_root", "{d}/changed", "--vocab_size", "0",
          message="holds 100 tokens, manifest.json says 4096; re-run fineweb.py"),
    # train_gpt2.py: other runs' checkpoints, other runs, a full disk
    train("--resume auto with --max_steps below the newest checkpoint", "--log_dir", "{d}/ahead", "--resume", "auto",
          message="--max_steps 2 is below the step of"),
    train("--log_dir in use by another run", "--log_dir", "{d}/busy", message="is in use by another run (pid"),
    train("a full disk while checkpointing", file_size_limit=20_000,
          message="(File too large); earlier checkpoints are intact: free some space, then rerun with --resume auto"),
    train("a full disk while writing log.txt", "--log_dir", "{d}/full_log", file_size_limit=20_000,
          message="full_log/log.txt (File too large); the checkpoints are intact: free some space, then rerun"),
    # train_gpt2.py: resuming on other data or with other settings; the data's tokenizer
    train("--resume a checkpoint of other data", "--resume", "{d}/other_data.pt",
          message="was trained on other data than {d}/data holds"),
    train("--resume with another --batch_size", "--resume", "{d}/other_batch.pt",
          message="was trained with --batch_size 4, this run asks 2: resume with --batch_size 4"),
    train("a character preset on GPT-2 data", "--preset", "shakespeare_char",
          message="--tokenizer char: the data in {d}/data is in gpt2 tokens"),
    train("the character preset without its data", "--preset", "shakespeare_char", "--data_root", "{d}/missing",
          message="--out_dir {d}/missing --tokenizer char`"),
    # train_gpt2.py: files that are not regular files, empty paths, numbers out of range
    train("--resume a FIFO", "--resume", "{d}/fifo.pt", message="checkpoint {d}/fifo.pt is not a regular file"),
    train("--hellaswag_data that is a FIFO", "--hellaswag_interval", "1", "--hellaswag_data", "{d}/fifo.jsonl",
          message="--hellaswag_data {d}/fifo.jsonl is not a regular file"),
    train("a shard that is a FIFO", "--data_root", "{d}/fifo_data", message="fifo_data/x_train_000001.npy is not a regular file"),
    train("log.txt that is a FIFO", "--log_dir", "{d}/fifo_log", message="fifo_log/log.txt is not a regular file"),
    train("an empty --log_dir", "--log_dir", "", message="--log_dir is an empty path"),
    train("an empty --data_root", "--data_root", "", message="--data_root is an empty path"),
    train("--seed out of range", "--seed", "18446744073709551616", message="--seed must be below 2**63"),
    train("malformed --hellaswag_data", "--hellaswag_interval", "1", "--hellaswag_data", "{d}/malformed.jsonl",
          message="malformed.jsonl:1: Expecting"),
    # sample.py, export_hf.py, plot.py
    Case("sample.py", "--init_from a checkpoint that does not exist", ("--init_from", "{d}/missing.pt", "--device", "cpu"),
         "does not exist"),
    Case("sample.py", "a temperature that is not finite", ("--init_from", "{d}/other_shape.pt", "--temperature", "inf"),
         "argument --temperature: expected a finite number, got 'inf'"),
    Case("sample.py", "a model smaller than its tokenizer", ("--init_from", "{d}/other_shape.pt", "--device", "cpu"),
         "the model's vocabulary (64 ids) is smaller than the gpt2 tokenizer's (50257)"),
    Case("sample.py", "an abbreviated option", ("--init_from", "{d}/other_shape.pt", "--temp", "0.5"),
         "unrecognized arguments: --temp 0.5"),
    Case("sample.py", "--init_from an empty path", ("--init_from", ""), "--init_from is an empty path"),
    Case("sample.py", "--seed out of range", ("--init_from", "{d}/other_shape.pt", "--seed", "-1"),
         "--seed must be in 0 .. 2**63 - 1"),
    Case("export_hf.py", "a checkpoint that does not exist", ("{d}/missing.pt", "{out}"), "does not exist"),
    Case("export_hf.py", "an OUT_DIR that holds files", ("{d}/other_shape.pt", "{d}/texts_full"),
         "already exists and is not an empty directory"),
    Case("export_hf.py", "a full disk", ("{d}/char_model.pt", "{out}"), "nothing was left behind", file_size_limit=2_000),
    Case("export_hf.py", "a model smaller than its tokenizer", ("{d}/other_shape.pt", "{out}"),
         "the model has 64 token rows, fewer than the 50257 ids of the gpt2 tokenizer"),
    Case("export_hf.py", "a checkpoint that names an unknown tokenizer", ("{d}/odd_tokenizer.pt", "{out}"),
         "manifest tokenizer 'sentencepiece': expected 'gpt2', or 'char'"),
    Case("export_hf.py", "an empty OUT_DIR", ("{d}/other_shape.pt", ""), "OUT_DIR is an empty path"),
    Case("plot.py", "a directory without log.txt", ("{d}/empty",), "log.txt does not exist"),
    Case("plot.py", "a log.txt with no readable line", ("{d}/bad_log",), "log.txt holds no metrics (1 line(s) unreadable"),
    Case("plot.py", "a log.txt that is a FIFO", ("{d}/fifo_log",), "fifo_log/log.txt is not a regular file"),
    Case("plot.py", "a full disk", ("{d}/good_log", "--out", "{out}.png"), "plot.py: error:", file_size_limit=2_000),
    # fineweb.py
    fineweb("--local file that does not exist", "missing.txt", message="no such file"),
    fineweb("--local file of an unknown type", "table.csv", message="unknown file type '.csv'"),
    fineweb("malformed jsonl", "malformed.jsonl", message="malformed.jsonl:1: malformed JSON line"),
    fineweb("jsonl without the text field", "no_text.jsonl", message="no field 'text' (fields: 'content')"),
    fineweb("empty corpus", "empty.txt", message="no documents in"),
    fineweb("text that is not UTF-8", "latin1.txt", message="not UTF-8 text"),
    fineweb("corrupt parquet", "corrupt.parquet", message="not a readable Parquet file"),
    fineweb("non-positive --shard_size", "doc.txt", "--shard_size", "0", message="--shard_size: must be positive"),
    fineweb("--prefix with a path separator", "doc.txt", "--prefix", "a/b", message="no path separators"),
    fineweb("--out_dir holding another corpus", "doc.txt", "--out_dir", "{d}/other_corpus",
            message="holds shards with another prefix"),
    fineweb("--out_dir that is a file", "doc.txt", "--out_dir", "{d}/a_file", "--workers", "1", "--no_progress",
            message="not a directory"),
    fineweb("--local directory", "texts", message="is a directory; name the files in it"),
    fineweb("--local symbolic link loop", "loop.txt", message="loop.txt: cannot use it"),
    fineweb("--local symbolic link to nothing", "gone.txt", message="a symbolic link to missing.txt"),
    fineweb("--local file without read permission", "secret.txt", message="secret.txt: cannot read it",
            not_as_root=True),
    fineweb("empty --local path", "doc.txt", "--local", "", message="argument --local: empty path"),
    fineweb("--out_dir inside a file", "doc.txt", "--out_dir", "{d}/a_file/sub", message="a_file/sub: cannot use it"),
    fineweb("--out_dir without write permission", "doc.txt", "--out_dir", "{d}/read_only",
            message="no permission to write in", not_as_root=True),
    fineweb("--out_dir on a full disk", "words.txt", "--workers", "1", "--no_progress", file_size_limit=4096,
            message="(File too large); free some space; no shard was finished: rerun the same command to start again"),
    fineweb("abbreviated option", "doc.txt", "--out", "{out}", message="unrecognized arguments: --out"),
    Case("fineweb.py", "--tokenizer char without --local", ("--tokenizer", "char", "--out_dir", "{out}"),
         "--tokenizer char needs --local files"),
    fineweb("--tokenizer char on over 65,536 distinct characters", "many_chars.txt", "--tokenizer", "char",
            message="more than the 65,536 ids of a uint16 shard"),
    fineweb("continuing an unfinished run with other settings", "half_bad.jsonl", "--out_dir", "{d}/stopped_run",
            "--shard_size", "2000", message="holds an unfinished run with other settings (shard_size 1000 there, 2000 "
            "here); pass --overwrite to start over, or use the same command to continue"),
    fineweb("continuing after a finished shard changed", "half_bad.jsonl", "--out_dir", "{d}/damaged_run",
            "--shard_size", "1000", message="changed after it was written (its sha256 is not the progress record's); "
            "pass --overwrite to start over"),
    fineweb("--out_dir in use by another fineweb.py", "doc.txt", "--out_dir", "{d}/busy",
            message="is in use by another fineweb.py (pid"),
    # hellaswag.py
    hellaswag("--data file that does not exist", "missing.jsonl", "other_shape.pt", message="does not exist"),
    hellaswag("malformed jsonl", "malformed.jsonl", "other_shape.pt", message="malformed.jsonl:1:"),
    hellaswag("label out of range", "label7.jsonl", "other_shape.pt",
              message="'label' must be an integer in 0..3, got 7"),
    hellaswag("--model checkpoint that does not exist", "ok.jsonl", "missing.pt", message="does not exist"),
    hellaswag("--model with a smaller vocabulary than GPT-2's", "ok.jsonl", "other_shape.pt", "--device", "cpu",
              message="vocab"),
    hellaswag("unknown device", "ok.jsonl", "other_shape.pt", "--device", "tpu", message="tpu"),
    hellaswag("--data that is a directory", "texts", "other_shape.pt", message="texts is a directory, not a file"),
    hellaswag("--model trained on another tokenizer", "ok.jsonl", "char_model.pt", "--device", "cpu",
              message="was trained with the char tokenizer; HellaSwag needs GPT-2's"),
    hellaswag("--data that is a FIFO", "fifo.jsonl", "other_shape.pt", message="fifo.jsonl is not a regular file"),
    # bench.py
    Case("bench.py", "--only an unknown section", ("--only", "bogus"), "unknown sections ['bogus']"),
    Case("bench.py", "non-positive --batch_size", ("--batch_size", "0"), "expected positive integers"),
    Case("bench.py", "--n_embd not divisible by --n_head", ("--n_embd", "33"), "must be divisible by --n_head"),
    Case("bench.py", "--device cuda without a GPU", ("--device", "cuda"), "CUDA is not available on this machine", cpu_only=True),
    Case("bench.py", "a float option that is not finite", ("--peak_flops", "nan"),
         "argument --peak_flops: expected a finite number, got 'nan'"),
    Case("bench.py", "a full disk for --json", ("--only", "train", "--n_layer", "1", "--n_head", "1", "--n_embd", "8",
         "--vocab_size", "16", "--block_size", "8", "--seq_len", "8", "--batch_size", "1", "--steps", "1",
         "--warmup_steps", "0", "--json", "{out}.json"), "(File too large); the tables above are the results",
         file_size_limit=100),
    Case("bench.py", "--json in a directory that is a file",
         ("--only", "train", "--n_layer", "1", "--n_head", "1", "--n_embd", "8", "--vocab_size", "16", "--block_size",
          "8", "--seq_len", "8", "--batch_size", "1", "--steps", "1", "--warmup_steps", "0", "--json",
          "{d}/a_file/bench.json"), "--json"),
]


# ----------------------------------------------------------------------------------------------------------
# The inputs


def make_inputs(d: Path) -> Path:
    """Every file and directory the cases name, in d."""
    tokens = lambda n: (np.arange(n) % 64).astype(np.uint16)  # noqa: E731  (ids 0..63: all < the tiny vocab)

    def shards(name: str, train_tokens) -> None:
        (d / name).mkdir()
        np.save(d / name / "x_val_000000.npy", tokens(1024))
        if isinstance(train_tokens, bytes):
            (d / name / "x_train_000001.npy").write_bytes(train_tokens)
        else:
            np.save(d / name / "x_train_000001.npy", train_tokens)

    shards("data", tokens(4096))
    shards("corrupt", b"\x93NUMPY this is not an array")
    shards("int32", tokens(4096).astype(np.int32))
    shards("short", tokens(20))
    (d / "empty").mkdir()
    (d / "a_file").write_text("a file where a directory belongs\n")

    config = GPTConfig(block_size=32, vocab_size=64, n_layer=1, n_head=1, n_embd=16)  # not TINY's 2 x 32
    torch.save({"model": GPT(config).state_dict(), "model_config": dataclasses.asdict(config)}, d / "other_shape.pt")
    torch.save({"model": GPT(config).state_dict(), "model_config": dataclasses.asdict(config), "optimizer": {},
                "train_loader": {}, "rng": {}, "step": 1}, d / "other_run.pt")
    (d / "torn.pt").write_bytes((d / "other_shape.pt").read_bytes()[:1000])
    (d / "not_a_model").mkdir()
    (d / "not_a_model" / "config.json").write_text("{this is not json")
    (d / "bad_log").mkdir()
    (d / "bad_log" / "log.txt").write_text("step train loss\n")

    (d / "doc.txt").write_text("A small document.\n")
    (d / "table.csv").write_text("text\nhello\n")
    (d / "malformed.jsonl").write_text('{"text": "no closing brace"\n')
    (d / "no_text.jsonl").write_text('{"content": "hello"}\n')
    (d / "empty.txt").write_text("")
    (d / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    (d / "corrupt.parquet").write_bytes(b"PAR1 this is not parquet")
    (d / "texts").mkdir()
    (d / "loop.txt").symlink_to("loop.txt")
    (d / "gone.txt").symlink_to("missing.txt")
    (d / "secret.txt").write_text("A document no one may read.\n")
    (d / "secret.txt").chmod(0)
    (d / "read_only").mkdir()
    (d / "read_only").chmod(0o555)
    (d / "words.txt").write_text("word " * 3000)  # val ~0.7 kB, train ~5.5 kB: the train shard fills the disk
    (d / "many_chars.txt").write_text(many_characters(70_000))
    (d / "other_corpus").mkdir()
    np.save(d / "other_corpus" / "other_val_000000.npy", tokens(10))
    stopped_fineweb_runs(d)

    tiny = GPTConfig(block_size=32, vocab_size=64, n_layer=2, n_head=2, n_embd=32)  # TINY's shape
    weights = {"model": GPT(tiny).state_dict(), "model_config": dataclasses.asdict(tiny)}
    torch.save(weights, d / "weights_only.pt")
    (d / "loop.pt").symlink_to("loop.pt")
    (d / "ahead").mkdir()
    torch.save({**weights, "optimizer": {}, "train_loader": {}, "rng": {}, "step": 4}, d / "ahead" / "model_00004.pt")
    torch.save({**weights, "tokenizer": {"tokenizer": "char", "vocab": "abc"}}, d / "char_model.pt")
    torch.save({**weights, "tokenizer": {"tokenizer": "sentencepiece"}}, d / "odd_tokenizer.pt")
    shards("unfinished", tokens(4096))
    (d / "unfinished" / ".fineweb_incomplete").touch()
    shards("two_corpora", tokens(4096))
    np.save(d / "two_corpora" / "y_train_000001.npy", tokens(100))
    shards("changed", tokens(100))
    (d / "changed" / "manifest.json").write_text(json.dumps({"tokenizer": "gpt2", "shards": [
        {"file": "x_val_000000.npy", "split": "val", "tokens": 1024},
        {"file": "x_train_000001.npy", "split": "train", "tokens": 4096}]}))
    (d / "busy").mkdir()  # the test process holds its lock, as a running train_gpt2.py would (see `outcomes`)
    (d / "texts_full").mkdir()
    (d / "texts_full" / "notes.txt").write_text("someone's files\n")
    (d / "good_log").mkdir()
    (d / "good_log" / "log.txt").write_text("".join(f"{i} train {10 - i}\n" for i in range(10)))

    torch.save({**weights, "optimizer": {}, "train_loader": {}, "rng": {}, "step": 1,
                "data": {"fingerprint": "0123456789abcdef" * 4}}, d / "other_data.pt")
    torch.save({**weights, "optimizer": {}, "train_loader": {}, "rng": {}, "step": 1,
                "train_config": {"batch_size": 4}}, d / "other_batch.pt")
    (d / "full_log").mkdir()  # log.txt 50 bytes short of the disk's end: the first evaluation's line does not fit
    (d / "full_log" / "log.txt").write_text("0 x 0.5\n" * ((20_000 - 50) // 8))
    for fifo in ("fifo.pt", "fifo.jsonl"):
        os.mkfifo(d / fifo)
    shards("fifo_data", tokens(4096))
    (d / "fifo_data" / "x_train_000001.npy").unlink()
    os.mkfifo(d / "fifo_data" / "x_train_000001.npy")
    (d / "fifo_log").mkdir()
    os.mkfifo(d / "fifo_log" / "log.txt")
    (d / "ok.jsonl").write_text(json.dumps({**EXAMPLE, "label": 0}) + "\n")
    (d / "label7.jsonl").write_text(json.dumps({**EXAMPLE, "label": 7}) + "\n")
    return d


def stopped_fineweb_runs(d: Path) -> None:
    """stopped_run/ and damaged_run/: what fineweb.py leaves when a bad line stops it after some finished shards
    (its progress record among them); in damaged_run/ a finished shard then changed."""
    import fineweb as fineweb_py  # (`fineweb` is the Case maker above)

    docs = "".join(json.dumps({"text": f"A small document, number {i}."}) + "\n" for i in range(1100))
    (d / "half_bad.jsonl").write_text(docs + '{"text": "cut off\n')  # after the first batch of documents
    for name in ("stopped_run", "damaged_run"):
        with pytest.raises(SystemExit, match="finished shards kept in"):
            fineweb_py.main(["--local", str(d / "half_bad.jsonl"), "--out_dir", str(d / name), "--shard_size", "1000",
                             "--workers", "1", "--no_progress"])
    shard = d / "damaged_run" / "half_bad_train_000001.npy"
    shard.write_bytes(shard.read_bytes()[:-1] + b"\xff")


def command(case: Case, d: Path, out: Path) -> list[str]:
    return [sys.executable, case.program, *(a.format(d=d, out=out) for a in case.args)]


def run_case(case: Case, d: Path, out: Path) -> subprocess.CompletedProcess:
    return launcher.run(command(case, d, out), cwd=ROOT, env={**child_env(), **dict(case.env)}, timeout=TIMEOUT,
                        file_size_limit=case.file_size_limit)


def skip_reason(case: Case) -> str:
    """Why this machine cannot make the input bad, or ''."""
    if case.cpu_only and CUDA:
        return "CUDA"
    if case.cuda_only and not CUDA:
        return "no CUDA"
    if case.not_as_root and AS_ROOT:
        return "running as root"
    return ""


@pytest.fixture(scope="module")
def outcomes(request, tmp_path_factory) -> dict:
    """(the inputs' directory, {case: future of its finished process}): the selected cases, started two at a time."""
    d = make_inputs(tmp_path_factory.mktemp("bad_inputs"))
    busy = os.open(d / "busy" / ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(busy, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held for the whole module: that case's log_dir is in use
    selected = [item.callspec.params["case"] for item in request.session.items
                if getattr(item, "originalname", "") == "test_bad_input_is_rejected_clearly"]
    pool = ThreadPoolExecutor(max_workers=2)
    futures = {case: pool.submit(run_case, case, d, d / "out" / f"case{i}")
               for i, case in enumerate(selected) if not skip_reason(case)}
    yield d, futures
    pool.shutdown(cancel_futures=True)
    os.close(busy)


@pytest.mark.xdist_group("bad_inputs")  # under pytest -n, every case in one worker: `outcomes` starts them all there
@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=[
    *([pytest.mark.skip(reason=skip_reason(c))] if skip_reason(c) else []),
    *([pytest.mark.gpt2_contract] if c.program == "export_hf.py" else [])])  # GPT-2's Hugging Face layout
    for c in CASES])
def test_bad_input_is_rejected_clearly(case, outcomes):
    d, futures = outcomes
    proc = futures[case].result()
    err = proc.stderr.strip()
    assert proc.returncode != 0, f"accepted (exit 0):\n{proc.stdout[-2000:]}\n{err[-2000:]}"
    assert "Traceback" not in err, err[-3000:]
    assert len(err.splitlines()) == 1, f"not one line on stderr:\n{err[-3000:]}"  # no usage block, no warning first
    assert "error" in err and case.message.format(d=d) in err, f"stderr: {err!r}"


def first_table(text: str) -> list[list[str]]:
    """The cells of the body rows of the first markdown table in text ('\\|' is a literal bar in a cell)."""
    lines = [line.strip() for line in text.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    rows = [line.replace("\\|", "\0").strip("|").split("|") for line in lines[start + 2 : end]]
    return [[cell.strip().replace("\0", "|") for cell in row] for row in rows]


def test_readme_table_lists_exactly_these_cases():
    """README's "Bad inputs" table has one row per case, in order: | program | bad input | command | error |."""
    rows = first_table(README.read_text().split("\n## Bad inputs\n", 1)[1])
    assert all(len(row) == 4 for row in rows), [row for row in rows if len(row) != 4]
    assert [(row[0].strip("`"), row[1]) for row in rows] == [(c.program, c.bad_input) for c in CASES]
