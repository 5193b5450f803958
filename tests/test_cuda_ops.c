// tests/test_cuda_ops.c — every CUDA op of model/ops_cuda.h against its CPU twin, on fresh random
// inputs: fp32 paths to a normalised error < 1e-4, bf16 paths (model/ops.h's twins) to the
// per-output tolerances stated in the cases (integer outputs exact). The cases themselves live in
// tests/cuda_ops_cases.h, shared with scripts/cuda_parity.c.
//
// Every test skips, saying why, in a CPU build or on a machine without a GPU; a skip is reported
// as a skip, never as a pass.
#include <criterion/criterion.h>
#include <string.h>

#include "tests/gpu_or_skip.h"
#include "core/backend.h"
#include "core/common.h"

#ifdef MT_CUDA
#include "tests/cuda_ops_cases.h"
#endif


#ifdef MT_CUDA
static void check_case(const char *name, co_result (*run)(mt_backend *)) {
    mt_backend *be = gpu_or_skip();
    uint64_t work0 = be->ledger.cur[MT_MEM_WORK];  // the cuBLASLt workspace
    co_result r = run(be);
    be->ops->synchronize(be);
    uint64_t work = be->ledger.cur[MT_MEM_WORK], act = be->ledger.cur[MT_MEM_ACT];
    mt_backend_free(be);
    if (getenv("CO_PRINT")) fprintf(stderr, "%s: err %.3f of tol: %s\n", name, r.err, r.what);
    if (r.skipped) cr_skip_test("%s: %s", name, r.what);
    cr_assert(r.err <= r.tol, "%s: error %.3e > tolerance %.0e; worst: %s", name, r.err, r.tol, r.what);
    cr_assert_eq(work, work0, "%s: scratch not released: work %llu bytes, %llu before", name,
                 (unsigned long long)work, (unsigned long long)work0);
    cr_assert_eq(act, 0, "%s: %llu bytes of test buffers left in the ledger", name, (unsigned long long)act);
}
#define OP_TEST(test, fn) \
    Test(cuda, test) { check_case(#test, fn); }
#else
#define OP_TEST(test, fn) \
    Test(cuda, test) { gpu_or_skip(); }
#endif

OP_TEST(op_embedding, co_embedding_h100)
OP_TEST(op_embedding_h128_rows_over_blocks, co_embedding_h128)
OP_TEST(op_rmsnorm, co_rmsnorm_h257)
OP_TEST(op_rmsnorm_h256, co_rmsnorm_h256)
OP_TEST(op_rope, co_rope)
OP_TEST(op_rope_yarn_table, co_rope_yarn)
OP_TEST(op_attention_causal_gqa, co_attention_causal)
OP_TEST(op_attention_sliding_window_masked_rows, co_attention_window_mask)
OP_TEST(op_attention_hd128_padding, co_attention_hd128_padding)
OP_TEST(op_attention_hd40_window1, co_attention_hd40_window1)
OP_TEST(op_attention_hd128_gqa_window_masked_rows, co_attention_hd128_gqa_window)
OP_TEST(op_attention_hd36_padding, co_attention_hd36_padding)
OP_TEST(op_attention_gqa4_hd64_left_padding, co_attention_gqa4_hd64_left_pad)
OP_TEST(op_attention_gqa8_hd128_s130, co_attention_gqa8_hd128)
OP_TEST(op_attention_mqa_window40_left_padding, co_attention_mqa_window_left_pad)
OP_TEST(op_attention_hd256_left_padding, co_attention_hd256_left_pad)
OP_TEST(op_attention_fd_config_gqa_window, co_attention_fd_gqa_window)
OP_TEST(op_attention_fd_config_mqa_window, co_attention_fd_mqa_window)
OP_TEST(op_attention_fd_config_mha, co_attention_fd_mha)
OP_TEST(op_attention_wmma_forced_gqa, co_attention_wmma_gqa)
OP_TEST(op_attention_cudnn_forced_gqa, co_attention_cudnn_gqa)
OP_TEST(op_attention_auto_gqa_window, co_attention_auto_window)
OP_TEST(op_attention_wmma_forced_gqa_window, co_attention_wmma_window)
OP_TEST(op_attention_cudnn_forced_gqa_window, co_attention_cudnn_window)
OP_TEST(op_attention_cudnn_padding_as_lengths_mqa, co_attention_cudnn_padding_lens)
OP_TEST(op_attention_cudnn_window_padding_as_lengths_hd128, co_attention_cudnn_window_lens)
OP_TEST(op_attention_cudnn_mqa_hd256, co_attention_cudnn_mqa_hd256)
OP_TEST(op_attention_sinks_gqa, co_attention_sinks_gqa)
OP_TEST(op_attention_sinks_window_left_padding, co_attention_sinks_window_pad)
OP_TEST(op_attention_sinks_hd24_window_mask, co_attention_sinks_hd24)
OP_TEST(op_attention_sinks_cudnn_mode_falls_back, co_attention_sinks_cudnn_mode)
OP_TEST(op_attention_mla_hd20_v10, co_attention_mla_hd20_v10)
OP_TEST(op_attention_mla_hd20_v10_window_masked_rows, co_attention_mla_hd20_v10_window_mask)
OP_TEST(op_attention_hd10_v20, co_attention_mla_hd10_v20)
OP_TEST(op_attention_mla_hd48_v32_left_padding, co_attention_mla_hd48_v32)
OP_TEST(op_attention_mla_hd192_v128, co_attention_mla_hd192_v128)
OP_TEST(op_attention_mla_wmma_forced_hd48_v32, co_attention_mla_wmma_hd48_v32)
OP_TEST(op_attention_mla_cudnn_forced_hd48_v32_lens, co_attention_mla_cudnn_hd48_v32)
OP_TEST(op_attention_cudnn_forced_gqa_window_hd24_v16, co_attention_mla_cudnn_gqa_window_hd24_v16)
OP_TEST(op_attention_sinks_hd20_v10, co_attention_mla_sinks_hd20_v10)
OP_TEST(op_rope_glm_partial, co_rope_glm_partial)
OP_TEST(op_rope_mla_interleaved_yarn, co_rope_mla_interleaved)
OP_TEST(op_rope_mla_key_slice, co_rope_mla_key_slice)
OP_TEST(op_mla_kv_assembly, co_mla_kv_small)
OP_TEST(op_mla_kv_assembly_v3_dims, co_mla_kv_v3_like)
OP_TEST(op_cross_entropy, co_ce_accumulate)
OP_TEST(op_cross_entropy_in_place, co_ce_in_place)
OP_TEST(op_add, co_add)
OP_TEST(op_f32_to_bf16, co_f32_to_bf16)
OP_TEST(op_router_k2_ties, co_router_k2)
OP_TEST(op_router_k1, co_router_k1)
OP_TEST(op_router_e64_k8, co_router_e64_k8)
OP_TEST(op_router_grouped_deepseek_v3, co_router_grouped_v3)
OP_TEST(op_router_grouped_glm_no_groups, co_router_grouped_glm)
OP_TEST(op_router_grouped_deepseek_v2_softmax, co_router_grouped_v2)
OP_TEST(op_router_grouped_sigmoid_no_norm, co_router_grouped_sigmoid_no_norm)
OP_TEST(op_router_bias_update_masked_rows, co_router_bias_update)
OP_TEST(op_router_seq_aux_masked_rows, co_router_seq_aux)
OP_TEST(op_aux_loss_masked_rows, co_aux_loss)
OP_TEST(op_zloss_masked_rows, co_zloss)
OP_TEST(op_permute_k2_empty_expert, co_permute_k2_empty)
OP_TEST(op_permute_k1, co_permute_k1)
OP_TEST(op_permute_all_on_one_expert, co_permute_one_expert)
OP_TEST(op_permute_e64_many_chunks, co_permute_e64)
OP_TEST(op_gather_combine_k2, co_gather_combine_k2)
OP_TEST(op_gather_combine_k1, co_gather_combine_k1)
OP_TEST(op_gather_combine_k8, co_gather_combine_k8)
OP_TEST(op_gather_combine_k8_h50_scalar, co_gather_combine_k8_h50)
OP_TEST(op_gather_combine_k2_dys_strided, co_gather_combine_k2_ld)
OP_TEST(op_gather_combine_k8_h50_dys_strided, co_gather_combine_k8_h50_ld)
OP_TEST(op_gather_combine_k2_stride_not_16_bytes, co_gather_combine_k2_ld_odd)
OP_TEST(op_swiglu, co_swiglu)
OP_TEST(op_swiglu_fused_f37_scalar, co_swiglu_f37)
OP_TEST(op_swiglu_fused_strided, co_swiglu_ld)
OP_TEST(op_swiglu_fused_strided_scalar, co_swiglu_ld_odd)
OP_TEST(op_swiglu_clamped_fused_strided, co_swiglu_clamped_ld)
OP_TEST(op_swiglu_fused_large_gates, co_swiglu_large_gates)
OP_TEST(op_swiglu_clamped_fused, co_swiglu_clamped)
OP_TEST(op_swiglu_clamped_fused_f37_scalar, co_swiglu_clamped_f37)
OP_TEST(op_bias, co_bias)
OP_TEST(op_logit_bias, co_logit_bias_e70)
OP_TEST(op_logit_bias_e6, co_logit_bias_e6)
OP_TEST(op_expert_biases, co_expert_bias_e7)
OP_TEST(op_expert_biases_e256, co_expert_bias_e256)
OP_TEST(op_clip_qkv, co_clip)
OP_TEST(op_shared_expert_gate, co_shared_gate)
OP_TEST(op_replay_weights_renormalised, co_weights_norm)
OP_TEST(op_replay_weights_norm_topk_prob_false, co_weights_no_norm)
OP_TEST(op_lora, co_lora_plain)
OP_TEST(op_lora_dropout, co_lora_dropout)
OP_TEST(op_lora_f32_out, co_lora_f32_out)
OP_TEST(op_adamw_master, co_adamw_master)
OP_TEST(op_adamw_bf16_direct, co_adamw_direct)

// A graph the library has no engine for (the stand-in told to answer so): auto mode falls back to
// the WMMA kernel, which computes the same results; emulated builds only.
Test(cuda, attention_cudnn_refused_graph_falls_back) {
    mt_backend *be = gpu_or_skip();
#ifdef MT_CUDA
    if (!attention_cudnn_emulated()) {
        mt_backend_free(be);
        cr_skip_test("the stand-in's refusal is emulated");
    }
    mt_backend_free(be);
    setenv("CUDASIM_CUDNN_NO_ENGINE", "1", 1);
    attention_set_mode(MT_ATTENTION_AUTO);
    check_case("attention fallback gqa window", co_attention_auto_window);
    check_case("attention fallback causal", co_attention_causal);
    unsetenv("CUDASIM_CUDNN_NO_ENGINE");
#else
    (void)be;
#endif
}

// cuDNN's forward graph with a planted bug: the emulator's stand-in (tests/cudasim/cudnn.cc) must
// refuse each, naming the call, where the unplanted graph runs. Emulated builds only: a real
// cuDNN need not refuse an overlapping stride (it computes garbage), so on a GPU this skips.
Test(cuda, attention_cudnn_refuses_planted_bugs) {
    mt_backend *be = gpu_or_skip();
#ifdef MT_CUDA
    if (!attention_cudnn_emulated()) {
        mt_backend_free(be);
        cr_skip_test("the planted-bug refusals are the emulator's cuDNN stand-in's");
    }
    const int B = 1, S = 16, nh = 4, nkv = 2, hd = 32;
    const size_t nq = (size_t)B * S * nh * hd, nk = (size_t)B * S * nkv * hd, nl = (size_t)B * S * nh;
    void *Q = co_up(be, NULL, nq * 2), *K = co_up(be, NULL, nk * 2), *V = co_up(be, NULL, nk * 2);
    void *O = co_up(be, NULL, nq * 2), *L = co_up(be, NULL, nl * 4);
    static const struct {
        int bug;
        const char *call;  // the failing call the message must name
    } cases[] = {{1, "Finalize(operation graph)"}, {2, "Execute"}, {3, "Finalize(matmul operation)"},
                 {4, "Execute"}, {5, "Execute"}};
    char msg[256];
    int st = attention_cudnn_planted(be, 0, O, L, Q, K, V, B, S, nh, nkv, hd, msg, sizeof msg);
    cr_assert_eq(st, 0, "the unplanted graph: %s", msg);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        st = attention_cudnn_planted(be, cases[i].bug, O, L, Q, K, V, B, S, nh, nkv, hd, msg, sizeof msg);
        cr_expect_neq(st, 0, "planted bug %d accepted", cases[i].bug);
        cr_expect(strstr(msg, cases[i].call) != NULL, "planted bug %d: \"%s\" does not name %s", cases[i].bug, msg,
                  cases[i].call);
    }
    be->ops->synchronize(be);
    co_free(be, Q, nq * 2), co_free(be, K, nk * 2), co_free(be, V, nk * 2), co_free(be, O, nq * 2), co_free(be, L, nl * 4);
    mt_backend_free(be);
#else
    (void)be;
#endif
}
