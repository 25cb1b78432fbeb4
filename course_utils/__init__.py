"""Helpers for the chapter 0.4 workbook (training engineering essentials).

One concept per module; every notebook first writes the idea in plain code,
then imports the helper from here (each module's docstring says where it is taught):

- ``env``         device choice, environment table, the ``COURSE_FAST`` size switch
- ``data``        CIFAR-10 from disk or the offline synthetic stand-in; subsets,
                  label corruption and resumable DataLoaders
- ``models``      the small CNNs used throughout
- ``repro``       seeding, determinism switches, RNG capture, run-config dump
- ``amp``         autocast dtype choice, GradScaler only for fp16, dtype tables
- ``clipping``    global-norm clipping that returns the pre-clip norm
- ``ema``         exponential moving average of weights
- ``durable``     the one atomic write (temp file beside, fsync, rename, folder fsync) and verified saves/loads
- ``checkpoint``  checkpoints with the full training state, verified, rotating
- ``checkpoint_async`` the same checkpoints written by a background thread (opt-in)
- ``monitor``     per-step records: smoothed loss, samples/s, peak memory, alarms
- ``sinks``       where the records go: JSONL (and its reader), TensorBoard, wandb, tqdm
- ``alerts``      the loss/grad-norm spike detector and the bad-step rate
- ``rollback``    the skip set of a rollback: which global batches, on the record, in the checkpoint
- ``debug``       single-batch overfitting, sample grids, sanity report
- ``estimate``    throughput measurement and training-time/cost estimates
- ``estimate_ckpt`` how often to checkpoint: Young/Daly interval, expected wall time and cost under preemption
- ``schedule``    warm-up + cosine lr schedule, stepped per optimizer step
- ``stats``       is A better than B over seeds: paired differences, a t-interval
- ``runfolder``   one run per folder: lock, status, identity, leftovers
- ``signals``     SIGTERM / Ctrl-C as a flag the loop checks; DataLoader worker masks
- ``cli``         command-line validators that run before torch is imported
- ``distributed`` what the ranks of a torchrun job must agree on
- ``heartbeat``   each rank's step and phase, published as it changes
- ``watchdog``    no rank made progress for so long: the hang named, stacks dumped, the job ended
- ``stragglers``  one rank persistently slower than the others
- ``hang_guard``  heartbeat, watchdog and stragglers as one part of a training script
- ``run_batches`` a run's data position: which global batch each step trains
- ``evaluation``  accuracy and mean loss of a classifier over batches
- ``interrupt``   run a script and SIGKILL it right after its k-th optimizer step: an exact ``kill -9``
- ``resume_doctor`` kill any training command at exact steps, resume it, name the first state that differs
"""
