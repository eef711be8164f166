// The ops of torch.ops.rksc_cpu_kernels, shared by its sources (radix_ext/cpu/kernels.py compiles
// them into one library): decode_layers.cpp calls the others directly, not through the dispatcher,
// so a layer of its loop runs the very functions the Python loop's calls reach.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
#include <cstdint>
#include <optional>
#include <tuple>

namespace rksc {

// kernels.cpp: int8-weight linear, fused residual add + RMSNorm, neox rotation, blend's donor KV.
at::Tensor w8a16_linear(const at::Tensor& x, const at::Tensor& w, int64_t N, const std::optional<at::Tensor>& bias);
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const std::optional<at::Tensor>& residual,
                                                const at::Tensor& weight, double eps);
at::Tensor rope_neox(const at::Tensor& x, int64_t heads, const at::Tensor& cos, const at::Tensor& sin);
void donor_kv(at::TensorList k_bufs, at::TensorList v_bufs, const at::Tensor& own, const at::Tensor& donors,
              const at::Tensor& cos, const at::Tensor& sin);
int64_t amx_rows();  // the row count from which w8a16_linear runs on AMX tiles (0: never, here)

// linear_amx.cpp: w8a16_linear's sums on AMX tiles, the same bits (q, xs: the rows at int16 and
// their scales; w: the weights packed for it; out: [M, N]).
bool amx_ready();
void w8a16_amx(const int16_t* q, const float* xs, int64_t M, int64_t K, const int8_t* w, int64_t N,
               const float* bias, float* out);

// causal_attention.cpp: the rksc_cpu backend's invariant attention, straight from the KV pool.
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k_buf, const at::Tensor& v_buf,
                            const at::Tensor& table, const at::Tensor& req_rows, const at::Tensor& row_offsets,
                            const at::Tensor& row_pos, double scale);

// decode_layers.cpp: every decoder layer of a decode step in one call.
std::tuple<at::Tensor, at::Tensor> decode_layers(
    const at::Tensor& hidden, at::TensorList norms, c10::ArrayRef<double> eps, at::TensorList linears,
    c10::IntArrayRef widths, const at::Tensor& cos, const at::Tensor& sin, at::TensorList k_bufs,
    at::TensorList v_bufs, const at::Tensor& loc, const at::Tensor& table, const at::Tensor& req_rows,
    const at::Tensor& row_offsets, const at::Tensor& row_pos, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
    c10::ArrayRef<double> scales, const std::optional<at::Tensor>& first_q);

}  // namespace rksc
