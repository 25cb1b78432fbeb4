"""The ONE troubleshooting order (course_utils.debug.TROUBLESHOOTING) and every place that renders it."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from course_utils.debug import (TROUBLESHOOTING, TroubleStep, troubleshooting_chain, troubleshooting_markdown,
                                troubleshooting_text)

ROOT = Path(__file__).resolve().parent.parent


def test_the_order_is_complete_and_each_step_names_where_it_is_taught():
    assert len(TROUBLESHOOTING) >= 6
    suspects = [s.suspect for s in TROUBLESHOOTING]
    assert len(set(suspects)) == len(suspects)
    for step in TROUBLESHOOTING:
        assert isinstance(step, TroubleStep) and all(step), step
        for nn, section in re.findall(r"(\d\d) (§\d+|实验 \d+)", step.taught_in):
            notebook = next((ROOT / "solutions").glob(f"{nn}_*.ipynb"))
            heading = "## " + section.lstrip("§") + "." if section.startswith("§") else "### " + section
            assert heading in notebook.read_text(encoding="utf-8"), f"{step.suspect}: {notebook.name} has no {heading!r}"


def test_the_chapter_rules_are_in_their_place():
    """NaN first (precision, lr); labels before loss before data alignment before the gradient chain
    (the seed's order); code bugs before the learning rate; throughput last, data loading first."""
    suspects = [s.suspect for s in TROUBLESHOOTING]
    assert suspects[0] == "精度与学习率" and "NaN" in TROUBLESHOOTING[0].symptom
    order = [suspects.index(x) for x in ("标签", "loss 写法", "数据对齐", "梯度链", "学习率与饱和")]
    assert order == sorted(order)
    assert suspects[-1] == "数据加载" and "吞吐" in TROUBLESHOOTING[-1].symptom
    assert troubleshooting_chain() == " → ".join(suspects)


def test_text_and_markdown_render_every_step_in_order():
    text, md = troubleshooting_text(), troubleshooting_markdown()
    for k, step in enumerate(TROUBLESHOOTING, 1):
        assert f"\n{k}. {step.suspect}: 症状 {step.symptom};怎么查: {step.check}" in text
        assert f"\n{k}. **{step.suspect}**:{step.symptom}。怎么查:{step.check}。" in md
    assert troubleshooting_chain() in text and troubleshooting_chain() in md
    links = re.findall(r"\]\(([^)]+)\)", troubleshooting_markdown("notebooks/"))
    assert links and all((ROOT / link).is_file() for link in links), links


def test_glossary_holds_exactly_the_rendered_order():
    glossary = (ROOT / "GLOSSARY.md").read_text(encoding="utf-8")
    assert troubleshooting_markdown("notebooks/") in glossary, \
        "GLOSSARY.md is stale: paste course_utils.debug.troubleshooting_markdown('notebooks/') into it"
    assert glossary.count("标准排查顺序**:") == 1


def test_debug_overfit_failure_prints_the_order(tmp_path, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("debug_overfit_under_test", ROOT / "solutions/homework/debug_overfit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # threshold 0: no loss is below it, so the run fails after 2 steps and prints its failure message
    rc = module.main(["--out", str(tmp_path), "--steps", "2", "--model", "tiny", "--threshold", "0", "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 1 and "单 batch 过拟合失败" in err
    assert troubleshooting_text() in err


# --- every rendering comes from the one source -----------------------------------------------------------------

def _notebook(name: str):
    import nbformat
    return nbformat.read(ROOT / "solutions" / name, as_version=4)


def _markdown_outputs(cell) -> list[str]:
    return [o["data"]["text/markdown"] for o in cell.get("outputs", []) if "text/markdown" in o.get("data", {})]


@pytest.mark.parametrize("name", ["07_single_batch_overfit.ipynb", "10_homework.ipynb"])
def test_notebooks_render_the_order_from_course_utils(name):
    """07 §2 displays troubleshooting_markdown() itself (10's closing section may too); 09 refers to 07 §2."""
    nb = _notebook(name)
    cells = [c for c in nb.cells if c.cell_type == "code" and "troubleshooting_markdown()" in c.source]
    if name == "10_homework.ipynb" and not cells:
        return   # the full list is kept in one place (07 §2), 10 may point to it
    assert len(cells) == 1, f"{name}: {len(cells)} cells render the order"
    shown = _markdown_outputs(cells[0])
    if name == "10_homework.ipynb" and not cells[0].outputs:
        return   # 10 is a slow notebook: its stored outputs may be absent, the nbval run executes the cell
    assert shown == [troubleshooting_markdown()], f"{name}'s stored output is stale: re-run release"


def test_09_asks_the_order_and_answers_it_from_course_utils():
    from course_tools.checks.nb09_self_test import ORDER_CHOICES, QUIZ
    from course_tools.quiz import check

    q6 = QUIZ.by_id["q6"]
    assert q6.choices == ORDER_CHOICES and q6.choices[q6.answer] == troubleshooting_chain()
    assert "07 §2" in q6.explanation and troubleshooting_text() not in q6.explanation   # the list lives in 07 §2
    wrong = [letter for letter in q6.choices if letter != q6.answer]
    assert len(set(q6.choices.values())) == 4 and not any(check(q6, w).correct for w in wrong)


# a chain of short segments joined by arrows: "标签 → loss → 梯度链"
_CHAIN = re.compile(r"(?:[^→;;。,,、:::()()\n]{1,14}→\s*){2,}[^→;;。,,、:::()()\n]{1,14}")
_TOPICS = ("标签", "loss", "梯度链", "学习率", "数据对齐", "精度", "数据加载", "detach")
_OLD = ("标签 → loss → 数据对齐 → 梯度链", "标签对齐 → loss 写法", "依次检查标签与输入是否对齐",
        "标签与输入是否对齐 → loss 的写法")


def _learner_texts() -> dict[str, str]:
    import ast

    import nbformat

    texts = {}
    for path in sorted((ROOT / "solutions").glob("*.ipynb")):
        for k, cell in enumerate(nbformat.read(path, as_version=4).cells):
            texts[f"{path.name} cell {k}"] = cell.source
    for folder in ("course_tools", "course_utils", "solutions/homework"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            texts[str(path.relative_to(ROOT))] = "\n".join(
                n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str))
    for name in ("README.md", "GLOSSARY.md"):
        texts[name] = (ROOT / name).read_text(encoding="utf-8")
    return texts


def test_no_second_troubleshooting_order_anywhere():
    """Any arrow chain naming three or more debugging topics is (part of) the one order,
    or one of question 6's deliberately wrong orders."""
    from course_tools.checks.nb09_self_test import ORDER_CHOICES

    allowed = set(ORDER_CHOICES.values())
    canonical = troubleshooting_chain()
    found = []
    for where, text in _learner_texts().items():
        found += [(where, old) for old in _OLD if old in text]
        for match in _CHAIN.finditer(text):
            chain = " → ".join(p.strip().strip("*`") for p in match.group(0).split("→"))
            if sum(any(t in p for t in _TOPICS) for p in chain.split(" → ")) >= 3 \
                    and chain not in allowed and chain not in canonical:
                found.append((where, chain))
    assert not found, found
