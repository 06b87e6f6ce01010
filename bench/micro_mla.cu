// Micro benchmark of MLA decode attention (absorbed form, paged bf16 latent cache, 576 values
// per token) at Kimi-K2.5's head counts per rank (8 heads at TP8, 64 at TP1) for contexts of
// 1K to 32K tokens and batches of 1 and 8 sequences. Reports the median time of CUDA-graph
// replays, the byte floor (the cache rows read, ctx x 1152 B per sequence, at the bandwidth of a
// device-to-device copy measured in the same run; 3.93 TB/s on H200) and the bandwidth over
// those bytes as a percentage of the copy's.
//
//   micro_mla [--json FILE] [--quick] [--heads H] [--batch B] [--ctx N]   (filters)
//             [--rows R]   R query rows per sequence (a verification step, causal within it)
//             [--kvf32]    the f32 latent cache (K25_KV_F32=1 mode; bytes counted at 4 B)
#include <math.h>

#include "micro_common.cuh"
#include "synth.h"

int main(int argc, char **argv) {
    const int quick = bench_flag(argc, argv, "--quick");
    const int f32 = bench_flag(argc, argv, "--kvf32");
    const int R = bench_int(argc, argv, "--rows", 1);
    const int es = f32 ? 4 : 2; // cache element size
    cudaStream_t s;
    int sms;
    const double copy_gbs = bench_start_single_gpu(argc, argv, &s, &sms);
    printf("# one call = latent norm + rope + cache write + q absorption + split attention + "
           "merge + W_UV; bytes = cache rows read (ctx x 576 x %d B per sequence); %d query "
           "row(s) per sequence\n", es, R);
    const int L = 512, dr = 64, dn = 128, dv = 128, W = L + dr, kv_block = 64;
    const int ctxs_full[] = {1024, 2048, 4096, 8192, 16384, 32768};
    const int ctxs_quick[] = {1024, 8192, 32768};
    const int *ctxs = quick ? ctxs_quick : ctxs_full;
    const int n_ctx = quick ? 3 : 6;
    const int heads[] = {8, 64};
    const int batches[] = {1, 8};
    printf("\n| heads | batch | ctx | us | floor us | GB/s | %% of copy |\n"
           "|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int hi = 0; hi < 2; hi++)
        for (int bi = 0; bi < 2; bi++)
            for (int ci = 0; ci < n_ctx; ci++) {
                const int H = heads[hi], B = batches[bi], ctx = ctxs[ci];
                if (bench_int(argc, argv, "--heads", H) != H || bench_int(argc, argv, "--batch", B) != B ||
                    bench_int(argc, argv, "--ctx", ctx) != ctx)
                    continue;
                const int max_blocks = ctx / kv_block + 1, n_blocks = max_blocks * B, T = B * R;
                void *cache;
                uint16_t *kvb, *norm_w;
                float *q, *kv, *out, *ws, *inv;
                int32_t *pos, *seq, *table;
                int *err;
                size_t cache_elems = (size_t)n_blocks * kv_block * W;
                CUDA_CHECK(cudaMalloc(&cache, cache_elems * es));
                k25k_synth_fill(cache, es, f32 ? K25_SYNTH_F32 : K25_SYNTH_UNIFORM, -7, 1, 2,
                                n_blocks * kv_block, W, W, 0, 0, s);
                CUDA_CHECK(cudaMalloc(&kvb, (size_t)H * (dn + dv) * L * 2));
                k25k_synth_fill(kvb, 2, K25_SYNTH_UNIFORM, -11, 1, 3, H * (dn + dv), L, L, 0, 0, s);
                CUDA_CHECK(cudaMalloc(&norm_w, L * 2));
                k25k_synth_fill(norm_w, 2, K25_SYNTH_NORM, 0, 1, 4, 1, L, L, 0, 0, s);
                CUDA_CHECK(cudaMalloc(&q, sizeof(float) * T * H * (dn + dr)));
                k25k_synth_fill(q, 4, K25_SYNTH_F32, -7, 1, 5, T, H * (dn + dr), H * (dn + dr), 0, 0, s);
                CUDA_CHECK(cudaMalloc(&kv, sizeof(float) * T * W));
                k25k_synth_fill(kv, 4, K25_SYNTH_F32, -7, 1, 6, T, W, W, 0, 0, s);
                CUDA_CHECK(cudaMalloc(&out, sizeof(float) * T * H * dv));
                // row b * R + r: sequence b, position ctx - R + r (the last R positions)
                std::vector<int32_t> hp(T), hs(T), ht((size_t)B * max_blocks);
                for (int t = 0; t < T; t++) hs[t] = t / R, hp[t] = ctx - R + t % R;
                for (size_t i = 0; i < ht.size(); i++) ht[i] = (int32_t)i;
                CUDA_CHECK(cudaMalloc(&pos, T * 4));
                CUDA_CHECK(cudaMalloc(&seq, T * 4));
                CUDA_CHECK(cudaMalloc(&table, ht.size() * 4));
                CUDA_CHECK(cudaMalloc(&err, 16));
                CUDA_CHECK(cudaMemset(err, 0, 16));
                CUDA_CHECK(cudaMemcpy(pos, hp.data(), T * 4, cudaMemcpyHostToDevice));
                CUDA_CHECK(cudaMemcpy(seq, hs.data(), T * 4, cudaMemcpyHostToDevice));
                CUDA_CHECK(cudaMemcpy(table, ht.data(), ht.size() * 4, cudaMemcpyHostToDevice));
                std::vector<float> hinv(dr / 2);
                for (int i = 0; i < dr / 2; i++) hinv[i] = powf(50000.0f, -2.0f * i / dr);
                CUDA_CHECK(cudaMalloc(&inv, sizeof(float) * dr / 2));
                CUDA_CHECK(cudaMemcpy(inv, hinv.data(), sizeof(float) * dr / 2, cudaMemcpyHostToDevice));
                int chunks = k25k_mla_chunks(T, H, sms);
                CUDA_CHECK(cudaMalloc(&ws, sizeof(float) * k25k_mla_workspace_floats(T, H, L, chunks)));
                k25k_mla_args a;
                memset(&a, 0, sizeof a);
                a.T = T, a.H = H, a.L = L, a.dr = dr, a.dn = dn, a.dv = dv;
                a.kv_block = kv_block, a.max_blocks = max_blocks, a.max_seqs = B, a.n_blocks = n_blocks;
                a.eps = 1e-6f, a.scale = 0.1447f;
                a.pos = pos, a.seq = seq, a.block_table = table, a.norm_w = norm_w, a.inv_freq = inv;
                a.err = err;
                // the decoder's barrier for the one-row merge inside the attention kernel
                // (K25_NO_MERGE_FOLD=1: the merge kernel, as the decoder then runs it)
                int *merge_sync = nullptr;
                if (!k25_env_flag("K25_NO_MERGE_FOLD")) {
                    CUDA_CHECK(cudaMalloc(&merge_sync, K25K_MLA_MERGE_SYNC_BYTES));
                    CUDA_CHECK(cudaMemset(merge_sync, 0, K25K_MLA_MERGE_SYNC_BYTES));
                }
                a.merge_sync = merge_sync;
                double us = time_graph_us(s, 20, quick ? 10 : 20, [&](int) {
                    k25k_mla_attention(&a, cache, f32, kvb, q, kv, out, ws, chunks, s);
                });
                int herr = 0;
                CUDA_CHECK(cudaMemcpy(&herr, err, 4, cudaMemcpyDeviceToHost));
                std::vector<float> ho((size_t)T * H * dv);
                CUDA_CHECK(cudaMemcpy(ho.data(), out, ho.size() * 4, cudaMemcpyDeviceToHost));
                int finite = !herr;
                for (float v : ho) finite &= isfinite(v) ? 1 : 0;
                double bytes = (double)B * ctx * W * es;
                double gbs = bytes / (us * 1e-6) / 1e9;
                double floor_us = bytes / (copy_gbs * 1e9) * 1e6;
                printf("| %d | %d | %d | %.1f | %.2f | %.0f | %.0f%% |%s\n", H, B, ctx, us, floor_us,
                       gbs, 100 * gbs / copy_gbs, finite ? "" : " NON-FINITE OUTPUT");
                fflush(stdout);
                bench_jsonl("{\"bench\":\"mla_decode\",\"heads\":%d,\"batch\":%d,\"rows\":%d,"
                            "\"kv_f32\":%d,\"ctx\":%d,\"us\":%.2f,\"floor_us\":%.2f,\"gbs\":%.1f,"
                            "\"pct_copy\":%.1f,\"finite\":%d}",
                            H, B, R, f32, ctx, us, floor_us, gbs, 100 * gbs / copy_gbs, finite);
                cudaFree(cache), cudaFree(kvb), cudaFree(norm_w), cudaFree(q), cudaFree(kv);
                cudaFree(out), cudaFree(ws), cudaFree(inv), cudaFree(pos), cudaFree(seq);
                cudaFree(table), cudaFree(err), cudaFree(merge_sync);
            }
    if (bench_json) fclose(bench_json);
    return 0;
}
