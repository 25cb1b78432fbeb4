"""13's capstone: the tiny LM trainer's four resume defects, the learner's copy, and the doctor run on it.

Reference machinery, not taught: 13 keeps visible the command it runs and the diagnosis it reads. The reference
trainer, ``course_tools/lab/train_tiny_lm.py``, resumes exactly; it sits in ``course_tools`` because 13's check
pastes a learner's two functions into it (:func:`with_functions`), also inside the grader's sandbox, which sees
only the course packages. :data:`DEFECTS` are textual edits of its ``save_checkpoint`` / ``load_checkpoint``, each
a kind of defect found in a real trainer (the comment names where); :func:`learner_copy`, the reference with all
four, is ``notebooks/capstone/train_tiny_lm.py`` byte for byte (``tests/test_nb13_resume_doctor.py``; to change the
trainer, edit the reference, then ``python -m course_tools.lab.capstone``). Example::

    path = write_trainer(folder, with_defects(trainer_source(), ["fp16 weights"]))
    verdict = run_doctor(path, folder / "doctor")
    verdict.exact, verdict.text
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TRAINER", "LEARNER_COPY", "STEPS", "DEFECTS", "trainer_source", "with_defects", "learner_copy",
           "with_functions", "write_trainer", "Verdict", "run_doctor", "first_finding", "main"]

TRAINER = Path(__file__).with_name("train_tiny_lm.py")
LEARNER_COPY = Path(__file__).resolve().parents[2] / "notebooks" / "capstone" / "train_tiny_lm.py"
STEPS = 24          # the trainer's default --steps: three epochs of eight batches
FUNCTIONS = ("save_checkpoint", "load_checkpoint")

# name -> the edits (reference text, defective text) that put the defect into save/load, in file order.
DEFECTS: dict[str, tuple[tuple[str, str], ...]] = {
    # MiniMind's resume file stores the weights as v.half(): half the weights' bytes, rounded to 11 bits on load
    "fp16 weights": (('    torch.save({"model": model.state_dict(),\n',
                      '    torch.save({"model": {k: v.half() for k, v in model.state_dict().items()},  # 2 bytes a weight\n'),),
    # the scheduler forgotten: LambdaLR starts its warm-up again after a resume
    "scheduler not saved": (('                "scheduler": scheduler.state_dict(),\n', ''),
                            ('    scheduler.load_state_dict(state["scheduler"])\n', '')),
    # the data order restarted (prime-rl PR #3332, ms-swift #10050): only the epoch saved, its batches replayed
    "data order restarted": (('                "sampler": sampler.state_dict(),\n', '                "epoch": sampler.epoch,\n'),
                             ('    sampler.load_state_dict(state["sampler"])\n', '    sampler.set_epoch(state["epoch"])\n')),
    # MiniMind saves no RNG state: dropout draws other masks after a resume
    "no RNG state": (('                "rng": torch.get_rng_state(),\n', ''),
                     ('    torch.set_rng_state(state["rng"])\n', '')),
}


def trainer_source() -> str:
    """The reference trainer's text (it resumes exactly)."""
    return TRAINER.read_text(encoding="utf-8")


def with_defects(source: str, names) -> str:
    """``source`` with the edits of each defect in ``names``; a ``ValueError`` when an edit's text is missing."""
    for name in names:
        for old, new in DEFECTS[name]:
            if source.count(old) != 1:
                raise ValueError(f"{name}: {old.strip()!r} occurs {source.count(old)} times")
            source = source.replace(old, new)
    return source


def learner_copy() -> str:
    """The learner's trainer: the reference with all four defects."""
    return with_defects(trainer_source(), DEFECTS)


def with_functions(cell: str, source: str | None = None) -> str:
    """``source`` (the reference) with its ``save_checkpoint`` and ``load_checkpoint`` replaced by ``cell``
    (a learner's exercise cell: its imports, helpers and the two functions), pasted where the first stood."""
    source = trainer_source() if source is None else source
    lines = source.splitlines(keepends=True)
    spans = [(node.lineno - 1, node.end_lineno) for node in ast.parse(source).body
             if isinstance(node, ast.FunctionDef) and node.name in FUNCTIONS]
    assert len(spans) == len(FUNCTIONS), spans
    (a, b), (c, d) = sorted(spans)
    return "".join(lines[:a]) + cell.strip("\n") + "\n" + "".join(lines[b:c]).lstrip("\n") + "".join(lines[d:])


def write_trainer(folder: Path, source: str) -> Path:
    """``source`` written as ``folder/train_tiny_lm.py``; its path."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "train_tiny_lm.py"
    path.write_text(source, encoding="utf-8")
    return path


@dataclass(frozen=True)
class Verdict:
    """What the doctor said: exit status (0 exact, 1 differed, 2 usage or the script failed by itself),
    the printed diagnosis, and its JSON report ({} when none was written)."""

    returncode: int
    text: str
    report: dict

    @property
    def exact(self) -> bool:
        return self.returncode == 0


def run_doctor(script: Path, folder: Path, steps: int = STEPS, seed: int = 1234, chains: str | None = None,
               timeout: float = 600) -> Verdict:
    """``python -m course_utils.resume_doctor --steps STEPS --workdir FOLDER -- python SCRIPT ... '[--resume]'``;
    ``chains`` (``"mid"``, ...): only those kill-and-resume chains (``--chains``), else all three."""
    folder.mkdir(parents=True, exist_ok=True)
    report = folder / "report.json"
    command = [sys.executable, "-m", "course_utils.resume_doctor", "--steps", str(steps), "--workdir", str(folder),
               *(["--chains", chains] if chains else []), "--report", str(report),
               "--", sys.executable, str(script), "--out", "{out}", "--steps", str(steps), "--seed", str(seed),
               "[--resume]"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=folder)
    data = json.loads(report.read_text(encoding="utf-8")) if report.is_file() else {}
    return Verdict(done.returncode, (done.stdout + done.stderr).strip(), data)


def first_finding(report: dict) -> tuple[str, str] | None:
    """(component, what) of the doctor's first finding (its report's ``first``), or None: the component's key
    (``"weights"``, ``"scheduler"``, ``"data"``, ``"rng"``, ...) and the doctor's one-line account of where it shows."""
    first = report.get("first")
    return (str(first["component"]), str(first["what"])) if isinstance(first, dict) else None


def main() -> None:
    """Write the learner's copy from the reference."""
    LEARNER_COPY.parent.mkdir(parents=True, exist_ok=True)
    LEARNER_COPY.write_text(learner_copy(), encoding="utf-8")
    print(f"wrote {LEARNER_COPY}")


if __name__ == "__main__":
    main()
