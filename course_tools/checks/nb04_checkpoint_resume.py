"""Checks for notebook 04 (checkpoint / resume).

``check_resume_equivalence(save_checkpoint, load_checkpoint, seed=1234)`` trains a small dropout MLP with AdamW
and a warm-up + cosine schedule for K steps, each step using all three CPU generators (python ``random`` picks the
mini-batch, numpy adds augmentation noise, torch draws the dropout masks); saves with the learner's
``save_checkpoint``, continues M steps (the reference); then builds fresh objects as a "new process" would
(different init, every generator reseeded), restores with ``load_checkpoint`` and continues M steps. The losses
must match step by step; a failure names the first missing element (weights, optimizer, scheduler, then each
generator's state). Everything comes from ``seed``: a wrong answer fails for every seed (the 50-seed sweep). Example::

    check_resume_equivalence(save_checkpoint, load_checkpoint)
"""
from __future__ import annotations

import copy
import random
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from course_tools.checks import call_learner, exercise_check, expect, fail, passed, seed_cpu
from course_utils.schedule import make_scheduler


__all__ = ["check_resume_equivalence", "HINTS"]

_N, _BATCH = 128, 16


def _build(init_seed: int, total_steps: int) -> tuple[nn.Module, torch.optim.Optimizer, object]:
    seed_cpu(init_seed)
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.01)
    scheduler = make_scheduler(optimizer, warmup_steps=4, total_steps=total_steps)
    return model, optimizer, scheduler


