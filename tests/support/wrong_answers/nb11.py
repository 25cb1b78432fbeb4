"""Typical wrong answers of notebook 11_multi_process: rank_batch and strip_module_prefix.

Each is a mistake a learner plausibly makes; its comment says which. Used by tests/support/exercise_registry.py
and the notebook's own test file.
"""
from __future__ import annotations

_ORDER = "import torch\nfrom course_utils.data import epoch_order\n"

# name -> (source, a fragment the failure message must contain)
WRONG_SHARE = {
    # no sharding: every rank trains on the whole global batch (the plain single-process loop, copied)
    "whole global batch on every rank": (_ORDER + '''
def rank_batch(n, global_batch, seed, epoch, step, rank, world_size):
    return epoch_order(n, seed, epoch)[step * global_batch:(step + 1) * global_batch].tolist()
''', "整个全局 batch"),
    # a per-rank batch size, but the rank is never used: every rank takes the same slice
    "rank never used": (_ORDER + '''
def rank_batch(n, global_batch, seed, epoch, step, rank, world_size):
    b = global_batch // world_size
    return epoch_order(n, seed, epoch)[step * b:(step + 1) * b].tolist()
''', "同样的"),
    # "each rank its own seed" applied to the data order: the ranks' orders differ, shares overlap and miss
    "rank in the data seed": (_ORDER + '''
def rank_batch(n, global_batch, seed, epoch, step, rank, world_size):
    batch = epoch_order(n, seed + rank, epoch)[step * global_batch:(step + 1) * global_batch]
    return batch.tensor_split(world_size)[rank].tolist()
''', "种子里也不要加 rank"),
    # the epoch is forgotten: the same order every epoch (DistributedSampler without set_epoch)
    "epoch forgotten": (_ORDER + '''
def rank_batch(n, global_batch, seed, epoch, step, rank, world_size):
    batch = epoch_order(n, seed, 0)[step * global_batch:(step + 1) * global_batch]
    return batch.tensor_split(world_size)[rank].tolist()
''', "set_epoch"),
    # positions in the epoch instead of the sample ids found there
    "positions instead of sample ids": (_ORDER + '''
def rank_batch(n, global_batch, seed, epoch, step, rank, world_size):
    batch = torch.arange(n)[step * global_batch:(step + 1) * global_batch]
    return batch.tensor_split(world_size)[rank].tolist()
''', "位置"),
    # DistributedSampler's way: shard the whole epoch first, then a per-rank batch of B // W
    "epoch sharded first, then B // W per rank": (_ORDER + '''
def rank_batch(n, global_batch, seed, epoch, step, rank, world_size):
    b = global_batch // world_size
    mine = epoch_order(n, seed, epoch)[rank::world_size]
    return mine[step * b:(step + 1) * b].tolist()
''', "漏了"),
    # torch.chunk: sizes are ceil(B / W) and some batches give fewer than W pieces
    "torch.chunk": (_ORDER + '''
def rank_batch(n, global_batch, seed, epoch, step, rank, world_size):
    batch = epoch_order(n, seed, epoch)[step * global_batch:(step + 1) * global_batch]
    return batch.chunk(world_size)[rank].tolist()
''', "IndexError"),
    # floor division: the remainder of a global batch that W does not divide is never trained on
    "B // W, remainder dropped": (_ORDER + '''
def rank_batch(n, global_batch, seed, epoch, step, rank, world_size):
    b = global_batch // world_size
    start = step * global_batch + rank * b
    return epoch_order(n, seed, epoch)[start:start + b].tolist()
''', "B // W"),
    # ceiling division: the last rank reaches into the next global batch
    "ceil(B / W), past the batch's end": (_ORDER + '''
def rank_batch(n, global_batch, seed, epoch, step, rank, world_size):
    b = -(-global_batch // world_size)
    start = step * global_batch + rank * b
    return epoch_order(n, seed, epoch)[start:start + b].tolist()
''', "末尾"),
    # drop_last: the short last global batch is skipped, its samples never seen this epoch
    "short last batch skipped": (_ORDER + '''
def rank_batch(n, global_batch, seed, epoch, step, rank, world_size):
    if (step + 1) * global_batch > n:
        return []
    batch = epoch_order(n, seed, epoch)[step * global_batch:(step + 1) * global_batch]
    return batch.tensor_split(world_size)[rank].tolist()
''', "最后一个不满"),
    # a fresh shuffle from the global generator on every call: ranks (and calls) disagree
    "global torch.randperm": (_ORDER + '''
def rank_batch(n, global_batch, seed, epoch, step, rank, world_size):
    batch = torch.randperm(n)[step * global_batch:(step + 1) * global_batch]
    return batch.tensor_split(world_size)[rank].tolist()
''', "全局随机数"),
    # a home-made (seed, epoch) shuffle instead of the course's epoch_order: not the script's global batches
    "own shuffle instead of epoch_order": ('''
import random
def rank_batch(n, global_batch, seed, epoch, step, rank, world_size):
    order = list(range(n))
    random.Random(seed * 1000 + epoch).shuffle(order)
    batch = order[step * global_batch:(step + 1) * global_batch]
    k, r = divmod(len(batch), world_size)
    start = rank * k + min(rank, r)
    return batch[start:start + k + (rank < r)]
''', "epoch_order"),
    # returns a float tensor (e.g. after mixing with a float computation)
    "float tensor": (_ORDER + '''
def rank_batch(n, global_batch, seed, epoch, step, rank, world_size):
    batch = epoch_order(n, seed, epoch)[step * global_batch:(step + 1) * global_batch].float()
    return batch.tensor_split(world_size)[rank]
''', "整数"),
}

