"""scheduler/hostmem.py: freed host memory is kept for the next step (no page faults anew)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# Allocates and fills a 64 MiB tensor ten times after three warm-up rounds: the minor page faults
# those take. With malloc's defaults each one mmaps fresh pages (16,384 faults of 4 KiB
# each); with freed memory kept, blocks are reused (at most one or two fault again).
CHILD = """
import resource, torch
from dbml.scheduler.execute.step import EagerStep
from dbml.scheduler.graph.optim import OptimizerSpec
EagerStep(torch.nn.Linear(2, 2), torch.nn.functional.mse_loss, OptimizerSpec("sgd", lr=0.1))
for _ in range(3):   # warm: the heap grows to its working set
    torch.empty(1 << 24).fill_(1.0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    torch.empty(1 << 24).fill_(1.0)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(setting: str) -> int:
    env = dict(os.environ, DBML_HOST_MALLOC=setting)
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.slow   # two child processes that import torch
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_training_step_keeps_large_freed_blocks_for_reuse():
    kept, system = faults("keep"), faults("system")
    block = (64 << 20) // 4096
    assert system > 8 * block, system          # every 64 MiB block faulted in anew
    assert kept * 4 < system, (kept, system)  # at most a block or two faulting again, not each one


# Frees 256 MiB of 16 MiB tensors while memory is kept, then gives it back: resident
# memory (VmRSS) falls by about as much only once give_back_freed_host_memory() ran.
GIVE_BACK = """
import torch
from dbml.scheduler.hostmem import keep_freed_host_memory, give_back_freed_host_memory

def rss():
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmRSS:"))

keep_freed_host_memory()
blocks = [torch.ones(1 << 22) for _ in range(16)]
held = rss()
del blocks
kept = rss()
print(held - kept, give_back_freed_host_memory(), held - rss())
"""


@pytest.mark.slow   # a child process that imports torch
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_freed_host_memory_kept_for_steps_goes_back_when_given_back():
    out = subprocess.run([sys.executable, "-c", GIVE_BACK], env=dict(os.environ, DBML_HOST_MALLOC="keep"),
                         capture_output=True, text=True, check=True)
    dropped_kept, trimmed, dropped = out.stdout.split()
    assert int(dropped_kept) < 32 << 20, out.stdout   # kept: freed, still resident
    assert trimmed == "True"
    assert int(dropped) > 200 << 20, out.stdout       # given back: the 256 MiB left the process
