"""The homework's five upgrades as data: number, title, the scripts its check runs, the check's name, the patch.

One place for the list that the dashboard (:mod:`course_tools.progress`) shows and the checks
(:mod:`course_tools.checks.nb10_homework`, which pairs each entry with its check function) and the
grader run. Importing it loads no check code: the dashboard stays light.

Example::

    from course_tools.checks.upgrades import UPGRADE_LIST
    [(u.number, u.title) for u in UPGRADE_LIST]      # [(1, "种子 + config.json"), ...]
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TRAIN", "HEALTHY", "TWIN", "UpgradeInfo", "UPGRADE_LIST"]

TRAIN, HEALTHY, TWIN = "train_cifar.py", "debug_overfit.py", "debug_overfit_broken_labels.py"


@dataclass(frozen=True)
class UpgradeInfo:
    """One upgrade: its scripts (in the homework folder), the name of its check in ``nb10_homework``,
    the reference answer's commit for it (``patch``, relative to ``solutions/homework``), and the flags it
    adds to ``train_cifar.py`` (``flags``: a script whose ``--help`` lists none of them has not started it)."""

    number: int
    title: str
    scripts: tuple[str, ...]
    check: str
    patch: str
    flags: tuple[str, ...] = ()


UPGRADE_LIST: tuple[UpgradeInfo, ...] = (
    UpgradeInfo(1, "种子 + config.json", (TRAIN,), "check_config", "upgrades/1_seed_config.patch",
                ("--out", "--seed", "--max-steps", "--model", "--data-fraction")),
    UpgradeInfo(2, "完整检查点 + kill 后续训", (TRAIN,), "check_resume", "upgrades/2_checkpoint_resume.patch",
                ("--resume", "--ckpt-every-steps", "--dropout")),
    UpgradeInfo(3, "梯度裁剪 + grad norm 日志", (TRAIN,), "check_clipping", "upgrades/3_clipping.patch", ("--clip",)),
    UpgradeInfo(4, "EMA 权重 + 并排评估", (TRAIN,), "check_ema", "upgrades/4_ema.patch", ("--ema-decay",)),
    UpgradeInfo(5, "单 batch 过拟合 + 对照脚本", (HEALTHY, TWIN), "check_overfit", "upgrades/5_debug_overfit.patch"),
)
