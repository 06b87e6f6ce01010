// Builds and tears down a process's model stack (see instance.h).
#include "instance.h"

#include <string.h>

int instance_setup_dist(k25_dist *d, const k25_config *cfg, char *err) {
    int pp = cfg->pp > 0 ? cfg->pp : 1;
    int tp = cfg->tp > 0 ? cfg->tp : d->world_size / pp;
    if (tp < 1) return k25_err(err, "run.pp = %d exceeds the %d MPI ranks", pp, d->world_size);
    if (config_check_tp(cfg, tp, err) != 0) return -1;
    return dist_setup_groups(d, tp, pp, err);
}

int instance_open(k25_instance *in, const k25_config *cfg, const k25_dist *d,
                  const k25_instance_opts *o, char *err) {
    memset(in, 0, sizeof *in);
    const char *backend = o->backend ? o->backend : cfg->backend;
    if (strcmp(backend, "cpu") != 0 && strcmp(backend, "cuda") != 0)
        return k25_err(err, "unknown backend '%s' (cpu or cuda)", backend);

    k25_tensor_source src;
    if (o->model_dir) {
        in->ck = checkpoint_open(o->model_dir, err);
        if (!in->ck) return -1;
        src = checkpoint_source(in->ck);
    } else {
        src = synth_source(o->synth_seed);
    }
    // Pipeline stage p holds an equal share of the layers (the last one takes the rest).
    int per = cfg->n_layers / d->pp_size;
    int lb = d->pp_rank * per, le = d->pp_rank == d->pp_size - 1 ? cfg->n_layers : lb + per;
    if (weights_plan(&in->w, cfg, d->tp_rank, d->tp_size, lb, le, &src, err) != 0) {
        instance_close(in);
        return -1;
    }

    if (strcmp(backend, "cuda") == 0) {
        in->be = backend_cuda_create(cfg, d);
        if (!in->be) {
            instance_close(in);
            return k25_err(err, "backend cuda: this binary was built without CUDA (make CUDA=1)");
        }
    } else {
        in->be = backend_cpu_create(cfg, d, o->threads > 0 ? o->threads : cfg->threads);
    }
    in->m = model_create(cfg, &in->w, in->be, d, &o->model);
    return 0;
}

void instance_close(k25_instance *in) {
    if (in->m) model_free(in->m);
    if (in->be) in->be->destroy(in->be);
    weights_free(&in->w);
    if (in->ck) checkpoint_close(in->ck);
    memset(in, 0, sizeof *in);
}
