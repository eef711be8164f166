// The CPU kernels of ``--cpu-linear-dtype int8`` (AVX-512 VNNI), built and loaded by
// radix_ext/cpu/kernels.py, which also packs the weights and says why these numbers:
// ``torch.ops.rksc_cpu_kernels.w8a16_linear``, ``add_rms_norm``, ``rope_neox`` and ``donor_kv``; and the
// registration of every op of the library (``causal_attention`` is in causal_attention.cpp,
// ``decode_layers`` in decode_layers.cpp). Every one computes a row from that row alone.
//
// w8a16_linear.
// Weights: int8, one float32 scale per row and group of 32 inputs (qw[n, k] * sw[n, k / 32]).
// (The layout is below, at ``tile``.)
// Inputs: each row rounded to int16 at its own scale sx[m] = max|x[m]| / 32767.
// y[m, n] = sx[m] * sum_g sw[n, g] * float(sum_{k in g} qx[m, k] * qw[n, k]) + bias[n]
// Each group's sum is exact in int32 (|sum| <= 32 * 32767 * 127 < 2^31) and the groups are added in
// order with one fused multiply-add each, whatever the tile: a row's output depends on that row
// alone, never on the rows batched with it. vpdpwssd multiplies 16-bit pairs: 32 products per
// instruction; the weights are read as bytes and widened in registers.
#include "kernels.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <unordered_set>
#include <vector>

namespace {

constexpr int64_t kGroup = 32;   // inputs per weight scale
constexpr int64_t kCols = 16;    // output columns per packed block (one zmm of int32 sums)
constexpr int64_t kBlocks = 4;   // blocks per task
constexpr int kMaxRows = 3;      // rows per tile: 3 x 4 int32 and float32 accumulators fit 32 zmm
constexpr int64_t kAmxRows = 16; // from here on, AMX tiles where they run (linear_amx.cpp)

void quantize_row(const float* x, int64_t K, int16_t* q, float* scale) {
  __m512 amax = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_loadu_ps(x + k)));
  const float m = _mm512_reduce_max_ps(amax);
  const float s = m > 0.f ? m / 32767.f : 1.f;
  const __m512 inv = _mm512_set1_ps(1.f / s);
  const __m512i hi = _mm512_set1_epi32(32767), lo = _mm512_set1_epi32(-32767);
  for (int64_t k = 0; k < K; k += 16) {
    __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + k), inv));  // half to even
    v = _mm512_max_epi32(_mm512_min_epi32(v, hi), lo);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + k), _mm512_cvtepi32_epi16(v));
  }
  *scale = s;
}

// R rows x C blocks. w: [NB][K/32][576] bytes: per block and group, the weights [16 pairs of
// inputs][16 columns][2] int8, then the group's 16 float32 scales: one sequential stream per block.
constexpr int64_t kGroupBytes = kGroup * kCols + kCols * 4;

template <int R, int C>
void tile(const int16_t* q, int64_t K, const float* xs, const int8_t* w, int64_t nb0, int64_t N,
          const float* bias, float* out, int64_t ldo) {
  __m512 facc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) facc[r][c] = _mm512_setzero_ps();
  const int64_t G = K / kGroup;
  const int8_t* wb[C];
  for (int c = 0; c < C; ++c) wb[c] = w + (nb0 + c) * G * kGroupBytes;
  for (int64_t g = 0; g < G; ++g) {
    __m512i acc[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_si512();
    const int16_t* qg = q + g * kGroup;
    for (int64_t j = 0; j < kGroup / 2; ++j) {
      __m512i wv[C];
      for (int c = 0; c < C; ++c)
        wv[c] = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb[c] + g * kGroupBytes + j * 32)));
      for (int r = 0; r < R; ++r) {
        int32_t pair;
        std::memcpy(&pair, qg + r * K + 2 * j, 4);
        const __m512i a = _mm512_set1_epi32(pair);
        for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpwssd_epi32(acc[r][c], a, wv[c]);
      }
    }
    for (int c = 0; c < C; ++c) {
      const __m512 s = _mm512_loadu_ps(reinterpret_cast<const float*>(wb[c] + g * kGroupBytes + kGroup * kCols));
      for (int r = 0; r < R; ++r) facc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][c]), s, facc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    const __m512 sx = _mm512_set1_ps(xs[r]);
    for (int c = 0; c < C; ++c) {
      const int64_t n0 = (nb0 + c) * kCols;
      const __mmask16 m = n0 + kCols <= N ? static_cast<__mmask16>(0xFFFF)
                                          : static_cast<__mmask16>((1u << (N - n0)) - 1);
      __m512 v = _mm512_mul_ps(facc[r][c], sx);
      if (bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, bias + n0));
      _mm512_mask_storeu_ps(out + r * ldo + n0, m, v);
    }
  }
}

