// Fuzz target: the checkpoint index (model.safetensors.index.json) as read by
// checkpoint_open.
//
// src/checkpoint.c reads the index only from a file inside the checkpoint directory, so each
// input is written to <scratch>/model.safetensors.index.json; the scratch directory also holds
// two small valid shards, model-00001-of-00002.safetensors and model-00002-of-00002.safetensors,
// so an index naming them opens and its lookups run. A weight_map value naming any other file
// fails at open (the index parsing before it is what is fuzzed).
//
// An opened checkpoint must be consistent: index sorted with unique names, every entry's shard
// in range, shard names sorted and unique, and checkpoint_find agreeing with the index.
#include "checkpoint.h"
#include "fuzz_common.h"

static const char *dir;

static void write_shard(const char *name, const char *header, size_t data_bytes) {
    size_t hl = strlen(header);
    size_t total = 8 + hl + data_bytes;
    uint8_t *buf = calloc(1, total);
    if (!buf) abort();
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, header, hl);
    fuzz_write_file(name, buf, total);
    free(buf);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    dir = fuzz_dir();
    write_shard("model-00001-of-00002.safetensors",
                "{\"language_model.model.embed_tokens.weight\":{\"dtype\":\"BF16\",\"shape\":[4,2],"
                "\"data_offsets\":[0,16]},\"model.norm.weight\":{\"dtype\":\"F32\",\"shape\":[2],"
                "\"data_offsets\":[16,24]}}",
                24);
    write_shard("model-00002-of-00002.safetensors",
                "{\"__metadata__\":{\"format\":\"pt\"},\"language_model.lm_head.weight\":{\"dtype\":"
                "\"BF16\",\"shape\":[4,2],\"data_offsets\":[0,16]}}",
                16);
    return 0;
}

static void check_checkpoint(const k25_checkpoint *ck) {
    if (ck->n_shards < 1 || !ck->index || ck->n_index < 1) fuzz_fail("opened without shards/index");
    for (int i = 0; i < ck->n_shards; i++)
        if (i && strcmp(ck->shard_names[i - 1], ck->shard_names[i]) >= 0)
            fuzz_fail("shard names not sorted/unique");
    for (int i = 0; i < ck->n_index; i++) {
        const struct ckpt_entry *e = &ck->index[i];
        if (i && strcmp(ck->index[i - 1].name, e->name) >= 0) fuzz_fail("index not sorted/unique");
        if (e->shard < 0 || e->shard >= ck->n_shards) fuzz_fail("shard %d out of range", e->shard);
        char err[K25_ERR_LEN];
        int shard = -1;
        const st_tensor *t = checkpoint_find(ck, e->name, &shard, err);
        if (t && (shard < 0 || shard >= ck->n_shards)) fuzz_fail("checkpoint_find shard %d", shard);
        if (t && st_find(&ck->shards[shard], t->name) != t) fuzz_fail("checkpoint_find tensor");
        (void)checkpoint_find(ck, e->name, NULL, NULL);
    }
    char path[4096];
    checkpoint_config_path(ck, path, sizeof path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_write_file(CKPT_INDEX_FILE, data, size);
    char err[K25_ERR_LEN];
    err[0] = 0;
    k25_checkpoint *ck = checkpoint_open(dir, err);
    if (!ck) {
        if (!err[0]) fuzz_fail("checkpoint_open failed without a message");
    } else {
        check_checkpoint(ck);
        checkpoint_close(ck);
    }
    return 0;
}
