"""Helpers for the chapter 0.4 workbook (training engineering essentials).

One concept per module; every notebook first writes the idea in plain code,
then imports the helper from here:

- ``env``        device choice, environment table, the ``COURSE_FAST`` size switch
- ``data``       CIFAR-10 from disk or the offline synthetic stand-in; subsets,
                 label corruption and resumable DataLoaders
- ``models``     the small CNNs used throughout
- ``repro``      seeding, determinism switches, RNG capture, run-config dump
- ``amp``        autocast dtype choice, GradScaler only for fp16, dtype tables
- ``clipping``   global-norm clipping that returns the pre-clip norm
- ``ema``        exponential moving average of weights
- ``checkpoint`` atomic, checksummed, rotating checkpoints; graceful stop
- ``monitor``    per-step metrics, spike alarm, JSONL/TensorBoard/wandb
- ``debug``      single-batch overfitting, sample grids, sanity report
- ``estimate``   throughput measurement and training-time/cost estimates
- ``schedule``   warm-up + cosine lr schedule, stepped per optimizer step
"""
