// w8a16_linear on Intel AMX tiles, for 16 rows and more: the same numbers as kernels.cpp's AVX-512
// VNNI kernel, bit for bit, in fewer instructions (radix_ext/cpu/kernels.py packs the weights a
// second time for it, where ``amx_ready()``).
//
// The VNNI kernel sums each group of 32 products qx[m, k] * qw[n, k] exactly in int32, qx at int16.
// AMX multiplies bytes, so each input row is split at the byte: qx = 256 * hi + lo, hi signed
// (TDPBSSD: signed x signed) and lo unsigned (TDPBUSD: unsigned x signed). Both sums are exact
// in int32 (|hi sum| <= 32 * 128 * 127, |lo sum| <= 32 * 255 * 127), and so is 256 * hi sum + lo
// sum, which is the VNNI kernel's group sum. Each group's sum is then scaled and added in float32
// with the very multiply-adds, in the very order, of kernels.cpp's ``tile``: the same bits.
//
// A tile holds one group of 32 inputs: A (16 rows x 32 bytes, hi or lo) times B (8 quads x 16
// columns x 4 bytes, the weights of one 16-column block) into C (16 x 16 int32). Each group's C is
// stored and folded into float accumulators held in registers while the next group's tiles run.
#include "kernels.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace {

constexpr int64_t kGroup = 32;
constexpr int64_t kRows = 16;        // rows per tile
constexpr int64_t kQuads = 512;      // weight bytes per block and group: [8 quads][16 columns][4]
constexpr int64_t kRecord = 576;     // then the block's 16 float32 scales of the group
constexpr int64_t kRowChunk = 128;   // rows whose hi / lo bytes stay in cache while the weights stream
constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;  // arch_prctl: ask Linux for the tile state

struct alignas(64) TileConfig {  // LDTILECFG's 64 bytes, palette 1
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles: 0 hi, 1 lo (16 x 32 bytes), 2 weights (8 x 64 bytes), 4-5 and 6-7 the hi and lo sums of
// even and odd groups (16 x 64 bytes), so that a group's sums are stored while the next one's run.
__attribute__((target("amx-tile"))) void configure() {
  TileConfig cfg;
  cfg.rows[0] = cfg.rows[1] = kRows;
  cfg.colsb[0] = cfg.colsb[1] = kGroup;
  cfg.rows[2] = kGroup / 4;
  cfg.colsb[2] = 64;
  for (int t = 4; t < 8; ++t) {
    cfg.rows[t] = kRows;
    cfg.colsb[t] = 64;
  }
  // Not _tile_loadconfig: GCC 12 declares its operand as 8 bytes, and drops the stores after them.
  asm volatile("ldtilecfg %0" : : "m"(cfg));
}

__attribute__((target("amx-tile"))) void release() { _tile_release(); }

// One group's hi and lo sums (tiles 0 and 1 times tile 2) into tiles HI and LO, then into OUT
// ([2][16][16] int32). A macro: GCC's tile intrinsics take the tile's number as a literal.
#define RKSC_GROUP_SUMS(HI, LO, OUT) \
  do {                               \
    _tile_zero(HI);                  \
    _tile_zero(LO);                  \
    _tile_dpbssd(HI, 0, 2);          \
    _tile_dpbusd(LO, 1, 2);          \
    _tile_stored(HI, (OUT)[0], 64);  \
    _tile_stored(LO, (OUT)[1], 64);  \
  } while (0)

// One 16-column block for 16 rows: the float32 accumulators of kernels.cpp's tile, per group.
__attribute__((target("amx-tile,amx-int8,avx512f"))) void block(const int8_t* hi, const uint8_t* lo, int64_t K,
                                                              const int8_t* wb, __m512* out) {
  alignas(64) int32_t sums[2][2][kRows][16];  // [group parity][hi, lo][row][column]
  const int64_t G = K / kGroup;
  __m512 acc[kRows];  // local, so that they stay in registers
  for (int r = 0; r < kRows; ++r) acc[r] = _mm512_setzero_ps();
  auto fold = [&](int64_t g) {
    const __m512 s = _mm512_loadu_ps(reinterpret_cast<const float*>(wb + g * kRecord + kQuads));
    for (int r = 0; r < kRows; ++r) {
      const __m512i sum = _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(sums[g & 1][0][r]), 8),
                                           _mm512_load_si512(sums[g & 1][1][r]));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), s, acc[r]);
    }
  };
  for (int64_t g = 0; g < G; ++g) {
    _tile_loadd(0, hi + g * kGroup, K);
    _tile_loadd(1, lo + g * kGroup, K);
    _tile_loadd(2, wb + g * kRecord, 64);
    if (g & 1) {
      RKSC_GROUP_SUMS(6, 7, sums[1]);
    } else {
      RKSC_GROUP_SUMS(4, 5, sums[0]);
    }
    if (g > 0) fold(g - 1);
  }
  fold(G - 1);
  for (int r = 0; r < kRows; ++r) out[r] = acc[r];
}

}  // namespace

