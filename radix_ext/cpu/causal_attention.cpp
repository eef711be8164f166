// The invariant causal attention of the rksc_cpu backend (radix_ext/cpu/attention.py), one of the
// sources of torch.ops.rksc_cpu_kernels (radix_ext/cpu/kernels.py builds them together).
//
// causal_attention: softmax(q k^T * scale) v of query rows at given positions of their requests,
// each row seeing its request's keys at positions 0..pos. Every row's arithmetic is fixed by its
// own query, its position and the keys and values up to it: scores as one fused multiply-add chain
// over the head's dimensions in order, the exact maximum, exponentials and their sum over keys in
// chunks of 16 anchored at position 0, then the values weighted in key order and scaled by 1 / sum.
// So a row's output is the same bits whether it is computed in a prefill of the whole prompt,
// behind a cached prefix, alone in a decode step or batched with other requests (SDPA's flash
// kernel blocks keys and queries by the sequence's length; its rows agree with this to float
// rounding, not bits).
//
// q [T, Hq, D] float32 (rows of one request consecutive); k_buf [S, Hk, D], v_buf [S, Hk, Dv]:
// the KV pool; table [R, W] int32: the pool slot of each position of each request row; req_rows [B]
// int64: each request's row of the table; row_offsets [B + 1] int64: request b's query rows are
// row_offsets[b] .. row_offsets[b + 1]; row_pos [T] int64: each query row's position.
#include "kernels.h"

#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <immintrin.h>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

constexpr int64_t kKeys = 16;  // keys per chunk: one zmm of scores
constexpr int kVecs = 6;       // query vectors per group: 6 x 4 value accumulators + 4 values fit 32 zmm

// The KV pool's rows of a request sit wherever its slots are: ask for the next ones early.
constexpr int64_t kAhead = 8;  // values: keys ahead
inline void prefetch(const float* p, int64_t floats) {
  for (int64_t i = 0; i < floats; i += 16) _mm_prefetch(reinterpret_cast<const char*>(p + i), _MM_HINT_T0);
}

// exp(x) for x <= 0 (Cephes' expf: x = n ln2 + r, exp(r) by its degree-7 polynomial, then 2^n).
inline __m512 exp_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.33654f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(p, n);
}

// 16 x 16 float transpose: rows r[i] (16 floats each, stride lds) -> out[j * ldo + i].
inline void transpose16(const float* const* r, int64_t col, float* out, int64_t ldo) {
  __m512 a[16], b[16];
  for (int i = 0; i < 16; ++i) a[i] = _mm512_loadu_ps(r[i] + col);
  for (int i = 0; i < 16; i += 2) {
    b[i] = _mm512_unpacklo_ps(a[i], a[i + 1]);
    b[i + 1] = _mm512_unpackhi_ps(a[i], a[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    a[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(b[i]), _mm512_castps_pd(b[i + 2])));
    a[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(b[i]), _mm512_castps_pd(b[i + 2])));
    a[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(b[i + 1]), _mm512_castps_pd(b[i + 3])));
    a[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(b[i + 1]), _mm512_castps_pd(b[i + 3])));
  }
  // a[4k + m]: rows 4k..4k+3, column m + 4 * lane-quarter; gather the quarters across row groups
  for (int m = 0; m < 4; ++m) {
    const __m512 t0 = _mm512_shuffle_f32x4(a[m], a[4 + m], 0x44), t1 = _mm512_shuffle_f32x4(a[m], a[4 + m], 0xEE);
    const __m512 t2 = _mm512_shuffle_f32x4(a[8 + m], a[12 + m], 0x44), t3 = _mm512_shuffle_f32x4(a[8 + m], a[12 + m], 0xEE);
    _mm512_storeu_ps(out + (m + 0) * ldo, _mm512_shuffle_f32x4(t0, t2, 0x88));
    _mm512_storeu_ps(out + (m + 4) * ldo, _mm512_shuffle_f32x4(t0, t2, 0xDD));
    _mm512_storeu_ps(out + (m + 8) * ldo, _mm512_shuffle_f32x4(t1, t3, 0x88));
    _mm512_storeu_ps(out + (m + 12) * ldo, _mm512_shuffle_f32x4(t1, t3, 0xDD));
  }
}

struct QueryVec {
  const float* q;  // [D]
  float* out;      // [Dv]
  int64_t pos;
};

