// Result files that appear whole or not at all (--dump-logits, k25bench --json): written as
// PATH.tmp and renamed over PATH when complete, so a killed or failed run never leaves a
// truncated file under the name a script reads. PATH.tmp sits beside the file a link points
// to, so the rename replaces the file, not the link. An existing PATH that is not a regular
// file (/dev/null, a named pipe) is written in place: renaming over it would replace the
// device node with a regular file.
#pragma once
#include <stdio.h>

typedef struct k25_out_file {
    FILE *f;
    char *path;  // where the data lands (a link's target)
    char *tmp;   // PATH.tmp; NULL when written in place
    const char *what;
} k25_out_file;

#ifdef __cplusplus
extern "C" {
#endif

// Whether `path` can be opened by out_file_open (with the same `seekable`), checked before a
// long run so that it does not fail at the end. `what` (the flag) starts every message.
int out_file_check(const char *path, const char *what, int seekable, char *err);
// Whether two output paths name one regular file, existing or not (two spellings, links):
// two outputs there would overwrite each other.
int out_file_same(const char *a, const char *b);
// Opens for writing (binary). `seekable`: refuse a target that cannot be rewound (a pipe),
// for formats that rewrite their header last.
int out_file_open(k25_out_file *o, const char *path, const char *what, int seekable, char *err);
// Whether the target is written in place (its content then cannot be replaced, only appended).
int out_file_in_place(const k25_out_file *o);
// Flushes, syncs and closes, then renames into place; any failed write before it counts.
// The temporary file is removed on failure.
int out_file_commit(k25_out_file *o, char *err);
// Closes and removes the temporary file (an error path); no-op on a closed file.
void out_file_abandon(k25_out_file *o);

#ifdef __cplusplus
}
#endif
