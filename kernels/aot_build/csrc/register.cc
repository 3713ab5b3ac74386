// hicache-fuzz's own registration of sglang's AOT kvcacheio ops.
//
// sglang's Python code (sgl_kernel/kvcacheio.py, and through it the host pools) calls these ops as
// torch.ops.sgl_kernel.<name>.default(...). sglang-kernel registers them from its own extension file together
// with every other op of the library; this file registers only the transfer ops, under the same names and
// the same schemas as the sglang-kernel 0.4.10 wheel (argument names and order matter: the Python wrappers
// pass them positionally), bound to the functions compiled from sglang's transfer.cu (fetched, not copied).
//
// Dispatch: the transfer ops take a mix of CPU (pinned host buffers, index tensors on the "wrong" device) and
// CUDA tensors, so they are registered for the CUDA key like upstream: any CUDA tensor argument selects
// them. get_device_accessible_ptr takes a CPU tensor alone and therefore gets a catch-all kernel.

#include <torch/library.h>

#include <cstdint>
#include <vector>

// ---- the functions defined in transfer.cu (signatures as compiled there) -------------------------------
void transfer_kv_per_layer(const at::Tensor src_k, at::Tensor dst_k, const at::Tensor src_v, at::Tensor dst_v,
                           const at::Tensor src_indices, const at::Tensor dst_indices, int64_t item_size,
                           int64_t block_quota, int64_t num_warps_per_block);
void transfer_kv_per_layer_pf_lf(const at::Tensor src_k, at::Tensor dst_k, const at::Tensor src_v, at::Tensor dst_v,
                                 const at::Tensor src_indices, const at::Tensor dst_indices, int64_t layer_id,
                                 int64_t item_size, int64_t src_layout_dim, int64_t block_quota,
                                 int64_t num_warps_per_block);
void transfer_kv_per_layer_ph_lf(const at::Tensor src_k, at::Tensor dst_k, const at::Tensor src_v, at::Tensor dst_v,
                                 const at::Tensor src_indices, const at::Tensor dst_indices, int64_t layer_id,
                                 int64_t item_size, int64_t src_layout_dim, int64_t page_size, int64_t head_num,
                                 int64_t block_quota, int64_t num_warps_per_block);
void transfer_kv_all_layer(const at::Tensor src_k_layers, const at::Tensor dst_k_layers,
                           const at::Tensor src_v_layers, const at::Tensor dst_v_layers,
                           const at::Tensor src_indices, const at::Tensor dst_indices, int64_t item_size,
                           int64_t num_layers, int64_t block_quota, int64_t num_warps_per_block);
void transfer_kv_all_layer_lf_pf(const at::Tensor src_k_layers, at::Tensor dst_k, const at::Tensor src_v_layers,
                                 at::Tensor dst_v, const at::Tensor src_indices, const at::Tensor dst_indices,
                                 int64_t item_size, int64_t dst_layout_dim, int64_t num_layers,
                                 int64_t block_quota, int64_t num_warps_per_block);
void transfer_kv_all_layer_lf_ph(const at::Tensor src_k_layers, at::Tensor dst_k, const at::Tensor src_v_layers,
                                 at::Tensor dst_v, const at::Tensor src_indices, const at::Tensor dst_indices,
                                 int64_t item_size, int64_t dst_layout_dim, int64_t num_layers, int64_t page_size,
                                 int64_t head_num, int64_t block_quota, int64_t num_warps_per_block);
void transfer_kv_per_layer_mla(const at::Tensor src, at::Tensor dst, const at::Tensor src_indices,
                               const at::Tensor dst_indices, int64_t item_size, int64_t block_quota,
                               int64_t num_warps_per_block);
void transfer_kv_per_layer_mla_pf_lf(const at::Tensor src, at::Tensor dst, const at::Tensor src_indices,
                                     const at::Tensor dst_indices, int64_t layer_id, int64_t item_size,
                                     int64_t src_layout_dim, int64_t block_quota, int64_t num_warps_per_block);
