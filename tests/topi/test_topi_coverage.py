"""Every declared operator has a TE compute, except the opaque ones listed here."""

from opfusion.ir import list_ops
from opfusion.topi import get_compute, ops_with_compute

# Opaque operators: they run along a whole axis with data-dependent order or a running
# total, which a TE compute cannot express cheaply; the executor calls their NumPy
# reference (or a hand-written routine) instead.
OPAQUE = {
    "sort",
    "argsort",
    "topk",
    "cumsum",  # a scan: as a compute it would be a quadratic triangular sum
    "check_indices",  # raises on a bad index, which a kernel cannot do: it runs in NumPy
    "cumprod",  # a scan, as cumsum
    # writes at computed positions (checked first; a kernel cannot raise)
    "scatter_elements", "scatter_nd", "tensor_scatter", "max_unpool",
    "nn.max_pool_indices",  # the first maximum's position: an argmax over windows
    "col2im",  # overlapping blocks summed into an image
    "reverse_sequence",  # per-entry lengths, checked
    "bitcast",  # reinterpreting bytes has no TE expression
    "det",  # an LU factorization
    # sampling at data-dependent positions, and transforms, run by NumPy (not hot)
    "image.grid_sample", "image.roi_align", "nn.deform_conv2d", "image.resample",
    "dft", "stft", "tfidf_vectorizer",
}


def test_every_operator_has_a_compute():
    missing = [name for name in list_ops() if name not in OPAQUE and get_compute(name) is None]
    assert not missing, f"operators without a TE compute: {missing}"


def test_the_opaque_list_names_only_declared_operators_without_computes():
    declared = set(list_ops())
    assert OPAQUE <= declared, sorted(OPAQUE - declared)
    assert not OPAQUE & set(ops_with_compute()), "an opaque op got a compute: drop it here"
