// CRC-32 manifest of a checkpoint directory: writing and checking.
#include "verify.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "progress.h"

#define VERIFY_BUF (16u << 20) // read size: large sequential reads

// ------------------------------------------------------------------------------------------
// helpers

typedef struct {
    char **names;
    int n;
} name_list;

static void names_free(name_list *l) {
    for (int i = 0; i < l->n; i++) free(l->names[i]);
    free(l->names);
    l->names = NULL;
    l->n = 0;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int is_safetensors(const char *name) {
    size_t n = strlen(name), s = strlen(".safetensors");
    return n > s && !strcmp(name + n - s, ".safetensors");
}

// Sorted names of the *.safetensors files of dir.
static int list_shards(const char *dir, name_list *out, char *err) {
    memset(out, 0, sizeof *out);
    DIR *d = opendir(dir);
    if (!d) return k25_err(err, "%s: cannot open directory: %s", dir, strerror(errno));
    int cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!is_safetensors(e->d_name)) continue;
        if (out->n == cap) {
            cap = cap ? 2 * cap : 64;
            out->names = realloc(out->names, sizeof(char *) * (size_t)cap);
            if (!out->names) K25_DIE("out of memory listing %s", dir);
        }
        out->names[out->n++] = k25_strdup(e->d_name);
    }
    closedir(d);
    // With no shards names is still NULL, which qsort may not be given even for zero items.
    if (out->n) qsort(out->names, (size_t)out->n, sizeof(char *), cmp_str);
    return 0;
}

static int file_size(const char *path, uint64_t *size) {
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return -1;
    *size = (uint64_t)st.st_size;
    return 0;
}

// CRC-32 (zlib) of a whole file, reporting progress.
static int file_crc(const char *path, uint8_t *buf, uint32_t *crc, char *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return k25_err(err, "%s: cannot open: %s", path, strerror(errno));
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    uLong c = crc32(0L, Z_NULL, 0);
    for (;;) {
        ssize_t got = read(fd, buf, VERIFY_BUF);
        if (got < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            close(fd);
            return k25_err(err, "%s: read error: %s", path, strerror(e));
        }
        if (got == 0) break;
        c = crc32_z(c, buf, (z_size_t)got);
        progress_update((uint64_t)got);
    }
    close(fd);
    *crc = (uint32_t)c;
    return 0;
}

// ------------------------------------------------------------------------------------------
// writing

int verify_write_manifest(const char *dir, char *err) {
    name_list l;
    if (list_shards(dir, &l, err)) return -1;
    if (l.n == 0) {
        names_free(&l);
        return k25_err(err, "%s: no *.safetensors files to put in a manifest", dir);
    }
    char path[4096], tmp[4200];
    uint64_t total = 0, size;
    for (int i = 0; i < l.n; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, l.names[i]);
        if (!file_size(path, &size)) total += size;
    }
    snprintf(tmp, sizeof tmp, "%s/%s.tmp", dir, VERIFY_MANIFEST);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        names_free(&l);
        return k25_err(err, "%s: cannot create: %s", tmp, strerror(errno));
    }
    uint8_t *buf = k25_malloc(VERIFY_BUF);
    int rc = 0;
    progress_begin("checksumming", total);
    for (int i = 0; i < l.n && !rc; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, l.names[i]);
        uint32_t crc;
        if (file_size(path, &size)) rc = k25_err(err, "%s: not a regular file", path);
        else if (!(rc = file_crc(path, buf, &crc, err)))
            fprintf(f, "%08x %llu %s\n", crc, (unsigned long long)size, l.names[i]);
    }
    progress_end();
    free(buf);
    names_free(&l);
    if (fclose(f) != 0 && !rc) rc = k25_err(err, "%s: write error", tmp);
    if (!rc) {
        snprintf(path, sizeof path, "%s/%s", dir, VERIFY_MANIFEST);
        if (rename(tmp, path) != 0) rc = k25_err(err, "%s: cannot rename: %s", tmp,
                                                 strerror(errno));
    }
    if (rc) unlink(tmp);
    return rc;
}

// ------------------------------------------------------------------------------------------
// checking

typedef struct {
    uint32_t crc;
    uint64_t size;
    char *name;
} manifest_line;