WRONG_PREFIX = {
    # str.replace also removes "module." inside a key (head_module.weight -> head_weight)
    "str.replace": ('''
def strip_module_prefix(state_dict):
    return {k.replace("module.", ""): v for k, v in state_dict.items()}
''', "str.replace"),
    # replace once: right for DDP's keys, but breaks a plain key with "module." inside
    "str.replace once, on every key": ('''
def strip_module_prefix(state_dict):
    return {k.replace("module.", "", 1): v for k, v in state_dict.items()}
''', "原样保留"),
    # str.lstrip strips a set of characters (embed.weight -> bed.weight)
    "str.lstrip": ('''
def strip_module_prefix(state_dict):
    return {k.lstrip("module."): v for k, v in state_dict.items()}
''', "lstrip"),
    # always cuts 7 characters, prefix or not
    "k[7:] on every key": ('''
def strip_module_prefix(state_dict):
    return {k[7:]: v for k, v in state_dict.items()}
''', "原样保留"),
    # drops the first dotted component of every key
    "split on the first dot": ('''
def strip_module_prefix(state_dict):
    return {k.split(".", 1)[1]: v for k, v in state_dict.items()}
''', "原样保留"),
    # keeps only the prefixed keys: a plain state_dict comes back empty
    "filters instead of keeping": ('''
def strip_module_prefix(state_dict):
    return {k[len("module."):]: v for k, v in state_dict.items() if k.startswith("module.")}
''', "空字典"),
    # strips every leading "module.", also the model's own child called module
    "strips repeatedly": ('''
def strip_module_prefix(state_dict):
    out = {}
    for k, v in state_dict.items():
        while k.startswith("module."):
            k = k[len("module."):]
        out[k] = v
    return out
''', "一层"),
    # torch's helper edits the dict in place (and returns None)
    "consume_prefix_in_state_dict_if_present, in place": ('''
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present
def strip_module_prefix(state_dict):
    consume_prefix_in_state_dict_if_present(state_dict, "module.")
    return state_dict
''', "原地修改"),
    # pops and re-inserts in the caller's dict
    "renames keys in the caller's dict": ('''
def strip_module_prefix(state_dict):
    for k in list(state_dict):
        if k.startswith("module."):
            state_dict[k[len("module."):]] = state_dict.pop(k)
    return state_dict
''', "被改动"),
    # returns the new key names only
    "returns the keys": ('''
def strip_module_prefix(state_dict):
    return [k.removeprefix("module.") for k in state_dict]
''', "字典"),
    # clones and zero-fills "to be safe": the weights are lost
    "new tensors instead of the values": ('''
import torch
def strip_module_prefix(state_dict):
    return {k.removeprefix("module."): torch.zeros_like(v) for k, v in state_dict.items()}
''', "值"),
}
