"""The residue-class decomposition of strided bwd_data (cc/conv/strided_classes.h), which the
CUDA implicit_precomp_gemm runs: its host program (tests/native/check_strided_classes.cc) checks the
sub-problems, sub-filters and the dx scatter against a naive bwd_data on 400 random problems,
without a GPU."""

from util import needs_cxx, run_host_check


@needs_cxx
def test_strided_classes_match_naive_bwd_data(tmp_path):
    out = run_host_check("check_strided_classes.cc", tmp_path)
    assert out.startswith("ok: 400 problems"), out