template <int C>
void rows(const int16_t* q, int64_t M, int64_t K, const float* xs, const int8_t* w, int64_t nb0,
          int64_t N, const float* bias, float* out) {
  int64_t r = 0;
  for (; r + kMaxRows <= M; r += kMaxRows) tile<kMaxRows, C>(q + r * K, K, xs + r, w, nb0, N, bias, out + r * N, N);
  if (M - r == 2) tile<2, C>(q + r * K, K, xs + r, w, nb0, N, bias, out + r * N, N);
  if (M - r == 1) tile<1, C>(q + r * K, K, xs + r, w, nb0, N, bias, out + r * N, N);
}

// One row's neox rotation: heads of 2 * half floats from x into o, by c / s [half].
void rotate_row(const float* x, float* o, int64_t heads, int64_t half, const float* c, const float* s) {
  for (int64_t h = 0; h < heads; ++h) {
    const float* x1 = x + h * 2 * half;
    const float* x2 = x1 + half;
    float* o1 = o + h * 2 * half;
    float* o2 = o1 + half;
    int64_t i = 0;
    for (; i + 16 <= half; i += 16) {
      const __m512 a = _mm512_loadu_ps(x1 + i), b = _mm512_loadu_ps(x2 + i);
      const __m512 vc = _mm512_loadu_ps(c + i), vs = _mm512_loadu_ps(s + i);
      _mm512_storeu_ps(o1 + i, _mm512_sub_ps(_mm512_mul_ps(a, vc), _mm512_mul_ps(b, vs)));
      _mm512_storeu_ps(o2 + i, _mm512_add_ps(_mm512_mul_ps(b, vc), _mm512_mul_ps(a, vs)));
    }
    for (; i < half; ++i) {
      o1[i] = x1[i] * c[i] - x2[i] * s[i];
      o2[i] = x2[i] * c[i] + x1[i] * s[i];
    }
  }
}

void check_cos_sin(const at::Tensor& cos, const at::Tensor& sin, int64_t n, int64_t half) {
  TORCH_CHECK(cos.scalar_type() == at::kFloat && cos.is_contiguous() && cos.numel() == n * half &&
              sin.scalar_type() == at::kFloat && sin.is_contiguous() && sin.numel() == n * half,
              "cos, sin: contiguous float32 [n, 1, ", half, "]");
}

}  // namespace

namespace rksc {

at::Tensor w8a16_linear(const at::Tensor& x, const at::Tensor& w, int64_t N, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous() && x.dim() == 2, "x: contiguous float32 [M, K]");
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(K % kGroup == 0, "the input width must be a multiple of ", kGroup, ", got ", K);
  TORCH_CHECK(w.scalar_type() == at::kChar && w.is_contiguous() && w.dim() == 3 && w.size(1) * kGroup == K &&
              w.size(2) == kGroupBytes, "w: packed int8 [N/16, K/32, ", kGroupBytes, "], got ", w.sizes(), " for K ", K);
  const int64_t NB = (N + kCols - 1) / kCols;  // then, where w holds 2 * NB blocks, the AMX tiles' copy
  TORCH_CHECK(N > 0 && (w.size(0) == NB || w.size(0) == 2 * NB), "N ", N, " does not fit ", w.size(0), " blocks");
  const float* b = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == N, "bias: float32 [N]");
    b = bias->data_ptr<float>();
  }
  at::Tensor out = at::empty({M, N}, x.options());
  if (M == 0) return out;
  at::Tensor q = at::empty({M, K}, x.options().dtype(at::kShort));
  at::Tensor xs = at::empty({M}, x.options());
  const float* xp = x.data_ptr<float>();
  int16_t* qp = q.data_ptr<int16_t>();
  float* xsp = xs.data_ptr<float>();
  at::parallel_for(0, M, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) quantize_row(xp + r * K, K, qp + r * K, xsp + r);
  });
  const int8_t* wp = w.data_ptr<int8_t>();
  float* op = out.data_ptr<float>();
  if (w.size(0) == 2 * NB && M >= kAmxRows && amx_ready()) {
    w8a16_amx(qp, xsp, M, K, wp + NB * w.size(1) * kGroupBytes, N, b, op);
    return out;
  }
  at::parallel_for(0, (NB + kBlocks - 1) / kBlocks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t nb0 = t * kBlocks;
      switch (std::min(kBlocks, NB - nb0)) {
        case 4: rows<4>(qp, M, K, xsp, wp, nb0, N, b, op); break;
        case 3: rows<3>(qp, M, K, xsp, wp, nb0, N, b, op); break;
        case 2: rows<2>(qp, M, K, xsp, wp, nb0, N, b, op); break;
        default: rows<1>(qp, M, K, xsp, wp, nb0, N, b, op); break;
      }
    }
  });
  return out;
}

