"""Typical wrong answers of notebook 05_reproducibility: set_seed.

Each is a mistake a learner plausibly makes; its comment says which. Used by tests/support/exercise_registry.py
and the notebook's own test file.
"""
from __future__ import annotations

# name -> (source, a fragment the failure message must contain)
WRONG = {
    # forgets numpy: a hand-written numpy augmentation stays random
    "missing numpy": ('''
import random
import torch

def set_seed(seed):
    random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
''', "numpy"),
    # creates a new numpy Generator and throws it away; the global np.random is untouched
    "numpy default_rng instead of the global RNG": ('''
import random
import numpy as np
import torch

def set_seed(seed):
    random.seed(seed)
    np.random.default_rng(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
''', "default_rng"),
    # random.Random(seed) builds a separate object; the module-level random is untouched
    "random.Random(seed) instead of random.seed": ('''
import random
import numpy as np
import torch

def set_seed(seed):
    random.Random(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
''', "python random"),
    # forgets python random altogether
    "missing python random": ('''
import numpy as np
import torch

def set_seed(seed):
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
''', "python random"),
    # seeds the GPUs only (torch.cuda.manual_seed_all does not touch the CPU generator)
    "cuda only, no CPU torch": ('''
import random
import numpy as np
import torch

def set_seed(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.cuda.manual_seed_all(seed)
''', "torch CPU"),
    # a constant instead of the argument: every "different seed" run is the same run
    "constant seed": ('''
import random
import numpy as np
import torch

def set_seed(seed):
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    torch.cuda.manual_seed_all(0)
''', "不同的数"),
    # the argument is ignored for numpy only (a copied snippet with a hard-coded 42)
    "numpy seeded with a constant": ('''
import random
import numpy as np
import torch

def set_seed(seed):
    random.seed(seed)
    np.random.seed(42)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
''', "numpy"),
    # random.seed() without an argument seeds from the clock: two calls differ
    "random.seed() without the argument": ('''
import random
import numpy as np
import torch

def set_seed(seed):
    random.seed()
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
''', "python random"),
    # seeds only the CPU generator object: GPUs are never seeded
    "CPU generator object only, no CUDA": ('''
import random
import numpy as np
import torch

def set_seed(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.default_generator.manual_seed(seed)
''', "manual_seed_all"),
}
