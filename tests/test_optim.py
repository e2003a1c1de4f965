"""Known answers for the LR schedules."""

import numpy as np
import pytest
import torch

from lmc.optim import WarmupLinearDecay


def test_warmup_linear_decay_matches_004_interp():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.4)
    sched = WarmupLinearDecay(opt, warmup_steps=5, total_steps=20)
    expected = np.interp(np.arange(21), [0, 5, 20], [0, 1, 0]) * 0.4
    seen = []
    for _ in range(21):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    np.testing.assert_allclose(seen, expected, atol=1e-12)


def test_warmup_linear_decay_rejects_bad_counts():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(ValueError, match="warmup_steps"):
        WarmupLinearDecay(opt, warmup_steps=10, total_steps=10)