// Scores of N query vectors against keys 0 .. chunks * 16 - 1: kt [chunks][D][16] -> s[n * ld + j].
// C chunks at a time: each chunk's sums are its own chain over d, so the C x N chains run side by side.
template <int N>
void scores(const QueryVec* v, int64_t D, const float* kt, int64_t chunks, float scale, float* s, int64_t ld) {
  constexpr int C = N <= 3 ? 4 : 2;
  const __m512 sc = _mm512_set1_ps(scale);
  int64_t c = 0;
  for (; c + C <= chunks; c += C) {
    __m512 acc[C][N];
    for (int i = 0; i < C; ++i)
      for (int n = 0; n < N; ++n) acc[i][n] = _mm512_setzero_ps();
    const float* kc = kt + c * D * kKeys;
    for (int64_t d = 0; d < D; ++d) {
      __m512 qd[N];
      for (int n = 0; n < N; ++n) qd[n] = _mm512_set1_ps(v[n].q[d]);
      for (int i = 0; i < C; ++i) {
        const __m512 k = _mm512_loadu_ps(kc + i * D * kKeys + d * kKeys);
        for (int n = 0; n < N; ++n) acc[i][n] = _mm512_fmadd_ps(qd[n], k, acc[i][n]);
      }
    }
    for (int i = 0; i < C; ++i)
      for (int n = 0; n < N; ++n) _mm512_storeu_ps(s + n * ld + (c + i) * kKeys, _mm512_mul_ps(acc[i][n], sc));
  }
  for (; c < chunks; ++c) {
    __m512 acc[N];
    for (int n = 0; n < N; ++n) acc[n] = _mm512_setzero_ps();
    const float* kc = kt + c * D * kKeys;
    for (int64_t d = 0; d < D; ++d) {
      const __m512 k = _mm512_loadu_ps(kc + d * kKeys);
      for (int n = 0; n < N; ++n) acc[n] = _mm512_fmadd_ps(_mm512_set1_ps(v[n].q[d]), k, acc[n]);
    }
    for (int n = 0; n < N; ++n) _mm512_storeu_ps(s + n * ld + c * kKeys, _mm512_mul_ps(acc[n], sc));
  }
}

// s[0 .. pos] -> exp(s - max); returns their sum.
float softmax_weights(float* s, int64_t pos) {
  const int64_t n = pos + 1, full = n / kKeys * kKeys;
  const __mmask16 tail = static_cast<__mmask16>((1u << (n - full)) - 1);
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < full; j += kKeys) mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + j));
  if (tail) mx = _mm512_mask_max_ps(mx, tail, mx, _mm512_maskz_loadu_ps(tail, s + full));
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < full; j += kKeys) {
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(s + j), m));
    _mm512_storeu_ps(s + j, e);
    sum = _mm512_add_ps(sum, e);
  }
  if (tail) {
    const __m512 e = _mm512_maskz_mov_ps(tail, exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, s + full), m)));
    _mm512_mask_storeu_ps(s + full, tail, e);
    sum = _mm512_add_ps(sum, e);
  }
  return _mm512_reduce_add_ps(sum);
}

// out_n[d0 .. d0 + 16W) = sum_{j <= pos_n} e[n * ld + j] * V[j][d0 ..], in key order, times inv[n].
template <int N, int W>
void weighted(const QueryVec* v, const float* e, int64_t ld, const float* vh, const int32_t* slots,
              int64_t vstride, int64_t d0, const float* inv) {
  __m512 acc[N][W];
  for (int n = 0; n < N; ++n)
    for (int w = 0; w < W; ++w) acc[n][w] = _mm512_setzero_ps();
  int64_t last = 0;
  for (int n = 0; n < N; ++n) last = std::max(last, v[n].pos);
  for (int64_t j = 0; j <= last; ++j) {
    const float* row = vh + static_cast<int64_t>(slots[j]) * vstride + d0;
    if (j + kAhead <= last) prefetch(vh + static_cast<int64_t>(slots[j + kAhead]) * vstride + d0, 16 * W);
    __m512 val[W];
    for (int w = 0; w < W; ++w) val[w] = _mm512_loadu_ps(row + 16 * w);
    for (int n = 0; n < N; ++n) {
      if (j > v[n].pos) continue;
      const __m512 p = _mm512_set1_ps(e[n * ld + j]);
      for (int w = 0; w < W; ++w) acc[n][w] = _mm512_fmadd_ps(p, val[w], acc[n][w]);
    }
  }
  for (int n = 0; n < N; ++n) {
    const __m512 s = _mm512_set1_ps(inv[n]);
    for (int w = 0; w < W; ++w) _mm512_storeu_ps(v[n].out + d0 + 16 * w, _mm512_mul_ps(acc[n][w], s));
  }
}