def _train(model, optimizer, scheduler, x, y, n_steps: int) -> list[float]:
    """``n_steps`` AdamW steps. python ``random`` picks the batch, numpy adds noise, torch drops units."""
    model.train()
    losses = []
    for _ in range(n_steps):
        idx = random.sample(range(len(x)), _BATCH)
        noise = torch.from_numpy(np.random.normal(0.0, 0.05, size=(_BATCH, x.shape[1])).astype(np.float32))
        loss = F.cross_entropy(model(x[idx] + noise), y[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    return losses


def _generators() -> tuple:
    return random.getstate(), np.random.get_state(), torch.get_rng_state()


def _set_generators(state: tuple) -> None:
    random.setstate(state[0])
    np.random.set_state(state[1])
    torch.set_rng_state(state[2])


def _same_numpy_state(a: tuple, b: tuple) -> bool:
    return a[0] == b[0] and np.array_equal(a[1], b[1]) and a[2:] == b[2:]


def _same_optimizer_state(saved: dict, current: dict) -> bool:
    if len(saved["state"]) == 0 or saved["state"].keys() != current["state"].keys():
        return False
    for key, state in saved["state"].items():
        other = current["state"][key]
        for name in ("exp_avg", "exp_avg_sq", "step"):
            if name not in other or not torch.equal(torch.as_tensor(state[name]), torch.as_tensor(other[name])):
                return False
    return True


@exercise_check
def check_resume_equivalence(save_checkpoint, load_checkpoint, seed: int = 1234) -> None:
    """Save after K steps, restore into fresh objects, continue: losses must equal the uninterrupted run."""
    learner_generators, threads = _generators(), torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny MLP: on a busy CPU, extra threads only wait for each other
    try:
        _check(save_checkpoint, load_checkpoint, seed)
    finally:
        torch.set_num_threads(threads)
        _set_generators(learner_generators)  # the notebook's own random streams are left as they were


def _check(save_checkpoint, load_checkpoint, seed: int) -> None:
    rng = np.random.default_rng(seed)
    k_steps, m_steps, epoch = int(rng.integers(5, 9)), 4, int(rng.integers(1, 5))  # epoch < k_steps: a swap shows
    total = k_steps + m_steps + 4
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(_N, 12, generator=gen)
    y = torch.randint(0, 4, (_N,), generator=gen)

    random.seed(seed)
    np.random.seed(seed % 2**32)
    model, optimizer, scheduler = _build(seed, total)
    _train(model, optimizer, scheduler, x, y, k_steps)
    snap_model = copy.deepcopy(model.state_dict())
    snap_opt = copy.deepcopy(optimizer.state_dict())
    snap_last_epoch = scheduler.last_epoch
    snap_generators = _generators()

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ckpt.pt"
        call_learner(save_checkpoint, path, model, optimizer, scheduler, epoch, k_steps)
        expect(path.is_file() and path.stat().st_size > 0, f"save_checkpoint 把检查点写到 {path.name}",
               "文件不存在或为空", "最后要 torch.save(字典, path)")
        try:
            torch.load(path, weights_only=True)
        except Exception as exc:
            fail("检查点能用 torch.load(weights_only=True) 读取", f"{type(exc).__name__}",
                 "只存张量、数字、字符串和它们的 dict/list/tuple: np.random.get_state() 里有 numpy 数组,"
                 "要转换(或用 course_utils.repro.rng_state());也不要存优化器对象本身")
        _set_generators(snap_generators)  # whatever save did, the reference continues from the saved point
        reference = _train(model, optimizer, scheduler, x, y, m_steps)

        # a "new process": different init, every generator reseeded as a fresh script would do
        fresh_model, fresh_opt, fresh_sched = _build(seed + 7919, total)
        random.seed(seed + 1)
        np.random.seed((seed + 2) % 2**32)
        torch.manual_seed(seed + 3)
        found = call_learner(load_checkpoint, path, fresh_model, fresh_opt, fresh_sched)
        after_load = _generators()

    _expect_restored(found, (epoch, k_steps), (snap_model, snap_opt, snap_last_epoch, snap_generators),
                     (fresh_model, fresh_opt, fresh_sched), after_load)
    resumed = _train(fresh_model, fresh_opt, fresh_sched, x, y, m_steps)
    worst = max(range(m_steps), key=lambda i: abs(resumed[i] - reference[i]))
    expect(abs(resumed[worst] - reference[worst]) <= 1e-6,
           f"续训后 {m_steps} 步的 loss 与不中断时逐步相同",
           f"续训第 {worst + 1} 步 loss {resumed[worst]:.6f},不中断为 {reference[worst]:.6f}")
    passed(f"断点续训等价: 第 {k_steps} 步保存检查点、换新对象恢复后,{m_steps} 步 loss 与不中断完全一致"
           "(模型、优化器、调度器和三个 CPU 随机数生成器都恢复了)")


def _expect_restored(found, saved: tuple[int, int], snapshot: tuple, fresh: tuple, after_load: tuple) -> None:
    """What ``load_checkpoint`` returned and restored, against the state at the save (epoch and step, model,
    optimizer, scheduler, the three CPU generators), in the order a learner fixes them."""
    epoch, k_steps = saved
    snap_model, snap_opt, snap_last_epoch, snap_generators = snapshot
    fresh_model, fresh_opt, fresh_sched = fresh
    expect(isinstance(found, (tuple, list)) and len(found) == 2,
           f"load_checkpoint 返回 (epoch, step) = ({epoch}, {k_steps})", f"{found!r}", "return 两个数: epoch, step")
    got = tuple(int(v) for v in found)
    expect(got != (k_steps, epoch) or got == (epoch, k_steps), f"load_checkpoint 返回 (epoch, step) = ({epoch}, {k_steps})",
           f"{got}", "顺序反了: 先 epoch,后 step")
    expect(got == (epoch, k_steps), f"load_checkpoint 返回 (epoch, step) = ({epoch}, {k_steps})", f"{got}",
           "返回检查点里存的 epoch 和 step,而不是固定的数")
    restored = fresh_model.state_dict()
    expect(all(torch.equal(restored[k], v) for k, v in snap_model.items()),
           "模型权重与保存时相同", "权重不同", "model.state_dict() 存了吗?load_state_dict 调了吗?")
    expect(_same_optimizer_state(snap_opt, fresh_opt.state_dict()),
           "优化器状态(AdamW 的 exp_avg / exp_avg_sq / step)被恢复", "与保存时不同",
           "optimizer.state_dict() 要存,也要 load_state_dict 回去: 动量清零 = 训练“失忆”")
    expect(fresh_sched.last_epoch == snap_last_epoch,
           f"学习率调度器的进度 last_epoch = {snap_last_epoch}", f"{fresh_sched.last_epoch}",
           "恢复后不要再调 scheduler.step()" if fresh_sched.last_epoch == snap_last_epoch + 1
           else "scheduler.state_dict() 存了、恢复了吗?否则学习率预热会从头再来")
    expect(after_load[0] == snap_generators[0],
           "python random 的状态与保存时相同(这里用 random 抽 batch)", "不同",
           "四个生成器都要存: random.getstate() / random.setstate();恢复之后不能再从它抽数")
    expect(_same_numpy_state(after_load[1], snap_generators[1]),
           "numpy 全局 RNG 的状态与保存时相同(这里用 np.random 加噪声)", "不同",
           "np.random.get_state() 要完整存下(五个字段,含位置 pos),转换成 weights_only 能读的类型")
    expect(torch.equal(after_load[2], snap_generators[2]),
           "torch 随机数状态与保存时相同(dropout 依赖它)", "不同",
           "torch.get_rng_state() / torch.set_rng_state();恢复要放在最后,之后不能再从它抽数")


HINTS: dict[str, tuple[str, ...]] = {
    "check_resume_equivalence": (
        "续训要和没中断过一样,检查点里就得有下一步要用到的一切:权重只是其一,优化器的动量、学习率调度走到哪、"
        "训练到第几个 epoch 和第几步、还有会影响后面抽样的随机数状态,缺一样曲线就会在续训后分叉",
        "04 的「2. 完整检查点的五要素:手写,再用 course_utils」一节逐项列出了五要素,并用实验展示了少存任何一项的后果",
        "常错的几处:随机数只存了 torch 的,漏了 Python random、numpy 或 GPU 的生成器;numpy 的状态原样存进去,"
        "默认的 weights_only=True 读不回;恢复随机数之后又调用了会抽随机数的代码;返回值写成了 (step, epoch)",
    ),
}
