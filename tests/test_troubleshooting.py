"""The ONE troubleshooting order (course_utils.debug.TROUBLESHOOTING) and every place that renders it."""
from __future__ import annotations

import re
from pathlib import Path

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
