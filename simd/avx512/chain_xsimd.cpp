// The chain tables' window maxima (simd/chain_xsimd.hpp) instantiated for AVX-512.
#include "simd/chain_xsimd.hpp"

namespace dfp::simd {

void avx512::chain_window_max(const ChainWindowArgs& a, int64_t* best) {
  chain_window_max_simd<xsimd::avx512f>(a, best);
}

}  // namespace dfp::simd
