"""Checks for notebook 11 (several processes: DDP on the CPU with gloo).

``check_rank_batch(rank_batch, seed=1234)`` calls the learner's ``rank_batch(n, global_batch, seed, epoch, step,
rank, world_size)`` for every step and rank of two epochs (two ranks with an odd last batch; four ranks with a
global batch four does not divide): together the ranks hold exactly the step's global batch of
``course_utils.data.epoch_order``, the shares differ by at most one sample, a call gives the same answer twice.
``check_strip_module_prefix(strip_module_prefix, seed=1234)`` gets the ``state_dict`` of a DDP-wrapped model, a
plain one and one whose model has its own child ``module``: exactly one leading ``module.`` goes (layer names
make ``str.replace`` and ``str.lstrip`` fail), the result loads with ``strict=True``, the argument is untouched.
Both derive every size and value from ``seed``; a wrong answer fails for every seed (``tests/test_exercise_sweeps.py``).

Example::

    check_rank_batch(rank_batch)
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from course_tools.checks import call_learner, exercise_check, expect, fail, passed
from course_utils.data import batches_per_epoch, epoch_order

__all__ = ["check_rank_batch", "check_strip_module_prefix", "HINTS"]

PREFIX = "module."


# ---------------------------------------------------------------- rank_batch

def _cases(seed: int) -> list[tuple[int, int, int, int, int]]:
    """``(n, global_batch, data_seed, epoch, world_size)``: sizes every typical mistake trips over.

    Two ranks: an even global batch, a last batch of odd size (at least 3), a later epoch.
    Four ranks: a global batch that 4 does not divide, a last batch of 5 or 6 samples (``torch.chunk``
    makes only three pieces of those).
    Every global batch holds at least as many samples as there are ranks (``course_utils.data``
    refuses smaller ones: a rank without samples).
    """
    rng = np.random.default_rng(seed)
    half = int(rng.integers(3, 7))
    b2 = 2 * half
    last2 = int(rng.choice(np.arange(3, b2, 2)))
    n2 = b2 * int(rng.integers(2, 4)) + last2
    b4 = 4 * int(rng.integers(2, 4)) + int(rng.integers(1, 4))
    last4 = int(rng.integers(5, 7))
    n4 = b4 * int(rng.integers(1, 3)) + last4
    data_seeds = rng.integers(0, 1_000_000, size=2)
    return [(n2, b2, int(data_seeds[0]), int(rng.integers(1, 6)), 2),
            (n4, b4, int(data_seeds[1]), int(rng.integers(2, 10)), 4)]


def _as_ids(value: Any, where: str) -> list[int]:
    """The learner's answer as a list of python ints (a list, tuple, range, 1-D tensor or array)."""
    expect(isinstance(value, (list, tuple, range, torch.Tensor, np.ndarray)), "返回样本编号的列表(list[int])",
           f"{type(value).__name__}({where})", "最后 return 一个列表")
    if isinstance(value, (torch.Tensor, np.ndarray)):
        integer = value.dtype.kind in "iu" if isinstance(value, np.ndarray) else \
            not value.dtype.is_floating_point and not value.dtype.is_complex and value.dtype != torch.bool
        expect(value.ndim == 1 and integer, "一维整数张量或列表(样本编号)",
               f"{type(value).__name__},形状 {tuple(value.shape)},dtype {value.dtype}({where})")
        return [int(v) for v in value.tolist()]
    expect(all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in value), "样本编号是整数",
           f"{list(value)[:8]!r}({where})", "返回整数的列表(张量可以 .tolist()),而不是浮点数或张量的列表")
    return [int(v) for v in value]


