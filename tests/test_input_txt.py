"""input.txt, the built-in corpus, and scripts/build_input_txt.py that makes it."""

import re

import build_input_txt as build  # scripts/, which conftest puts on the path
from conftest import ROOT


def test_input_txt_is_about_a_megabyte_of_clean_plays():
    raw = (ROOT / "input.txt").read_bytes()
    text = raw.decode("utf-8")
    assert build.MIN_CHARS <= len(text) <= build.MAX_CHARS
    assert "\r" not in text and text.endswith("\n") and not text.endswith("\n\n")
    assert "gutenberg" not in text.lower() and "*** start" not in text.lower()
    plays = text.split(build.PLAY_SEPARATOR)
    assert len(plays) == 8
    assert all(p.splitlines()[2] == "by William Shakespeare" for p in plays)
    assert all(
        "\n\n\n" not in p.rstrip("\n") for p in plays
    )  # inside a play at most one blank line
    assert not re.search(r"[ \t]+\n", text)  # no trailing spaces


def test_clean_play_strips_boilerplate_and_collapses_blank_lines():
    raw = (
        "The Project Gutenberg EBook of Hamlet\r\nLicense blah\r\n"
        "*** START OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\r\n\r\n\r\n"
        "HAMLET   \r\n\r\n\r\n\r\nACT I.\r\n\r\nBer.\r\nWho's there?\r\n\r\n"
        "*** END OF THIS PROJECT GUTENBERG EBOOK HAMLET ***\r\nmore license\r\n"
    )
    assert build.clean_play(raw) == "HAMLET\n\nACT I.\n\nBer.\nWho's there?"


def test_play_selection_is_sorted_and_skips_poems_and_incomplete(tmp_path):
    for name, size in [
        ("b_play", 40),
        ("a_play", 30),
        ("sonnets", 10),
        ("cymbeline", 10),
        ("c_play", 50),
        ("d_play", 20),
    ]:
        (tmp_path / f"{name}_gut.txt").write_text("x" * size)
        (tmp_path / f"{name}_gut_f.txt").write_text("folio")
    text, names = build.build_corpus(tmp_path, min_chars=100, max_chars=120)
    # a (33) + b (43) = 76; c (53) would pass 120, so it is skipped; d (23) -> 99; still < 100,
    # nothing left
    assert names == ["a_play_gut.txt", "b_play_gut.txt", "d_play_gut.txt"]
    assert text == build.PLAY_SEPARATOR.join(["x" * 30, "x" * 40, "x" * 20]) + "\n"
