"""The shared stub-hint helpers catch a hint that gives away a line of the answer."""
from tests.support.notebook_cells import answer_lines_in, stub_hints

SOLUTION = '''def f(x):
    ### BEGIN SOLUTION 提示: 先归一化
    total = x.sum(dim=0, keepdim=True)
    return x / total
    ### END SOLUTION
'''


def test_stub_hints_reads_every_raise_message():
    stub = 'def f(x):\n    raise NotImplementedError("提示 A")\n\ndef g():\n    raise NotImplementedError("提示 B")\n'
    assert stub_hints(stub) == ["提示 A", "提示 B"]


def test_a_leaking_hint_is_caught_and_a_clean_one_is_not():
    assert answer_lines_in("提示: 用 total = x.sum(dim=0,keepdim=True)", SOLUTION) == ["total = x.sum(dim=0, keepdim=True)"]
    assert answer_lines_in("提示: 先归一化", SOLUTION) == []
    assert answer_lines_in("... return x / total", SOLUTION) == ["return x / total"]   # spaces do not hide it
    assert answer_lines_in("return x / total", SOLUTION, min_chars=20) == []    # short lines left out on request
