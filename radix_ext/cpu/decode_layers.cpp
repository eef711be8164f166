// decode_layers: every decoder layer of a decode step in one call from Python (the lean decode's
// loop, radix_ext/cpu/decode.py ``_decode``, with int8 linears), one of the sources of
// torch.ops.rksc_cpu_kernels (radix_ext/cpu/kernels.py builds them together).
//
// Per layer l, on n rows of width H (hidden [n, H] float32, the embedding's output):
//   x, residual = add_rms_norm(hidden, residual, norms[2l], eps[2l])     (layer 0: residual = hidden)
//   q, k, v     = split(w8a16_linear(x, linears[4l], widths[4l]))        ([q_heads | kv_heads | kv_heads] x head_dim)
//   q, k        = rope_neox(q, q_heads, cos, sin), rope_neox(k, kv_heads, cos, sin)
//   k_bufs[l][loc] = k; v_bufs[l][loc] = v                               (SGLang's MHATokenToKVPool write on the CPU)
//   hidden      = w8a16_linear(causal_attention(q, k_bufs[l], v_bufs[l], table, ..., scales[l]), linears[4l + 1])
//   x, residual = add_rms_norm(hidden, residual, norms[2l + 1], eps[2l + 1])
//   g           = w8a16_linear(x, linears[4l + 2], widths[4l + 2])
//   hidden      = w8a16_linear(silu(g[:, :d]) * g[:, d:], linears[4l + 3])  (SiluAndMul.forward_native)
// and returns (hidden, residual) for the stack's final norm. With ``first_q`` [n, q_heads x head_dim]
// (ASKS blend's kept rows, radix_ext/asks/blend.py), the first layer's queries come rotated from
// the caller, which also wrote that layer's K and V for these rows into the pool from the same
// input (the same kernels, so the same bits): the first layer starts at its attention. These are the functions the Python loop
// reaches through the dispatcher, called directly, and the ATen ops its torch calls dispatch to
// (index_put_ of Tensor.__setitem__, silu, mul), in its order on the same tensors: the same bits.
// What it saves is the Python around them: about 12 op calls from Python per layer, 30 layers.
// Every shape is checked before the first layer writes the pool, so a refused call changes nothing.
#include "kernels.h"

#include <ATen/ops/mul.h>
#include <ATen/ops/silu.h>
#include <c10/util/irange.h>