def _verify_step(shares: list[list[int]], order: list[int], order0: list[int], n: int, b: int, epoch: int,
                 step: int, where: str) -> None:
    w = len(shares)
    want = order[step * b:(step + 1) * b]
    flat = [i for share in shares for i in share]
    expect(all(0 <= i < n for i in flat), f"样本编号在 0..{n - 1} 之间", f"{sorted(set(flat))[:10]}({where})")
    expect(not all(sorted(share) == sorted(want) for share in shares),
           f"每个 rank 只拿全局 batch 的一份(约 {b // w} 个)", f"每个 rank 都拿了整个全局 batch({where})",
           "没有分片时 W 个进程在同一批样本上算 W 遍:按 rank 取自己的那一份")
    expect(not all(share == shares[0] for share in shares) or not shares[0],
           "各 rank 拿到不同的样本", f"所有 rank 拿到同样的 {len(shares[0])} 个样本({where})",
           "函数的结果要随 rank 变化:每个 rank 取全局 batch 里属于自己的那一段")
    positions = list(range(step * b, min((step + 1) * b, n)))
    expect(not (sorted(flat) == positions and sorted(want) != positions),
           "样本编号(epoch 顺序里这些位置上的数)", f"返回的是位置 {positions[0]}..{positions[-1]}({where})",
           "order = epoch_order(n, seed, epoch) 之后取 order[位置],不是位置本身")
    extra = set(flat) - set(want)
    if extra:
        old = set(order0[step * b:(step + 1) * b])
        following = set(order[(step + 1) * b:(step + 2) * b])
        where_in_order = {sample: k for k, sample in enumerate(order)}
        contiguous = all(share == order[where_in_order[share[0]]:where_in_order[share[0]] + len(share)]
                         for share in shares if share)
        if epoch and set(flat) == old:
            hint = "顺序和 epoch 无关了(每个 epoch 都一样):epoch_order 要传入 epoch,这正是 DistributedSampler.set_epoch 管的事"
        elif contiguous and extra <= following:
            hint = "越过了这一步全局 batch 的末尾:每个 rank 只在 order[step*B:(step+1)*B] 里取"
        else:
            hint = ("所有 rank 要用同一个顺序 epoch_order(n, seed, epoch):不要用全局随机数,种子里也不要加 rank"
                    "(各 rank 不同的是 dropout 的随机数,不是数据顺序)")
        fail("各 rank 合起来正好是这一步的全局 batch", f"有 {len(extra)} 个样本不属于它({where})", hint)
    duplicates = len(flat) - len(set(flat))
    expect(duplicates == 0, "每个样本只分给一个 rank", f"{duplicates} 个样本被分给了不止一个 rank({where})",
           "各 rank 的份额不能重叠")
    missing = set(want) - set(flat)
    expect(not missing, "各 rank 合起来正好是这一步的全局 batch", f"漏了 {len(missing)} 个样本({where})",
           "最后一个不满的全局 batch 也要分给各 rank,一个样本都不丢" if missing == set(want) else
           "全局 batch 不能被 world_size 整除时(最后一个不满的 batch 也一样),余下的样本也要分出去:B // W 会丢掉余数")
    sizes = [len(share) for share in shares]
    expect(max(sizes) - min(sizes) <= 1, "各 rank 的份额最多差 1 个样本", f"份额大小 {sizes}({where})",
           "均分:前 B % W 个 rank 各多拿 1 个(torch.tensor_split 就是这样分的;torch.chunk 不是)")


@exercise_check
def check_rank_batch(rank_batch: Callable[..., Any], seed: int = 1234) -> None:
    """Every step of two epochs, every rank: the shares partition the step's global batch, balanced, deterministic."""
    with torch.random.fork_rng(devices=[]):  # whatever the learner's function draws, the notebook's stream is kept
        _check_rank_batch(rank_batch, seed)
    passed("rank_batch: 2 个和 4 个 rank,各 rank 合起来恰好是每一步的全局 batch(含最后一个不满的),"
           "每个样本每个 epoch 恰好一次,份额最多差 1")


def _check_rank_batch(rank_batch: Callable[..., Any], seed: int) -> None:
    for n, b, data_seed, epoch, w in _cases(seed):
        order, order0 = epoch_order(n, data_seed, epoch).tolist(), epoch_order(n, data_seed, 0).tolist()
        for step in range(batches_per_epoch(n, b)):
            where = f"n={n}, global_batch={b}, epoch={epoch}, step={step}, world_size={w}"
            shares = [_as_ids(call_learner(rank_batch, n, b, data_seed, epoch, step, rank, w), f"{where}, rank={rank}")
                      for rank in range(w)]
            _verify_step(shares, order, order0, n, b, epoch, step, where)
            again = _as_ids(call_learner(rank_batch, n, b, data_seed, epoch, step, w - 1, w), where)
            expect(again == shares[-1], "同样的参数两次调用结果相同", f"rank {w - 1} 两次得到不同的样本({where})",
                   "不要用全局随机数(random.shuffle、torch.randperm 不传 generator):顺序只由 (seed, epoch) 决定")


# ---------------------------------------------------------------- strip_module_prefix

class _Net(nn.Module):
    """Layer names that catch string mistakes: ``embed`` starts with letters of "module." (``lstrip``
    eats them), ``head_module`` contains "module." (``replace`` breaks it)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.embed = nn.Linear(5, width)
        self.norm = nn.BatchNorm1d(width)
        self.head_module = nn.Linear(width, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head_module(torch.relu(self.norm(self.embed(x))))


class _Wrapper(nn.Module):
    """Names its child ``module``, as ``DistributedDataParallel`` does (and many EMA wrappers)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.module = inner


def _trained_net(seed: int) -> tuple[_Net, torch.Tensor]:
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    net = _Net(int(rng.integers(4, 9)))
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    net.train()
    net(torch.randn(16, 5, generator=gen))  # BatchNorm's running statistics move away from their defaults
    net.eval()
    return net, torch.randn(7, 5, generator=gen)


