# %% [markdown]
# # Tutorial: `lmc` from Python
#
# This notebook uses `lmc`'s Python API without the command line or a Lightning `Trainer`:
# it trains two small MLPs in-process, aligns them with weight matching, plots the loss along
# the straight line between them before and after alignment, and merges three models with
# MergeMany and STE-MM. Everything runs on a CPU in well under two minutes on synthetic data
# (the docs build executes it, so the outputs below are the ones this version of `lmc` gives).
#
# The source is `docs/tutorials/python-api.py` (a [jupytext](https://jupytext.readthedocs.io)
# percent script): open it as a notebook with `jupytext --to ipynb`, or run it as a script.

# %%
import matplotlib.pyplot as plt
import torch
from torch import nn

from lmc.evaluation import evaluate
from lmc.interpolation import alpha_grid, interpolate_path
from lmc.merging import MERGE_METHODS, MergeInputs, train_merge
from lmc.models import MLP
from lmc.permutation import apply_permutation, spec_for, weight_matching

torch.manual_seed(0)

# %% [markdown]
# ## Data: a synthetic classification task
#
# 20-dimensional Gaussian inputs labelled by a random two-layer teacher (4 classes): hard enough
# that the students need their hidden units, small enough to train in seconds.

# %%
teacher = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4))
with torch.no_grad():
    x = torch.randn(6000, 20)
    out = teacher(x)
    y = ((out - out.mean(0)) / out.std(0)).argmax(1)  # standardised: classes of similar size
train = [(x[i : i + 100], y[i : i + 100]) for i in range(0, 5000, 100)]
test = [(x[i : i + 500], y[i : i + 500]) for i in range(5000, 6000, 500)]
print("class frequencies:", torch.bincount(y, minlength=4).tolist())

# %% [markdown]
# ## Two models from different seeds
#
# `lmc.models.MLP` is a plain `nn.Module`; a few epochs of Adam, as a plain loop.


# %%
def trained(seed: int, epochs: int = 8) -> MLP:
    torch.manual_seed(seed)
    net = MLP(in_features=20, out_features=4, width=128, depth=2)
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    for _ in range(epochs):
        for xb, yb in train:
            opt.zero_grad()
            nn.functional.cross_entropy(net(xb), yb).backward()
            opt.step()
    return net.eval()


models = [trained(seed) for seed in (0, 1, 2)]
for k, net in enumerate(models):
    print(f"model {k}: test accuracy {evaluate(net, test).acc:.3f}")

# %% [markdown]
# ## Weight matching
#
# `spec_for` gives the permutation spec of a built-in network (which weights each hidden unit's
# permutation acts on); `weight_matching` finds the permutations of model 1's hidden units that
# bring its weights closest to model 0's (004 §4.2, accelerated), and `apply_permutation` gives
# the aligned copy. Permuting hidden units does not change the function:

# %%
a, b = models[0], models[1]
spec = spec_for(a)
result = weight_matching(a, b, spec, method="accelerated")
b_aligned = apply_permutation(b.state_dict(), spec, result.perm)

probe = MLP(in_features=20, out_features=4, width=128, depth=2).eval()
probe.load_state_dict(b_aligned)
xb = test[0][0]
print("same function after permuting:", torch.allclose(probe(xb), b(xb), atol=1e-5))
print("permutation groups:", {k: tuple(p.shape) for k, p in result.perm.items()})

# %% [markdown]
# ## Naive and matched barriers
#
# `interpolate_path` evaluates `(1 - α) a + α b` at every α; its barrier (000 Def. 2.1, the
# largest rise of the loss above the straight line between the endpoints' losses) comes with
# it. Matching first removes most of the barrier.

# %%
alphas = alpha_grid(21)
naive, _ = interpolate_path(probe, a.state_dict(), b.state_dict(), {"test": test}, alphas)
matched, _ = interpolate_path(probe, a.state_dict(), b_aligned, {"test": test}, alphas)
for name, path in (("naive", naive), ("matched", matched)):
    print(f"{name:8s} loss barrier {path.barriers['test']['loss']:.4f}")

plt.figure(figsize=(5, 3.2))
plt.plot(alphas, naive.metrics["test/loss"], label="naive")
plt.plot(alphas, matched.metrics["test/loss"], label="weight matching")
plt.xlabel("α")
plt.ylabel("test loss")
plt.legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# ## Merging three models: MergeMany and STE-MM
#
# Every merge method is an entry of `lmc.merging.MERGE_METHODS` with one contract: it takes
# the models (and data where it needs it) as `MergeInputs` and returns a `Merged` (the merged
# state, permutations where there are any, diagnostics). Plain averaging ignores the
# symmetry; MergeMany aligns all models to each other first. STE-MM (004 Alg. 1) *trains*: it
# builds a search (a module with a loss and a result) that `train_merge` trains with the same
# plain loop every trained method uses (`lmc fit` trains it with `TrainedMergeTask`).

# %%
states = [m.state_dict() for m in models]
inputs = MergeInputs(states, spec, net=probe, align_batches=train[:10], train_batches=train)
for method in ("naive", "mergemany", "stemm"):
    if MERGE_METHODS.entry(method).trains:
        merged = train_merge(inputs, method, epochs=2).merged  # Adam, lr 1e-3 (004 App. B.2)
    else:
        merged = MERGE_METHODS.get(method)(inputs)
    probe.load_state_dict(merged.state)
    print(f"{method:10s} merged model: test accuracy {evaluate(probe, test).acc:.3f}")
