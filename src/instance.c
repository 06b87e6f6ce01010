// Builds and tears down a process's model stack (see instance.h): the TP x PP groups, this
// stage's weights, the backend and the model.
#include "instance.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "pipeline.h"
#ifdef K25_CUDA
#include "pp_nccl.h"
#endif

int instance_setup_dist(k25_dist *d, const k25_config *cfg, char *err) {
    int pp = cfg->pp > 0 ? cfg->pp : 1;
    int *first = k25_malloc(sizeof(int) * (size_t)(pp + 1));
    int rc = pipeline_layout(cfg, pp, first, err);
    free(first);
    if (rc) return -1;
    if (d->world_size % pp)
        return k25_err(err, "run.pp = %d pipeline stages cannot split the %d MPI ranks evenly "
                       "(the ranks are pp stages x tp ranks; use a rank count that is a "
                       "multiple of %d)", pp, d->world_size, pp);
    int tp = cfg->tp > 0 ? cfg->tp : d->world_size / pp;
    if (config_check_tp(cfg, tp, err) != 0) return -1;
    return dist_setup_groups(d, tp, pp, err);
}

// A stage without the first layer never embeds, one without the last never runs the final
// norm or the lm_head: their slices are not materialized there (weights_plan describes every
// top-level tensor; describing costs nothing, holding the bytes does).
static void drop_other_stages_tensors(k25_weights *w, const k25_config *cfg) {
    k25_tensor *drop[3];
    int n = 0;
    if (w->layer_begin > 0) drop[n++] = &w->embed;
    if (w->layer_end < cfg->n_layers) drop[n++] = &w->final_norm, drop[n++] = &w->lm_head;
    for (int i = 0; i < n; i++) {
        drop[i]->kind = K25_SRC_NONE;
        drop[i]->file_data = NULL;
    }
}

// run.kv_cache_mb: at most that many MiB of latent cache on a rank, as a serving engine's memory
// budget; with fewer blocks than the sequences could use, requests wait for free ones. Every
// stage indexes one block table, so the stage with the most layers sets the count. A draft's
// cache has as many blocks as the target's (spec.h), so a block's share of the budget is both.
static int cache_cap(const k25_config *cfg, const k25_instance_opts *o, int layers,
                     const k25_backend *be, k25_model_opts *mo, char *err) {
    int mb = o->kv_cache_mb, kv_block = mo->kv_block > 0 ? mo->kv_block : cfg->kv_block;
    int values = cfg->kv_lora_rank + cfg->qk_rope_dim;
    size_t token = ((size_t)layers * values + (size_t)o->kv_extra_values) * be->kv_value_bytes;
    size_t block = token * kv_block;
    size_t fit = ((size_t)mb << 20) / block;
    char draft[96] = "", beside[96] = "";
    if (o->kv_extra_values > 0) {
        snprintf(draft, sizeof draft, " + the draft's %lld", (long long)o->kv_extra_values);
        snprintf(beside, sizeof beside, " and as many of the draft's");
    }
    if (fit == 0)
        return k25_err(err, "run.kv_cache_mb=%d holds no cache block: a block takes %.2f MiB (%d "
                       "tokens x (%d layers x %d values%s) x %d bytes)", mb, block / 1048576.0,
                       kv_block, layers, values, draft, be->kv_value_bytes);
    mo->max_blocks = fit < INT_MAX ? (int)fit : INT_MAX;
    if (mo->max_blocks < o->min_blocks)
        return k25_err(err, "run.kv_cache_mb=%d holds %d cache blocks of %d tokens%s; %s needs %d",
                       mb, mo->max_blocks, kv_block, beside, o->min_for, o->min_blocks);
    return 0;
}

