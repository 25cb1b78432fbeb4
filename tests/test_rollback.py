"""course_utils.rollback: the skip set of a rollback is exactly the batches named, survives a
checkpoint, and is the same on every rank."""
from __future__ import annotations

import json

import pytest
import torch

from course_utils.data import CIFARArrays, make_loader, synthetic_cifar10
from course_utils.rollback import SKIPPED_FILE, RollbackRecord, SkipSet

N, BATCH, SEED = 203, 16, 7   # 13 batches per epoch, the last one short (203 = 12 * 16 + 11)


def _skips() -> SkipSet:
    return SkipSet(N, BATCH, SEED)


def test_skipped_positions_are_exactly_checkpoint_to_bad_plus_margin():
    skips = _skips()
    record = skips.plan(bad_step=30, bad_position=30, restored_step=24, restored_position=24, skip_batches=3)
    assert list(record.positions()) == list(range(24, 34))
    assert skips.skipped_positions() == list(range(24, 34))
    assert [p for p in range(60) if skips.is_skipped(p)] == list(range(24, 34))
    assert skips.next_position(24) == 34 and skips.next_position(23) == 23 and skips.next_position(40) == 40


def test_skipped_samples_are_the_loaders_batches():
    """The samples named for a position are what make_loader(epoch, start_batch) yields there."""
    images, labels = synthetic_cifar10(N, seed=3)
    ds = CIFARArrays(images, labels, "synthetic")
    skips = _skips()
    skips.plan(bad_step=14, bad_position=14, restored_step=11, restored_position=11, skip_batches=1)  # crosses epoch 0 -> 1
    per_epoch = skips.per_epoch
    assert per_epoch == 13
    for position, samples in skips.skipped_samples().items():
        epoch, k = skips.epoch_and_batch(position)
        loader = make_loader(ds, BATCH, seed=SEED, epoch=epoch, start_batch=k)
        assert next(iter(loader.batch_sampler)) == samples
        _, y = next(iter(loader))
        assert [labels[i] for i in samples] == y.tolist()
    assert sorted(skips.skipped_samples()) == [11, 12, 13, 14, 15]
    assert len(skips.samples(12)) == N - 12 * BATCH  # the short last batch of epoch 0


def test_overlapping_rollbacks_and_the_restored_position():
    skips = _skips()
    skips.plan(bad_step=20, bad_position=20, restored_step=15, restored_position=15, skip_batches=2)
    # restored to the same healthy checkpoint (no new one since): the new range swallows the old one
    second = skips.plan(bad_step=17, bad_position=25, restored_step=15, restored_position=15, skip_batches=0)
    assert second.number == 2 and skips.skipped_positions() == list(range(15, 26))
    assert skips.next_position(15) == 26
    with pytest.raises(ValueError, match="已经被跳过"):
        skips.plan(bad_step=18, bad_position=20, restored_step=15, restored_position=15, skip_batches=0)


@pytest.mark.parametrize("kw, message", [
    (dict(skip_batches=-1), "不能为负"),
    (dict(restored_step=31), "之间"),
    (dict(restored_position=31), "之间"),
    (dict(lr_factor=0.0), "正数"),
])
def test_impossible_plans_are_refused(kw, message):
    args = dict(bad_step=30, bad_position=30, restored_step=24, restored_position=24, skip_batches=3) | kw
    with pytest.raises(ValueError, match=message):
        _skips().plan(**args)


def test_round_trip_through_a_checkpoint(tmp_path):
    skips = _skips()
    skips.plan(bad_step=30, bad_position=33, restored_step=24, restored_position=27, skip_batches=4, lr_factor=0.5)
    skips.plan(bad_step=50, bad_position=60, restored_step=45, restored_position=55, skip_batches=0)
    path = tmp_path / "ckpt.pt"
    torch.save({"extra": {"rollback": skips.state_dict()}}, path)
    restored = _skips()
    restored.load_state_dict(torch.load(path, weights_only=True)["extra"]["rollback"])
    assert restored == skips and restored.records == skips.records
    assert [restored.next_position(p) for p in range(80)] == [skips.next_position(p) for p in range(80)]
    assert restored.records[0].lr_factor == 0.5
    # another data order must not silently take these positions
    with pytest.raises(ValueError, match="另一种数据顺序"):
        SkipSet(N, BATCH, SEED + 1).load_state_dict(skips.state_dict())


