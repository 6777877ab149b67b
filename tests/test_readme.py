"""README.md is part of the product: its commands must parse, and the quick start must run (at tiny settings)."""

import re
import shlex
import sys
from pathlib import Path

import pytest

import launcher
import train_gpt2
from helpers import child_env

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, flags=re.S)


def commands(block: str) -> list[list[str]]:
    """Each `&&`-separated command of a block as argv, comments and line continuations removed."""
    joined = block.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        for part in line.split("&&"):
            argv = shlex.split(part, comments=True)
            if argv:
                out.append(argv)
    return out


def readme_commands() -> list[list[str]]:
    return [argv for block in bash_blocks(README) for argv in commands(block)]


def section(title: str) -> str:
    return README.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def run(argv, **kw):
    return launcher.run(argv, cwd=ROOT, env=child_env(), timeout=600, **kw)


def test_quick_start_has_exactly_two_commands_and_ci_runs_the_test_one():
    blocks = bash_blocks(section("Quick start"))
    assert len(blocks) == 2 and all(len(b.strip().splitlines()) == 1 for b in blocks)
    main_job, test_job = (commands(b) for b in blocks)
    assert main_job[0][:3] == test_job[0][:3] == ["pip", "install", "-r"]
    assert main_job[-1][:3] == ["python", "train_gpt2.py", "--preset"]
    ci_lines = [ln.strip() for ln in (ROOT / ".ci/run").read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert shlex.split(ci_lines[-1]) == test_job[-1], "CI must run exactly the README's test command"
    assert "requirements.txt" in (ROOT / ".ci/run").read_text()


RUN_FOR_REAL = ("sample.py", "plot.py")  # no parser to call alone: the slow test runs them
EXPORT = "export_hf.py"  # GPT-2's Hugging Face layout: run by the gpt2_contract test below


def train_args(argv: list[str]):
    """The training flags of a `python train_gpt2.py ...` or `torchrun ... train_gpt2.py ...` command, else None."""
    return argv[argv.index("train_gpt2.py") + 1 :] if "train_gpt2.py" in argv else None


def test_every_training_command_in_the_readme_parses():
    found = [args for argv in readme_commands() if (args := train_args(argv)) is not None]
    assert len(found) >= 4
    for args in found:
        cfg = train_gpt2.parse_train_args(args)
        if "gpt2-124M" in args:
            assert (cfg.total_batch_size, cfg.max_steps, cfg.max_lr) == (524288, 19073, 6e-4)


@pytest.mark.slow
def test_readme_commands_run_at_tiny_settings(tmp_path):
    """The quick start for real (shortened), the BPE smoke run, then sample.py / plot.py / hellaswag.py as the README
    spells them (on the BPE checkpoint: HellaSwag is in GPT-2's tokens)."""
    cmds = readme_commands() + inline_commands(README)
    quick = ["--max_steps", "4", "--eval_interval", "2", "--val_tokens", "1024", "--sample_interval", "4"]
    logs = {}
    for preset, data_name in (("shakespeare_char", "data/shakespeare_char"), ("shakespeare", "data/shakespeare")):
        fineweb = next(c for c in cmds if c[:2] == ["python", "fineweb.py"] and data_name in c)
        data, logs[preset] = tmp_path / preset, tmp_path / f"log_{preset}"
        assert run([sys.executable if a == "python" else str(data) if a == data_name else a for a in fineweb]).returncode == 0
        train = next(c for c in cmds if c == ["python", "train_gpt2.py", "--preset", preset])
        result = run([sys.executable] + train[1:] + ["--data_root", str(data), "--log_dir", str(logs[preset])] + quick)
        assert result.returncode == 0, result.stderr[-2000:]
        assert "val loss" in result.stdout and "sample 0 at step 4:" in result.stdout
    ckpt = logs["shakespeare"] / "model_00004.pt"
    assert ckpt.is_file() and (logs["shakespeare_char"] / "model_00004.pt").is_file()

    overfit = next(c for c in cmds if "--overfit_batch" in c)
    result = run([sys.executable] + overfit[1:] + ["--data_root", str(tmp_path / "shakespeare"), "--log_dir",
                                                   str(tmp_path / "overfit"), "--max_steps", "3"])
    assert result.returncode == 0, result.stderr[-2000:]

    # our checkpoint stands in for the hub model and for the README's log/model_19073.pt
    subst = {"python": sys.executable, "gpt2": str(ckpt), "log/model_19073.pt": str(ckpt), "cuda": "cpu",
             "out/gpt2-ours": str(tmp_path / "hf"), "log": str(logs["shakespeare"]),
             "log/shakespeare_char/model_02000.pt": str(logs["shakespeare_char"] / "model_00004.pt")}
    jsonl = tmp_path / "hs.jsonl"
    jsonl.write_text('{"ctx": "The king", "endings": ["speaks.", "sleeps.", "runs away.", "is dead."], "label": 0}\n' * 3)
    ran = set()
    for argv in cmds:
        if argv[:2] in (["python", script] for script in RUN_FOR_REAL):
            argv = [subst.get(a, a) for a in argv]
            for flag, value in (("--max_length", "12"), ("--max_new_tokens", "5")):  # short samples
                if flag in argv:
                    argv[argv.index(flag) + 1] = value
        elif argv[:2] == ["python", "hellaswag.py"]:
            argv = [subst.get(a, a) for a in argv] + ["--data", str(jsonl)]
        else:
            continue
        result = run(argv)
        assert result.returncode == 0, (argv, result.stderr[-2000:])
        ran.add(argv[1])
    assert ran == {*RUN_FOR_REAL, "hellaswag.py"}
    assert (logs["shakespeare"] / "curves.png").is_file()


@pytest.mark.gpt2_contract
def test_readme_export_commands_run(tmp_path):
    """export_hf.py as the README spells it, on one of our checkpoints (GPT-2's layout, so part of the contract)."""
    import dataclasses

    import torch

    config = train_gpt2.GPTConfig(block_size=16, vocab_size=50304, n_layer=1, n_head=1, n_embd=16)
    ckpt = tmp_path / "model_00004.pt"
    torch.save({"model": train_gpt2.GPT(config).state_dict(), "model_config": dataclasses.asdict(config)}, ckpt)
    exports = [c for c in readme_commands() + inline_commands(README) if c[:2] == ["python", EXPORT]]
    assert exports
    for i, argv in enumerate(exports):
        out = tmp_path / f"hf{i}"
        argv = [{"python": sys.executable, "log/model_19073.pt": str(ckpt), "out/gpt2-ours": str(out)}.get(a, a)
                for a in argv]
        result = run(argv)
        assert result.returncode == 0, (argv, result.stderr[-2000:])
        assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()


def inline_commands(text: str) -> list[list[str]]:
    """`python X.py ...` / `torchrun ...` code spans in the prose (placeholders like FILE... left out)."""
    spans = re.findall(r"`((?:python|torchrun) [^`]*)`", text)
    return [shlex.split(span) for span in spans if "..." not in span]


def test_every_command_in_the_readme_parses():
    """Each command the README shows, in a code block or in the prose, is accepted by its program's parser."""
    import bench
    import fineweb
    import hellaswag

    parsers = {"fineweb.py": fineweb.build_parser().parse_args, "hellaswag.py": hellaswag.parse_args,
               "bench.py": bench.parse_args, "train_gpt2.py": train_gpt2.parse_train_args}
    checked = 0
    for argv in readme_commands() + inline_commands(README):
        script = next((a for a in argv if a.endswith(".py")), None)
        if script is None or script in (*RUN_FOR_REAL, EXPORT):
            continue  # pip, or the commands the tests above run for real
        args = argv[argv.index(script) + 1 :]
        if "-h" in args:
            with pytest.raises(SystemExit) as e:
                parsers[script](args)
            assert e.value.code == 0
        else:
            parsers[script](args)
        checked += 1
    assert checked >= 12