void transfer_kv_all_layer_mla(const at::Tensor src_layers, const at::Tensor dst_layers,
                               const at::Tensor src_indices, const at::Tensor dst_indices, int64_t item_size,
                               int64_t num_layers, int64_t block_quota, int64_t num_warps_per_block);
void transfer_kv_all_layer_mla_lf_pf(const at::Tensor src_layers, at::Tensor dst, const at::Tensor src_indices,
                                     const at::Tensor dst_indices, int64_t item_size, int64_t dst_layout_dim,
                                     int64_t num_layers, int64_t block_quota, int64_t num_warps_per_block);
void transfer_kv_direct(const std::vector<at::Tensor>& src_layers, std::vector<at::Tensor> dst_layers,
                        const at::Tensor src_indices, const at::Tensor dst_indices, int64_t page_size);
void transfer_kv_per_layer_direct_pf_lf(const std::vector<at::Tensor>& src_ptrs, std::vector<at::Tensor> dst_ptrs,
                                        const at::Tensor& src_indices, const at::Tensor& dst_indices,
                                        int64_t layer_id, int64_t page_size);
void transfer_kv_all_layer_direct_lf_pf(const std::vector<at::Tensor>& src_ptrs, std::vector<at::Tensor> dst_ptrs,
                                        const at::Tensor& src_indices, const at::Tensor& dst_indices,
                                        int64_t page_size);
void transfer_embedding_ranges_direct(const at::Tensor& src, at::Tensor& dst, const std::vector<int64_t>& src_starts,
                                      const std::vector<int64_t>& dst_starts, const std::vector<int64_t>& lengths);
int64_t get_device_accessible_ptr(const at::Tensor& tensor, int64_t device_index);