int64_t amx_rows() { return amx_ready() ? kAmxRows : 0; }

// add_rms_norm: s = x + residual (or x alone), y = (s * (1 / sqrt(mean(s^2) + eps))) * weight, per
// row; returns (y, s), s empty [0, K] without a residual (x itself; no alias). SGLang's RMSNorm.forward_native computes the same products; only the order of
// the sum of squares differs (float rounding). One pass per row, no temporaries.
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const std::optional<at::Tensor>& residual,
                                                const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous() && x.dim() == 2, "x: contiguous float32 [M, K]");
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(K % 16 == 0, "the width must be a multiple of 16, got ", K);
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.is_contiguous() && weight.numel() == K, "weight: float32 [K]");
  const bool add = residual.has_value() && residual->defined();
  if (add) TORCH_CHECK(residual->scalar_type() == at::kFloat && residual->is_contiguous() && residual->sizes() == x.sizes(),
                       "residual: contiguous float32 like x");
  at::Tensor out = at::empty({M, K}, x.options());
  at::Tensor sum = at::empty({add ? M : 0, K}, x.options());  // without a residual, s is x: not returned
  const float* xp = x.data_ptr<float>();
  const float* rp = add ? residual->data_ptr<float>() : nullptr;
  const float* wp = weight.data_ptr<float>();
  float* sp = add ? sum.data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();
  at::parallel_for(0, M, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = xp + r * K;
      const float* sr = add ? sp + r * K : xr;
      __m512 sq = _mm512_setzero_ps();
      for (int64_t k = 0; k < K; k += 16) {
        __m512 v = _mm512_loadu_ps(xr + k);
        if (add) {
          v = _mm512_add_ps(v, _mm512_loadu_ps(rp + r * K + k));
          _mm512_storeu_ps(sp + r * K + k, v);
        }
        sq = _mm512_fmadd_ps(v, v, sq);
      }
      const float mean = _mm512_reduce_add_ps(sq) / static_cast<float>(K);
      const __m512 inv = _mm512_set1_ps(1.f / std::sqrt(mean + static_cast<float>(eps)));
      for (int64_t k = 0; k < K; k += 16) {
        const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(sr + k), inv);
        _mm512_storeu_ps(op + r * K + k, _mm512_mul_ps(v, _mm512_loadu_ps(wp + k)));
      }
    }
  });
  return {out, sum};
}

// rope_neox: the neox rotation of x [n, heads * 2h] (rows may be strided) by cos / sin [n, 1, h]:
// [x1 * cos - x2 * sin, x2 * cos + x1 * sin] per head, into a new contiguous tensor. Each element is
// two rounded products and a rounded sum, as in SGLang's torch code: the same bits.
at::Tensor rope_neox(const at::Tensor& x, int64_t heads, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.stride(1) == 1, "x: float32 [n, width], unit stride");
  const int64_t n = x.size(0), width = x.size(1);
  TORCH_CHECK(heads > 0 && width % (2 * heads) == 0, "width ", width, " is not heads x an even head size");
  const int64_t half = width / heads / 2;
  check_cos_sin(cos, sin, n, half);
  at::Tensor out = at::empty({n, width}, x.options());
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  for (int64_t r = 0; r < n; ++r) {
    rotate_row(xp + r * x.stride(0), op + r * width, heads, half, cos.data_ptr<float>() + r * half,
               sin.data_ptr<float>() + r * half);
  }
  return out;
}

