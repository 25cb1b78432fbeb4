"""The resume doctor: kill any training script at exact optimizer steps, resume it, name the first state that differs.

What: ``python -m course_utils.resume_doctor --steps N -- python train.py --out {out} '[--resume]'`` runs
the command once uninterrupted and in chains killed after exact optimizer steps and resumed in the same
folder (mid-epoch, right after an epoch end, twice in one chain), records every step from outside the
script (weights, optimizer state and lr, RNG states, the batch and its sample indices, an EMA, a
GradScaler) and prints the first difference, what it means and the fix (``--lang en``: in English);
a JSON report goes beside it. Exit 0: every resume exact; 1: one differed; 2: usage error or a
script that fails by itself.

Why: a resume that is "almost" right trains on: the loss curve looks continuous while a sample is seen
twice, an lr restarts or dropout draws other masks. Comparing states bit for bit (one CPU thread: a
correct resume is bit-identical) finds the first one and names it.

Pitfall: the doctor tests the script's checkpoints where the kills leave them: save often (every few
steps and at each epoch end), or a kill resumes from far back.

The parts: ``probe`` (in the script's process), ``runs`` (commands, kills, chains), ``forks`` (the chains'
processes forked from one interpreter that imported torch), ``compare`` (the first difference), ``explain``
(its words), ``cli`` (the command). Taught in ``04_checkpoint_resume`` §9;
the homework checks (``course_tools/checks/homework_resume.py``) share its machinery.

Example::

    python -m course_utils.resume_doctor --steps 40 -- python train.py --out {out} '[--resume]'
"""
from course_utils.resume_doctor.cli import DIFFERED, ERROR, EXACT, diagnose, examine, main

__all__ = ["EXACT", "DIFFERED", "ERROR", "diagnose", "examine", "main"]