int instance_open(k25_instance *in, const k25_config *cfg, const k25_dist *d,
                  const k25_instance_opts *o, char *err) {
    memset(in, 0, sizeof *in);
    const char *backend = o->backend ? o->backend : cfg->backend;
    if (strcmp(backend, "cpu") != 0 && strcmp(backend, "cuda") != 0)
        return k25_err(err, "unknown backend '%s' (cpu or cuda)", backend);

    k25_tensor_source src;
    int rc = 0;
    if (o->model_dir) {
        in->ck = checkpoint_open(o->model_dir, err);
        rc = in->ck ? 0 : -1;
        if (in->ck) src = checkpoint_source(in->ck);
    } else {
        src = synth_source(o->synth_seed);
    }
    // This rank's layers: its pipeline stage's (pipeline.h), or all of them for a model that is
    // not split over the stages (run.pp = 1 on a pipelined world: a draft beside the target
    // runs whole on every stage).
    int stages = cfg->pp > 1 ? d->pp_size : 1, stage = stages > 1 ? d->pp_rank : 0;
    if (!rc && cfg->pp > 1 && cfg->pp != d->pp_size)
        rc = k25_err(err, "run.pp = %d but the ranks form %d pipeline stages", cfg->pp,
                     d->pp_size);
    int *first = k25_malloc(sizeof(int) * (size_t)(stages + 1));
    if (!rc) rc = pipeline_layout(cfg, stages, first, err);
    int lb = rc ? 0 : first[stage], le = rc ? 0 : first[stage + 1];
    int most_layers = 0;
    for (int s = 0; !rc && s < stages; s++)
        if (first[s + 1] - first[s] > most_layers) most_layers = first[s + 1] - first[s];
    free(first);
    // The block tables index sequence slots x blocks a slot in int (a larger product left the
    // backend's copy unallocated, and the first step crashed)
    const int64_t entries = model_table_entries(cfg, &o->model);
    if (!rc && entries > INT_MAX) {
        const int kv_block = o->model.kv_block > 0 ? o->model.kv_block : cfg->kv_block;
        rc = k25_err(err, "run.ctx_size=%d in cache blocks of %d tokens (run.kv_block_size) for "
                     "%d sequences makes a block table of %lld entries, more than %d: raise "
                     "run.kv_block_size, or lower run.ctx_size or the concurrency", cfg->ctx_size,
                     kv_block, o->model.max_seqs > 0 ? o->model.max_seqs : 1,
                     (long long)entries, INT_MAX);
    }
    // run.sim_tp (benchmarks only): TP rank r holds slice r of a sim_tp-way split, so fewer GPUs
    // than sim_tp time one rank's share of the larger run, all-reduces across the real ranks
    int w_rank = d->tp_rank, w_size = d->tp_size;
    if (!rc && cfg->sim_tp > 1) {
        if (cfg->sim_tp % d->tp_size != 0 || cfg->sim_tp == d->tp_size)
            rc = k25_err(err, "run.sim_tp = %d simulates a larger run than the %d TP rank%s here "
                         "and must be a larger multiple of it", cfg->sim_tp, d->tp_size,
                         d->tp_size > 1 ? "s" : "");
        else
            rc = config_check_tp(cfg, cfg->sim_tp, err);
        w_size = cfg->sim_tp;
    }
    if (!rc) rc = weights_plan(&in->w, cfg, w_rank, w_size, lb, le, &src, err);
    // A stage whose own layers fail to load, or a node without the checkpoint, must not leave
    // the other ranks waiting in the first collective below (the backend's or the model's)
    if (dist_agree(d, rc == 0, err)) {
        instance_close(in);
        return -1;
    }
    drop_other_stages_tensors(&in->w, cfg);

    if (strcmp(backend, "cuda") == 0) {
        in->be = backend_cuda_create(cfg, d);
        if (!in->be) {
            instance_close(in);
            return k25_err(err, "backend cuda: this binary was built without CUDA (make CUDA=1)");
        }
#ifdef K25_CUDA
        if (stages > 1 && !in->be->pp_send) pp_nccl_attach(in->be);
#endif
    } else {
        in->be = backend_cpu_create(cfg, d, o->threads > 0 ? o->threads : cfg->threads);
    }
    k25_model_opts mo = o->model;
    if (o->kv_cache_mb > 0 && cache_cap(cfg, o, most_layers, in->be, &mo, err)) {
        instance_close(in);
        return -1;
    }
    in->m = model_create(cfg, &in->w, in->be, d, &mo);
    return 0;
}

void instance_close(k25_instance *in) {
    if (in->m) model_free(in->m);
    if (in->be) in->be->destroy(in->be);
    weights_free(&in->w);
    if (in->ck) checkpoint_close(in->ck);
    memset(in, 0, sizeof *in);
}
