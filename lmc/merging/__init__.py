"""Merging many models modulo permutations (SPEC C4, C6; 004): pure functions, no Lightning.

* :mod:`lmc.merging.ste`: the straight-through estimator for 2 models (004 §2.3) and STE-MM for
  n models (004 §4.1, Alg. 1) with accelerated, warm-started weight matching (§4.2):
  :class:`STEMM` (proxies + straight-through forward); :mod:`lmc.merging.loop`: the ``stemm``
  and ``ste`` methods and :func:`ste_mm` / :func:`ste`;
* :mod:`lmc.merging.search`: what a merge method that trains builds (:class:`MergeSearch`) and
  the one plain loop that trains it (:func:`train_search`, :func:`train_merge`);
* :mod:`lmc.merging.baselines`: :func:`check_models`, weight matching to one reference
  (:func:`wm_to_reference`, 004 §3) and MergeMany (:func:`merge_many_perms`, §5);
* :mod:`lmc.merging.evaluate`: merged vs original loss/accuracy, pairwise merges (Fig. 4),
  sharpness (§6.2); :mod:`lmc.merging.geometry`: distance ratios and triplet angles (§6.1);
* :mod:`lmc.merging.ccmm`: cycle-consistent multi-model matching by Frank-Wolfe (C2M3;
  registered as the ``ccmm`` merge method); :mod:`lmc.merging.sinkhorn`: Sinkhorn re-basin
  (Peña et al. 2023); :mod:`lmc.merging.otfusion` and :mod:`lmc.merging.fedma`: OTFusion and
  FedMA, registered with prune-before-align in :mod:`lmc.merging.fusion`;
* :mod:`lmc.merging.contract`: the one registry of merge methods, :data:`MERGE_METHODS`, every
  entry ``method(MergeInputs, **options) -> Merged`` (``naive``, ``wm_ref``, ``mergemany``,
  ``ccmm``, ``otfusion``, ``fedma``, ``zip``, ``permute``) or, for a method that trains,
  ``-> MergeSearch`` (``stemm``, ``ste``, ``sinkhorn``), and :func:`merge_sweep`.
"""

from lmc.merging.baselines import (
    align_states,
    check_models,
    merge_many_perms,
    naive_perms,
    parameter_keys,
    wm_to_reference,
)
from lmc.merging.ccmm import CCMMResult, ccmm, ccmm_merge, ccmm_perms, pairwise_permutation
from lmc.merging.contract import (
    MERGE_METHODS,
    Merged,
    MergeInputs,
    MergeMethod,
    MergeMethodEntry,
    by_permutation,
    check_options,
    merge_sweep,
    method_options,
)
from lmc.merging.evaluate import (
    MergeEvaluation,
    MergeSweep,
    OriginalStats,
    evaluate_merge,
    evaluate_originals,
    evaluate_sweep,
)
from lmc.merging.fedma import fedma, local_train, match_layer
from lmc.merging.fusion import fedma_merge, otfusion_merge
from lmc.merging.geometry import (
    describe,
    distance_ratios,
    pairwise_distances,
    triplet_angles,
)
from lmc.merging.loop import STEResult, ste, ste_mm, ste_search, stemm_search
from lmc.merging.otfusion import (
    FusionResult,
    Pruning,
    check_fusion_models,
    materialize,
    otfusion,
    prune_models,
)
from lmc.merging.search import MergeSearch, Progress, SearchRun, train_merge, train_search
from lmc.merging.sinkhorn import (
    SinkhornRebasin,
    SinkhornResult,
    SinkhornSearch,
    sinkhorn,
    sinkhorn_rebasin,
    sinkhorn_search,
    temperature,
)
from lmc.merging.ste import (
    STEMM,
    Mixing,
    ModelBank,
    mix_states,
    sample_mixing_weights,
    straight_through,
)
from lmc.merging.zipit import permute_merge, zip_clusters, zip_merge, zip_states

__all__ = [
    "MergeInputs",
    "MergeMethod",
    "MergeMethodEntry",
    "MergeSearch",
    "Merged",
    "Progress",
    "SearchRun",
    "train_merge",
    "train_search",
    "by_permutation",
    "check_options",
    "merge_sweep",
    "method_options",
    "fedma_merge",
    "otfusion_merge",
    "sinkhorn_search",
    "stemm_search",
    "ste_search",
    "permute_merge",
    "zip_clusters",
    "zip_merge",
    "zip_states",
    "CCMMResult",
    "SinkhornRebasin",
    "SinkhornResult",
    "SinkhornSearch",
    "ccmm",
    "ccmm_merge",
    "ccmm_perms",
    "pairwise_permutation",
    "sinkhorn",
    "sinkhorn_rebasin",
    "temperature",
    "FusionResult",
    "Pruning",
    "check_fusion_models",
    "fedma",
    "local_train",
    "match_layer",
    "materialize",
    "otfusion",
    "prune_models",
    "MERGE_METHODS",
    "STEMM",
    "MergeEvaluation",
    "MergeSweep",
    "ModelBank",
    "Mixing",
    "OriginalStats",
    "STEResult",
    "align_states",
    "check_models",
    "describe",
    "distance_ratios",
    "evaluate_merge",
    "evaluate_originals",
    "evaluate_sweep",
    "merge_many_perms",
    "naive_perms",
    "mix_states",
    "pairwise_distances",
    "parameter_keys",
    "sample_mixing_weights",
    "ste",
    "ste_mm",
    "straight_through",
    "triplet_angles",
    "wm_to_reference",
]
