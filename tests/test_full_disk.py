"""Every writer on a full disk: a file-size limit (RLIMIT_FSIZE, SIGXFSZ ignored) makes a large
write fail as ENOSPC would. Each program ends with one line naming the file, leaves no temporary
file behind, and a rerun with room finishes the job. The programs' main() run in this process,
under the limit for as long as they run (fineweb.py's forked workers inherit it)."""

import contextlib
import resource
import signal

import pytest
from conftest import documents, make_corpus, one_line_error, run_main, tiny_flags, train_tiny

import export_hf
import fineweb
import train_gpt2

LIMIT = 20_000  # bytes a file may hold: logs and records fit, shards and checkpoints do not


@contextlib.contextmanager
def file_size_limit(limit):
    """This process's writes past `limit` bytes of a file fail (EFBIG), its soft limit only:
    lifted again at the end."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def cannot_write(main, args, limit, capsys, program, path):
    """main(args) under the limit ends in one line saying it cannot write path; that line."""
    with file_size_limit(limit):
        code, err = run_main(main, args, capsys)
    one_line_error(code, err, program, f"cannot write {path}")
    return err


def leftovers(root):
    return sorted(p.name for p in root.rglob("*.tmp*"))


def test_fineweb_on_a_full_disk_then_with_room(tmp_path, capsys):
    text = tmp_path / "docs.txt"
    text.write_text("\n\n\n".join(documents(60)) + "\n")
    args = ["--local", str(text), "--tokenizer", "char", "--out_dir", str(tmp_path / "data")]
    err = cannot_write(fineweb.main, args, LIMIT, capsys, "fineweb.py", tmp_path / "data")
    assert ".npy" in err
    assert leftovers(tmp_path) == []
    # with room, the same command finishes; its shards are a clean build's
    fineweb.main(args)
    clean = make_corpus(tmp_path / "clean", documents(60))
    made = sorted((tmp_path / "data").glob("*.npy"))
    assert [p.name for p in made] == sorted(p.name for p in clean.glob("*.npy"))
    assert all(p.read_bytes() == (clean / p.name).read_bytes() for p in made)


# a limit at the run's first write (its code, kept in code/), then one halfway through the
# checkpoint, in torch's zip writer
@pytest.mark.parametrize("limit, name", [(30_000, "code/"), (200_000, "model_00002.pt")])
def test_trainer_on_a_full_disk(tmp_path, small_corpus, capsys, limit, name):
    log_dir = tmp_path / "log"
    args = tiny_flags(small_corpus, log_dir, max_steps=2)
    cannot_write(train_gpt2.main, args, limit, capsys, "train_gpt2.py", log_dir / name)
    assert leftovers(tmp_path) == []
    assert list(log_dir.glob("model_*")) == []
    # a start that failed leaves nothing it made: the same command with room starts clean; a
    # run that failed at its first checkpoint, after its steps, keeps its log and goes on with
    # --resume auto
    if name == "code/":
        assert not log_dir.exists()
    else:
        args += ["--resume", "auto"]
    train_gpt2.main(args)
    assert [p.name for p in log_dir.glob("model_*")] == ["model_00002.pt"]


@pytest.mark.parametrize("name", ["log.txt", "runs.jsonl"])
def test_trainer_records_on_a_full_disk_name_the_file_and_leave_no_torn_line(
    tmp_path, small_corpus, capsys, name
):
    # a log.txt (or runs.jsonl) near the limit: its next record fails mid-line; the error names
    # it, and the part written is cut off again, so every line stays whole
    log_dir = tmp_path / "log"
    train_tiny(small_corpus, log_dir, max_steps=2)
    with open(log_dir / name, "a") as f:
        f.write("0 filler 1.0\n" * 8000 if name == "log.txt" else '{"filler": 1}\n' * 8000)
    before = (log_dir / name).read_bytes()
    limit = len(before) + 10
    args = tiny_flags(small_corpus, log_dir, max_steps=4, resume="auto")
    cannot_write(train_gpt2.main, args, limit, capsys, "train_gpt2.py", log_dir / name)
    # (the first record it appends is longer than the 10 bytes left)
    assert (log_dir / name).read_bytes() == before
    # with room, the same run goes on
    train_tiny(small_corpus, log_dir, max_steps=4, resume="auto")
    lines = (log_dir / "log.txt").read_text().splitlines()
    assert all(len(line.split()) == 3 for line in lines)


@pytest.mark.gpt2_contract  # export_hf.py writes GPT-2's format: an edited model may not fit it
def test_export_on_a_full_disk(tmp_path, small_corpus, capsys, quiet_transformers):
    log_dir = tmp_path / "log"
    train_tiny(small_corpus, log_dir, max_steps=1)
    out = tmp_path / "hf"
    args = [log_dir / "model_00001.pt", out]
    cannot_write(export_hf.main, args, 2_000, capsys, "export_hf.py", out)
    assert leftovers(tmp_path) == []
    assert not out.exists()
