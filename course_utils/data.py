"""CIFAR-10 for the workbook: real data when it is on disk, otherwise a synthetic stand-in.

Everything here runs offline. ``load_cifar10`` looks for ``cifar-10-batches-py``
under the data root (argument, else ``$COURSE_DATA``, else ``<repo>/data``) and
falls back to a deterministic synthetic data set with the same shapes, dtypes,
class names and normalisation. It prints one line saying which source it uses.
The stand-in is generated once and kept under the data root (``synthetic/``): the
next kernel or script loads it in milliseconds instead of generating it again.
The fallback is only for "no data at all": a ``cifar-10-batches-py`` folder whose
files are missing, truncated or malformed raises ``UnreadableDataError`` naming the
file, rather than training on the stand-in and evaluating on real data.

Pitfall: a plain ``DataLoader(shuffle=True)`` draws its order from the global
torch RNG, so a restarted process replays epoch 0's order. ``make_loader`` makes
the order a pure function of ``(seed, epoch)`` and can start mid-epoch, and
augmentation is a function of ``(seed, epoch, index)``: which worker processes a
sample, or whether the run was resumed, does not change it.

Several processes (DDP under torchrun): the epoch order is cut into global batches first,
then each rank takes its contiguous share of each one (``rank_share``; sizes differ by at
most one). So step k trains on the same samples with 1, 2 or 8 processes, each sample of
the epoch exactly once, and a run can resume mid-epoch with another number of processes.
The per-rank weighting that keeps the gradient equal to the global batch's is in ``make_loader``.

Example::

    train = load_cifar10(train=True)            # prints the source
    small = take_fraction(train, 0.05)          # the "5% data" rule
    loader = make_loader(small, 128, seed=0, epoch=3, start_batch=10)
    mine = make_loader(small, 128, seed=0, epoch=3, rank=1, world_size=2)  # rank 1's 64 of each 128

Taught in ``00_start_here`` §2 (which data), ``05_reproducibility`` §2 (``make_loader``), ``07_single_batch_overfit`` §3–4 (label corruption, 5% of the data), ``11_multi_process`` (a share per rank).
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import io
import os
import zipfile
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from course_utils.durable import atomic_write_bytes
from course_utils.env import by_size

__all__ = ["CLASSES", "MEAN", "STD", "CIFAR_FOLDER", "SYSTEMATIC_SWAP", "CIFARArrays", "UnreadableDataError",
           "default_data_root", "load_cifar10", "synthetic_cifar10", "take_fraction", "corrupt_labels", "epoch_order",
           "rank_share", "EpochBatches", "make_loader", "batches_per_epoch"]


CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)
CIFAR_FOLDER = "cifar-10-batches-py"
# Pairs a tired annotator mixes up; used by ``corrupt_labels(mode="systematic")``.
SYSTEMATIC_SWAP = (2, 9, 0, 5, 7, 3, 8, 4, 6, 1)  # airplane<->bird, automobile<->truck, cat<->dog, deer<->horse, frog<->ship


class CIFARArrays(Dataset):
    """Images as a uint8 array ``(N, 32, 32, 3)`` plus integer labels.

    Items are ``(float tensor 3x32x32, normalised; int label)``. With
    ``augment=True`` a random 4-pixel-padded crop and a horizontal flip are
    applied, drawn from ``(seed, epoch, index)``; call ``set_epoch`` before
    building each epoch's loader (``make_loader`` does this).
    """

    def __init__(self, data: np.ndarray, targets: list[int], source: str, reason: str = "",
                 augment: bool = False, seed: int = 0) -> None:
        if data.dtype != np.uint8 or data.ndim != 4 or data.shape[1:] != (32, 32, 3):
            raise ValueError(f"图像数组应为 uint8 (N, 32, 32, 3),实际是 {data.dtype} {data.shape}")
        if len(targets) != len(data):
            raise ValueError(f"标签数 {len(targets)} 与图像数 {len(data)} 不一致")
        self.data = data
        self.targets = [int(t) for t in targets]
        self.classes = list(CLASSES)
        self.source = source
        self.reason = reason
        self.augment = augment
        self.seed = seed
        self.epoch = 0
        self._mean = torch.tensor(MEAN).view(3, 1, 1)
        self._std = torch.tensor(STD).view(3, 1, 1)

    def __len__(self) -> int:
        return len(self.data)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        img = self.data[index]
        if self.augment:
            rng = np.random.default_rng((self.seed, self.epoch, int(index)))
            dy, dx, flip = rng.integers(0, 9), rng.integers(0, 9), rng.integers(0, 2)
            padded = np.pad(img, ((4, 4), (4, 4), (0, 0)), mode="reflect")
            img = padded[dy:dy + 32, dx:dx + 32]
            if flip:
                img = img[:, ::-1]
        x = torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1).float().div_(255)
        return (x - self._mean) / self._std, self.targets[index]

    def replace(self, data: np.ndarray | None = None, targets: list[int] | None = None,
                **changes) -> "CIFARArrays":
        """A copy with some fields replaced (used by subsets and label corruption)."""
        new = CIFARArrays(self.data if data is None else data,
                          self.targets if targets is None else targets,
                          changes.pop("source", self.source), changes.pop("reason", self.reason),
                          changes.pop("augment", self.augment), changes.pop("seed", self.seed))
        for key, value in changes.items():
            setattr(new, key, value)
        return new


class UnreadableDataError(RuntimeError):
    """Real CIFAR-10 is on disk but a file of it is missing, truncated or malformed (the message names it)."""


def default_data_root() -> Path:
    """``$COURSE_DATA`` if set, else the ``data/`` folder at the workbook's root."""
    env = os.environ.get("COURSE_DATA")
    return Path(env).expanduser() if env else Path(__file__).resolve().parent.parent / "data"


