// Result files written whole through PATH.tmp (see out_file.h).
#include "out_file.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

// A new file: `path` itself, or what a dangling link names (so that the link stays a link).
static char *dangling_target(const char *path) {
    char to[PATH_MAX];
    struct stat st;
    if (lstat(path, &st) != 0 || !S_ISLNK(st.st_mode)) return k25_strdup(path);
    ssize_t n = readlink(path, to, sizeof to - 1);
    if (n <= 0) return k25_strdup(path);
    to[n] = 0;
    const char *slash = strrchr(path, '/');
    if (to[0] == '/' || !slash) return k25_strdup(to);
    int dir = (int)(slash - path) + 1; // a relative target is relative to the link's directory
    char *out = k25_malloc((size_t)dir + (size_t)n + 1);
    sprintf(out, "%.*s%s", dir, path, to);
    return out;
}

// The absolute name of the file that `path` writes (links and ".." resolved, the directory's
// when the file does not exist yet); NULL when its directory does not resolve.
static char *landing(const char *path) {
    char *t = dangling_target(path), buf[PATH_MAX], *out = NULL;
    if (realpath(t, buf)) {
        out = k25_strdup(buf);
    } else {
        const char *slash = strrchr(t, '/');
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - t) + 1 : 1, slash ? t : ".");
        if (realpath(dir, buf)) {
            out = k25_malloc(strlen(buf) + strlen(t) + 2);
            sprintf(out, "%s/%s", buf, slash ? slash + 1 : t);
        }
    }
    free(t);
    return out;
}

int out_file_same(const char *a, const char *b) {
    struct stat sa, sb;
    int ea = stat(a, &sa) == 0, eb = stat(b, &sb) == 0;
    if (ea && eb) // a device or pipe written in place may well take two outputs
        return S_ISREG(sa.st_mode) && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    char *la = landing(a), *lb = landing(b);
    int same = la && lb && !strcmp(la, lb);
    free(la);
    free(lb);
    return same;
}

static int not_rewindable(const char *path, const char *what, char *err) {
    return k25_err(err, "%s: %s cannot be rewound (a pipe?): the format writes its row count "
                   "last; give a regular file", what, path);
}

// Where the data lands (*real, to free) and whether it is written in place. `seekable`: a pipe
// or socket is refused here already, so that the check before a run catches it.
static int resolve(const char *path, const char *what, int seekable, char **real, int *in_place,
                   char *err) {
    *real = NULL;
    *in_place = 0;
    if (!path || !*path) return k25_err(err, "%s: the path is empty", what);
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno != ENOENT) return k25_err(err, "%s: %s: %s", what, path, strerror(errno));
        *real = dangling_target(path);
        return 0;
    }
    if (S_ISDIR(st.st_mode)) return k25_err(err, "%s: %s is a directory", what, path);
    if (seekable && (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)))
        return not_rewindable(path, what, err);
    if (!S_ISREG(st.st_mode)) {
        *real = k25_strdup(path);
        *in_place = 1;
        return 0;
    }
    char buf[PATH_MAX];
    if (!realpath(path, buf)) return k25_err(err, "%s: %s: %s", what, path, strerror(errno));
    *real = k25_strdup(buf);
    return 0;
}

static char *tmp_name(const char *real) {
    char *tmp = k25_malloc(strlen(real) + 5);
    sprintf(tmp, "%s.tmp", real);
    return tmp;
}

int out_file_check(const char *path, const char *what, int seekable, char *err) {
    char *real;
    int in_place;
    if (resolve(path, what, seekable, &real, &in_place, err)) return -1;
    int rc = 0;
    if (in_place) {
        // Opening a named pipe for writing would wait for a reader; asking is enough here.
        if (access(real, W_OK) != 0)
            rc = k25_err(err, "%s: cannot write %s: %s", what, real, strerror(errno));
    } else {
        char *tmp = tmp_name(real);
        FILE *f = fopen(tmp, "wb");
        if (!f) rc = k25_err(err, "%s: cannot create %s: %s", what, tmp, strerror(errno));
        else fclose(f), unlink(tmp);
        free(tmp);
    }
    free(real);
    return rc;
}

int out_file_open(k25_out_file *o, const char *path, const char *what, int seekable, char *err) {
    memset(o, 0, sizeof *o);
    o->what = what;
    int in_place;
    if (resolve(path, what, seekable, &o->path, &in_place, err)) return -1;
    if (!in_place) o->tmp = tmp_name(o->path);
    const char *name = o->tmp ? o->tmp : o->path;
    o->f = fopen(name, "wb");
    if (!o->f) {
        k25_err(err, "%s: cannot create %s: %s", what, name, strerror(errno));
        out_file_abandon(o);
        return -1;
    }
    if (seekable && in_place && lseek(fileno(o->f), 0, SEEK_CUR) < 0) { // a terminal, say
        out_file_abandon(o);
        return not_rewindable(path, what, err);
    }
    return 0;
}

int out_file_in_place(const k25_out_file *o) { return o->f && !o->tmp; }

int out_file_commit(k25_out_file *o, char *err) {
    if (!o->f) return 0;
    errno = 0;
    int bad = fflush(o->f) != 0 || ferror(o->f);
    if (!bad && o->tmp && fsync(fileno(o->f)) != 0) bad = 1;
    int e = errno;
    if (fclose(o->f) != 0 && !bad) bad = 1, e = errno;
    o->f = NULL;
    const char *name = o->tmp ? o->tmp : o->path;
    int rc = 0;
    if (bad)
        rc = k25_err(err, "%s: writing %s failed%s%s", o->what, name, e ? ": " : "",
                     e ? strerror(e) : "");
    else if (o->tmp && rename(o->tmp, o->path) != 0)
        rc = k25_err(err, "%s: cannot rename %s to %s: %s", o->what, o->tmp, o->path,
                     strerror(errno));
    if (rc && o->tmp) unlink(o->tmp);
    free(o->path);
    free(o->tmp);
    o->path = o->tmp = NULL;
    return rc;
}

void out_file_abandon(k25_out_file *o) {
    if (o->f) fclose(o->f);
    if (o->f && o->tmp) unlink(o->tmp);
    o->f = NULL;
    free(o->path);
    free(o->tmp);
    o->path = o->tmp = NULL;
}
