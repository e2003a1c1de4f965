"""derive_spec on timm models (issue 35), ``pretrained=False`` (nothing downloaded): a handful
in the default suite, one per family that derives in the slow contract test."""

from __future__ import annotations

import warnings

import pytest
import timm
import torch

from tests.permutation.test_derive_torchvision import contract

# a family each: functional batch norm + activation (BatchNormAct2d), timm's Linear (F.linear)
# and squeeze-excitation, layer scale through a reshape
HANDFUL = ["efficientnet_b0", "mobilenetv3_small_050", "convnext_atto"]

# the families whose representative (benchmarks/derive_timm.py) derives and checks today; the
# slow test holds them there (25 of 85 families, 2026-11-27)
DERIVING = [
    "convmixer", "convnext", "cspnet", "cspnext", "densenet", "dla", "dpn", "efficientnet",
    "hardcorenas", "hgnet", "inception_next", "inception_v3", "lcnetv2", "mambaout",
    "mobilenetv3", "rdnet", "regnet", "repvit", "res2net", "resnetv2", "rexnet", "selecsls",
    "starnet", "xception", "xception_aligned",
]  # fmt: skip


def build(name: str) -> torch.nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return timm.create_model(name, pretrained=False, num_classes=10).eval()


@pytest.mark.parametrize("name", HANDFUL)
def test_a_timm_model_meets_the_derive_contract(name):
    """torchvision's contract (tests/permutation/test_derive_torchvision.py): derive, check_spec,
    weight matching recovers a permuted copy exactly, the midpoint of two inits runs."""
    contract(lambda: build(name), size=64)


@pytest.mark.slow
def test_every_deriving_family_still_derives():
    from benchmarks.derive_timm import derive_one, representatives

    picks = representatives()
    failed = {f: derive_one(picks[f]) for f in DERIVING}
    assert {f: s for f, s in failed.items() if s != "ok"} == {}