def load_cifar10(train: bool = True, root: str | os.PathLike | None = None, download: bool = False,
                 augment: bool = False, seed: int = 0, quiet: bool = False) -> CIFARArrays:
    """CIFAR-10 train or test split; real data if found, else the synthetic stand-in.

    The result has ``source`` ("cifar10" or "synthetic") and ``reason``.
    Sizes of the stand-in: 50,000/10,000 images, or 5,000/1,000 with ``COURSE_FAST=1``.
    Raises ``UnreadableDataError`` when the ``cifar-10-batches-py`` folder exists but a
    file of the split cannot be read: the stand-in replaces missing data, never broken data.
    """
    root = Path(root).expanduser() if root is not None else default_data_root()
    split = "train" if train else "test"
    data = targets = None
    folder = root / CIFAR_FOLDER
    if not folder.is_dir() and download:
        try:
            from torchvision.datasets import CIFAR10
            CIFAR10(str(root), train=train, download=True)
        except Exception as exc:  # offline: no data at all, the stand-in is used
            reason = f"下载失败({type(exc).__name__}: {str(exc)[:80]})"
    if folder.is_dir():
        data, targets = _read_cifar_from_disk(folder, train)
        reason = f"在 {folder} 找到了真实数据"
    elif not download:
        reason = f"{root} 下没有 {CIFAR_FOLDER}"
    if data is not None:
        ds = CIFARArrays(data, targets, "cifar10", reason, augment, seed)
        msg = f"数据: 真实 CIFAR-10 ({split}, {len(ds)} 张) — {reason}"
    else:
        n = by_size(50_000, 5_000) if train else by_size(10_000, 1_000)
        images, labels = _cached_synthetic(root, n, seed=1 if train else 2)
        reason += ";使用内置合成替身(放入真实数据或设置 COURSE_DATA 即可切换)"
        ds = CIFARArrays(images, labels, "synthetic", reason, augment, seed)
        msg = f"数据: 合成 CIFAR-10 替身 ({split}, {len(ds)} 张) — {reason}"
    if not quiet:
        print(msg)
    return ds


