// Checkpoint directory: index + shards, canonical-name lookup, the file tensor source.
#include "checkpoint.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "json_object.h"

// ------------------------------------------------------------------------------------------
// opening

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}
static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const struct ckpt_entry *)a)->name, ((const struct ckpt_entry *)b)->name);
}

// A shard is a *.safetensors file of the directory itself: the files --verify lists and checks
// (one in a subdirectory or of another suffix would load unchecked).
static int bad_shard_name(const char *s) {
    size_t n = strlen(s), x = strlen(".safetensors");
    return n <= x || strcmp(s + n - x, ".safetensors") || strchr(s, '/') ||
           strstr(s, "..") != NULL;
}

// Parses the index into ck->index and the sorted unique ck->shard_names.
static int read_index(k25_checkpoint *ck, const char *path, char *err) {
    size_t len;
    char *text = k25_read_file(path, &len, err);
    if (!text) return -1;
    cJSON *root = json_parse_object(text, len, path, err);
    free(text);
    if (!root) return -1;
    int rc = 0;
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm)) {
        cJSON_Delete(root);
        return k25_err(err, "%s: missing or non-object \"weight_map\"", path);
    }
    int n = cJSON_GetArraySize(wm);
    ck->index = k25_calloc((size_t)(n ? n : 1), sizeof *ck->index);
    char **files = k25_calloc((size_t)(n ? n : 1), sizeof(char *));
    const cJSON *e;
    cJSON_ArrayForEach(e, wm) {
        if (!cJSON_IsString(e) || bad_shard_name(e->valuestring)) {
            rc = k25_err(err, "%s: weight_map entry '%.200s': '%.200s' is not a shard file name "
                         "in the directory (*.safetensors)", path, e->string,
                         cJSON_IsString(e) ? e->valuestring : "(not a string)");
            break;
        }
        ck->index[ck->n_index].name = k25_strdup(e->string);
        files[ck->n_index] = e->valuestring; // borrowed until cJSON_Delete
        ck->n_index++;
    }
    if (!rc) {
        // Shard numbers by file name: sort the unique names, then map each entry.
        char **uniq = k25_malloc(sizeof(char *) * (size_t)(n ? n : 1));
        memcpy(uniq, files, sizeof(char *) * (size_t)ck->n_index);
        qsort(uniq, (size_t)ck->n_index, sizeof(char *), cmp_str);
        int nu = 0;
        for (int i = 0; i < ck->n_index; i++)
            if (!nu || strcmp(uniq[nu - 1], uniq[i])) uniq[nu++] = uniq[i];
        ck->shard_names = k25_calloc((size_t)(nu ? nu : 1), sizeof(char *));
        for (int i = 0; i < nu; i++) ck->shard_names[i] = k25_strdup(uniq[i]);
        ck->n_shards = nu;
        for (int i = 0; i < ck->n_index; i++) {
            char **hit = bsearch(&files[i], uniq, (size_t)nu, sizeof(char *), cmp_str);
            ck->index[i].shard = (int)(hit - uniq);
        }
        free(uniq);
        qsort(ck->index, (size_t)ck->n_index, sizeof *ck->index, cmp_entry);
        for (int i = 1; i < ck->n_index && !rc; i++)
            if (!strcmp(ck->index[i - 1].name, ck->index[i].name))
                rc = k25_err(err, "%s: tensor '%.200s' appears twice in weight_map", path,
                             ck->index[i].name);
        if (!rc && nu == 0) rc = k25_err(err, "%s: weight_map is empty", path);
    }
    free(files);
    cJSON_Delete(root);
    return rc;
}

k25_checkpoint *checkpoint_open(const char *dir, char *err) {
    k25_checkpoint *ck = k25_calloc(1, sizeof *ck);
    ck->dir = k25_strdup(dir);
    char path[4096];
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        k25_err(err, "%s: not a checkpoint directory: %s", dir,
                stat(dir, &st) != 0 ? strerror(errno) : "not a directory");
        goto fail;
    }
    snprintf(path, sizeof path, "%s/%s", dir, CKPT_INDEX_FILE);
    if (stat(path, &st) == 0) {
        if (read_index(ck, path, err)) goto fail;
    } else {
        snprintf(path, sizeof path, "%s/%s", dir, CKPT_SINGLE_FILE);
        if (stat(path, &st) != 0) {
            k25_err(err, "%s: no %s or %s in the checkpoint directory", dir, CKPT_INDEX_FILE,
                    CKPT_SINGLE_FILE);
            goto fail;
        }
        ck->shard_names = k25_calloc(1, sizeof(char *));
        ck->shard_names[0] = k25_strdup(CKPT_SINGLE_FILE);
        ck->n_shards = 1;
    }
    ck->shards = k25_calloc((size_t)ck->n_shards, sizeof(st_file));
    for (int i = 0; i < ck->n_shards; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, ck->shard_names[i]);
        char why[K25_ERR_LEN];
        if (st_open(&ck->shards[i], path, why)) {
            if (ck->index)
                k25_err(err, "shard %s (listed in %s): %s", ck->shard_names[i], CKPT_INDEX_FILE,
                        why);
            else
                k25_err(err, "%s", why);
            goto fail;
        }
        ck->file_bytes += ck->shards[i].map_size;
    }
    return ck;
