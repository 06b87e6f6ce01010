// A rank's weights: for every tensor of the model, the slice this rank holds and where its
// bytes come from (a region of an mmap'd safetensors shard, or the synthetic generator).
// Slicing is decided once, by weights_plan() from the tensor's name and role; a backend then
// materializes each slice in its own memory (k25_tensor.dev).
//
// Tensor-parallel split over tp ranks (r = tp rank), global shapes as in the checkpoint,
// PyTorch [out, in] row-major:
//   embed_tokens [V, D]           replicated (rows read on demand); first pipeline stage only
//   q_a_proj, kv_a_proj_with_mqa  replicated (their outputs are normalized over the full width)
//   q_b_proj  [H*192, q_lora]     rows of heads [r*H/tp, (r+1)*H/tp)
//   kv_b_proj [H*256, kv_lora]    rows of the same heads
//   o_proj    [D, H*128]          columns of the same heads            -> partial sum
//   dense / shared gate, up [I, D] rows [r*I/tp, (r+1)*I/tp)
//   dense / shared down [D, I]    columns of the same range            -> partial sum
//   experts gate, up [I_e, D]     rows [r*I_e/tp, ...) (INT4: packed rows + scale rows)
//   experts down [D, I_e]         columns of the same range (packed cols / 8, scale cols / 32)
//   router gate [E, D], bias [E]  replicated
//   lm_head [V, D]                rows [r*V/tp, (r+1)*V/tp) (vocabulary-parallel); last stage
//   norms                         replicated
#pragma once
#include "common.h"
#include "config.h"

typedef enum { K25_BF16 = 0, K25_F32 = 1, K25_I32 = 2 } k25_dtype;
typedef enum { K25_SRC_NONE = 0, K25_SRC_FILE = 1, K25_SRC_SYNTH = 2 } k25_src_kind;

#ifdef __cplusplus
extern "C" {
#endif
size_t k25_dtype_size(k25_dtype t);
const char *k25_dtype_name(k25_dtype t);
#ifdef __cplusplus
}
#endif

typedef struct k25_tensor {
    char name[128];          // canonical name, e.g. "model.layers.3.self_attn.q_b_proj.weight"
    k25_dtype dtype;
    int64_t rows, cols;      // this rank's shape in stored elements (1-D: rows = 1)
    int64_t g_rows, g_cols;  // global stored shape (INT4 packed: cols = in/8; scales: in/32)
    int64_t row0, col0;      // where this slice starts in the global tensor
    k25_src_kind kind;
    const uint8_t *file_data; // FILE: first byte of the global tensor in the mmap'd shard
    uint64_t synth_seed;      // SYNTH: generator inputs (synth.h)
    uint64_t synth_id;
    int synth_kind, synth_exp;
    void *dev;                // the backend's materialized copy (owned by the backend)
    size_t dev_bytes;
} k25_tensor;

#ifdef __cplusplus
extern "C" {
#endif
// Copies local rows [r0, r0+nr) of the slice into dst (nr * cols elements, stored dtype).
void tensor_read_rows(const k25_tensor *t, int64_t r0, int64_t nr, void *dst);
static inline size_t tensor_bytes(const k25_tensor *t) {
    return (size_t)(t->rows * t->cols) * k25_dtype_size(t->dtype);
}
// Element (r, c) of the local slice as float (INT4 packed tensors: the raw word as float is
// meaningless; use expert_w_dequant).
float tensor_get_f32(const k25_tensor *t, int64_t r, int64_t c);
#ifdef __cplusplus
}
#endif

// One routed-expert projection: BF16 weight [out, in], or INT4 packed int32 [out, in/8] with
// bf16 scales [out, in/32] (scale.kind != K25_SRC_NONE).
typedef struct k25_expert_w {
    k25_tensor w, scale;
    int64_t out, in;         // local logical shape
} k25_expert_w;

typedef struct k25_layer {
    int index;               // global layer index
    int is_moe;
    k25_tensor attn_norm;    // [D]
    k25_tensor q_a;          // [q_lora, D]
    k25_tensor q_a_norm;     // [q_lora]
    k25_tensor q_b;          // [H_local*(nope+rope), q_lora]
    k25_tensor kv_a;         // [kv_lora+rope, D]
    k25_tensor kv_a_norm;    // [kv_lora]
    k25_tensor kv_b;         // [H_local*(nope+v), kv_lora]
    k25_tensor o_proj;       // [D, H_local*v]
    k25_tensor ffn_norm;     // [D]
    // dense MLP (is_moe == 0) or shared expert (is_moe == 1, width n_shared*moe_inter)
    k25_tensor ffn_gate;     // [I_local, D]
    k25_tensor ffn_up;       // [I_local, D]
    k25_tensor ffn_down;     // [D, I_local]
    // MoE only
    k25_tensor router;       // [E, D]
    k25_tensor router_bias;  // [E] f32
    k25_expert_w *exp_gate;  // [E], each [I_e_local, D]
    k25_expert_w *exp_up;    // [E], each [I_e_local, D]
    k25_expert_w *exp_down;  // [E], each [D, I_e_local]
    void *backend_data;      // a backend's repacked expert weights, if it repacks
} k25_layer;

typedef struct k25_weights {
    const k25_config *cfg;
    int tp_rank, tp_size;
    int layer_begin, layer_end; // layers this rank holds: [begin, end)
    int n_heads_local, dense_inter_local, moe_inter_local, vocab_local, vocab_begin;
    k25_tensor embed;        // [V, D] replicated
    k25_tensor final_norm;   // [D]
    k25_tensor lm_head;      // [V_local, D]
    k25_layer *layers;       // [n_layers], only [layer_begin, layer_end) are filled
} k25_weights;

// Where a weights_plan gets each global tensor from. lookup() returns 0 and fills
// kind/file_data (with dtype and global shape checked) or -1 with a message in err.
typedef struct k25_tensor_source {
    void *ctx;
    int (*lookup)(void *ctx, k25_tensor *t, char *err);
} k25_tensor_source;

#ifdef __cplusplus
extern "C" {
#endif

// Fills every tensor of w for this rank's slice and layers from src. Returns 0 or -1 (err
// names the tensor). The config must already have passed config_check_tp.
int weights_plan(k25_weights *w, const k25_config *cfg, int tp_rank, int tp_size,
                 int layer_begin, int layer_end, const k25_tensor_source *src, char *err);
void weights_free(k25_weights *w);
// The synthetic source (deterministic weights for any config, no files).
k25_tensor_source synth_source(uint64_t seed);
// Dequantized element (o, i) of a routed-expert projection's local slice.
float expert_w_get(const k25_expert_w *e, int64_t o, int64_t i);
// Bytes this rank holds (sum of tensor_bytes over its slices).
size_t weights_bytes(const k25_weights *w);

#ifdef __cplusplus
}
#endif