def _read_cifar_from_disk(folder: Path, train: bool) -> tuple[np.ndarray, list[int]]:
    """The python-pickle CIFAR-10 batches of one split, each file checked (shapes, dtypes, labels)."""
    import pickle
    images, labels = [], []
    for name in [f"data_batch_{i}" for i in range(1, 6)] if train else ["test_batch"]:
        path = folder / name
        try:
            with open(path, "rb") as f:
                entry = pickle.load(f, encoding="latin1")
            rows = np.asarray(entry["data"])
            batch_labels = [int(t) for t in entry.get("labels", entry.get("fine_labels", []))]
            if rows.dtype != np.uint8 or rows.ndim != 2 or rows.shape[1] != 3072:
                raise ValueError(f"图像应为 uint8 (N, 3072),实际是 {rows.dtype} {rows.shape}")
            if len(batch_labels) != len(rows) or not all(0 <= t < 10 for t in batch_labels):
                raise ValueError(f"{len(rows)} 张图配了 {len(batch_labels)} 个标签,或标签不在 0–9")
        except FileNotFoundError:
            raise UnreadableDataError(f"真实数据不完整: 缺少 {path};补齐文件,或移走 {folder} 改用合成替身") from None
        except Exception as exc:  # truncated or foreign pickle, wrong layout
            raise UnreadableDataError(f"真实数据文件 {path} 无法读取({type(exc).__name__}: {str(exc)[:80]});"
                                      "文件可能被截断或损坏,请重新下载") from None
        images.append(rows.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        labels += batch_labels
    return np.ascontiguousarray(np.concatenate(images), dtype=np.uint8), labels


# Per class: grating orientation (radians), frequency (cycles per image), colour direction.
_THETA = np.linspace(0, np.pi, 10, endpoint=False) + 0.1
_FREQ = np.array([1.5, 2.5, 3.5, 2.0, 3.0, 1.5, 2.5, 3.5, 2.0, 3.0])
_COLOUR = np.random.default_rng(1234).uniform(-1, 1, size=(10, 3))


@functools.lru_cache(maxsize=8)
def synthetic_cifar10(n: int, seed: int = 1) -> tuple[np.ndarray, list[int]]:
    """``n`` synthetic 32x32 RGB uint8 images with balanced labels, deterministic in ``seed``.

    Each class is an oriented colour grating with jittered angle, frequency and
    phase, blended with a distractor grating of another class (up to 65% weight),
    on a random background with pixel noise. Some blends are genuinely ambiguous,
    so a good model stays below 100% test accuracy.
    """
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(n) % 10)
    yy, xx = np.mgrid[0:32, 0:32].astype(np.float32) / 32.0
    out = np.empty((n, 32, 32, 3), np.uint8)
    for start in range(0, n, 2048):
        lab = labels[start:start + 2048]
        m = len(lab)
        other = (lab + rng.integers(1, 10, m)) % 10
        w = rng.uniform(0.0, 0.65, m).astype(np.float32)
        main = _grating(rng, lab, xx, yy)
        distractor = _grating(rng, other, xx, yy)
        pattern = (1 - w)[:, None, None] * main + w[:, None, None] * distractor
        colour = (1 - w)[:, None] * _COLOUR[lab] + w[:, None] * _COLOUR[other]
        colour = (colour + rng.normal(0, 0.35, (m, 3))).astype(np.float32)
        background = rng.uniform(0.3, 0.7, (m, 1, 1, 3)).astype(np.float32)
        img = background + 0.3 * pattern[..., None] * colour[:, None, None, :]
        img += 0.1 * rng.standard_normal(img.shape, dtype=np.float32)
        out[start:start + m] = np.clip(img * 255, 0, 255).astype(np.uint8)
    return out, labels.tolist()


SYNTHETIC_CACHE = "synthetic"  # folder under the data root with the stand-in's arrays, one .npz per split


@functools.lru_cache(maxsize=1)
def _generator_id() -> str:
    """Names the generator's code and constants: a cache written by another version is never read."""
    source = inspect.getsource(synthetic_cifar10) + inspect.getsource(_grating)
    constants = b"".join(a.tobytes() for a in (_THETA, _FREQ, _COLOUR))
    return hashlib.sha256(source.encode() + constants).hexdigest()[:16]