// ---- schemas: one line per op, as sglang-kernel 0.4.10 declares them ------------------------------------
TORCH_LIBRARY_FRAGMENT(sgl_kernel, m) {
  // per-token kernels, one layer (load-back) and all layers through pointer tables (write-back)
  m.def("transfer_kv_per_layer(Tensor src_k, Tensor dst_k, Tensor src_v, Tensor dst_v, Tensor src_indices, "
        "Tensor dst_indices, int item_size, int block_quota, int num_warps_per_block) -> ()");
  m.def("transfer_kv_per_layer_pf_lf(Tensor src_k, Tensor dst_k, Tensor src_v, Tensor dst_v, Tensor src_indices, "
        "Tensor dst_indices, int layer_id, int item_size, int src_layout_dim, int block_quota, "
        "int num_warps_per_block) -> ()");
  m.def("transfer_kv_per_layer_ph_lf(Tensor src_k, Tensor dst_k, Tensor src_v, Tensor dst_v, Tensor src_indices, "
        "Tensor dst_indices, int layer_id, int item_size, int src_layout_dim, int page_size, int head_num, "
        "int block_quota, int num_warps_per_block) -> ()");
  m.def("transfer_kv_all_layer(Tensor src_k_layers, Tensor dst_k_layers, Tensor src_v_layers, "
        "Tensor dst_v_layers, Tensor src_indices, Tensor dst_indices, int item_size, int num_layers, "
        "int block_quota, int num_warps_per_block) -> ()");
  m.def("transfer_kv_all_layer_lf_pf(Tensor src_k_layers, Tensor dst_k, Tensor src_v_layers, Tensor dst_v, "
        "Tensor src_indices, Tensor dst_indices, int item_size, int dst_layout_dim, int num_layers, "
        "int block_quota, int num_warps_per_block) -> ()");
  m.def("transfer_kv_all_layer_lf_ph(Tensor src_k_layers, Tensor dst_k, Tensor src_v_layers, Tensor dst_v, "
        "Tensor src_indices, Tensor dst_indices, int item_size, int dst_layout_dim, int num_layers, "
        "int page_size, int head_num, int block_quota, int num_warps_per_block) -> ()");
  m.def("transfer_kv_per_layer_mla(Tensor src, Tensor dst, Tensor src_indices, Tensor dst_indices, "
        "int item_size, int block_quota, int num_warps_per_block) -> ()");
  m.def("transfer_kv_per_layer_mla_pf_lf(Tensor src, Tensor dst, Tensor src_indices, Tensor dst_indices, "
        "int layer_id, int item_size, int src_layout_dim, int block_quota, int num_warps_per_block) -> ()");
  m.def("transfer_kv_all_layer_mla(Tensor src_layers, Tensor dst_layers, Tensor src_indices, "
        "Tensor dst_indices, int item_size, int num_layers, int block_quota, int num_warps_per_block) -> ()");
  m.def("transfer_kv_all_layer_mla_lf_pf(Tensor src_layers, Tensor dst, Tensor src_indices, Tensor dst_indices, "
        "int item_size, int dst_layout_dim, int num_layers, int block_quota, int num_warps_per_block) -> ()");
  // page-granular copies issued from the host (io backend "direct", page_first_direct layout)
  m.def("transfer_kv_direct(Tensor[] src_layers, Tensor[] dst_layers, Tensor src_indices, Tensor dst_indices, "
        "int page_size) -> ()");
  m.def("transfer_kv_per_layer_direct_pf_lf(Tensor[] src_ptrs, Tensor[] dst_ptrs, Tensor src_indices, "
        "Tensor dst_indices, int layer_id, int page_size) -> ()");
  m.def("transfer_kv_all_layer_direct_lf_pf(Tensor[] src_ptrs, Tensor[] dst_ptrs, Tensor src_indices, "
        "Tensor dst_indices, int page_size) -> ()");
  m.def("transfer_embedding_ranges_direct(Tensor src, Tensor! dst, int[] src_starts, int[] dst_starts, "
        "int[] lengths) -> ()");
  // the address a kernel must use for a (registered host or device) tensor: equal to data_ptr on CUDA (UVA),
  // different on ROCm, where sglang's host pools refuse to build pointer tables without it
  m.def("get_device_accessible_ptr(Tensor tensor, int device_index) -> int", &get_device_accessible_ptr);
}

TORCH_LIBRARY_IMPL(sgl_kernel, CUDA, m) {
  m.impl("transfer_kv_per_layer", &transfer_kv_per_layer);
  m.impl("transfer_kv_per_layer_pf_lf", &transfer_kv_per_layer_pf_lf);
  m.impl("transfer_kv_per_layer_ph_lf", &transfer_kv_per_layer_ph_lf);
  m.impl("transfer_kv_all_layer", &transfer_kv_all_layer);
  m.impl("transfer_kv_all_layer_lf_pf", &transfer_kv_all_layer_lf_pf);
  m.impl("transfer_kv_all_layer_lf_ph", &transfer_kv_all_layer_lf_ph);
  m.impl("transfer_kv_per_layer_mla", &transfer_kv_per_layer_mla);
  m.impl("transfer_kv_per_layer_mla_pf_lf", &transfer_kv_per_layer_mla_pf_lf);
  m.impl("transfer_kv_all_layer_mla", &transfer_kv_all_layer_mla);
  m.impl("transfer_kv_all_layer_mla_lf_pf", &transfer_kv_all_layer_mla_lf_pf);
  m.impl("transfer_kv_direct", &transfer_kv_direct);
  m.impl("transfer_kv_per_layer_direct_pf_lf", &transfer_kv_per_layer_direct_pf_lf);
  m.impl("transfer_kv_all_layer_direct_lf_pf", &transfer_kv_all_layer_direct_lf_pf);
  m.impl("transfer_embedding_ranges_direct", &transfer_embedding_ranges_direct);
}