def _call_strip(fn: Callable[..., Any], state: dict, what: str) -> Mapping:
    keys_before = list(state)
    values_before = {k: v.clone() for k, v in state.items()}
    out = call_learner(fn, state)
    expect(list(state) == keys_before and all(torch.equal(state[k], v) for k, v in values_before.items()),
           "传入的字典保持原样(返回一个新字典)", f"{what} 被改动了",
           "新建一个字典返回;torch 的 consume_prefix_in_state_dict_if_present 是原地修改的")
    expect(isinstance(out, Mapping), "返回一个字典(键 → 张量)", f"{type(out).__name__}({what})", "最后 return 新字典")
    return out


def _key_hint(got: list[str], want: list[str]) -> str:
    if any(k.startswith("bed.") for k in got):
        return "str.lstrip('module.') 去掉的是这几个字符组成的集合,不是前缀(embed 变成了 bed):用 key[len('module.'):] 或 key.removeprefix('module.')"
    if any(k.startswith("head_") and not k.startswith("head_module.") for k in got):
        return "str.replace 把键中间的 'module.' 也删掉了(head_module.weight):只去掉开头的那一个"
    return "只去掉开头的一个 'module.'"


@exercise_check
def check_strip_module_prefix(strip_module_prefix: Callable[[dict], Any], seed: int = 1234) -> None:
    """DDP-style, plain and doubly wrapped state dicts: one leading ``module.`` removed, values kept, input untouched."""
    with torch.random.fork_rng(devices=[]):  # building the test models draws from torch's global generator
        _check_strip_module_prefix(strip_module_prefix, seed)
    passed("strip_module_prefix: DDP 的 state_dict 能严格加载进普通模型且输出相同;普通的原样不动;"
           "只去掉开头的一个 module.;传入的字典没有被改动")


def _check_strip_module_prefix(strip_module_prefix: Callable[[dict], Any], seed: int) -> None:
    net, x = _trained_net(seed)
    plain = net.state_dict()

    wrapped = _Wrapper(net).state_dict()
    out = _call_strip(strip_module_prefix, wrapped, "DDP 的 state_dict")
    got, want = sorted(out), sorted(plain)
    expect(got == want, f"键与普通模型相同,例如 {want[0]!r}",
           f"{[k for k in got if k not in plain][:3] or got[:3]}(缺 {len(set(want) - set(got))} 个)", _key_hint(got, want))
    expect(all(torch.equal(out[k], plain[k]) for k in want), "每个键对应的张量原样保留", "有的值变了",
           "只改键,不改值")
    fresh = _Net(net.embed.out_features).eval()
    fresh.load_state_dict(dict(out), strict=True)
    with torch.no_grad():
        same = torch.equal(fresh(x), net(x))
    expect(same, "加载后输出与原模型相同", "输出不同", "只改键,不改值")

    out = _call_strip(strip_module_prefix, plain, "普通模型的 state_dict")
    expect(sorted(out) == want, "没有 module. 前缀的键原样保留",
           f"{sorted(out)[:3]}(原来是 {want[:3]})" if out else "返回了空字典",
           "没有前缀的键不动(已经去过前缀的字典再处理一次,结果不变):先判断 key.startswith('module.')")

    nested = _Wrapper(_Wrapper(net)).state_dict()
    out = _call_strip(strip_module_prefix, nested, "套了两层的 state_dict")
    want_nested = sorted(PREFIX + k for k in plain)
    expect(sorted(out) == want_nested, f"只去掉开头的一个 module.,例如 {want_nested[0]!r}", f"{sorted(out)[:3]}",
           "DDP 只加一层 module.:模型自己叫 module 的子模块(例如 EMA 包装类的 self.module)要保留,不要循环去前缀")


HINTS: dict[str, tuple[str, ...]] = {
    "check_rank_batch": (
        "DDP 里每个 rank 训练全局 batch 的一份:所有 rank 用同一个 epoch 顺序、取同一个全局 batch,再把它分成 "
        "world_size 份、各拿自己那份;合起来不多不少正好是这个全局 batch",
        "11 的「3. 数据:每个 rank 看到的是什么」一节演示了各 rank 怎样分到样本,以及 epoch 怎样改变顺序",
        "常错的两处:顺序要随 epoch 变、与 rank 无关(epoch 传给 epoch_order,种子里不加 rank);全局 batch 不能被 "
        "world_size 整除时余数也要分出去,各份最多差 1 个(torch.chunk 做不到,看看 tensor_split 怎么分)",
    ),
    "check_strip_module_prefix": (
        "DDP 把模型放在一个叫 module 的属性里,所以 state_dict 的每个键前面多了一个 'module.'。"
        "要做的只是去掉键开头的这一个前缀,值和没有前缀的键都不动",
        "11 的「6. module. 前缀」一节打印了包装前后的键,并说明了为什么加载会失败",
        "常错的是字符串方法:lstrip 去掉的是一组字符(会把 embed 吃成 bed),replace 会连键中间的 'module.' 一起删;"
        "只在键以前缀开头时切掉开头那几个字符;新建一个字典返回,不要改传入的",
    ),
}