def test_two_ranks_compute_the_same_skip_set_and_share_its_samples():
    plans = dict(bad_step=30, bad_position=30, restored_step=24, restored_position=24, skip_batches=3)
    ranks = [_skips() for _ in range(2)]
    for skips in ranks:
        skips.plan(**plans)
    assert ranks[0] == ranks[1] and ranks[0].skipped_positions() == ranks[1].skipped_positions()
    for position in ranks[0].skipped_positions():
        shares = [ranks[r].samples(position, rank=r, world_size=2) for r in range(2)]
        assert shares[0] + shares[1] == ranks[0].samples(position)
        assert not set(shares[0]) & set(shares[1])


def test_records_for_metrics_status_and_the_run_folder():
    skips = _skips()
    record = skips.plan(bad_step=30, bad_position=30, restored_step=24, restored_position=24, skip_batches=3)
    event = record.event()
    assert event["event"] == "rollback" and event["skipped"] == 10 and event["restored_step"] == 24
    json.dumps(event)
    entry = record.history_entry()
    assert entry["state"] == "rolled_back" and entry["skipped_positions"] == [24, 33]
    written = json.loads(skips.skipped_json())
    assert SKIPPED_FILE.endswith(".json")
    assert written["skipped_batches"] == 10 and sorted(map(int, written["positions"])) == list(range(24, 34))
    assert written["positions"]["30"] == skips.samples(30)
    assert [RollbackRecord(**r) for r in written["rollbacks"]] == skips.records
    assert written["skipped_fraction_of_an_epoch"] == pytest.approx(10 / 13)


def test_positions_and_epochs():
    skips = _skips()
    assert skips.epoch_and_batch(27) == (2, 1) and skips.position(2, 1) == 27
    with pytest.raises(ValueError):
        skips.position(0, 13)


def test_the_rollback_part_gives_every_step_its_batch_and_keeps_newer_records(tmp_path):
    """``Rollback.position``: step s trains the s-th position no rollback skipped (the professional script's
    reference run: rollbacks 12 -> 8 and 21 -> 16); a checkpoint part loads back, and reloading the healthy
    checkpoint a rollback goes back to keeps the rollback just planned."""
    from course_utils.checkpoint import saved_parts
    from course_utils.rollback import Rollback
    from course_utils.runfolder import RunFolder

    rollback = Rollback(SkipSet(500, 32, 0, drop_last=True), enabled=True, skip_batches=2, lr_factor=0.5)
    first = rollback.skips.plan(bad_step=12, bad_position=11, restored_step=8, restored_position=8, skip_batches=2)
    healthy = rollback.state_dict()  # what last_good.pt at step 16 holds
    rollback.skips.plan(bad_step=21, bad_position=rollback.position(20), restored_step=16,
                        restored_position=rollback.position(16), skip_batches=2)
    assert [rollback.position(s) for s in range(30)] == [*range(0, 8), *range(14, 22), *range(29, 43)]
    rollback.load_state_dict(healthy)  # the rollback reloads last_good.pt: its own record stays
    assert len(rollback.skips.records) == 2
    with RunFolder.claim(tmp_path / "run", resume=False) as run:
        fresh = Rollback(SkipSet(500, 32, 0, drop_last=True), enabled=True, run=run)
        fresh.load_state_dict(healthy)  # a resume: the checkpoint's records, and status.json's history
        assert fresh.skips.records == [first] and run.history == [first.history_entry()]
    old_layout = {"extra": {"rollback": {**healthy, "position": 22}}}  # checkpoints before the registry
    assert saved_parts(old_layout)["rollback"]["skips"] == saved_parts({"parts": {"rollback": healthy}})["rollback"]["skips"]
    with pytest.raises(ValueError, match="另一种数据顺序"):
        Rollback(SkipSet(500, 64, 0, drop_last=True), enabled=True).load_state_dict(healthy)