def _cached_synthetic(root: Path, n: int, seed: int) -> tuple[np.ndarray, list[int]]:
    """``synthetic_cifar10(n, seed)``, kept in ``root/synthetic/`` so that the next process loads it.

    Generating 50,000 images takes seconds in every kernel and script; loading them, milliseconds.
    Written with the one atomic write; read only if shapes, dtypes and labels are as generated
    (else regenerated and replaced); a root that cannot be written (read-only, full) means no cache.
    """
    path = root / SYNTHETIC_CACHE / f"{n}-{seed}-{_generator_id()}.npz"
    try:
        with np.load(path, allow_pickle=False) as saved:
            images, labels = saved["images"], saved["labels"]
        balanced = labels.dtype.kind == "i" and np.array_equal(np.bincount(labels), np.bincount(np.arange(n) % 10))
        if images.shape == (n, 32, 32, 3) and images.dtype == np.uint8 and labels.shape == (n,) and balanced:
            return images, labels.tolist()
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        pass  # no cache yet, or a damaged one: generate it again
    images, labels = synthetic_cifar10(n, seed)
    buffer = io.BytesIO()
    np.savez(buffer, images=images, labels=np.asarray(labels, dtype=np.int64))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, buffer.getvalue())
    except OSError:
        pass
    return images, labels


def _grating(rng: np.random.Generator, lab: np.ndarray, xx: np.ndarray, yy: np.ndarray) -> np.ndarray:
    m = len(lab)
    theta = (_THETA[lab] + rng.normal(0, 0.15, m)).astype(np.float32)
    freq = (_FREQ[lab] * rng.uniform(0.85, 1.15, m)).astype(np.float32)
    phase = rng.uniform(0, 2 * np.pi, m).astype(np.float32)
    proj = xx[None] * np.cos(theta)[:, None, None] + yy[None] * np.sin(theta)[:, None, None]
    return np.sin(2 * np.pi * freq[:, None, None] * proj + phase[:, None, None])


def take_fraction(ds: CIFARArrays, fraction: float, seed: int = 0) -> CIFARArrays:
    """A class-balanced random ``fraction`` of ``ds`` (the "run on 5% first" rule)."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction 应在 (0, 1] 之间,实际是 {fraction}")
    if fraction == 1:
        return ds
    rng = np.random.default_rng(seed)
    targets = np.asarray(ds.targets)
    keep = []
    for c in np.unique(targets):
        idx = np.flatnonzero(targets == c)
        k = max(1, int(round(len(idx) * fraction)))
        keep.append(rng.choice(idx, size=k, replace=False))
    keep = np.sort(np.concatenate(keep))
    return ds.replace(data=ds.data[keep], targets=targets[keep].tolist())


def corrupt_labels(ds: CIFARArrays, fraction: float, mode: str = "random", seed: int = 0) -> CIFARArrays:
    """A copy of ``ds`` with ``fraction`` of its labels made wrong, seeded.

    ``mode="random"``: each chosen label becomes a different, uniformly drawn class.
    ``mode="systematic"``: each chosen label is swapped with its look-alike
    (``SYSTEMATIC_SWAP``: cat<->dog, automobile<->truck, ...), a consistent mapping
    that a model can memorise. The copy has ``corrupted``: a bool array per sample.
    """
    if not 0 <= fraction <= 1:
        raise ValueError(f"fraction 应在 [0, 1] 之间,实际是 {fraction}")
    if mode not in ("random", "systematic"):
        raise ValueError(f"mode 只能是 'random' 或 'systematic',实际是 {mode!r}")
    rng = np.random.default_rng(seed)
    targets = np.asarray(ds.targets).copy()
    chosen = rng.choice(len(targets), size=int(round(len(targets) * fraction)), replace=False)
    if mode == "random":
        targets[chosen] = (targets[chosen] + rng.integers(1, 10, len(chosen))) % 10
    else:
        targets[chosen] = np.asarray(SYSTEMATIC_SWAP)[targets[chosen]]
    corrupted = np.zeros(len(targets), bool)
    corrupted[chosen] = True
    return ds.replace(targets=targets.tolist(), corrupted=corrupted)


def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The sample order of one epoch: a permutation that depends only on (seed, epoch)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g)


def rank_share(batch_size: int, rank: int, world_size: int) -> slice:
    """Rank ``rank``'s part of a global batch of ``batch_size`` samples: a contiguous slice.

    The sizes differ by at most one: the first ``batch_size % world_size`` ranks take one more
    (a batch of 5 on 2 ranks: 3 and 2). Together the slices cover the batch exactly once.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank 应在 [0, {world_size}) 之间,实际是 {rank}")
    base, extra = divmod(batch_size, world_size)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (1 if rank < extra else 0))


