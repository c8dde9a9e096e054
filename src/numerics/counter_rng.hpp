// Counter-based random numbers for the data pipeline: every draw is a pure function of
// (seed, stream, epoch, index, draw number), so results do not depend on threads or timing.
#pragma once

#include <cstdint>

namespace dfp {

// SplitMix64's finaliser: a bijective mix with full avalanche, the basis of the counter-based
// streams below.
inline uint64_t mix64(uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ull;
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

}  // namespace dfp