namespace rksc {

bool amx_ready() {
  static const bool ready = [] {
    const char* env = std::getenv("RKSC_CPU_AMX");
    if (env != nullptr && std::strcmp(env, "0") == 0) return false;
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((d >> 24) & 1) || !((d >> 25) & 1)) return false;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;  // Linux 5.16 and later
  }();
  return ready;
}

void w8a16_amx(const int16_t* q, const float* xs, int64_t M, int64_t K, const int8_t* w, int64_t N,
               const float* bias, float* out) {
  const int64_t NB = (N + 15) / 16, G = K / kGroup;
  const int64_t padded = (M + kRows - 1) / kRows * kRows;
  at::Tensor bytes = at::empty({2, padded, K}, at::TensorOptions().dtype(at::kChar));
  int8_t* hi = bytes.data_ptr<int8_t>();
  uint8_t* lo = reinterpret_cast<uint8_t*>(hi + padded * K);
  std::memset(hi + M * K, 0, (padded - M) * K);
  std::memset(lo + M * K, 0, (padded - M) * K);
  at::parallel_for(0, M, 16, [&](int64_t r0, int64_t r1) {
    const __m512i low = _mm512_set1_epi16(0xFF);
    for (int64_t i = r0 * K; i < r1 * K; i += 32) {  // K is a multiple of 32
      const __m512i v = _mm512_loadu_si512(q + i);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + i), _mm512_cvtepi16_epi8(_mm512_srai_epi16(v, 8)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo + i), _mm512_cvtepi16_epi8(_mm512_and_si512(v, low)));
    }
  });
  const int64_t chunks = (padded + kRowChunk - 1) / kRowChunk;
  at::parallel_for(0, chunks * NB, 1, [&](int64_t t0, int64_t t1) {
    configure();
    __m512 acc[kRows];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t chunk = t / NB, nb = t % NB, n0 = nb * 16;
      const __mmask16 mask = n0 + 16 <= N ? static_cast<__mmask16>(0xFFFF)
                                          : static_cast<__mmask16>((1u << (N - n0)) - 1);
      const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + n0) : _mm512_setzero_ps();
      for (int64_t r0 = chunk * kRowChunk; r0 < std::min(padded, (chunk + 1) * kRowChunk); r0 += kRows) {
        block(hi + r0 * K, lo + r0 * K, K, w + nb * G * kRecord, acc);
        for (int64_t r = 0; r < std::min(kRows, M - r0); ++r) {
          __m512 v = _mm512_mul_ps(acc[r], _mm512_set1_ps(xs[r0 + r]));
          if (bias) v = _mm512_add_ps(v, b);
          _mm512_mask_storeu_ps(out + (r0 + r) * N + n0, mask, v);
        }
      }
    }
    release();
  });
}

}  // namespace rksc