fail:
    checkpoint_close(ck);
    return NULL;
}

void checkpoint_close(k25_checkpoint *ck) {
    if (!ck) return;
    for (int i = 0; i < ck->n_shards; i++) {
        if (ck->shards) st_close(&ck->shards[i]);
        free(ck->shard_names[i]);
    }
    for (int i = 0; i < ck->n_index; i++) free(ck->index[i].name);
    free(ck->index);
    free(ck->shards);
    free(ck->shard_names);
    free(ck->dir);
    free(ck);
}

void checkpoint_config_path(const k25_checkpoint *ck, char *buf, size_t cap) {
    snprintf(buf, cap, "%s/config.json", ck->dir);
}

// ------------------------------------------------------------------------------------------
// lookup

// Exact stored name; NULL with err set when absent or listed but missing from its shard.
static const st_tensor *find_exact(const k25_checkpoint *ck, const char *name, int *shard,
                                   int *listed, char *err) {
    *listed = 0;
    if (!ck->index) {
        *shard = 0;
        const st_tensor *t = st_find(&ck->shards[0], name);
        *listed = t != NULL;
        return t;
    }
    struct ckpt_entry key = {(char *)name, 0};
    const struct ckpt_entry *e =
        bsearch(&key, ck->index, (size_t)ck->n_index, sizeof key, cmp_entry);
    if (!e) return NULL;
    *listed = 1;
    *shard = e->shard;
    const st_tensor *t = st_find(&ck->shards[e->shard], name);
    if (!t && err)
        k25_err(err, "tensor '%.200s': %s lists it in %s but that file does not contain it",
                name, CKPT_INDEX_FILE, ck->shard_names[e->shard]);
    return t;
}

const st_tensor *checkpoint_find(const k25_checkpoint *ck, const char *canonical, int *shard,
                                 char *err) {
    char pref[320];
    snprintf(pref, sizeof pref, "%s%s", CKPT_PREFIX, canonical);
    int listed, s = 0;
    const st_tensor *t = find_exact(ck, pref, &s, &listed, err);
    if (!t && !listed) t = find_exact(ck, canonical, &s, &listed, err);
    if (!t && !listed && err)
        k25_err(err, "tensor '%.200s' not found in checkpoint %s (tried '%.200s' and '%.200s')",
                canonical, ck->dir, pref, canonical);
    if (shard) *shard = s;
    return t;
}

// ------------------------------------------------------------------------------------------
// the file tensor source

static void shape_str(const st_tensor *t, char *buf, size_t cap) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < t->ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

// An INT4 weight_packed's sibling weight_shape, when present, must be (out, in).
static int check_weight_shape(const k25_checkpoint *ck, const k25_tensor *t, char *err) {
    char name[192];
    size_t base = strlen(t->name) - strlen("_packed");
    snprintf(name, sizeof name, "%.*s_shape", (int)base, t->name);
    int shard;
    const st_tensor *s = checkpoint_find(ck, name, &shard, NULL);
    if (!s) return 0;
    const char *file = ck->shard_names[shard];
    int64_t want[2] = {t->g_rows, t->g_cols * 8}, got[2];
    if ((s->dtype != ST_I32 && s->dtype != ST_I64) || s->numel != 2)
        return k25_err(err, "%s: tensor '%s': expected 2 integers (I32 or I64), found %s x %lld",
                       file, s->name, st_dtype_name(s->dtype), (long long)s->numel);
    for (int i = 0; i < 2; i++) {
        if (s->dtype == ST_I32) {
            int32_t v;
            memcpy(&v, s->data + 4 * i, 4);
            got[i] = v;
        } else {
            memcpy(&got[i], s->data + 8 * i, 8);
        }
    }
    if (got[0] != want[0] || got[1] != want[1])
        return k25_err(err, "%s: tensor '%s': (%lld, %lld), expected (%lld, %lld)", file,
                       s->name, (long long)got[0], (long long)got[1], (long long)want[0],
                       (long long)want[1]);
    return 0;
}

