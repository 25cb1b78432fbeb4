"""bench/read_time.py: its counts on a small file with a known answer, and its calibration (no timing)."""
from __future__ import annotations

import textwrap

import pytest

from tests.support.bench_scripts import load


@pytest.fixture(scope="module")
def read_time():
    return load("read_time")


SOURCE = textwrap.dedent('''\
    """Two words."""
    from pkg.parts import Box, helper


    # one comment here
    def run(box: Box) -> int:
        b = box
        return b.size + helper(b.missing)  # trailing
''')


def test_counts_on_a_known_file(read_time, tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "parts.py").write_text(
        "class Box:\n    size: int = 0\n\n\ndef helper(x):\n    return x\n")
    (tmp_path / "script.py").write_text(SOURCE)
    m = read_time.measure(tmp_path / "script.py", [tmp_path / "pkg"], ("pkg",))
    # tokens: from pkg . parts import Box , helper (8); def run ( box : Box ) -> int : (10); b = box (3);
    # return b . size + helper ( b . missing ) (11)
    assert {k: m[k] for k in read_time.REFERENCE} == {
        "lines": 8, "code_lines": 4, "prose_lines": 2, "code_tokens": 32, "prose_words": 6, "lookups": 3}
    # Box and helper imported; Box.size read through an alias; Box.missing is not Box's, so not a look-up
    assert m["_names"] == ["Box", "helper"] and m["_pairs"] == [("Box", "size")]


def test_an_f_string_is_one_token_on_every_python(read_time):
    """Python 3.12's tokenize splits an f-string into parts (FSTRING_START...): counted as one, as 3.10-3.11 do."""
    counts = read_time.text_counts('x = f"a{b + c:>{w}}d"\ny = (f"one"\n     f"two {x}")\n')
    assert counts["code_tokens"] == 3 + 6 and counts["code_lines"] == 3


def test_the_reference_reads_in_the_calibrated_time_on_both_bases(read_time):
    ref = read_time.REFERENCE
    assert read_time.line_minutes(ref) == pytest.approx(read_time.REFERENCE_MINUTES)
    assert read_time.token_minutes(ref) == pytest.approx(read_time.REFERENCE_MINUTES)
    doubled = {k: 2 * v for k, v in ref.items()}
    assert read_time.line_minutes(doubled) == pytest.approx(2 * read_time.REFERENCE_MINUTES)
    assert read_time.token_minutes(doubled) == pytest.approx(2 * read_time.REFERENCE_MINUTES)


def test_main_reports_both_bases_for_the_professional_script(read_time, capsys):
    result = read_time.main([])
    out = capsys.readouterr().out
    assert "line basis" in out and "token basis" in out
    assert result["lines"] > 300 and result["lookups"] > 0
    assert 0 < result["line_minutes"] < result["token_minutes"]