static void manifest_free(manifest_line *m, int n) {
    for (int i = 0; i < n; i++) free(m[i].name);
    free(m);
}

static int read_manifest(const char *dir, manifest_line **out, int *n_out, char *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, VERIFY_MANIFEST);
    int fd = k25_open_regular(path, NULL, err);
    if (fd < 0 && errno == ENOENT)
        return k25_err(err, "%s: no checksum manifest to verify against; create one from a good "
                       "copy with `k25-mkckpt --manifest %s`", path, dir);
    if (fd < 0) return -1;
    FILE *f = fdopen(fd, "r");
    if (!f) {
        close(fd);
        return k25_err(err, "%s: cannot open: %s", path, strerror(errno));
    }
    manifest_line *m = NULL;
    int n = 0, cap = 0, line = 0, rc = 0;
    char buf[4096];
    while (fgets(buf, sizeof buf, f)) {
        line++;
        size_t len = strlen(buf);
        while (len && (buf[len - 1] == '\n' || buf[len - 1] == '\r')) buf[--len] = 0;
        if (!len) continue;
        unsigned crc;
        unsigned long long size;
        int used = 0;
        if (sscanf(buf, "%8x %llu %n", &crc, &size, &used) < 2 || used == 0 || !buf[used] ||
            strchr(buf + used, '/')) {
            rc = k25_err(err, "%s:%d: expected \"<crc32 hex> <size> <file name>\"", path, line);
            break;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            m = realloc(m, sizeof *m * (size_t)cap);
            if (!m) K25_DIE("out of memory reading %s", path);
        }
        m[n].crc = crc;
        m[n].size = size;
        m[n].name = k25_strdup(buf + used);
        n++;
    }
    fclose(f);
    if (!rc && n == 0) rc = k25_err(err, "%s: empty manifest", path);
    if (rc) {
        manifest_free(m, n);
        return -1;
    }
    *out = m;
    *n_out = n;
    return 0;
}

int verify_checkpoint_part(const char *dir, int part, int n_parts, char *err) {
    manifest_line *m = NULL;
    int n = 0;
    if (read_manifest(dir, &m, &n, err)) return -1;
    char path[4096];
    int rc = 0;
    // Cheap checks first: every listed file present with its size, every shard listed.
    uint64_t total = 0;
    for (int i = 0; i < n && !rc; i++) {
        uint64_t size;
        snprintf(path, sizeof path, "%s/%s", dir, m[i].name);
        if (file_size(path, &size))
            rc = k25_err(err, "%s: missing (listed in %s)", path, VERIFY_MANIFEST);
        else if (size != m[i].size)
            rc = k25_err(err, "%s: %llu bytes, %s says %llu (truncated or replaced)", path,
                         (unsigned long long)size, VERIFY_MANIFEST,
                         (unsigned long long)m[i].size);
        else if (i % n_parts == part)
            total += size;
    }
    name_list l = {0};
    if (!rc) rc = list_shards(dir, &l, err);
    for (int i = 0; i < l.n && !rc; i++) {
        int found = 0;
        for (int j = 0; j < n && !found; j++) found = !strcmp(l.names[i], m[j].name);
        if (!found)
            rc = k25_err(err, "%s/%s: not listed in %s (regenerate it with `k25-mkckpt "
                         "--manifest %s`)", dir, l.names[i], VERIFY_MANIFEST, dir);
    }
    names_free(&l);
    if (!rc) {
        uint8_t *buf = k25_malloc(VERIFY_BUF);
        progress_begin("verifying checkpoint", total);
        for (int i = part; i < n && !rc; i += n_parts) {
            uint32_t crc;
            snprintf(path, sizeof path, "%s/%s", dir, m[i].name);
            if (!(rc = file_crc(path, buf, &crc, err)) && crc != m[i].crc)
                rc = k25_err(err, "%s: CRC-32 %08x, %s says %08x (file corrupted)", path, crc,
                             VERIFY_MANIFEST, m[i].crc);
        }
        progress_end();
        free(buf);
    }
    manifest_free(m, n);
    return rc;
}

int verify_checkpoint(const char *dir, char *err) { return verify_checkpoint_part(dir, 0, 1, err); }
