"""plot.py draws a run's log.txt as curves.png: every kind it holds, GPT-2's reference lines only where they apply,
atomically, and never stopping a run."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import launcher
import plot
from helpers import child_env

ROOT = Path(__file__).resolve().parents[1]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def run_script(script: str, *args) -> subprocess.CompletedProcess:
    return launcher.run([sys.executable, str(ROOT / script), *args], cwd=ROOT, env=child_env(), timeout=300)


def write_log(log_dir: Path, hella: bool = True) -> Path:
    """A log.txt as run_files.Metrics writes it: train every step, val (and HellaSwag) every 5 steps."""
    lines = [f"{step} train {11.0 - 0.3 * step:.6f}" for step in range(11)]
    for step in (0, 5, 10):
        lines.append(f"{step} val {11.0 - 0.25 * step:.6f}")
        if hella:
            lines.append(f"{step} hella {0.25 + 0.002 * step:.6f}")
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / "log.txt").write_text("\n".join(lines) + "\n")
    return log_dir


def read_png(path: Path):
    import matplotlib.image

    assert path.read_bytes()[:8] == PNG_SIGNATURE
    return matplotlib.image.imread(path)  # (height, width, RGBA)


# ----------------------------------------------------------------------------------------------------------
# plot


def test_curves_png_draws_a_png_and_write_curves_is_atomic(tmp_path):
    out = plot.write_curves(write_log(tmp_path))
    assert out == tmp_path / "curves.png"
    height, width, _ = read_png(out).shape
    assert width > height > 0  # two panels side by side
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curves.png", "log.txt"]  # no temp file left


def test_every_kind_in_the_log_gets_a_panel(tmp_path):
    """A kind plot.py has never heard of is drawn too: adding a metric needs no change here."""
    one = read_png(plot.write_curves(write_log(tmp_path / "run", hella=False), tmp_path / "elsewhere.png"))
    two = read_png(plot.write_curves(write_log(tmp_path / "run2")))
    log = write_log(tmp_path / "run3")
    with open(log / "log.txt", "a") as f:
        f.writelines(f"{step} my_new_metric {step ** 0.5:.6f}\n" for step in range(11))
    three = read_png(plot.write_curves(log))
    assert 0 < one.shape[1] < two.shape[1] < three.shape[1]  # 1, 2, 3 panels side by side


def test_gpt2_reference_lines_only_for_a_fineweb_edu_run(tmp_path):
    """header.txt records the data's manifest: GPT-2's FineWeb-Edu val loss and HellaSwag lines are drawn for a
    FineWeb-Edu run only; on Shakespeare (or unknown data) the panels are the same as with no reference at all."""
    pngs = {}
    for dataset in ("fineweb-edu", "local", None):
        log = write_log(tmp_path / str(dataset))
        if dataset:
            (log / "header.txt").write_text(json.dumps({"config": {}}, indent=1) + "\n" +
                                            json.dumps({"data": {"dataset": dataset}}, indent=1) + "\n")
        assert plot.run_dataset(log) == dataset
        pngs[dataset] = plot.curves_png(log)
    assert pngs["local"] == pngs[None] != pngs["fineweb-edu"]


def test_curves_need_a_log(tmp_path):
    with pytest.raises(FileNotFoundError, match="log.txt does not exist"):
        plot.curves_png(tmp_path)
    (tmp_path / "log.txt").write_text("")
    with pytest.raises(ValueError, match="no metrics"):
        plot.curves_png(tmp_path)


def test_refresh_plot_never_raises(tmp_path, monkeypatch, capsys):
    plot.refresh(tmp_path)  # no log yet: a warning, not an exception
    assert "curves.png not updated" in capsys.readouterr().err
    write_log(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)  # as if matplotlib were missing
    plot.refresh(tmp_path)
    assert "curves.png not updated (ModuleNotFoundError" in capsys.readouterr().err
    assert not (tmp_path / "curves.png").exists()
    monkeypatch.undo()
    plot.refresh(tmp_path)
    read_png(tmp_path / "curves.png")


def test_plot_cli(tmp_path):
    result = run_script("plot.py", write_log(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "curves.png" in result.stdout
    read_png(tmp_path / "curves.png")


def test_plot_cli_missing_log_is_one_line_error(tmp_path):
    result = run_script("plot.py", tmp_path / "no_such_run")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0 and result.stderr.startswith("plot.py: error: ")
    assert "log.txt does not exist" in result.stderr


def test_unreadable_lines_are_skipped_with_a_warning_and_the_rest_drawn(tmp_path):
    """A torn last line (a full disk, a kill) or a line edited by hand: plot.py names each (file and line) in a
    warning and still draws every readable value."""
    log = write_log(tmp_path)
    with open(log / "log.txt", "a") as f:
        f.write("11 train\nnot a metric line at all\n12 train 7.5")
    result = run_script("plot.py", log)
    assert result.returncode == 0, result.stderr
    warnings = result.stderr.strip().splitlines()
    n = len((log / "log.txt").read_text().splitlines())
    assert [w.split(": skipped")[0] for w in warnings] == [f"warning: {log / 'log.txt'}:{n - 2}",
                                                           f"warning: {log / 'log.txt'}:{n - 1}"]
    assert plot.read_log(log / "log.txt")["train"][-1] == (12, 7.5)  # the line after them still counts
    read_png(log / "curves.png")
