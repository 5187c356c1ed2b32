// The one deterministic random source of the core (workload generation, scheduler
// tie-breaks and random policies). The standard library's distributions are
// implementation-defined, so a seed would not give the same sequence on every platform;
// this one does (xoshiro256** seeded through splitmix64, and our own
// exponential/normal/gamma samplers). Header-only; not thread-safe.
#pragma once

#include <cmath>
#include <cstdint>

namespace kvroute {

// splitmix64's finaliser: a good 64-bit mixer, also used to derive text keys.
constexpr uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Combines values into one key (order matters).
constexpr uint64_t MixKey(uint64_t a, uint64_t b) { return Mix64(a ^ Mix64(b + 0x51ed27f3ULL)); }

class Rng {
 public:
  explicit Rng(uint64_t seed) {
    uint64_t x = seed;
    for (uint64_t& s : s_) {
      x += 0x9e3779b97f4a7c15ULL;
      s = Mix64(x);
    }
  }

  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, 1), 53 bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  // Uniform in (0, 1]: safe under log().
  double UniformPositive() { return static_cast<double>((Next() >> 11) + 1) * 0x1.0p-53; }
  // Uniform integer in [0, n); n > 0. Lemire's multiply-shift with rejection: unbiased,
  // one multiply in the common case.
  uint64_t Below(uint64_t n) {
    unsigned __int128 m = static_cast<unsigned __int128>(Next()) * n;
    auto low = static_cast<uint64_t>(m);
    if (low < n) {
      const uint64_t threshold = -n % n;
      while (low < threshold) {
        m = static_cast<unsigned __int128>(Next()) * n;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }
  // Exponential with the given rate (> 0).
  double Exponential(double rate) { return -std::log(UniformPositive()) / rate; }
  // Standard normal (Box-Muller; one of the pair is cached).
  double Normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u = UniformPositive();
    const double v = Uniform();
    const double r = std::sqrt(-2.0 * std::log(u));
    spare_ = r * std::sin(2.0 * M_PI * v);
    has_spare_ = true;
    return r * std::cos(2.0 * M_PI * v);
  }
  // Gamma(shape, scale), shape > 0 (Marsaglia-Tsang, with the shape < 1 boost).
  double Gamma(double shape, double scale) {
    if (shape < 1.0) {
      return Gamma(shape + 1.0, scale) * std::pow(UniformPositive(), 1.0 / shape);
    }
    const double d = shape - 1.0 / 3.0;
    const double c = 1.0 / std::sqrt(9.0 * d);
    for (;;) {
      double x, v;
      do {
        x = Normal();
        v = 1.0 + c * x;
      } while (v <= 0.0);
      v = v * v * v;
      const double u = UniformPositive();
      if (u < 1.0 - 0.0331 * x * x * x * x) return d * v * scale;
      if (std::log(u) < 0.5 * x * x + d * (1.0 - v + std::log(v))) return d * v * scale;
    }
  }

 private:
  static constexpr uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
  double spare_ = 0.0;
  bool has_spare_ = false;
};

}  // namespace kvroute