namespace rksc {

namespace {

void check_layers(const at::Tensor& hidden, at::TensorList norms, c10::ArrayRef<double> eps, at::TensorList linears,
                  c10::IntArrayRef widths, const at::Tensor& cos, const at::Tensor& sin, at::TensorList k_bufs,
                  at::TensorList v_bufs, const at::Tensor& loc, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                  c10::ArrayRef<double> scales, const std::optional<at::Tensor>& first_q) {
  const int64_t L = static_cast<int64_t>(k_bufs.size());
  TORCH_CHECK(L > 0, "decode_layers: no layers");
  TORCH_CHECK(static_cast<int64_t>(norms.size()) == 2 * L && static_cast<int64_t>(eps.size()) == 2 * L &&
              static_cast<int64_t>(linears.size()) == 4 * L && static_cast<int64_t>(widths.size()) == 4 * L &&
              static_cast<int64_t>(v_bufs.size()) == L && static_cast<int64_t>(scales.size()) == L,
              "decode_layers: for ", L, " layers (k_bufs) it takes 2 norms and eps, 4 linears and widths, "
              "1 v_buf and scale per layer; got ", norms.size(), " norms, ", eps.size(), " eps, ", linears.size(),
              " linears, ", widths.size(), " widths, ", v_bufs.size(), " v_bufs, ", scales.size(), " scales");
  TORCH_CHECK(hidden.scalar_type() == at::kFloat && hidden.dim() == 2 && hidden.is_contiguous(),
              "decode_layers: hidden must be contiguous float32 [n, H], got ", hidden.scalar_type(), " ",
              hidden.sizes());
  const int64_t n = hidden.size(0), H = hidden.size(1);
  TORCH_CHECK(q_heads > 0 && kv_heads > 0 && head_dim > 0 && head_dim % 2 == 0,
              "decode_layers: heads and an even head size, got ", q_heads, ", ", kv_heads, ", ", head_dim);
  const int64_t qs = q_heads * head_dim, kvs = kv_heads * head_dim;
  TORCH_CHECK(cos.numel() == n * head_dim / 2 && sin.numel() == n * head_dim / 2,
              "decode_layers: cos, sin must be [n, 1, head_dim / 2] = [", n, ", 1, ", head_dim / 2, "]");
  TORCH_CHECK((loc.scalar_type() == at::kLong || loc.scalar_type() == at::kInt) && loc.dim() == 1 && loc.numel() == n,
              "decode_layers: loc must be int64 or int32 [n] = [", n, "], got ", loc.scalar_type(), " ", loc.sizes());
  TORCH_CHECK(!first_q || (first_q->scalar_type() == at::kFloat && first_q->is_contiguous() &&
                            first_q->dim() == 2 && first_q->size(0) == n && first_q->size(1) == qs),
              "decode_layers: first_q must be contiguous float32 [n, q_heads x head_dim] = [", n, ", ", qs, "]");
  for (const auto l : c10::irange(L)) {
    for (const auto i : c10::irange(2))
      TORCH_CHECK(norms[2 * l + i].scalar_type() == at::kFloat && norms[2 * l + i].numel() == H,
                  "decode_layers: layer ", l, " norm ", i, " must be float32 [", H, "]");
    const int64_t ins[4] = {H, qs, H, widths[4 * l + 2] / 2};  // each linear's input width
    const int64_t outs[4] = {qs + 2 * kvs, H, widths[4 * l + 2], H};
    for (const auto i : c10::irange(4)) {
      const at::Tensor& w = linears[4 * l + i];
      TORCH_CHECK(widths[4 * l + i] == outs[i] && outs[i] > 0 && (i != 2 || outs[i] % 2 == 0),
                  "decode_layers: layer ", l, " linear ", i, " (qkv, o, gate_up, down) must give ", outs[i],
                  i == 2 ? " (even)" : "", " columns, got ", widths[4 * l + i]);
      TORCH_CHECK(w.scalar_type() == at::kChar && w.dim() == 3 && w.size(1) * 32 == ins[i],
                  "decode_layers: layer ", l, " linear ", i, " must be packed int8 for ", ins[i], " inputs, got ",
                  w.scalar_type(), " ", w.sizes());
    }
    for (const at::Tensor* buf : {&k_bufs[l], &v_bufs[l]})
      TORCH_CHECK(buf->scalar_type() == at::kFloat && buf->is_contiguous() && buf->dim() == 3 &&
                  buf->size(1) == kv_heads && buf->size(2) == head_dim,
                  "decode_layers: layer ", l, " KV buffers must be contiguous float32 [slots, ", kv_heads, ", ",
                  head_dim, "], got ", buf->scalar_type(), " ", buf->sizes());
  }
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> decode_layers(
    const at::Tensor& hidden, at::TensorList norms, c10::ArrayRef<double> eps, at::TensorList linears,
    c10::IntArrayRef widths, const at::Tensor& cos, const at::Tensor& sin, at::TensorList k_bufs,
    at::TensorList v_bufs, const at::Tensor& loc, const at::Tensor& table, const at::Tensor& req_rows,
    const at::Tensor& row_offsets, const at::Tensor& row_pos, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
    c10::ArrayRef<double> scales, const std::optional<at::Tensor>& first_q) {
  check_layers(hidden, norms, eps, linears, widths, cos, sin, k_bufs, v_bufs, loc, q_heads, kv_heads, head_dim, scales,
               first_q);
  const int64_t qs = q_heads * head_dim, kvs = kv_heads * head_dim;
  const c10::List<std::optional<at::Tensor>> slots({loc});
  at::Tensor h = hidden, residual, x;
  for (const auto l : c10::irange(static_cast<int64_t>(k_bufs.size()))) {
    at::Tensor q;
    if (l == 0 && first_q) {
      residual = h;  // the stack's input is the first residual; its K, V and rotated queries are given
      q = *first_q;
    } else {
      if (l == 0) {
        residual = h;  // the stack's input is the first residual
        x = std::get<0>(add_rms_norm(h, std::nullopt, norms[0], eps[0]));
      } else {
        std::tie(x, residual) = add_rms_norm(h, residual, norms[2 * l], eps[2 * l]);
      }
      const at::Tensor qkv = w8a16_linear(x, linears[4 * l], widths[4 * l], std::nullopt);
      q = rope_neox(qkv.narrow(1, 0, qs), q_heads, cos, sin);
      const at::Tensor k = rope_neox(qkv.narrow(1, qs, kvs), kv_heads, cos, sin);
      const at::Tensor v = qkv.narrow(1, qs + kvs, kvs);
      k_bufs[l].index_put_(slots, k.view({-1, kv_heads, head_dim}));
      v_bufs[l].index_put_(slots, v.view({-1, kv_heads, head_dim}));
    }
    const at::Tensor attn = causal_attention(q.view({-1, q_heads, head_dim}), k_bufs[l], v_bufs[l], table, req_rows,
                                             row_offsets, row_pos, scales[l]);
    h = w8a16_linear(attn.view({attn.size(0), qs}), linears[4 * l + 1], widths[4 * l + 1], std::nullopt);
    std::tie(x, residual) = add_rms_norm(h, residual, norms[2 * l + 1], eps[2 * l + 1]);
    const at::Tensor g = w8a16_linear(x, linears[4 * l + 2], widths[4 * l + 2], std::nullopt);
    const int64_t d = g.size(1) / 2;
    const at::Tensor act = at::mul(at::silu(g.narrow(1, 0, d)), g.narrow(1, d, d)).contiguous();
    h = w8a16_linear(act, linears[4 * l + 3], widths[4 * l + 3], std::nullopt);
  }
  return {h, residual};
}

}  // namespace rksc