class EpochBatches(Sampler[list[int]]):
    """The batches of one epoch: ``epoch_order(n, seed, epoch)`` (or ``range(n)``) cut into global
    batches of ``batch_size``, from batch ``start_batch`` on; with ``world_size > 1`` each batch is
    this rank's share of the global one (``rank_share``).

    Global batch ``k`` holds the same samples whatever the number of processes; only who
    computes which of them changes. That is what lets a run resume mid-epoch with another
    number of processes without skipping or repeating a sample.
    """

    def __init__(self, n: int, batch_size: int, seed: int = 0, epoch: int = 0, shuffle: bool = True,
                 start_batch: int = 0, drop_last: bool = False, rank: int = 0, world_size: int = 1) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size 应为正整数,实际是 {batch_size}")
        if batch_size < world_size:
            raise ValueError(f"全局 batch {batch_size} 小于进程数 {world_size}:有的进程会分不到样本")
        last = n % batch_size
        if not drop_last and 0 < last < world_size:
            raise ValueError(f"最后一个 batch 只有 {last} 个样本,少于进程数 {world_size}:用 drop_last=True 或换 batch size")
        self.n, self.batch_size, self.seed, self.epoch, self.shuffle = n, batch_size, seed, epoch, shuffle
        self.start_batch, self.drop_last, self.rank, self.world_size = start_batch, drop_last, rank, world_size
        self.share = rank_share(batch_size, rank, world_size)  # checks the rank

    def __iter__(self) -> Iterator[list[int]]:
        order = epoch_order(self.n, self.seed, self.epoch) if self.shuffle else torch.arange(self.n)
        for k in range(self.start_batch, batches_per_epoch(self.n, self.batch_size, self.drop_last)):
            batch = order[k * self.batch_size:(k + 1) * self.batch_size]
            yield batch[rank_share(len(batch), self.rank, self.world_size)].tolist()

    def __len__(self) -> int:
        return max(0, batches_per_epoch(self.n, self.batch_size, self.drop_last) - self.start_batch)


def make_loader(ds: Dataset, batch_size: int, *, seed: int = 0, epoch: int = 0, shuffle: bool = True,
                start_batch: int = 0, num_workers: int = 0, drop_last: bool = False, pin_memory: bool = False,
                rank: int = 0, world_size: int = 1,
                worker_init_fn: Callable[[int], None] | None = None) -> DataLoader:
    """A DataLoader whose batches depend only on ``(seed, epoch)``; starts at ``start_batch``.

    Batch ``k`` of ``make_loader(..., start_batch=s)`` equals batch ``s + k`` of the
    loader started at 0, with or without workers: that is what exact mid-epoch
    resume needs. The loader never draws from the global torch RNG.

    Several processes (DDP): ``batch_size`` is the global batch; rank ``rank`` of ``world_size``
    gets its ``rank_share`` of each global batch, so together the ranks see every sample of the
    epoch exactly once, in the same global batches as a single process. When the shares differ
    in size (5 on 2 ranks: 3 and 2), weight rank r's mean loss by ``n_r * world_size / batch_size``:
    DDP averages the ranks' gradients, and the average is then the gradient of the global
    batch's mean loss. Worker processes get seeds that differ between ranks (rank 0's are
    those of a single-process loader); ``worker_init_fn`` runs in each worker as usual.
    """
    if hasattr(ds, "set_epoch"):
        ds.set_epoch(epoch)
    batches = EpochBatches(len(ds), batch_size, seed, epoch, shuffle, start_batch, drop_last, rank, world_size)
    # base seed of the worker RNGs; each rank's differs (the odd constant changes the low 32 bits, all that a CPU
    # generator keeps of its seed), rank 0's is a single process's
    worker_seed = torch.Generator().manual_seed(seed * 7_919 + epoch + rank * 0x9E3779B1)
    return DataLoader(ds, batch_sampler=batches, num_workers=num_workers, pin_memory=pin_memory,
                      generator=worker_seed, worker_init_fn=worker_init_fn)


def batches_per_epoch(n: int, batch_size: int, drop_last: bool = False) -> int:
    """Global batches in an epoch of ``n`` samples (the same for any number of processes)."""
    return n // batch_size if drop_last else -(-n // batch_size)
