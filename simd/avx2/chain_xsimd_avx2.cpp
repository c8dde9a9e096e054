// The chain tables' window maxima (simd/chain_xsimd.hpp) instantiated for AVX2.
#include "simd/chain_xsimd.hpp"

namespace dfp::simd {

void avx2::chain_window_max(const ChainWindowArgs& a, int64_t* best) {
  chain_window_max_simd<xsimd::avx2>(a, best);
}

}  // namespace dfp::simd
