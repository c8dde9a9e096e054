// dfp's random numbers, all counter-based: every draw is a pure function of a seed and a
// counter (element, image, step, draw number), so results depend neither on threads nor on
// timing, and every kernel level and the CUDA device draw the same numbers. The one place that
// defines them: the data pipeline (shuffle, augmentation), DFP16 stochastic rounding (ARS-5), the
// multiply hash of dropout and BF16/FP16 rounding, and the per-step seeds.
#pragma once

#include <cstdint>

// Functions the CUDA device calls too (src/cuda/ops.hpp) are host-and-device under nvcc.
#if defined(__CUDACC__)
#define DFP_HOST_DEVICE __host__ __device__
#else
#define DFP_HOST_DEVICE
#endif

namespace dfp {

// The 64-bit golden ratio (Weyl increment): steps of a counter that visit every value.
inline constexpr uint64_t kGoldenGamma = 0x9E3779B97F4A7C15ull;

// A seed for training step `step`: the base seed mixed with a Weyl sequence over the steps, plus
// `offset`, which separates the streams one base seed serves (the INT16 convolution's
// quantization streams use their own).
DFP_HOST_DEVICE inline uint64_t step_seed(uint64_t seed, uint64_t step, uint64_t offset = 0) noexcept {
  return seed ^ (step * kGoldenGamma + offset);
}

// SplitMix64's finaliser: a bijective mix with full avalanche, the basis of the counter-based
// streams below.
DFP_HOST_DEVICE inline uint64_t mix64(uint64_t x) noexcept {
  x += kGoldenGamma;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Distinct salts keep the shuffle and augmentation streams independent for the same seed.
constexpr uint64_t kShuffleSalt = 0x53485546464C45ull;  // "SHUFFLE"
constexpr uint64_t kAugmentSalt = 0x4155474D454E54ull;  // "AUGMENT"

inline uint64_t stream_key(uint64_t seed, uint64_t salt, uint64_t epoch, uint64_t index) noexcept {
  return mix64(mix64(mix64(seed ^ salt) ^ epoch) ^ index);
}

// Uniform in [0, n) by multiply-high (Lemire): the bias is below n / 2^64, far below anything a
// training run could observe, and unlike std::uniform_int_distribution the result is the same
// with every standard library.
inline uint32_t uniform_below(uint64_t r, uint32_t n) noexcept {
  return uint32_t((static_cast<unsigned __int128>(r) * n) >> 64);
}

// Uniform in [0, 1) with 53 random bits.
inline double uniform01(uint64_t r) noexcept { return double(r >> 11) * 0x1.0p-53; }

// Draw numbers of one sample's augmentation stream (the argument of mix64(key + n)): 1, 2 crop
// offsets, 3 flip, 16 + 4 * attempt + {0, 1, 2, 3} RandomResizedCrop.
constexpr uint64_t kDrawPadY = 1, kDrawPadX = 2, kDrawFlip = 3, kDrawResizedCrop = 16;

// ---- Element streams of the kernels -------------------------------------------------------

// Two counter-based streams: element i's number depends only on (seed, i), never on thread count.
//
// DFP16 stochastic rounding draws from ARS-5 (Salmon et al., "Parallel random numbers: as easy
// as 1, 2, 3", SC'11; Random123's ars.h): five AES rounds keyed by the seed, over the 128-bit
// counter i/4, whose four 32-bit output words serve elements 4(i/4) .. 4(i/4)+3. Salmon et al.
// report five rounds as the fewest without statistical failures in TestU01's batteries (Random123
// defaults to seven for a margin; rounding noise needs none). On AVX-512 with VAES one VAESENC works on
// four counters at once, so 16 numbers cost five instructions: about 3x cheaper on Zen 4 than the
// four VPMULLD of the multiply hash below, which made stochastic quantization compute bound.
// The scalar form here is the specification: the AES round in software, bit for bit the
// AESENC/AESENCLAST instructions.
struct Block128 {
  uint64_t lo = 0, hi = 0;  // little-endian: byte b of the block is byte (b % 8) of lo (b < 8) or hi
};
namespace aes_detail {
constexpr uint8_t xtime(uint8_t a) { return static_cast<uint8_t>((a << 1) ^ ((a & 0x80) ? 0x1B : 0)); }
constexpr uint8_t rotl8(uint8_t x, int s) { return static_cast<uint8_t>((x << s) | (x >> (8 - s))); }
struct Sbox {
  uint8_t v[256] = {};
  constexpr Sbox() {  // FIPS-197 S-box: multiplicative inverse in GF(2^8), then the affine map
    uint8_t p = 1, q = 1;
    do {
      p = static_cast<uint8_t>(p ^ xtime(p));  // p *= 3 (3 generates the field's units)
      q = static_cast<uint8_t>(q ^ (q << 1));  // q /= 3, so q = 1/p
      q = static_cast<uint8_t>(q ^ (q << 2));
      q = static_cast<uint8_t>(q ^ (q << 4));
      if (q & 0x80) q = static_cast<uint8_t>(q ^ 0x09);
      v[p] = static_cast<uint8_t>(q ^ rotl8(q, 1) ^ rotl8(q, 2) ^ rotl8(q, 3) ^ rotl8(q, 4) ^ 0x63);
    } while (p != 1);
    v[0] = 0x63;
  }
};
inline constexpr Sbox kSbox{};
// AESENC (last = false) or AESENCLAST: ShiftRows, SubBytes, [MixColumns], xor round key.
// State byte r + 4c is row r, column c.
inline Block128 round(Block128 in, Block128 key, bool last) noexcept {
  uint8_t a[16], s[16];
  for (int b = 0; b < 16; ++b) a[b] = static_cast<uint8_t>((b < 8 ? in.lo : in.hi) >> (8 * (b % 8)));
  for (int c = 0; c < 4; ++c)
    for (int r = 0; r < 4; ++r) s[r + 4 * c] = kSbox.v[a[r + 4 * ((c + r) & 3)]];
  if (!last)
    for (int c = 0; c < 4; ++c) {
      const uint8_t a0 = s[4 * c], a1 = s[4 * c + 1], a2 = s[4 * c + 2], a3 = s[4 * c + 3];
      const uint8_t all = static_cast<uint8_t>(a0 ^ a1 ^ a2 ^ a3);
      s[4 * c + 0] = static_cast<uint8_t>(a0 ^ all ^ xtime(static_cast<uint8_t>(a0 ^ a1)));
      s[4 * c + 1] = static_cast<uint8_t>(a1 ^ all ^ xtime(static_cast<uint8_t>(a1 ^ a2)));
      s[4 * c + 2] = static_cast<uint8_t>(a2 ^ all ^ xtime(static_cast<uint8_t>(a2 ^ a3)));
      s[4 * c + 3] = static_cast<uint8_t>(a3 ^ all ^ xtime(static_cast<uint8_t>(a3 ^ a0)));
    }
  Block128 out;
  for (int b = 0; b < 16; ++b) (b < 8 ? out.lo : out.hi) |= uint64_t{s[b]} << (8 * (b % 8));
  out.lo ^= key.lo;
  out.hi ^= key.hi;
  return out;
}
}  // namespace aes_detail

inline constexpr int kArsRounds = 5;
// Round keys: k0 = (seed, kArsKeyHi), k(r+1) = k(r) + Weyl constants, per 64-bit half (ars.h).
inline constexpr uint64_t kArsKeyHi = 0x6a09e667f3bcc908ULL;  // frac(sqrt 2): any fixed value
inline constexpr uint64_t kArsWeylLo = 0x9E3779B97F4A7C15ULL, kArsWeylHi = 0xBB67AE8584CAA73BULL;
inline Block128 ars_round_key(uint64_t seed, int r) noexcept {
  return {seed + uint64_t(r) * kArsWeylLo, kArsKeyHi + uint64_t(r) * kArsWeylHi};
}
inline Block128 ars5(uint64_t seed, uint64_t counter) noexcept {
  Block128 v{counter ^ seed, kArsKeyHi};  // counter's high half is 0
  for (int r = 1; r <= kArsRounds; ++r) v = aes_detail::round(v, ars_round_key(seed, r), r == kArsRounds);
  return v;
}
// Word `index % 4` of ARS-5(seed, index / 4), top 24 bits: u = rand24 * 2^-24 in [0, 1).
inline uint32_t ars_word(Block128 b, uint64_t index) noexcept {
  const uint64_t half = (index & 2) ? b.hi : b.lo;
  return static_cast<uint32_t>(half >> (32 * (index & 1)));
}
inline uint32_t dfp16_rand24(uint64_t seed, uint64_t index) noexcept {
  return ars_word(ars5(seed, index >> 2), index) >> 8;
}

// Dropout and BF16/FP16 stochastic rounding draw from a multiply hash that the CUDA device draws
// bit for bit (src/cuda/ops.hpp): 24 bits, u = rand24 * 2^-24 in [0, 1).
DFP_HOST_DEVICE inline uint32_t mix32(uint32_t x) noexcept {  // "lowbias32" (C. Wellons): a strong 32-bit mixer
  x ^= x >> 16; x *= 0x7feb352dU; x ^= x >> 15; x *= 0x846ca68bU; x ^= x >> 16;
  return x;
}
DFP_HOST_DEVICE inline uint32_t stochastic_key(uint64_t seed) noexcept {
  return mix32(static_cast<uint32_t>(seed) ^ mix32(static_cast<uint32_t>(seed >> 32) + 0x9e3779b9U));
}
DFP_HOST_DEVICE inline uint32_t stochastic_rand24(uint32_t key, uint64_t index) noexcept {
  // Streams repeat every 2^32 elements of one tensor; harmless for rounding noise.
  return mix32(mix32(static_cast<uint32_t>(index) ^ key) + key) >> 8;
}

}  // namespace dfp