static int file_lookup(void *ctx, k25_tensor *t, char *err) {
    const k25_checkpoint *ck = ctx;
    int shard;
    const st_tensor *s = checkpoint_find(ck, t->name, &shard, err);
    if (!s) {
        // Say which expert format the checkpoint has when the config asked for the other one.
        char alt[192];
        int other;
        if (ends_with(t->name, ".weight_packed") || ends_with(t->name, ".weight_scale")) {
            snprintf(alt, sizeof alt, "%.*s", (int)(strlen(t->name) - 7), t->name);
            if (checkpoint_find(ck, alt, &other, NULL))
                return k25_err(err, "tensor '%s' not found: the checkpoint has BF16 routed "
                               "experts ('%s') but the configuration says INT4 "
                               "(quant.experts_int4)", t->name, alt);
        } else if (strstr(t->name, ".mlp.experts.") && ends_with(t->name, ".weight")) {
            snprintf(alt, sizeof alt, "%s_packed", t->name);
            if (checkpoint_find(ck, alt, &other, NULL))
                return k25_err(err, "tensor '%s' not found: the checkpoint has INT4 routed "
                               "experts ('%s') but the configuration says BF16 "
                               "(quant.experts_int4)", t->name, alt);
        }
        return -1;
    }
    const char *file = ck->shard_names[shard];
    if (s->k25_dtype < 0)
        return k25_err(err, "%s: tensor '%s': dtype %s is not supported (expected %s)", file,
                       s->name, st_dtype_name(s->dtype), k25_dtype_name(t->dtype));
    if ((k25_dtype)s->k25_dtype != t->dtype)
        return k25_err(err, "%s: tensor '%s': dtype %s, expected %s", file, s->name,
                       st_dtype_name(s->dtype), k25_dtype_name(t->dtype));
    int ok = (s->ndim == 2 && s->shape[0] == t->g_rows && s->shape[1] == t->g_cols) ||
             (t->g_rows == 1 && s->ndim == 1 && s->shape[0] == t->g_cols);
    if (!ok) {
        char got[160];
        shape_str(s, got, sizeof got);
        if (t->g_rows == 1)
            return k25_err(err, "%s: tensor '%s': shape %s, expected [%lld]", file, s->name, got,
                           (long long)t->g_cols);
        return k25_err(err, "%s: tensor '%s': shape %s, expected [%lld, %lld]", file, s->name,
                       got, (long long)t->g_rows, (long long)t->g_cols);
    }
    if (ends_with(t->name, ".weight_packed") && check_weight_shape(ck, t, err)) return -1;
    t->kind = K25_SRC_FILE;
    t->file_data = s->data;
    return 0;
}

k25_tensor_source checkpoint_source(k25_checkpoint *ck) {
    k25_tensor_source s = {ck, file_lookup};
    return s;
}

// mkdir -p
static int make_dirs(const char *dir) {
    char *p = k25_strdup(dir);
    int rc = 0;
    for (char *s = p + 1; rc == 0 && *s; s++)
        if (*s == '/') {
            *s = 0;
            if (mkdir(p, 0755) != 0 && errno != EEXIST) rc = -1;
            *s = '/';
        }
    if (rc == 0 && mkdir(p, 0755) != 0 && errno != EEXIST) rc = -1;
    free(p);
    return rc;
}

int checkpoint_dir_fresh(const char *dir, char *err) {
    if (!*dir) return k25_err(err, "the output directory's name is empty");
    if (make_dirs(dir) != 0)
        return k25_err(err, "%s: cannot create directory: %s", dir, strerror(errno));
    DIR *d = opendir(dir);
    if (!d) return k25_err(err, "%s: cannot open directory: %s", dir, strerror(errno));
    struct dirent *e;
    const char *held = NULL;
    while (!held && (e = readdir(d))) {
        size_t n = strlen(e->d_name), s = strlen(".safetensors");
        if (!strcmp(e->d_name, CKPT_INDEX_FILE) || !strcmp(e->d_name, "config.json") ||
            (n > s && !strcmp(e->d_name + n - s, ".safetensors")))
            held = e->d_name;
    }
    int rc = held ? k25_err(err, "%s already holds a checkpoint (%s); remove it or write elsewhere",
                            dir, held)
                  : 0;
    closedir(d);
    return rc;
}
