"""The gathers' geometry (cc/conv/gather_geo.h), which every CUDA GEMM conv kernel and its
table, im2col and col2im kernels use: its host program (tests/native/check_gather_geo.cc) checks the
pixel each GEMM row reads through each tap, one tap at a time and walking all taps, against
conv.h's in_idx / out_idx on random strided, padded and dilated problems, without a GPU."""

from util import needs_cxx, run_host_check


@needs_cxx
def test_gathered_pixels_match_the_conv_index_functions(tmp_path):
    out = run_host_check("check_gather_geo.cc", tmp_path)
    assert out.startswith("ok: 362 problems"), out