template <int N>
void group(const QueryVec* v, int64_t D, int64_t Dv, const float* kt, const float* vh, const int32_t* slots,
           int64_t vstride, float scale, float* s, int64_t ld) {
  int64_t last = 0;
  for (int n = 0; n < N; ++n) last = std::max(last, v[n].pos);
  scores<N>(v, D, kt, last / kKeys + 1, scale, s, ld);
  float inv[N];
  for (int n = 0; n < N; ++n) inv[n] = 1.f / softmax_weights(s + n * ld, v[n].pos);
  int64_t d0 = 0;
  for (; d0 + 64 <= Dv; d0 += 64) weighted<N, 4>(v, s, ld, vh, slots, vstride, d0, inv);
  switch ((Dv - d0) / 16) {
    case 3: weighted<N, 3>(v, s, ld, vh, slots, vstride, d0, inv); break;
    case 2: weighted<N, 2>(v, s, ld, vh, slots, vstride, d0, inv); break;
    case 1: weighted<N, 1>(v, s, ld, vh, slots, vstride, d0, inv); break;
    default: break;
  }
}

using GroupFn = void (*)(const QueryVec*, int64_t, int64_t, const float*, const float*, const int32_t*, int64_t,
                         float, float*, int64_t);
constexpr GroupFn kGroups[kVecs + 1] = {nullptr, group<1>, group<2>, group<3>, group<4>, group<5>, group<6>};

}  // namespace