// donor_kv: for every layer's K and V buffer ([slots, heads, head] float32, contiguous), row own[r]
// takes row donors[r]: V as is, K rotated by cos / sin [n, 1, head / 2] (rope_neox's arithmetic, so
// the same bits as rotating the gathered rows). ASKS blend's reused rows (radix_ext/asks/kv_writes.py).
// No donor slot may be one this call writes (refused): every row reads what was there before the call.
void donor_kv(at::TensorList k_bufs, at::TensorList v_bufs, const at::Tensor& own, const at::Tensor& donors,
              const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(k_bufs.size() == v_bufs.size(), "as many K as V buffers");
  TORCH_CHECK(own.scalar_type() == at::kLong && donors.scalar_type() == at::kLong && own.is_contiguous() &&
              donors.is_contiguous() && own.numel() == donors.numel(), "own, donors: contiguous int64 [n]");
  const int64_t n = own.numel(), layers = static_cast<int64_t>(k_bufs.size());
  if (n == 0 || layers == 0) return;
  const at::Tensor& first = k_bufs[0];
  TORCH_CHECK(first.dim() == 3 && first.size(2) % 2 == 0, "K and V buffers: [slots, heads, an even head size]");
  const int64_t heads = first.size(1), width = heads * first.size(2), half = first.size(2) / 2;
  for (int64_t l = 0; l < layers; ++l) {
    for (const at::Tensor* b : {&k_bufs[l], &v_bufs[l]}) {
      TORCH_CHECK(b->scalar_type() == at::kFloat && b->is_contiguous() && b->dim() == 3 &&
                  b->sizes() == first.sizes(), "K and V buffers: contiguous float32, each ", first.sizes());
    }
  }
  check_cos_sin(cos, sin, n, half);
  const int64_t* op = own.data_ptr<int64_t>();
  const int64_t* dp = donors.data_ptr<int64_t>();
  const int64_t slots = first.size(0);
  std::unordered_set<int64_t> written(op, op + n);
  for (int64_t r = 0; r < n; ++r) {
    TORCH_CHECK(op[r] >= 0 && op[r] < slots && dp[r] >= 0 && dp[r] < slots, "slot out of range at row ", r);
    TORCH_CHECK(!written.count(dp[r]), "donor slot ", dp[r], " is also written (row ", r, ")");
  }
  std::vector<float*> ks(layers), vs(layers);
  for (int64_t l = 0; l < layers; ++l) {
    ks[l] = k_bufs[l].data_ptr<float>();
    vs[l] = v_bufs[l].data_ptr<float>();
  }
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  at::parallel_for(0, layers * n, 64, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t l = t / n, r = t % n;
      rotate_row(ks[l] + dp[r] * width, ks[l] + op[r] * width, heads, half, cp + r * half, sp + r * half);
      std::memcpy(vs[l] + op[r] * width, vs[l] + dp[r] * width, width * sizeof(float));
    }
  });
}

}  // namespace rksc

TORCH_LIBRARY(rksc_cpu_kernels, m) {
  m.def("w8a16_linear(Tensor x, Tensor w, int N, Tensor? bias) -> Tensor");
  m.def("add_rms_norm(Tensor x, Tensor? residual, Tensor weight, float eps) -> (Tensor, Tensor)");
  m.def("rope_neox(Tensor x, int heads, Tensor cos, Tensor sin) -> Tensor");
  m.def("donor_kv(Tensor(a!)[] k_bufs, Tensor(b!)[] v_bufs, Tensor own, Tensor donors, Tensor cos, Tensor sin) -> ()");
  m.def("amx_rows() -> int", &rksc::amx_rows);  // no tensor to dispatch on: one kernel for all
  m.def("causal_attention(Tensor q, Tensor k_buf, Tensor v_buf, Tensor table, Tensor req_rows, Tensor row_offsets, "
        "Tensor row_pos, float scale) -> Tensor");
  m.def("decode_layers(Tensor hidden, Tensor[] norms, float[] eps, Tensor[] linears, int[] widths, Tensor cos, "
        "Tensor sin, Tensor(a!)[] k_bufs, Tensor(b!)[] v_bufs, Tensor loc, Tensor table, Tensor req_rows, "
        "Tensor row_offsets, Tensor row_pos, int q_heads, int kv_heads, int head_dim, float[] scales, "
        "Tensor? first_q=None) "
        "-> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(rksc_cpu_kernels, CPU, m) {
  m.impl("w8a16_linear", &rksc::w8a16_linear);
  m.impl("add_rms_norm", &rksc::add_rms_norm);
  m.impl("rope_neox", &rksc::rope_neox);
  m.impl("donor_kv", &rksc::donor_kv);
  m.impl("causal_attention", &rksc::causal_attention);
  m.impl("decode_layers", &rksc::decode_layers);
}
