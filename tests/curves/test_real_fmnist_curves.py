"""Real-data check of 002's claim on Fashion-MNIST (slow: about ten minutes on 2 CPU cores).

Runs ``benchmarks/curves.py`` (cached VGG-11 x1/8 endpoints): the aligned curve's minimum test
accuracy exceeds the unaligned curve's, and both beat the straight line between the endpoints.
"""

from __future__ import annotations

import pytest

from tests.helpers import lmc_data_dir

pytestmark = pytest.mark.slow


def test_aligned_curve_beats_unaligned_curve_beats_the_line(tmp_path, capsys):
    lmc_data_dir("FashionMNIST")
    from benchmarks.curves import main

    main(["--out", str(tmp_path)])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    acc = {k: float(v) for k, v in (item.split("=") for item in last.split())}
    assert acc["min_acc_aligned"] > acc["min_acc_unaligned"] > acc["min_acc_linear"]
    assert acc["min_acc_pam"] > acc["min_acc_linear"]