namespace rksc {

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf,
                            const at::Tensor& table, const at::Tensor& req_rows, const at::Tensor& row_offsets,
                            const at::Tensor& row_pos, double scale) {
  TORCH_CHECK(q.scalar_type() == at::kFloat && q.dim() == 3 && q.stride(2) == 1 && q.stride(1) == q.size(2),
              "q: float32 [T, Hq, D], heads contiguous");
  TORCH_CHECK(k_buf.scalar_type() == at::kFloat && k_buf.is_contiguous() && k_buf.dim() == 3 &&
              v_buf.scalar_type() == at::kFloat && v_buf.is_contiguous() && v_buf.dim() == 3 &&
              k_buf.size(0) == v_buf.size(0) && k_buf.size(1) == v_buf.size(1), "k_buf, v_buf: float32 [S, Hk, D]");
  const int64_t T = q.size(0), Hq = q.size(1), D = q.size(2), Hk = k_buf.size(1), Dv = v_buf.size(2);
  TORCH_CHECK(k_buf.size(2) == D && D % kKeys == 0 && Dv % 16 == 0 && Hk > 0 && Hq % Hk == 0,
              "head sizes: D ", D, ", Dv ", Dv, " must be multiples of 16 and Hq ", Hq, " a multiple of Hk ", Hk);
  TORCH_CHECK(table.scalar_type() == at::kInt && table.is_contiguous() && table.dim() == 2, "table: int32 [R, W]");
  const int64_t B = req_rows.numel();
  TORCH_CHECK(req_rows.scalar_type() == at::kLong && req_rows.is_contiguous() && row_offsets.scalar_type() == at::kLong &&
              row_offsets.is_contiguous() && row_offsets.numel() == B + 1 && row_pos.scalar_type() == at::kLong &&
              row_pos.is_contiguous() && row_pos.numel() == T, "req_rows [B], row_offsets [B + 1], row_pos [T]: int64");
  const int64_t* rr = req_rows.data_ptr<int64_t>();
  const int64_t* off = row_offsets.data_ptr<int64_t>();
  const int64_t* pos = row_pos.data_ptr<int64_t>();
  TORCH_CHECK(off[0] == 0 && off[B] == T, "row_offsets must run from 0 to T = ", T);
  const int64_t W = table.size(1), S = k_buf.size(0);
  std::vector<int64_t> keys(B), kt_off(B + 1, 0);  // keys each request's rows see; its transposed keys' offset
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(rr[b] >= 0 && rr[b] < table.size(0) && off[b] <= off[b + 1], "request ", b, ": bad row or offsets");
    int64_t last = -1;
    for (int64_t t = off[b]; t < off[b + 1]; ++t) {
      TORCH_CHECK(pos[t] >= 0 && pos[t] < W, "row ", t, ": position ", pos[t], " outside the table's ", W);
      last = std::max(last, pos[t]);
    }
    keys[b] = last + 1;
    kt_off[b + 1] = kt_off[b] + (last + kKeys) / kKeys * kKeys * D * Hk;
  }
  const int32_t* tab = table.data_ptr<int32_t>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < keys[b]; ++j) {
      const int32_t slot = tab[rr[b] * W + j];
      TORCH_CHECK(slot >= 0 && slot < S, "request ", b, " position ", j, ": slot ", slot, " outside the pool");
    }
  at::Tensor out = at::empty({T, Hq, Dv}, q.options());
  if (T == 0) return out;
  at::Tensor kt = at::empty({kt_off[B]}, q.options());
  const float* kp = k_buf.data_ptr<float>();
  const float* vp = v_buf.data_ptr<float>();
  float* ktp = kt.data_ptr<float>();
  // Phase 1: each request's keys per KV head, transposed into chunks [keys / 16][D][16] (zeros past the end).
  at::parallel_for(0, B * Hk, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> zeros(D, 0.f);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / Hk, h = t % Hk, chunks = (keys[b] + kKeys - 1) / kKeys;
      float* dst = ktp + kt_off[b] + h * chunks * kKeys * D;
      const int32_t* slots = tab + rr[b] * W;
      for (int64_t c = 0; c < chunks; ++c) {
        const float* rows[16];
        for (int64_t j = 0; j < kKeys; ++j) {
          const int64_t p = c * kKeys + j;
          rows[j] = p < keys[b] ? kp + (static_cast<int64_t>(slots[p]) * Hk + h) * D : zeros.data();
          if (p + kKeys < keys[b]) prefetch(kp + (static_cast<int64_t>(slots[p + kKeys]) * Hk + h) * D, D);
        }
        for (int64_t d = 0; d < D; d += 16) transpose16(rows, d, dst + c * kKeys * D + d * kKeys, kKeys);
      }
    }
  });
  // Phase 2: tasks of up to kVecs query vectors of one request and one KV head (its query heads
  // side by side, then as many of its rows as fit: they read the same keys), ordered small, large,
  // small, ... so that the threads' contiguous shares of the task list cost about the same.
  const int64_t G = Hq / Hk, heads = std::min<int64_t>(G, kVecs), per_task = std::max<int64_t>(1, kVecs / heads);
  std::vector<std::array<int64_t, 4>> tasks;  // (request, first query head, first row, rows)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hk; ++h)
      for (int64_t g = h * G; g < (h + 1) * G; g += heads)
        for (int64_t r = off[b]; r < off[b + 1]; r += per_task) tasks.push_back({b, g, r, std::min(per_task, off[b + 1] - r)});
  std::vector<int64_t> order(tasks.size());
  for (size_t i = 0, lo = 0, hi = tasks.size(); i < tasks.size(); ++i) order[i] = (i % 2 == 0) ? lo++ : --hi;
  const float* qp = q.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t qs = q.stride(0);
  int64_t max_keys = 0;
  for (int64_t b = 0; b < B; ++b) max_keys = std::max(max_keys, (keys[b] + kKeys - 1) / kKeys * kKeys);
  at::parallel_for(0, static_cast<int64_t>(tasks.size()), 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> s(kVecs * max_keys);
    QueryVec vecs[kVecs];
    for (int64_t i = i0; i < i1; ++i) {
      const auto [b, g0, r0, rows] = tasks[order[i]];
      const int64_t g1 = std::min(g0 + heads, (g0 / G + 1) * G), h = g0 / G, chunks = (keys[b] + kKeys - 1) / kKeys;
      int n = 0;
      for (int64_t r = r0; r < r0 + rows; ++r)
        for (int64_t g = g0; g < g1; ++g) vecs[n++] = {qp + r * qs + g * D, op + (r * Hq + g) * Dv, pos[r]};
      kGroups[n](vecs, D, Dv, ktp + kt_off[b] + h * chunks * kKeys * D, vp + h * Dv, tab + rr[b] * W,
                 Hk * Dv, static_cast<float>(scale), s.data(), max_keys);
    }
  });
  return out;
}

}  // namespace rksc
